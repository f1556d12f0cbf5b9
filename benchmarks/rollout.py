"""Rollout generation: the batched `hf` engine against naive per-trajectory `model.generate`.

Two claims, measured in the same run on a random-init Qwen3 shaped like the embedded default model
(the shape is what matters for speed, not the weights) with the embedded ChatML tokenizer:

1. Throughput: N concurrent trajectories through the engine vs one `generate` call per trajectory,
   same prompts, same number of sampled tokens. Target: at least 3x the tokens/s.
2. SAAR prefix reuse: after some tool turns a call fails; the correction is sampled from the context
   with the error, then grafted, and generation continues from the purified context. Tokens the
   engine prefills for each of those requests vs the whole context that a fresh `generate` recomputes.
   Target: under 10% for the correction.
3. The same engine behind `cleaner serve`'s OpenAI API, sampled through `OpenAIEngine` over
   loopback HTTP with streaming (server and client in this process): what the protocol costs
   against calling the engine directly.

    python benchmarks/rollout.py                      # CPU, about a minute
    python benchmarks/rollout.py --threads 1           # steadier on a busy machine
    python benchmarks/rollout.py --device cuda --dtype bfloat16 --layers 12 --hidden 1024
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
import types

import torch

from cleaner.data.prompts import AGENT_NOTE, ANSWER_FORMAT, MATH_INTRO, TOOL_HINT
from cleaner.engines import SamplingParams
from cleaner.engines.hf import HFEngine
from cleaner.engines.remote import OpenAIEngine
from cleaner.engines.server import CompletionServer
from cleaner.formats import get_format
from cleaner.tiny.model import ModelShape, build_model
from cleaner.tiny.tokenizer import build_tokenizer

PROBLEM = (
    "Let $a$ and $b$ be positive integers with $\\gcd(a, b) = 6$ and $\\operatorname{{lcm}}(a, b) = "
    "{n}$. How many ordered pairs $(a, b)$ are there? Write a program that counts them."
)
ERROR = "Traceback line 3\nNameError: name 'divisors' is not defined"
RESULT = "[(6, {n}), (18, {m}), (42, 90)]\n4"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=16, help="concurrent trajectories")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens sampled per turn")
    parser.add_argument("--turns", type=int, default=3, help="tool turns before the failing one")
    parser.add_argument("--layers", type=int, default=ModelShape.layers)
    parser.add_argument("--hidden", type=int, default=ModelShape.hidden_size)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many timings")
    return parser.parse_args()


def build(args):
    corpus = [MATH_INTRO, TOOL_HINT, AGENT_NOTE, ANSWER_FORMAT, PROBLEM, ERROR, RESULT] * 50
    tokenizer = build_tokenizer(corpus, vocab_size=1024)
    heads = max(4, args.hidden // 64)
    shape = ModelShape(
        hidden_size=args.hidden,
        layers=args.layers,
        heads=heads,
        kv_heads=heads // 2,
        intermediate_size=3 * args.hidden,
        max_positions=8192,
    )
    model = build_model(tokenizer, shape).to(args.device, getattr(torch, args.dtype)).eval()
    prompts = []
    for i in range(args.sessions):
        content = (
            MATH_INTRO + PROBLEM.format(n=360 + 6 * i) + TOOL_HINT + AGENT_NOTE + ANSWER_FORMAT
        )
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return tokenizer, model, prompts


class Rates:
    """The best tokens/s seen, by wall clock and per CPU-second of this process."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    @contextlib.contextmanager
    def timing(self):
        timing = types.SimpleNamespace(tokens=0)
        wall, cpu = time.perf_counter(), time.process_time()
        yield timing
        self.wall = max(self.wall, timing.tokens / (time.perf_counter() - wall))
        self.cpu = max(self.cpu, timing.tokens / (time.process_time() - cpu))

    def __str__(self):
        return f"{self.wall:8.1f} wall, {self.cpu:8.1f} CPU"


def naive_generate(model, prompt: list[int], new_tokens: int) -> int:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out.shape[1] - ids.shape[1]


async def engine_generate(engine, prompts: list[list[int]], new_tokens: int, tag: str) -> int:
    params = [SamplingParams(max_new_tokens=new_tokens, seed=i) for i in range(len(prompts))]
    generations = await asyncio.gather(
        *(
            engine.generate(f"{tag}{i}", p, q)
            for i, (p, q) in enumerate(zip(prompts, params, strict=True))
        )
    )
    for i in range(len(prompts)):
        await engine.close(f"{tag}{i}")
    return sum(len(g.token_ids) for g in generations)


