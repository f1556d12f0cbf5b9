"""The transformers engine against plain forward passes of the same model: the batched cache, prefix
reuse and rollback must change nothing in what the model computes."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from cleaner.engines import SamplingParams
from cleaner.engines.hf import HFEngine, _truncate
from cleaner.engines.text import TextStream
from cleaner.formats import get_format
from tests.engines.conftest import chain_model, reference_logprobs

TOLERANCE = 1e-5


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]  # clear of the special tokens


def assert_matches_reference(model, context, generation, temperature=1.0):
    expected = reference_logprobs(model, context, generation.token_ids, temperature)
    assert generation.logprobs == pytest.approx(expected, abs=TOLERANCE)


async def test_one_session_matches_a_full_forward_pass(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(0), 20, len(chatml_tokenizer))
    for temperature in (1.0, 0.7):
        params = SamplingParams(temperature=temperature, max_new_tokens=16, seed=3)
        generation = await engine.generate(f"t{temperature}", context, params)
        assert len(generation.token_ids) == 16
        assert_matches_reference(model, context, generation, temperature)
        assert (generation.cached_tokens, generation.prefill_tokens) == (0, len(context))


@pytest.mark.parametrize(
    "attention, prefill_chunk",
    [("sdpa", 2048), ("sdpa", 4), ("eager", 2048)],  # 4: prompts are prefilled in pieces
)
async def test_batched_sessions_of_different_lengths_match_full_forward_passes(
    model, chatml_tokenizer, attention, prefill_chunk
):
    model.set_attn_implementation(attention)
    engine = HFEngine(model, chatml_tokenizer, prefill_chunk=prefill_chunk)
    rng = random.Random(1)
    contexts = [random_ids(rng, n, len(chatml_tokenizer)) for n in (3, 40, 11, 25)]
    # 100 new tokens: that row outgrows the cache's spare capacity
    params = [SamplingParams(max_new_tokens=n, seed=i) for i, n in enumerate((12, 5, 100, 9))]
    generations = await asyncio.gather(
        *(
            engine.generate(f"s{i}", c, p)
            for i, (c, p) in enumerate(zip(contexts, params, strict=True))
        )
    )
    for context, p, generation in zip(contexts, params, generations, strict=True):
        assert len(generation.token_ids) == p.max_new_tokens
        assert_matches_reference(model, context, generation)


async def test_a_correction_prefills_only_the_error_and_a_graft_recomputes_after_the_divergence(
    model, chatml_tokenizer
):
    """SAAR: the correction reuses the whole history; after the graft the context diverges where the
    failed call was, so the correction's tokens (computed with the error in view) are recomputed."""
    engine = HFEngine(model, chatml_tokenizer)
    rng = random.Random(2)
    vocab = len(chatml_tokenizer)
    prompt, error, result = (random_ids(rng, n, vocab) for n in (30, 7, 5))
    params = SamplingParams(max_new_tokens=10, seed=5)

    failed = await engine.generate("traj", prompt, params)
    with_error = prompt + failed.token_ids + error
    correction = await engine.generate("traj", with_error, params)
    # the failed call's last token was sampled but never run through the model
    assert correction.cached_tokens == len(prompt) + len(failed.token_ids) - 1
    assert correction.prefill_tokens == len(error) + 1
    assert_matches_reference(model, with_error, correction)

    purified = prompt + correction.token_ids + result
    after_graft = await engine.generate("traj", purified, params)
    assert after_graft.cached_tokens == len(prompt) + _common_prefix(
        failed.token_ids, correction.token_ids
    )
    assert_matches_reference(model, purified, after_graft)


