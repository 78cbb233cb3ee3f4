"""GRPO with shared prompts: each distinct prompt of a batch runs forward (and backward) once, not once per sample.

GRPO draws `num_generations` completions of every prompt, so a batch of 8 rows holds 8 / num_generations distinct
prompts, each repeated. TRL scores every row as a full sequence (prompt + completion) in each log-prob pass: the
policy pass with gradients and the reference pass for the KL. Tool-use prompts are long (the system prompt lists
the tools' JSON schemas: ~250-700 tokens) and completions short (<= 128), so on a CPU most of a step is the same
prompt computed again and again.

`SharedPromptGRPOTrainer` overrides TRL's `_get_per_token_logps_and_entropies` for text-only batches: rows are
grouped by their prompt tokens, each distinct prompt (minus its last token) runs once through
`toolschool.engine.shared_prefix` (its keys/values gathered for the rows sharing it, gradients summed into the one
computation), and each row's last prompt token + completion runs on top. The log-probs (and entropies) of the
completion tokens come from TRL's own chunked log-prob kernel (`trl.kernels.ChunkedLogProbFunction`) with the
temperature and soft-capping TRL's fused LM head applies, and only on completion positions: TRL's fused head on a
CPU projects every position of the sequence, the prompt included, through the 49k-token vocabulary.

Positions: TRL's forward passes only the attention mask, so a left-padded prompt's tokens sit at positions
`pad..L-1`; generation (and `shared_prefix`) number real tokens from 0, as each sequence would be alone. We use
the real-token positions: they are what the completion was sampled with. For rotary-position models (Llama,
SmolLM2, Qwen) attention depends only on relative positions, so the two agree up to float rounding; the tests
compare against TRL on unpadded prompts (identical positions) and against each full sequence run alone.

Sampling: generation prefills each distinct prompt once and hands its cache to the prompt's samples. On a CPU
(fp32) it reads the policy through `packed_view`: an eval-mode clone whose LoRA layers are folded into one
oneDNN-prepacked weight `W + scaling * B @ A`, refolded after every optimizer step, so the samples come from the
current weights without PEFT's dropout and per-layer adapter matmuls — what TRL's vLLM path does by merging the
adapter into the engine each step. The KL reference pass (adapters disabled, no gradients) reads the same view,
which then folds nothing. Its KV cache decodes into preallocated buffers (`kv_buffer.BufferedLayer`, as
the local backend does) instead of copying the whole cache every token. Sampled tokens are TRL's (same sampler,
stops and EOS masking).

Anything else (images, MoE auxiliary losses, gradient checkpointing, models with extra logit scaling, a one-token
prompt) takes TRL's original path unchanged.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch
from trl import GRPOTrainer

from toolschool.engine.kv_buffer import BufferedLayer
from toolschool.engine.packed_weights import packed_view, packing_available
from toolschool.engine.shared_prefix import decoder_and_head, group_by_prefix, shared_prefix_hidden_states

# Config fields by which some architectures rescale logits before the softmax (TRL's fused head reads them);
# a model with any of them set keeps TRL's path rather than a second copy of that logic here.
_LOGIT_SCALING_FIELDS = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
_VOCAB_CHUNK = 32768  # TRL's _CHUNKED_LOGPROB_CHUNK_SIZE: vocabulary columns per projection tile


def supports_shared_prompts(model: Any) -> bool:
    """Whether the shared-prompt path computes exactly what TRL's fused LM head would for this model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(base, "get_decoder") or not hasattr(base, "config"):  # e.g. wrapped for distributed training
        return False
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if any(getattr(config, name, None) is not None for name in _LOGIT_SCALING_FIELDS):
        return False
    if getattr(config, "output_router_logits", False):
        return False
    checkpointing = getattr(type(base), "is_activation_checkpointing", None)
    return not (checkpointing is not None and base.is_activation_checkpointing)


