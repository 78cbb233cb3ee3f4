"""`toolschool rl` end to end on the tiny random model: a few GRPO steps, logs, adapter, merged, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import (
    answer_example,
    calc_example,
    read_log,
    rl_config,
    save_sft_like_adapter,
    train_rl,
    write_jsonl,
)
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ConfigError, DataError


@pytest.fixture()
def train_file(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "train.jsonl", [calc_example(12, 34), calc_example(7, 8), answer_example(), calc_example(3, 9)]
    )


def test_rl_single_turn_writes_logs_adapter_merged_and_resumes(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    from toolschool.models.loading import load_model
    from toolschool.train.rl import read_reward_curve

    out = tmp_path / "rl"
    result = train_rl(rl_config(tiny_model_dir, train_file), out, progress=False)
    assert result.steps == 2
    curve = read_reward_curve(out / "train_log.jsonl")
    assert [r["step"] for r in curve] == [1, 2]
    for record in curve:
        for key in (
            "reward",
            "rewards/format",
            "rewards/tool",
            "rewards/arguments",
            "rewards/length",
            "kl",
            "valid_format_rate",
            "tool_accuracy",
        ):
            assert key in record, key
        assert -0.7 <= record["reward"] <= 2.5
    spread = [1 - r["frac_reward_zero_std"] for r in curve]  # TRL's per-step share of groups without spread
    assert result.groups_with_reward_spread == round(sum(spread) / len(spread), 4)
    assert (out / "checkpoints" / "checkpoint-2").is_dir()
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert any((out / "tensorboard").iterdir())
    merged = load_model(str(out / "merged"), device="cpu", dtype="fp32")
    assert merged.adapter is None and merged.model.config.model_type == "llama"

    # Resume: one more step continues from checkpoint-2 rather than starting over. The interrupted run had
    # logged a step 3 after its last checkpoint (and died mid-line): the resumed run's step 3 replaces it.
    with (out / "train_log.jsonl").open("a") as log:
        log.write(json.dumps({"step": 3, "reward": 0.0}) + "\n" + '{"step": 4, "rew')
    resumed = train_rl(rl_config(tiny_model_dir, train_file, num_steps=3), out, resume=True, progress=False)
    assert resumed.steps == 3
    steps = [r["step"] for r in read_reward_curve(out / "train_log.jsonl")]
    assert steps == [1, 2, 3]


def test_reward_spread_is_the_share_of_groups_grpo_learns_from(tmp_path: Path) -> None:
    from toolschool.train.rl import reward_spread

    log = tmp_path / "train_log.jsonl"
    assert reward_spread(log) is None  # no log
    lines = [{"step": 1, "reward": 0.5, "frac_reward_zero_std": 1.0}, {"step": 2, "reward": 1.0}]
    lines.append({"step": 3, "reward": 1.0, "frac_reward_zero_std": 0.5})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert reward_spread(log) == 0.25  # steps 1 and 3: 0 and 0.5 of the groups had spread


def test_rl_refuses_to_overwrite_checkpoints_without_resume(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    from toolschool.errors import ToolschoolError

    out = tmp_path / "rl"
    (out / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(ToolschoolError, match="--resume"):
        train_rl(rl_config(tiny_model_dir, train_file), out, progress=False)
    # the command too, and it leaves the run's config.toml (what it was trained with) alone
    from typer.testing import CliRunner

    from toolschool.cli import app

    (out / "config.toml").write_text("# the run's own settings\n")
    args = ["rl", "--model", str(tiny_model_dir), "--train", str(train_file), "--out", str(out)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "already holds checkpoints" in refused.output
    assert (out / "config.toml").read_text() == "# the run's own settings\n"


def test_unknown_reward_is_refused_before_loading_anything(tmp_path: Path, train_file: Path) -> None:

    config = rl_config(tmp_path / "no-such-model", train_file, rewards=["format", "helpfulness"])
    with pytest.raises(ConfigError, match="unknown reward name.*'helpfulness'.*valid names: format, tool"):
        train_rl(config, tmp_path / "out", progress=False)


def test_multi_turn_without_expected_answer_is_refused(tmp_path: Path) -> None:

    example = calc_example(2, 3)
    del example["meta"]["expected_answer"]
    train = write_jsonl(tmp_path / "train.jsonl", [calc_example(4, 5), example])
    config = rl_config(tmp_path / "no-such-model", train, mode="multi_turn")
    with pytest.raises(DataError, match=r"no meta.expected_answer: .*train.jsonl:2"):
        train_rl(config, tmp_path / "out", progress=False)


def test_multi_turn_needs_hermes_and_batch_must_hold_whole_groups(tmp_path: Path, train_file: Path) -> None:

    with pytest.raises(ConfigError, match="needs the hermes format"):
        train_rl(rl_config(tmp_path, train_file, mode="multi_turn", format="json"), tmp_path / "o", progress=False)
    with pytest.raises(ConfigError, match="not a multiple of rl.num_generations"):
        train_rl(rl_config(tmp_path, train_file, batch_size=5), tmp_path / "o", progress=False)


def test_reference_model_with_another_tokenizer_is_refused(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    other = tmp_path / "other-ref"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<extra_token_a>", "<extra_token_b>"])
    tokenizer.save_pretrained(other)
    (other / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    config = rl_config(tiny_model_dir, train_file, ref_model=str(other))
    with pytest.raises(ConfigError, match="uses another tokenizer"):
        train_rl(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_cli_rl_reports_bad_reward_in_one_line(tmp_path: Path, train_file: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "rl",
            "--model",
            "smollm2-135m",
            "--train",
            str(train_file),
            "--reward",
            "format",
            "--reward",
            "vibes",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2
    assert "unknown reward name(s) 'vibes'" in result.output
    assert "Traceback" not in result.output


def test_tool_callable_renders_the_tool_schema_and_returns_observations() -> None:
    from transformers.utils import get_json_schema

    from toolschool.tools.registry import build_registry
    from toolschool.train.rl import tool_callable

    registry = build_registry(only=["calculator", "unit_convert"])
    try:
        calc = tool_callable(registry.get("calculator"))
        schema = get_json_schema(calc)["function"]
        assert schema["name"] == "calculator"
        assert schema["parameters"]["required"] == ["expression"]
        assert schema["parameters"]["properties"]["expression"]["type"] == "string"
        assert calc(expression="1234*5678") == registry.call("calculator", {"expression": "1234*5678"}).text
        assert "7006652" in calc(expression="1234*5678")
        # Bad arguments come back as the tool's own error text, which the model reads as the observation.
        assert registry.call("calculator", {"expression": "1/0"}).is_error
        assert calc(expression="1/0") == registry.call("calculator", {"expression": "1/0"}).text
        units = get_json_schema(tool_callable(registry.get("unit_convert")))["function"]["parameters"]
        assert set(units["required"]) == set(registry.get("unit_convert").parameters["required"])
    finally:
        registry.close()


def test_rl_multi_turn_executes_tools_and_rewards_the_final_answer(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random model never writes a call, so its sampler is replaced by a scripted one: first a calculator call,
    then (after seeing the tool's answer) a final answer quoting it. TRL runs the real tool in between."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from toolschool.engine.shared_prompt_grpo import SharedPromptGRPOTrainer
    from toolschool.train.rl import read_reward_curve

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    response_open = tokenizer("<tool_response>", add_special_tokens=False)["input_ids"]
    seen_observations: list[str] = []

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):  # noqa: ANN001
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            if "<tool_response>" in text:
                observation = text.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0].strip()
                seen_observations.append(observation)
                reply = f"The result is {observation}.<|im_end|>"
            else:
                question = text.rsplit("What is ", 1)[-1].split("?")[0]
                a, _, b = question.partition(" times ")
                reply = (
                    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
                    + f"{a}*{b}"
                    + '"}}\n</tool_call><|im_end|>'
                )
            out.append(tokenizer(reply, add_special_tokens=False)["input_ids"])  # prompts arrive already repeated
        return out, None

    assert response_open  # the template's observation marker is real text the scripted sampler can find
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    # our trainer's own sampler (each distinct prompt prefilled once) is replaced by the same script
    monkeypatch.setattr(
        SharedPromptGRPOTrainer, "_generate_shared_prefill", lambda self, ids: scripted(self, ids, 0, 0, 0)
    )
    train = write_jsonl(tmp_path / "train.jsonl", [calc_example(12, 34), calc_example(7, 8)])
    out = tmp_path / "rl"
    config = rl_config(tiny_model_dir, train, mode="multi_turn", num_steps=1, max_tokens=96, merge=False)
    result = train_rl(config, out, progress=False)
    assert result.steps == 1 and result.merged_dir is None
    record = read_reward_curve(out / "train_log.jsonl")[0]
    assert sorted(seen_observations)[:1] and {"408", "56"} >= set(seen_observations)
    assert record["rewards/answer"] == 1.0
    assert record["rewards/format"] == 1.0 and record["rewards/tool"] == 0.5 and record["rewards/arguments"] == 1.0
    assert record["tools/call_frequency"] == 1.0 and record["tools/failure_frequency"] == 0.0
    assert record["answer_accuracy"] == 1.0


def test_fewer_examples_than_prompts_per_step_still_train(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One example, two prompts per step: the examples are cycled to fill a step instead of training 0 steps; the
    run still counts one example (the report said "trained on 2 examples" beside SFT's 1 in the demo)."""
    from toolschool.train.rl import META_FILE

    train = write_jsonl(tmp_path / "one.jsonl", [calc_example(12, 34)])
    result = train_rl(rl_config(tiny_model_dir, train, num_steps=1, merge=False), tmp_path / "rl", progress=False)
    assert result.steps == 1
    assert [r["step"] for r in read_log(tmp_path / "rl") if "reward" in r] == [1]
    assert json.loads((tmp_path / "rl" / META_FILE).read_text())["examples"] == 1


