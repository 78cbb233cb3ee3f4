"""Shared-prefix batching for SFT: run each batch's common system prompt (tool schemas) once, not once per row.

Tool-use examples of one tool set all begin with the same rendered system block (the system prompt and the
tools' JSON schemas, ~350 tokens for calculator + python) followed by a ~50-150-token conversation. A padded
or padding-free batch runs that block forward and backward for every row; on a compute-bound CPU that is most
of the training time. Here:

- `prefix_length` finds, per example, the tokens of its leading system block (checked to be a token prefix of
  the full rendering and to end before the first learned token, so no label moves or disappears);
- `PrefixGroupedSampler` orders the examples so that each batch holds examples sharing a prefix, shuffled
  within and across groups as a function of seed + epoch only (so `--resume`, which skips the batches already
  seen, continues with the same data);
- `SharedPrefixCollator` emits the distinct prefixes, right-padded suffixes and next-token targets;
- `shared_prefix_trainer` subclasses TRL's SFTTrainer (logging, checkpointing, callbacks unchanged): its
  `compute_loss` runs `shared_prefix_hidden_states` (exact loss and gradients, see
  `toolschool.engine.shared_prefix`), applies the LM head only at positions with a target (no vocabulary
  projection for prompt tokens), and normalises like TRL: summed token losses / `num_items_in_batch` under
  gradient accumulation, else / the batch's label count. It logs `tokens_run` (prefix once per batch +
  suffixes) next to `tokens_represented` (full rows).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from toolschool.engine.shared_prefix import decoder_and_head, group_by_prefix, shared_prefix_hidden_states
from toolschool.errors import DataError

BATCHING_MODES = ("shared_prefix", "padding_free", "padded")
_PROBES = ("A", "B")


class PrefixFinder:
    """Token length of an example's rendered leading system block; the block's rendering is cached per tool set."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def system_block(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Tokens the chat template writes before the first non-system message (system text + tool schemas).

        Rendered as the common token prefix of the leading system messages followed by two different one-word
        user messages, which works whether the template writes a default system prompt or not.
        """
        lead = []
        for message in messages:
            if message.get("role") != "system":
                break
            lead.append(message)
        key = json.dumps([lead, tools], sort_keys=True, default=str)
        if key not in self._cache:
            renders = []
            for probe in _PROBES:
                text = self.tokenizer.apply_chat_template(
                    [*lead, {"role": "user", "content": probe}], tools=tools or None, tokenize=False
                )
                renders.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            self._cache[key] = renders[0][: common_prefix_length(renders[0], renders[1])]
        return self._cache[key]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_length(ids: Sequence[int], labels: Sequence[int], block: Sequence[int]) -> int:
    """How many leading tokens of `ids` may be shared: the part of `block` that `ids` really starts with, ending
    before the position that predicts the first label (that position's hidden state must come from the suffix).
    0 when the first learned token is at position 0 or 1: nothing can be shared (only shared-prefix batching
    needs a prefix, and `check_prefixes_shareable` refuses such rows for it).
    """
    first_label = next(i for i, lab in enumerate(labels) if lab != -100)
    if first_label < 2:
        return 0
    return max(1, min(common_prefix_length(ids, block), first_label - 1))


def check_prefixes_shareable(rows: Sequence[dict[str, Any]]) -> None:
    """Shared-prefix batching runs every row's prefix once per batch: a row without one cannot be batched so."""
    unshareable = sum(1 for row in rows if row["prefix_length"] == 0)
    if unshareable:
        raise DataError(
            f"{unshareable} training example(s) have a learned token at position 1 (the chat template writes no "
            "role header before the reply), so sft.batching = 'shared_prefix' has no prompt token to share",
            hint="train them with --batching padding_free (sft.batching = 'padding_free')",
        )


class PrefixGroupedSampler(torch.utils.data.Sampler[int]):
    """Example order in which each run of `batch_size` indices shares one prefix, as far as group sizes allow.

    Per epoch: shuffle each group, cut it into full batches, shuffle those batches across groups; the groups'
    leftovers (fewer than a batch each) are shuffled together and come last (mixed batches stay correct, they
    just share less). Deterministic in (seed, epoch), so a resumed run sees the same order and skips exactly
    the batches it already trained on. Under `accelerate`, each process takes whole batches of this order.

    With `lengths` (each example's suffix length: what runs right-padded after the shared prefix), a shuffled
    group is cut into mega-batches of 50 batches that are sorted by length before being cut into batches (the HF
    Trainer's `group_by_length` rule, without its "at least 4 mega-batches" clause: on 300 examples that clause
    leaves 16% of the padded suffix tokens padding instead of 4%, and padding is what a CPU step wastes most),
    so a batch's suffixes are of similar length. Batch order stays random.
    """

    def __init__(self, keys: Sequence[Any], batch_size: int, seed: int, lengths: Sequence[int] | None = None) -> None:
        if lengths is not None and len(lengths) != len(keys):
            raise ValueError(f"{len(lengths)} lengths for {len(keys)} examples")
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.lengths = list(lengths) if lengths is not None else None
        groups: dict[Any, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key, []).append(index)
        self.groups = list(groups.values())
        self.num_examples = len(keys)

    def _length_grouped(self, members: list[int]) -> list[int]:
        if self.lengths is None:
            return members
        lengths = self.lengths
        mega = 50 * self.batch_size
        out: list[int] = []
        for start in range(0, len(members), mega):
            out.extend(sorted(members[start : start + mega], key=lambda i: lengths[i], reverse=True))
        return out

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{epoch}")
        batches: list[list[int]] = []
        leftovers: list[int] = []
        for group in self.groups:
            members = list(group)
            rng.shuffle(members)
            members = self._length_grouped(members)
            full = len(members) - len(members) % self.batch_size
            batches.extend(members[i : i + self.batch_size] for i in range(0, full, self.batch_size))
            leftovers.extend(members[full:])
        rng.shuffle(batches)
        rng.shuffle(leftovers)
        return [i for batch in batches for i in batch] + leftovers

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch))

    def __len__(self) -> int:
        return self.num_examples


