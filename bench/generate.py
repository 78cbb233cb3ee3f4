"""Generation throughput of the local backend vs plain `model.generate`, and batch-1 decode vs the memory bound.

Same run, same model, same greedy settings and the same prompts (a user question with the calculator tool
offered, so every prompt carries the ~190-token tool system prompt):
- `generate_one_at_a_time`: `model.generate` for one prompt after another (what a naive loop does);
- `backend_1_concurrent`: the local backend, one request after another;
- `backend_16_concurrent`: the local backend, 16 requests awaited at once (continuous batching).
Tokens/s counts generated tokens over wall time, prefill included; all three paths run all 16 prompts. The
backend's prefix cache is emptied before each timed backend run, so a repeat cannot reuse the previous
repeat's prompts: within a run, prompts share only what real traffic shares (the system prompt and tool list,
reused by every prompt after the first). Each figure is the median of `--repeats` runs; the load average
before and after says whether anything else ran on the machine meanwhile.

Memory bound: at batch 1 every decode step reads all weights once, so tokens/s <= bandwidth / weight bytes.
Bandwidth is measured here with a large tensor copy (bytes read + written); the ratio says how close batch-1
decode is to the hardware limit (the rest is attention/KV-cache traffic, kernel overheads and Python).

    .venv/bin/python bench/generate.py            # writes bench/results/generate.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import machine  # bench/ is the script's folder, first on sys.path
import torch

from toolschool.engine.local_backend import LocalBackend
from toolschool.models.backend import GenerationRequest, SamplingParams
from toolschool.models.loading import load_model
from toolschool.tools.builtin import builtin_schema

CALC = builtin_schema("calculator")
QUESTIONS = [
    "What is 1234 * 5678?",
    "Write a haiku about the sea.",
    "How many days are there in a leap year?",
    "Explain what a tool call is in one sentence.",
    "What is the square root of 144?",
    "Name three primary colours.",
    "Compute 17 + 25 * 3.",
    "Tell me a short fact about the moon.",
    "What is 2 to the power of 16?",
    "Give me a synonym for happy.",
    "How far is 10 miles in kilometres?",
    "What is the capital of Japan?",
    "Divide 1000 by 8.",
    "Describe a cat in five words.",
    "What is 99 squared?",
    "Suggest a name for a small robot.",
]


def requests(max_tokens: int) -> list[GenerationRequest]:
    return [
        GenerationRequest([{"role": "user", "content": q}], [CALC], SamplingParams(max_tokens=max_tokens))
        for q in QUESTIONS
    ]


def plain_generate(backend: LocalBackend, reqs: list[GenerationRequest]) -> tuple[int, float]:
    model = backend.model
    tokens = 0
    start = time.perf_counter()
    for req in reqs:
        ids = torch.tensor([backend.render_prompt(req)], device=backend.device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=req.params.max_tokens,
                do_sample=False,
                eos_token_id=sorted(backend.stop_token_ids),
                pad_token_id=backend.tokenizer.pad_token_id,
            )
        tokens += out.shape[1] - ids.shape[1]
    return tokens, time.perf_counter() - start


async def backend_sequential(backend: LocalBackend, reqs: list[GenerationRequest]) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = 0
    for req in reqs:
        (c,) = await backend.generate(req)
        tokens += len(c.token_ids)
    return tokens, time.perf_counter() - start


async def backend_concurrent(backend: LocalBackend, reqs: list[GenerationRequest]) -> tuple[int, float]:
    start = time.perf_counter()
    results = await asyncio.gather(*(backend.generate(r) for r in reqs))
    return sum(len(c[0].token_ids) for c in results), time.perf_counter() - start


def memory_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Copy bandwidth (bytes read + written per second), the median of a few large copies."""
    n = mib * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def busy_cpu_seconds() -> float:
    """CPU time all processes spent busy (user, system, irq, steal), from /proc/stat; 0 where it is missing."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequential-prompts", type=int, default=16, help="prompts in the one-at-a-time runs")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "generate.json"))
    args = parser.parse_args()

    loaded = load_model(args.model)
    backend = LocalBackend(loaded, max_batch_size=16)
    reqs = requests(args.max_tokens)
    seq_reqs = reqs[: args.sequential_prompts]
    prompt_tokens = [len(backend.render_prompt(r)) for r in reqs]

    async def run_all() -> dict[str, list[tuple[int, float]]]:
        await backend_sequential(backend, reqs[:1])  # warm-up (first-call allocations)
        await backend_concurrent(backend, reqs)
        plain_generate(backend, reqs[:1])
        runs: dict[str, list[tuple[int, float]]] = {"plain": [], "seq": [], "conc": [], "decode1": []}
        for _ in range(args.repeats):
            runs["plain"].append(plain_generate(backend, seq_reqs))
            before = (backend.stats.decode_tokens, backend.stats.decode_seconds)
            backend.prefix_cache.clear()
            runs["seq"].append(await backend_sequential(backend, seq_reqs))
            runs["decode1"].append((backend.stats.decode_tokens - before[0], backend.stats.decode_seconds - before[1]))
            before_conc = dataclasses.replace(backend.stats)
            backend.prefix_cache.clear()
            runs["conc"].append(await backend_concurrent(backend, reqs))
            split["prefill_s"].append(backend.stats.prefill_seconds - before_conc.prefill_seconds)
            split["decode_s"].append(backend.stats.decode_seconds - before_conc.decode_seconds)
            split["decode_tokens"].append(backend.stats.decode_tokens - before_conc.decode_tokens)
            split["prefill_passes"].append(backend.stats.prefill_passes - before_conc.prefill_passes)
            split["reused_prompt_tokens"].append(backend.stats.reused_prompt_tokens - before_conc.reused_prompt_tokens)
        return runs

    split: dict[str, list[float]] = {
        k: [] for k in ("prefill_s", "decode_s", "decode_tokens", "prefill_passes", "reused_prompt_tokens")
    }
    load_before, busy_before, own_before, wall_before = (
        os.getloadavg(),
        busy_cpu_seconds(),
        own_cpu_seconds(),
        time.time(),
    )
    runs = asyncio.run(run_all())
    load_after, wall = os.getloadavg(), time.time() - wall_before
    others = busy_cpu_seconds() - busy_before - (own_cpu_seconds() - own_before)
    asyncio.run(backend.aclose())

    def rate(samples: list[tuple[int, float]]) -> float:
        return statistics.median(t / s for t, s in samples)

    plain, seq, conc, decode1 = (rate(runs[k]) for k in ("plain", "seq", "conc", "decode1"))
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    bandwidth = memory_bandwidth_gbs()
    bound = bandwidth * 1e9 / weight_bytes
    result = {
        "model": args.model,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": loaded.device,
        "machine": machine.describe(),
        "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "run_wall_s": round(wall, 1),
        "cpu_seconds_used_by_other_processes": round(max(others, 0.0), 1),
        "quiet": others < 0.05 * wall * (os.cpu_count() or 1),
        "torch_threads": torch.get_num_threads(),
        "max_tokens": args.max_tokens,
        "prompt_tokens_median": statistics.median(prompt_tokens),
        "repeats": args.repeats,
        "sequential_prompts": len(seq_reqs),
        "concurrent_prompts": len(reqs),
        "tokens_per_s": {
            "generate_one_at_a_time": round(plain, 2),
            "backend_1_concurrent": round(seq, 2),
            "backend_16_concurrent": round(conc, 2),
        },
        "speedup_16_concurrent_vs_one_at_a_time": round(conc / plain, 2),
        "target_speedup": 8.0,
        "batch1_decode_tokens_per_s": round(decode1, 2),
        "concurrent_16_breakdown_median": {k: round(statistics.median(v), 3) for k, v in split.items()},
        "weight_bytes": weight_bytes,
        "memory_bandwidth_gb_s": round(bandwidth, 2),
        "memory_bound_tokens_per_s": round(bound, 2),
        "batch1_decode_vs_memory_bound": round(decode1 / bound, 3),
        "runs": {k: [[t, round(s, 3)] for t, s in v] for k, v in runs.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