@pytest.mark.parametrize("prefill_chunk", [2048, 3])
async def test_rollbacks_of_sessions_admitted_together_match_full_forward_passes(
    model, chatml_tokenizer, prefill_chunk
):
    """Two parked sessions come back in one step with suffixes of different lengths: the shorter
    suffix leaves padding columns between the session's reused prefix and its new tokens."""
    engine = HFEngine(model, chatml_tokenizer, prefill_chunk=prefill_chunk)
    rng = random.Random(3)
    vocab = len(chatml_tokenizer)
    first = [random_ids(rng, n, vocab) for n in (18, 9)]
    params = SamplingParams(max_new_tokens=6, seed=7)
    await asyncio.gather(*(engine.generate(f"s{i}", c, params) for i, c in enumerate(first)))
    second = [first[0][:12] + random_ids(rng, 1, vocab), first[1][:4] + random_ids(rng, 8, vocab)]
    generations = await asyncio.gather(
        *(engine.generate(f"s{i}", c, params) for i, c in enumerate(second))
    )
    assert [g.cached_tokens for g in generations] == [12, 4]
    for context, generation in zip(second, generations, strict=True):
        assert_matches_reference(model, context, generation)


async def test_staggered_multi_turn_sessions_match_full_forward_passes(model, chatml_tokenizer):
    """Sessions come back with their histories while others are mid-generation, so rows join and
    leave a running batch at different times, and the cache's columns move and grow."""
    engine = HFEngine(model, chatml_tokenizer, max_batch_size=3)
    vocab = len(chatml_tokenizer)

    async def trajectory(i):
        rng = random.Random(100 + i)
        context = random_ids(rng, rng.randrange(2, 40), vocab)
        for turn in range(4):
            params = SamplingParams(max_new_tokens=rng.randrange(1, 30), seed=10 * i + turn)
            generation = await engine.generate(f"s{i}", context, params)
            assert_matches_reference(model, context, generation)
            context = context + generation.token_ids + random_ids(rng, rng.randrange(1, 9), vocab)
            await asyncio.sleep(rng.random() / 100)  # a tool call

    await asyncio.gather(*(trajectory(i) for i in range(5)))


async def test_an_identical_context_still_computes_its_last_token(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(4), 10, len(chatml_tokenizer))
    params = SamplingParams(max_new_tokens=4, seed=1)
    first = await engine.generate("s", context, params)
    again = await engine.generate("s", context, params)
    assert (again.cached_tokens, again.prefill_tokens) == (9, 1)
    assert again.token_ids == first.token_ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=TOLERANCE)


async def test_more_sessions_than_batch_rows_all_complete_as_if_alone(model, chatml_tokenizer):
    rng = random.Random(5)
    contexts = [random_ids(rng, rng.randrange(2, 30), len(chatml_tokenizer)) for _ in range(7)]
    params = [SamplingParams(max_new_tokens=rng.randrange(1, 15), seed=i) for i in range(7)]
    crowded = HFEngine(model, chatml_tokenizer, max_batch_size=2)
    together = await asyncio.gather(
        *(
            crowded.generate(f"s{i}", c, p)
            for i, (c, p) in enumerate(zip(contexts, params, strict=True))
        )
    )
    for i, (context, p) in enumerate(zip(contexts, params, strict=True)):
        alone = await HFEngine(model, chatml_tokenizer).generate("alone", context, p)
        assert together[i].token_ids == alone.token_ids
        assert len(alone.token_ids) == p.max_new_tokens
        assert_matches_reference(model, context, together[i])
    assert crowded._running.active == []


async def test_the_same_seed_gives_the_same_generation_and_another_seed_another(
    model, chatml_tokenizer
):
    context = random_ids(random.Random(6), 8, len(chatml_tokenizer))

    async def sample(seed):
        engine = HFEngine(model, chatml_tokenizer)
        return await engine.generate("s", context, SamplingParams(max_new_tokens=20, seed=seed))

    a, b, c = await sample(11), await sample(11), await sample(12)
    assert (a.token_ids, a.logprobs, a.text) == (b.token_ids, b.logprobs, b.text)
    assert a.token_ids != c.token_ids


async def test_top_k_one_is_greedy_and_log_probs_stay_untruncated(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(7), 12, len(chatml_tokenizer))
    greedy = await engine.generate("a", context, SamplingParams(temperature=0, max_new_tokens=8))
    top1 = await engine.generate("b", context, SamplingParams(top_k=1, max_new_tokens=8, seed=0))
    assert top1.token_ids == greedy.token_ids
    assert_matches_reference(model, context, top1)
    assert max(top1.logprobs) < 0  # the full softmax's, not the truncated distribution's