def shared_prompt_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    cast_lm_head_to_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token log-probs [B, C] (and entropies) of the last `logits_to_keep` tokens, prompts computed once each.

    `input_ids`/`attention_mask` [B, P + C] are TRL's layout: left-padded prompts, then right-padded completions
    (C = `logits_to_keep`). Masked completion positions get 0, as in TRL. Returns None when a prompt has fewer
    than two real tokens (nothing to share; the caller uses TRL's path).
    """
    prompt_len = input_ids.size(1) - logits_to_keep
    prompt_ids, prompt_mask = input_ids[:, :prompt_len], attention_mask[:, :prompt_len].bool()
    completion_ids, completion_mask = input_ids[:, prompt_len:], attention_mask[:, prompt_len:]
    prompts = [row[mask] for row, mask in zip(prompt_ids, prompt_mask, strict=True)]
    if any(p.numel() < 2 for p in prompts):
        return None
    # Each prefix ends one token early: the suffix starts with the prompt's last token, whose hidden state
    # predicts the first completion token.
    keys, owner = group_by_prefix([tuple(p[:-1].tolist()) for p in prompts])
    prefixes = [torch.tensor(k, dtype=input_ids.dtype, device=input_ids.device) for k in keys]
    last = torch.stack([p[-1] for p in prompts])[:, None]
    suffix_ids = torch.cat([last, completion_ids], dim=1)
    suffix_mask = torch.cat([torch.ones_like(last), completion_mask.to(last.dtype)], dim=1)
    hidden = shared_prefix_hidden_states(model, prefixes, owner, suffix_ids, suffix_mask)[:, :-1]

    _, head = decoder_and_head(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scored = completion_mask.bool()
    rows = hidden[scored].to(head.weight.device)
    targets = completion_ids[scored].to(head.weight.device)
    context = nullcontext()
    if cast_lm_head_to_fp32:
        rows = rows.float()
        context = torch.autocast(rows.device.type, enabled=False)
    from trl.kernels import ChunkedLogProbFunction

    outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
    with context:
        logps, entropy, *_ = ChunkedLogProbFunction.apply(
            rows, head.weight, head.bias, targets, temperature, _VOCAB_CHUNK, softcap, 1.0, outputs
        )
    # masked_scatter keeps the result connected to the graph even when no position is scored
    full_logps = logps.new_zeros(scored.shape).masked_scatter(scored, logps)
    full_entropy = entropy.new_zeros(scored.shape).masked_scatter(scored, entropy) if compute_entropy else None
    return full_logps, full_entropy


class SharedPromptGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer, with each distinct prompt of a batch computed once per log-prob pass (see module doc).

    `share_prompts = False` restores TRL's method exactly (the benchmark times both in one run).
    """

    share_prompts: bool = True
    _sampler_view: tuple[Any, Any] | None = None  # (model, its packed inference view)

    def _time(self, name: str, seconds: float) -> None:
        """Where a step's time goes (logged as time/<name>, seconds per step): the benchmark's breakdown."""
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics[f"time/{name}"].append(seconds)

    def _generate_single_turn(
        self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int, has_tool_images: bool = False
    ) -> Any:
        started = time.perf_counter()
        plain = (
            self.share_prompts
            and not self.use_vllm
            and not self.use_transformers_continuous_batching
            and images is None
            and not multimodal_fields
            and min(len(ids) for ids in prompt_ids) >= 2
            and len({tuple(ids) for ids in prompt_ids}) < len(prompt_ids)
        )
        if plain:
            out = self._generate_shared_prefill(prompt_ids)
        else:
            out = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        self._time("generation", time.perf_counter() - started)
        return out

    def _sampler(self, model: Any) -> Any:
        """The policy as generation reads it: on a CPU in fp32, the packed eval-mode view (see module doc)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if not packing_available(base):
            return model
        if self._sampler_view is None or self._sampler_view[0] is not base:
            self._sampler_view = (base, packed_view(base))
        return self._sampler_view[1]

    def _generate_shared_prefill(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], None]:
        """TRL's transformers generation, with each distinct prompt prefilled once and its cache given to its rows.

        The prompts are left-padded as TRL pads them; all but the last prompt token of each distinct prompt run
        once, the cache is gathered for the rows, and `generate` continues from it (it only computes the tokens
        the cache lacks). Sampling, stopping and the EOS masking are TRL's.
        """
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
        from trl.models import unwrap_model_for_generation
        from trl.trainer.utils import pad

        device = self.accelerator.device
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        padded = pad(
            tensors,
            padding_value=self._tokenizer.pad_token_id,
            padding_side="left",
            pad_to_multiple_of=self.pad_to_multiple_of,
        ).to(device)
        mask = pad(
            [torch.ones_like(t) for t in tensors],
            padding_value=0,
            padding_side="left",
            pad_to_multiple_of=self.pad_to_multiple_of,
        ).to(device)
        _, owner = group_by_prefix([tuple(ids) for ids in prompt_ids])
        first = torch.tensor([owner.index(i) for i in range(max(owner) + 1)], device=device)
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            sampler = self._sampler(unwrapped)
            head_ids, head_mask = padded[first, :-1], mask[first, :-1]
            cache = DynamicCache(config=sampler.config)
            if all(type(layer) is DynamicLayer for layer in cache.layers):  # decode in place, no per-step copy
                cache.layers = [BufferedLayer() for _ in cache.layers]
            sampler(
                input_ids=head_ids,
                attention_mask=head_mask,
                position_ids=(head_mask.long().cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache.reorder_cache(torch.tensor(owner, device=device))
            generated = sampler.generate(
                input_ids=padded, attention_mask=mask, past_key_values=cache, generation_config=self.generation_config
            )
        completion_ids = generated[:, padded.size(1) :]
        # TRL's masking: keep each completion up to and including its first EOS
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=device))
        eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long, device=device)
        eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
        keep = torch.arange(is_eos.size(1), device=device)[None] <= eos_idx[:, None]
        return [c[m].tolist() for c, m in zip(completion_ids.cpu(), keep.cpu(), strict=True)], None

    def _get_per_token_logps_and_entropies(  # type: ignore[override]
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        started = time.perf_counter()
        out = self._logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            compute_entropy,
            compute_aux_loss,
            **multimodal,
        )
        # policy: the loss's forward (with gradients); no_grad: the reference (KL) or old-policy pass
        self._time("policy_forward" if torch.is_grad_enabled() else "no_grad_forward", time.perf_counter() - started)
        return out

    def _logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
        compute_aux_loss: bool,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        text_only = all(value is None for value in multimodal.values())
        if self.share_prompts and not torch.is_grad_enabled() and _adapters_disabled(model):
            # The KL reference pass: the base model alone, in inference — the sampler's packed view computes it
            # (its LoRA layers fold nothing while PEFT has them disabled).
            model = self._sampler(self.accelerator.unwrap_model(model))
        if self.share_prompts and text_only and not compute_aux_loss and supports_shared_prompts(model):
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):  # TRL's row chunks bound the memory peak
                end = min(start + batch_size, input_ids.size(0))
                with self.accelerator.autocast():
                    out = shared_prompt_logps(
                        model,
                        input_ids[start:end],
                        attention_mask[start:end],
                        logits_to_keep,
                        temperature=self.temperature,
                        compute_entropy=compute_entropy,
                        cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                    )
                if out is None:
                    break
                logps.append(out[0])
                entropies.append(out[1])
            else:
                return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None  # type: ignore[arg-type]
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **multimodal,
        )


def _adapters_disabled(model: Any) -> bool:
    """Whether `model` is a PEFT LoRA model whose adapters are all switched off (`disable_adapter()`)."""
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "disable_adapters")]
    return bool(layers) and all(m.disable_adapters for m in layers)


__all__ = ["SharedPromptGRPOTrainer", "shared_prompt_logps", "supports_shared_prompts"]
