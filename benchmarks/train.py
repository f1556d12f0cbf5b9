"""Training throughput: padding-free packed micro-batches against padded batches, same run.

Mixed lengths as in multi-turn RL (a long prompt, responses from a few tokens to the budget). Each
layout runs forward + backward over the same sequences with the same token budget per micro-batch;
throughput counts real tokens only. The baseline is padded batches in arrival order (what a simple
trainer does); padded batches sorted by length are shown too, as the strongest padded layout.

    python benchmarks/train.py [--sequences 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cleaner.train.packing import TrainSequence, forward_logprobs, pack, pad


def mixed_sequences(n: int, seed: int = 0, vocab: int = 2048) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.randint(150, 250)
        response = int(
            min(1000, rng.expovariate(1 / 200)) + 8
        )  # most short, a tail near the budget
        n_tok = prompt + response
        out.append(
            TrainSequence(
                [rng.randrange(1, vocab) for _ in range(n_tok)],
                [0] * prompt + [1] * response,
                [0] * n_tok,
                [0.0] * n_tok,
                advantage=rng.choice([-1.0, 1.0]),
            )
        )
    return out


def run(model, batches) -> float:
    start = time.perf_counter()
    for mb in batches:
        logprobs, _ = forward_logprobs(model, mb)
        (-(logprobs * mb.loss_mask).sum()).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens-per-batch", type=int, default=8192)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = Qwen3Config(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
    )
    model = Qwen3ForCausalLM(config)
    seqs = mixed_sequences(args.sequences)
    real = sum(len(s) for s in seqs)
    longest = max(len(s) for s in seqs)
    per_padded = max(1, args.tokens_per_batch // longest)
    layouts = {
        "padded, arrival order (baseline)": pad(seqs, per_padded),
        "padded, sorted by length": pad(sorted(seqs, key=len), per_padded),
        "packed (cleaner)": pack(seqs, args.tokens_per_batch),
    }
    print(
        f"{len(seqs)} sequences, {real} real tokens, longest {longest}; {model.num_parameters() / 1e6:.1f}M "
        f"parameters; {torch.get_num_threads()} threads"
    )
    for batches in layouts.values():
        run(model, batches[:1])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(args.repeats):  # interleaved, so a busy moment of the machine hits every layout
        for name, batches in layouts.items():
            times[name].append(run(model, batches))
    results = {}
    for name, batches in layouts.items():
        computed = sum(mb.tokens for mb in batches)
        results[name] = real / statistics.median(times[name])
        print(
            f"  {name:34s} {len(batches):3d} micro-batches  {computed:7d} tokens computed "
            f"({100 * (computed - real) / computed:4.1f}% padding)  {results[name]:8.0f} real tokens/s"
        )
    base = results["padded, arrival order (baseline)"]
    for name, value in results.items():
        print(f"  ratio {name:34s} {value / base:.2f}x")


if __name__ == "__main__":
    main()
