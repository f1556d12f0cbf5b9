from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cleaner.tiny.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def chatml_tokenizer():
    """A real byte-level BPE tokenizer with the embedded ChatML tool template, built locally."""
    corpus = [
        "Let me compute it with Python. print(x) def f(n): return n * 2 import math sympy numpy",
        'The answer is \\boxed{3}. {"name": "code_interpreter", "arguments": {"code": "print(1)"}}',
        "NameError: name 'x' is not defined Traceback line 1 ZeroDivisionError: division by zero",
    ] * 20
    return build_tokenizer(corpus, vocab_size=512)


@pytest.fixture(scope="session")
def random_policy(tmp_path_factory):
    """A randomly initialised Qwen3-architecture model with a real tokenizer and tool chat template,
    saved like any transformers model. It writes nonsense, but nonsense of varying length, so the
    overlong shaping gives its groups different rewards and GRPO has something to push on."""
    path = tmp_path_factory.mktemp("random-policy")
    tok = build_tokenizer(
        ["Find the GCD of 12 and 18. print(math.gcd(12, 18)) The answer is \\boxed{6}."] * 50,
        vocab_size=400,
    )
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