def test_truncation_keeps_the_top_k_and_the_smallest_prefix_reaching_top_p():
    logprobs = torch.log(torch.tensor([[0.1, 0.5, 0.15, 0.25]] * 3))
    kept = _truncate(logprobs, torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.7, 0.75]))
    assert torch.isfinite(kept).tolist() == [
        [False, True, False, True],
        [False, True, False, True],  # 0.5 + 0.25 reaches 0.7
        [False, True, False, True],  # exactly 0.75: the next token is not needed
    ]


async def test_generation_stops_right_after_a_complete_tool_call(chatml_tokenizer):
    encode = chatml_tokenizer.convert_tokens_to_ids
    script = ["Let", "<tool_call>", "print", "(", "1", ")", "</tool_call>", "on", "e"]
    ids = encode(script)
    model = chain_model(len(chatml_tokenizer), ids)
    engine = HFEngine(model, chatml_tokenizer)
    hermes = get_format("hermes")
    generation = await engine.generate(
        "s", ids[:1], SamplingParams(max_new_tokens=50, seed=0), hermes.detector
    )
    assert generation.finish_reason == "call"
    assert generation.token_ids == ids[1:7]
    assert generation.text == "<tool_call>print(1)</tool_call>"
    without_detector = await engine.generate("t", ids[:1], SamplingParams(max_new_tokens=8))
    assert without_detector.token_ids[:8] == ids[1:]


async def test_generation_stops_at_end_of_sequence_and_keeps_the_token(chatml_tokenizer):
    encode = chatml_tokenizer.convert_tokens_to_ids
    eos = chatml_tokenizer.eos_token_id
    ids = [*encode(["Let", "print", "(", "1"]), eos, encode("on")]
    model = chain_model(len(chatml_tokenizer), ids)
    engine = HFEngine(model, chatml_tokenizer)
    generation = await engine.generate("s", ids[:1], SamplingParams(max_new_tokens=50, seed=0))
    assert generation.finish_reason == "eos"
    assert generation.token_ids == ids[1:5]
    assert len(generation.logprobs) == 4
    assert generation.text == "print(1"


async def test_generation_stops_at_max_new_tokens(chatml_tokenizer):
    a, b = chatml_tokenizer.convert_tokens_to_ids(["print", "("])
    model = chain_model(len(chatml_tokenizer), [a, b, a])
    engine = HFEngine(model, chatml_tokenizer)
    generation = await engine.generate("s", [a], SamplingParams(max_new_tokens=5, seed=0))
    assert (generation.finish_reason, generation.token_ids) == ("length", [b, a, b, a, b])
    assert generation.text == "(print(print("


async def test_generation_stops_at_the_end_of_the_context_window(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    window = model.config.max_position_embeddings
    context = random_ids(random.Random(13), window - 3, len(chatml_tokenizer))
    near_the_end = await engine.generate("s", context, SamplingParams(max_new_tokens=10, seed=0))
    assert (near_the_end.finish_reason, len(near_the_end.token_ids)) == ("length", 3)
    full = context + near_the_end.token_ids
    at_the_end = await engine.generate("s", full, SamplingParams(max_new_tokens=10, seed=0))
    assert (at_the_end.finish_reason, at_the_end.token_ids) == ("length", [])


async def test_close_forgets_the_session(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(8), 10, len(chatml_tokenizer))
    params = SamplingParams(max_new_tokens=3, seed=0)
    await engine.generate("s", context, params)
    await engine.close("s")
    assert (await engine.generate("s", context, params)).cached_tokens == 0


async def test_closing_a_session_mid_generation_disturbs_no_other(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(11), 10, len(chatml_tokenizer))
    params = SamplingParams(max_new_tokens=100, seed=0)
    closing = asyncio.create_task(engine.generate("a", context, params))
    other = asyncio.create_task(engine.generate("b", context, params))
    while not engine._running.active:  # until both are in the batch, mid-generation
        assert not closing.done()
        await asyncio.sleep(0.001)
    await engine.close("a")
    assert (await closing).token_ids == (await other).token_ids
    assert (await engine.generate("a", context, params)).cached_tokens == 0


async def test_after_a_weight_update_reset_prefix_cache_recomputes_everything(
    model, chatml_tokenizer
):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(12), 10, len(chatml_tokenizer))
    params = SamplingParams(max_new_tokens=3, seed=0)
    await engine.generate("s", context, params)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(2)  # the cached keys are stale now
    model.train()  # as a trainer leaves it
    engine.reset_prefix_cache()
    generation = await engine.generate("s", context, params)
    assert model.training  # the engine restores the mode it found
    assert generation.cached_tokens == 0
    assert_matches_reference(model.eval(), context, generation)


