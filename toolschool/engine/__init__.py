"""The CPU speed engine: what makes generation and training fast on a few CPU cores.

Each piece gives what the plain path (HF `generate`, TRL's trainers) gives, up to float rounding, only faster; the
tests compare the two. The stages reach it through `make_backend` and the TRL trainer subclasses below.

Generation:
- `local_backend` — continuous batching of concurrent requests in one worker thread, with a prefix cache;
- `kv_buffer` — a KV cache written in place into preallocated buffers;
- `packed_weights` — a view of a model whose linear layers use oneDNN-prepacked weights (LoRA folded in);
- `cascade_attention` — rows sharing a prompt prefix read its keys once, as one query block;
- `sampling` — per-row greedy or seeded sampling, log-probs under the raw distribution;
- `openmp` — give back a thread's idle OpenMP workers, so two threads of torch work do not slow each other;
- `backends` — `make_backend`: a model name to the local backend or the OpenAI-compatible HTTP one.

Training:
- `shared_prefix` — run a prefix many sequences share once, gradients included;
- `shared_prefix_sft` — SFT batches grouped by their system block, on TRL's SFTTrainer;
- `shared_prompt_grpo` — GRPO scoring each distinct prompt once, a TRL GRPOTrainer subclass.

Dependencies: `toolschool.models` (interface, loading, grammar, device), `toolschool.errors`, torch,
transformers, PEFT and TRL; nothing in `toolschool.models`, `toolschool.chat` or `toolschool.tools` imports it.
"""