class SharedPrefixCollator:
    """Rows {input_ids, labels, prefix_length} -> distinct prefixes, right-padded suffixes, next-token targets.

    `labels` (and `shift_labels`, which the HF Trainer counts for `num_items_in_batch`) are already shifted:
    `labels[b, j]` is the target predicted from suffix position j, i.e. the full row's label at prefix + j + 1.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        keys = [tuple(f["input_ids"][: f["prefix_length"]]) for f in features]
        distinct, owner = group_by_prefix(keys)
        longest_prefix = max(len(k) for k in distinct)
        prefix_ids = torch.full((len(distinct), longest_prefix), self.pad_token_id, dtype=torch.long)
        for row, key in enumerate(distinct):
            prefix_ids[row, : len(key)] = torch.tensor(key)
        suffixes = [list(f["input_ids"][f["prefix_length"] :]) for f in features]
        targets = [list(f["labels"][f["prefix_length"] + 1 :]) + [-100] for f in features]
        width = max(len(s) for s in suffixes)
        input_ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(features), width), dtype=torch.long)
        labels = torch.full((len(features), width), -100, dtype=torch.long)
        for row, (suffix, target) in enumerate(zip(suffixes, targets, strict=True)):
            input_ids[row, : len(suffix)] = torch.tensor(suffix)
            attention[row, : len(suffix)] = 1
            labels[row, : len(target)] = torch.tensor(target)
        return {
            "prefix_ids": prefix_ids,
            "prefix_lengths": torch.tensor([len(k) for k in distinct]),
            "owner": torch.tensor(owner),
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": labels,
            "shift_labels": labels,
            "tokens_represented": torch.tensor(sum(len(f["input_ids"]) for f in features)),
        }


def shared_prefix_loss_sum(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies over the batch's targets, number of targets) for a collated batch."""
    lengths = inputs["prefix_lengths"].tolist()
    prefixes = [inputs["prefix_ids"][row, :n] for row, n in enumerate(lengths)]
    hidden = shared_prefix_hidden_states(
        model, prefixes, inputs["owner"].tolist(), inputs["input_ids"], inputs["attention_mask"]
    )
    labels = inputs["labels"]
    keep = labels != -100
    _, head = decoder_and_head(model)
    logits = head(hidden[keep]).float()  # the vocabulary projection only where a token is learned
    loss_sum = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum")
    return loss_sum, keep.sum()


@contextmanager
def _forward_replaced(module: Any, forward: Callable[..., Any]) -> Iterator[None]:
    """Make `module(...)` call `forward` for one step, so a DistributedDataParallel wrapper around it still runs
    its own forward (which arms the gradient all-reduce) while the computation is ours."""
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del module.forward
        else:
            module.forward = previous


