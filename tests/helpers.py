"""Test data shared by several test files (imported as `helpers`; tests/ is on sys.path under pytest)."""

from __future__ import annotations

from pathlib import Path

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def save_tiny_llama(out: Path, tokenizer_dir: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A randomly initialised Llama with the real SmolLM2 tokenizer, saved like any Hugging Face model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4 if hidden >= 64 else 2,
        num_key_value_heads=2 if hidden >= 64 else 1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out