def test_a_misspelt_lora_target_is_refused_before_anything_is_written(
    tiny_model_dir: Path, tmp_path: Path, train_file: Path
) -> None:
    """PEFT fails only when no target matches: "vproj" beside "q_proj" would leave v_proj untrained silently."""

    config = rl_config(tiny_model_dir, train_file, target_modules=["q_proj", "vproj"])
    with pytest.raises(ConfigError, match=r"lora.target_modules: 'vproj' names no module of the model") as info:
        train_rl(config, tmp_path / "out", progress=False)
    assert "v_proj" in info.value.hint and not (tmp_path / "out").exists()


def test_unknown_loss_type_is_refused_before_loading_anything(tmp_path: Path, train_file: Path) -> None:
    """TRL accepts any loss_type string and only fails at the first loss, after loading and sampling."""

    config = rl_config(tmp_path / "no-such-model", train_file, loss_type="ppo")
    with pytest.raises(ConfigError, match=r"rl.loss_type = 'ppo' is not a TRL GRPO loss.*dapo"):
        train_rl(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_resume_with_another_method_is_refused_before_training(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """LoRA checkpoints hold an adapter, full ones the whole model: resuming one as the other ended in a
    transformers traceback ("Can't find a checkpoint index") after loading, with the log already trimmed."""
    from toolschool.errors import ToolschoolError
    from toolschool.models.loading import load_model
    from toolschool.train.common import base_identity
    from toolschool.train.rl import META_FILE

    out = tmp_path / "rl"
    (out / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    identity = base_identity(load_model(str(tiny_model_dir), device="cpu", dtype="fp32"), str(tiny_model_dir))
    meta = {"base": identity, "mode": "single_turn", "format": "hermes", "method": "lora", "examples": 4}
    (out / META_FILE).write_text(json.dumps(meta))
    log = '{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.5}\n'
    (out / "train_log.jsonl").write_text(log)
    with pytest.raises(ToolschoolError, match=r"ran with other settings: rl.method: \"lora\" → \"full\""):
        train_rl(rl_config(tiny_model_dir, train_file, method="full"), out, resume=True, progress=False)
    assert json.loads((out / META_FILE).read_text())["method"] == "lora"
    assert (out / "train_log.jsonl").read_text() == log


def test_rl_on_top_of_an_sft_adapter_writes_an_adapter_and_checkpoints_that_load_with_it(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """Started from an adapter folder, RL trains a LoRA on the base with that adapter merged in. PEFT records the
    bare base for it, so adapter/ and every checkpoint used to load without the SFT adapter (evaluate, serve);
    they now name the SFT adapter as their base and the loader applies both, in order."""
    import torch

    from toolschool.models.loading import load_model
    from toolschool.train.common import latest_checkpoint

    sft = save_sft_like_adapter(tiny_model_dir, tmp_path / "sft-adapter")
    out = tmp_path / "rl"
    result = train_rl(rl_config(sft, train_file, num_steps=1, learning_rate=1e-9), out, progress=False)
    assert result.adapter_dir is not None and result.merged_dir is not None
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])

    def logits(model: object) -> torch.Tensor:
        with torch.no_grad():
            return load_model(str(model), device="cpu", dtype="fp32").model(ids).logits

    start, base = logits(sft), logits(tiny_model_dir)
    assert (start - base).abs().max() > 0.1  # the SFT adapter matters ...
    for saved in (result.merged_dir, result.adapter_dir, latest_checkpoint(out)):  # ... and each result keeps it
        assert torch.allclose(logits(saved), start, atol=1e-4), saved


def test_reference_model_works_on_trls_own_log_prob_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--ref-model with --no-share-prompts: TRL's log-prob pass calls the reference with its fused LM head, which
    TRL only adds to the models it builds itself; the reference we load after it must get it too."""
    from toolschool.train.rl import read_reward_curve

    train = write_jsonl(tmp_path / "train.jsonl", [calc_example(2, 3), calc_example(4, 5)])
    config = rl_config(
        tiny_model_dir, train, num_steps=1, merge=False, ref_model=str(tiny_model_dir), share_prompts=False
    )
    result = train_rl(config, tmp_path / "rl", progress=False)
    assert result.steps == 1
    assert read_reward_curve(tmp_path / "rl" / "train_log.jsonl")[0]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_data_errors_name_the_file_line_even_after_blank_lines(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The JSONL reader skips blank lines, so an example's position is not its line: messages must say the line."""

    example = calc_example(2, 3)
    del example["meta"]["expected_answer"]
    train = tmp_path / "train.jsonl"
    train.write_text("\n" + json.dumps(calc_example(4, 5)) + "\n\n" + json.dumps(example) + "\n")
    config = rl_config(tmp_path / "no-such-model", train, mode="multi_turn")
    with pytest.raises(DataError, match=r"no meta.expected_answer: \S*train.jsonl:4 "):
        train_rl(config, tmp_path / "out", progress=False)
    short = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    train.write_text("\n\n" + json.dumps(short) + "\n" + json.dumps(calc_example(4, 5)) + "\n")
    config = rl_config(tiny_model_dir, train, max_prompt_tokens=60)
    with pytest.raises(DataError, match=r"longer than rl.max_prompt_tokens = 60: \S*train.jsonl:4 \("):
        train_rl(config, tmp_path / "out", progress=False)


def test_resume_before_the_first_checkpoint_does_not_log_steps_twice(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """A run killed before its first checkpoint logged steps that --resume trains again from step 0."""
    from toolschool.train.rl import read_reward_curve

    out = tmp_path / "rl"
    out.mkdir()
    (out / "train_log.jsonl").write_text(
        json.dumps({"event": "start", "step": 0}) + "\n" + json.dumps({"step": 1, "reward": -9.0}) + "\n"
    )
    result = train_rl(rl_config(tiny_model_dir, train_file, num_steps=1, merge=False), out, resume=True, progress=False)
    assert result.steps == 1
    curve = read_reward_curve(out / "train_log.jsonl")
    assert [r["step"] for r in curve] == [1] and curve[0]["reward"] != -9.0


def test_resume_on_other_training_data_is_refused(tiny_model_dir: Path, train_file: Path, tmp_path: Path) -> None:
    """Resuming replays the data order and skips the batches already seen, which only holds for the same data."""
    from toolschool.errors import ToolschoolError
    from toolschool.train.rl import META_FILE

    out = tmp_path / "rl"
    train_rl(rl_config(tiny_model_dir, train_file, num_steps=1, merge=False), out, progress=False)
    assert json.loads((out / META_FILE).read_text())["train_sha256"]
    other = write_jsonl(tmp_path / "other.jsonl", [calc_example(5, 6), answer_example()])
    with pytest.raises(ToolschoolError, match=r"ran with other inputs: training file: [0-9a-f]{10}… → [0-9a-f]{10}…"):
        train_rl(rl_config(tiny_model_dir, other, num_steps=2, merge=False), out, resume=True, progress=False)
    resumed = train_rl(
        rl_config(tiny_model_dir, train_file, num_steps=2, merge=False), out, resume=True, progress=False
    )
    assert resumed.steps == 2


def test_full_rl_from_an_sft_adapter_keeps_the_start_model_as_the_kl_reference(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """Full fine-tuning: TRL reloads the reference from the policy's config path, which for a start adapter (merged
    in memory) is the bare base. The KL must be to the start model: ~0 at the first step, before any update."""
    from toolschool.train.rl import read_reward_curve

    sft = save_sft_like_adapter(tiny_model_dir, tmp_path / "sft-adapter")
    config = rl_config(sft, train_file, num_steps=1, method="full", merge=False)
    train_rl(config, tmp_path / "rl", progress=False)
    assert read_reward_curve(tmp_path / "rl" / "train_log.jsonl")[0]["kl"] == pytest.approx(0.0, abs=1e-5)


def test_a_fresh_run_into_a_folder_with_an_old_log_does_not_mix_them(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """A run that died before its first checkpoint leaves a log; running again without --resume starts at step 0
    and must not append its steps to the old ones."""
    from toolschool.train.rl import read_reward_curve

    out = tmp_path / "rl"
    out.mkdir()
    (out / "train_log.jsonl").write_text(json.dumps({"step": 1, "reward": -9.0}) + "\n")
    train_rl(rl_config(tiny_model_dir, train_file, num_steps=1, merge=False), out, progress=False)
    curve = read_reward_curve(out / "train_log.jsonl")
    assert [r["step"] for r in curve] == [1] and curve[0]["reward"] != -9.0


def test_multi_turn_call_with_arguments_as_a_json_string_is_executed(tokenizer) -> None:  # noqa: ANN001
    """`"arguments": "{\\"expression\\": ...}"` is a well-formed call for our parser (and runs at evaluation), but TRL's
    response parser kept the string and its tool loop called `tool(**string)`: an error observation instead."""
    import copy

    from trl.trainer.grpo_trainer import parse_response

    from toolschool.tools.registry import build_registry
    from toolschool.train.rl import _set_response_parser, tool_callable

    tok = copy.deepcopy(tokenizer)
    _set_response_parser(tok)
    registry = build_registry(only=["calculator"])
    try:
        tools = [tool_callable(registry.get("calculator"))]
        prefix = tok.apply_chat_template(
            [{"role": "user", "content": "What is 1234*5678?"}],
            tools=tools,
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
        text = '<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1234*5678\\"}"}\n</tool_call>'
        ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        call = parse_response(tok, ids, prefix=prefix, tools=tools)["tool_calls"][0]["function"]
        assert call["arguments"] == {"expression": "1234*5678"}
        assert "7006652" in tools[0](**call["arguments"])  # what TRL's tool loop does with it
    finally:
        registry.close()


def test_training_arguments_raise_no_deprecation_warning(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """`rl.gradient_checkpointing` reaches transformers under its current name (`activation_checkpointing`): the
    old keyword printed a FutureWarning at the start of every RL run."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_rl(rl_config(tiny_model_dir, train_file, num_steps=1, merge=False), tmp_path / "rl", progress=False)
    assert not [w for w in caught if "`gradient_checkpointing` is deprecated" in str(w.message)]


def test_bf16_rl_trains_on_fp32_weights_through_the_packed_sampler(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`[rl] dtype = "bf16"` (mixed precision): the LoRA base stays fp32, and the packed sampler and KL reference
    passes run under the accelerator's autocast (bf16 activations meeting fp32 oneDNN weights stopped the demo's
    first step); the merged model is fp32."""
    import torch
    from safetensors import safe_open

    train = write_jsonl(tmp_path / "train.jsonl", [calc_example(12, 34), calc_example(5, 6)])
    result = train_rl(rl_config(tiny_model_dir, train, num_steps=1, dtype="bf16"), tmp_path / "rl", progress=False)
    assert result.steps == 1 and result.precision == "bf16"
    with safe_open(str(result.merged_dir / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.float32}