async def saar_trajectory(engine, tokenizer, prompt: list[int], i: int, args) -> dict[str, int]:
    """Tool turns, a failing call, its correction, the graft, and one more turn from the result."""
    hermes = get_format("hermes")
    rng = random.Random(i)
    session = f"saar{i}"

    async def generate(context):
        params = SamplingParams(max_new_tokens=args.new_tokens, seed=rng.getrandbits(63))
        return await engine.generate(session, context, params)

    def observation(text):
        return hermes.observation_ids(tokenizer, text.format(n=360 + 6 * i, m=120 + i))

    context = list(prompt)
    for _ in range(args.turns):
        turn = await generate(context)
        context += turn.token_ids + observation(RESULT)
    failed = await generate(context)
    with_error = context + failed.token_ids + observation(ERROR)
    correction = await generate(with_error)
    purified = context + correction.token_ids + observation(RESULT)
    after_graft = await generate(purified)
    await engine.close(session)
    return {
        "correction_context": len(with_error),
        "correction_prefill": correction.prefill_tokens,
        "graft_context": len(purified),
        "graft_prefill": after_graft.prefill_tokens,
    }


async def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer, model, prompts = build(args)
    engine = HFEngine(model, tokenizer, max_batch_size=args.sessions, eos_token_ids=())
    n, new = args.sessions, args.new_tokens
    print(
        f"model: Qwen3 {args.layers} layers, hidden {args.hidden}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{args.device} {args.dtype}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{n} trajectories, prompts of {statistics.mean(map(len, prompts)):.0f} tokens, {new} new"
    )

    # warm-up, so neither side pays first-call costs in the timing
    naive_generate(model, prompts[0], 4)
    await engine_generate(engine, prompts[:2], 4, "warm")

    # Alternating repeats, best of each, so that load from elsewhere hits both sides alike. CPU time
    # (all threads of this process) is printed too: on a shared machine it is the steadier measure.
    naive, engine_best = Rates(), Rates()
    for _ in range(args.repeats):
        with naive.timing() as timing:
            timing.tokens = sum(naive_generate(model, p, new) for p in prompts)
        with engine_best.timing() as timing:
            timing.tokens = await engine_generate(engine, prompts, new, "run")
    print("\n1. throughput (tokens/s; by wall clock, and per CPU-second)")
    print(f"   naive model.generate, one trajectory at a time: {naive}")
    print(f"   HFEngine, {n} concurrent sessions:          {engine_best}")
    print(
        f"   ratio: {engine_best.wall / naive.wall:.1f}x wall clock, "
        f"{engine_best.cpu / naive.cpu:.1f}x CPU time (target >= 3x)"
    )

    start = time.perf_counter()
    runs = await asyncio.gather(
        *(saar_trajectory(engine, tokenizer, p, i, args) for i, p in enumerate(prompts))
    )
    seconds = time.perf_counter() - start

    def mean(key):
        return statistics.mean(r[key] for r in runs)

    correction = mean("correction_prefill") / mean("correction_context")
    graft = mean("graft_prefill") / mean("graft_context")
    print(f"\n2. SAAR prefix reuse ({args.turns} tool turns, then a failed call; {seconds:.1f}s)")
    print(
        f"   correction: prefills {mean('correction_prefill'):.0f} tokens; recomputing the "
        f"history: {mean('correction_context'):.0f} -> {correction:.1%} (target < 10%)"
    )
    print(
        f"   after the graft: prefills {mean('graft_prefill'):.0f} tokens; recomputing: "
        f"{mean('graft_context'):.0f} -> {graft:.1%}"
    )

    from aiohttp.test_utils import TestServer

    server = TestServer(CompletionServer(engine, tokenizer, "bench").app())
    await server.start_server()
    client = OpenAIEngine(str(server.make_url("/")))
    await engine_generate(client, prompts[:2], 4, "warm-remote")
    direct, remote = Rates(), Rates()
    for _ in range(args.repeats):
        with direct.timing() as timing:
            timing.tokens = await engine_generate(engine, prompts, new, "direct")
        with remote.timing() as timing:
            timing.tokens = await engine_generate(client, prompts, new, "remote")
    await client.aclose()
    await server.close()
    print("\n3. over the OpenAI API (loopback HTTP, a streamed chunk per token)")
    print(f"   HFEngine called directly:       {direct}")
    print(f"   OpenAIEngine -> cleaner serve:  {remote}")
    print(f"   ratio: {remote.wall / direct.wall:.2f}x wall clock")


if __name__ == "__main__":
    asyncio.run(main())
