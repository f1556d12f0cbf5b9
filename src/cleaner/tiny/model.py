"""The embedded default model: a tiny Qwen3 built from a config, saved and loaded exactly as Qwen3-4B is
(`AutoModelForCausalLM.from_pretrained(path)`, `AutoTokenizer.from_pretrained(path)` with its chat
template), so every code path that serves the tiny model serves the real one."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)


@dataclass(frozen=True)
class ModelShape:
    """The few numbers that size the tiny model (the rest are Qwen3's defaults)."""

    hidden_size: int = 128
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    head_dim: int | None = None
    """None: hidden_size // heads."""
    max_positions: int = 4096

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def tiny_config(tokenizer: PreTrainedTokenizerBase, shape: ModelShape | None = None) -> Qwen3Config:
    """A Qwen3 config sized by `shape`, with the tokenizer's vocabulary and special tokens."""
    shape = shape or ModelShape()
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim or shape.hidden_size // shape.heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,  # most of a tiny model's parameters would be the two embeddings
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_model(
    tokenizer: PreTrainedTokenizerBase, shape: ModelShape | None = None, *, seed: int = 0
) -> Qwen3ForCausalLM:
    """A freshly initialised tiny Qwen3 (deterministic for a seed)."""
    import torch

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(tokenizer, shape))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> Path:
    """Weights as safetensors, config, generation config, tokenizer and chat template."""
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def load_model(path: str | os.PathLike):
    """(model, tokenizer) through the Auto classes: the same code path as any Hub checkpoint."""
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