TOKEN_COUNTS_FILE = "toolschool_tokens.json"
_TOKEN_COUNTERS = ("_total_train_tokens", "_tokens_run", "_tokens_represented", "_tokens_computed")


def with_resumable_token_counts(trainer_class: type) -> type:
    """`trainer_class` whose running token totals (TRL's `num_tokens`, our `tokens_*`) are saved in each
    checkpoint and restored on resume.

    The HF Trainer restores optimizer, scheduler, RNG and step, but these totals live on the trainer object, so
    a resumed run would log them from zero again: `num_tokens` at step 10 would be the tokens since step 8.
    """
    import os

    class ResumableTokenCounts(trainer_class):  # type: ignore[misc, valid-type]
        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                counts = {name: getattr(self, name) for name in _TOKEN_COUNTERS if hasattr(self, name)}
                with open(os.path.join(folder, TOKEN_COUNTS_FILE), "w", encoding="utf-8") as handle:
                    json.dump(counts, handle)

        def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(resume_from_checkpoint, str):
                path = os.path.join(resume_from_checkpoint, TOKEN_COUNTS_FILE)
                if os.path.isfile(path):
                    with open(path, encoding="utf-8") as handle:
                        for name, value in json.load(handle).items():
                            if name in _TOKEN_COUNTERS:
                                setattr(self, name, value)
            return super().train(resume_from_checkpoint, *args, **kwargs)

    ResumableTokenCounts.__name__ = ResumableTokenCounts.__qualname__ = trainer_class.__name__
    return ResumableTokenCounts


def shared_prefix_trainer(keys: Sequence[Any], lengths: Sequence[int] | None = None) -> type:
    """TRL's SFTTrainer with the prefix-grouped sampler and the shared-prefix loss (`keys`: each row's prefix;
    `lengths`: each row's suffix length, to batch similar lengths together; None keeps a plain shuffle)."""
    from trl import SFTTrainer

    class SharedPrefixSFTTrainer(SFTTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._tokens_run = 0
            self._tokens_represented = 0
            self._tokens_computed = 0

        def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler[int]:
            return PrefixGroupedSampler(keys, self.args.per_device_train_batch_size, self.args.seed, lengths)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
            target = self.accelerator.unwrap_model(model)
            represented = int(inputs.pop("tokens_represented"))
            inputs.pop("shift_labels", None)
            # Accelerate's mixed precision (bf16=True) wraps the model's own forward in autocast; ours replaces
            # that forward for the step, so it runs in the accelerator's autocast itself.
            step = lambda **batch: shared_prefix_loss_sum(target, batch)  # noqa: E731
            with self.accelerator.autocast(), _forward_replaced(target, step):
                loss_sum, count = model(**inputs)
            if num_items_in_batch is None:
                loss = loss_sum / count.clamp(min=1)
            else:
                loss = loss_sum / torch.as_tensor(num_items_in_batch).clamp(min=1)
                if self.args.average_tokens_across_devices:
                    loss = loss * self.accelerator.num_processes
            if model.training:
                prefix = int(inputs["prefix_lengths"].sum())
                mask = inputs["attention_mask"]
                # prefix once + real suffix tokens, the rows' full lengths, prefix + padded suffixes; summed over
                # processes (every process runs this each micro-batch), as TRL counts its num_tokens
                counts = torch.tensor(
                    [prefix + int(mask.sum()), represented, prefix + mask.numel()], device=mask.device
                )
                run, represented_all, computed = (int(v) for v in self.accelerator.gather(counts).view(-1, 3).sum(0))
                self._tokens_run += run
                self._tokens_represented += represented_all
                self._tokens_computed += computed
                self._metrics["train"]["tokens_run"] = [self._tokens_run]
                self._metrics["train"]["tokens_represented"] = [self._tokens_represented]
                self._metrics["train"]["tokens_computed"] = [self._tokens_computed]
                self._metrics["train"]["num_tokens"] = [self._tokens_represented]
            if return_outputs:
                return loss, {"loss": loss}
            return loss

    return SharedPrefixSFTTrainer


__all__ = [
    "BATCHING_MODES",
    "PrefixFinder",
    "PrefixGroupedSampler",
    "SharedPrefixCollator",
    "TOKEN_COUNTS_FILE",
    "common_prefix_length",
    "prefix_length",
    "shared_prefix_loss_sum",
    "shared_prefix_trainer",
    "with_resumable_token_counts",
]