async def test_parked_caches_beyond_the_budget_are_dropped_least_recently_used_first(
    model, chatml_tokenizer
):
    engine = HFEngine(model, chatml_tokenizer, max_parked_tokens=30)
    rng = random.Random(9)
    contexts = [random_ids(rng, 20, len(chatml_tokenizer)) for _ in range(2)]
    params = SamplingParams(max_new_tokens=1, seed=0)
    for i, context in enumerate(contexts):
        await engine.generate(f"s{i}", context, params)
    assert (await engine.generate("s1", contexts[1], params)).cached_tokens == 19
    assert (await engine.generate("s0", contexts[0], params)).cached_tokens == 0


async def test_a_cancelled_generation_frees_its_session(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    context = random_ids(random.Random(10), 10, len(chatml_tokenizer))
    slow = asyncio.create_task(engine.generate("s", context, SamplingParams(max_new_tokens=400)))
    other = await engine.generate("o", context, SamplingParams(max_new_tokens=5, seed=0))
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    again = await engine.generate("s", context, SamplingParams(max_new_tokens=5, seed=0))
    assert again.token_ids == other.token_ids


async def test_one_generation_at_a_time_per_session(model, chatml_tokenizer):
    engine = HFEngine(model, chatml_tokenizer)
    first = asyncio.create_task(engine.generate("s", [20, 21], SamplingParams(max_new_tokens=5)))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="in flight"):
        await engine.generate("s", [20, 21], SamplingParams(max_new_tokens=5))
    await first


async def test_from_pretrained_loads_a_saved_model(model, chatml_tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    chatml_tokenizer.save_pretrained(tmp_path)
    engine = HFEngine.from_pretrained(str(tmp_path), dtype=torch.float32, max_batch_size=4)
    context = random_ids(random.Random(14), 10, len(chatml_tokenizer))
    generation = await engine.generate("s", context, SamplingParams(max_new_tokens=5, seed=0))
    assert_matches_reference(model, context, generation)


def test_text_stream_holds_back_split_characters(chatml_tokenizer):
    text = "héllo wörld — 数学 🙂 done"
    ids = chatml_tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(chatml_tokenizer)
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) + stream.flush() == text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if not d) > 0  # some tokens ended inside a character


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def test_forward_passes_run_under_the_autocast_dtype_given(model, chatml_tokenizer):
    """The trainer computes in bfloat16 on GPUs; the decoding thread must too (autocast contexts do
    not cross threads, so the engine sets its own)."""
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    context = random_ids(random.Random(5), 12, len(chatml_tokenizer))
    params = SamplingParams(temperature=0, max_new_tokens=4)
    await HFEngine(model, chatml_tokenizer).generate("s", context, params)
    assert set(seen) == {torch.float32}
    seen.clear()
    engine = HFEngine(model, chatml_tokenizer, autocast_dtype=torch.bfloat16)
    cast = await engine.generate("s", context, params)
    assert set(seen) == {torch.bfloat16}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference_logprobs(model, context, cast.token_ids)
    assert cast.logprobs == pytest.approx(expected, abs=2e-2)  # bfloat16 rounding, cached or not
