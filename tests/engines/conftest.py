from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3(vocab_size: int, seed: int = 0) -> Qwen3ForCausalLM:
    """A random-init Qwen3 with two layers: the real architecture, small enough to run in milliseconds."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    return Qwen3ForCausalLM(config).eval()


def chain_model(vocab_size: int, script: list[int]) -> Qwen3ForCausalLM:
    """A Qwen3 that, after each token of `script`, predicts the token that follows it there.

    Its attention and MLP outputs are zeroed, so the last hidden state is the normalized embedding of
    the last token; those embeddings are orthonormal, and the output layer points each successor's
    row at its predecessor's embedding. A bigram model, run through the full architecture.
    """
    model = tiny_qwen3(vocab_size)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        directions = torch.linalg.qr(torch.randn(hidden, hidden))[0].T
        for i, (token, following) in enumerate(dict(pairwise(script)).items()):
            model.model.embed_tokens.weight[token] = directions[i]
            model.lm_head.weight[following] += 50 * directions[i]
    return model


def reference_logprobs(
    model, context: list[int], generated: list[int], temperature: float = 1.0
) -> list[float]:
    """Log-probs of `generated` after `context` from one plain forward pass over the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([context + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [logprobs[len(context) - 1 + i, t].item() for i, t in enumerate(generated)]


@pytest.fixture
def model(chatml_tokenizer):
    return tiny_qwen3(len(chatml_tokenizer))
