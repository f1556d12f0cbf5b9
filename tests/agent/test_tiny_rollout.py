"""Online SAAR on the embedded tiny model, through the real engine and sandbox: a model that errs on
its own (errors are never injected), corrected as it generates."""

from __future__ import annotations

import asyncio

import pytest

from cleaner.agent import Rollout
from cleaner.collect import collect, grade_groups, summarize
from cleaner.config import RolloutConfig, SaarConfig
from cleaner.data import load_gym
from cleaner.engines.hf import HFEngine, load_policy
from cleaner.rewards.math import MathVerifier
from cleaner.sandbox import Limits, Sandbox
from cleaner.tiny.traces import TRACE_TASKS

pytestmark = pytest.mark.slow  # builds the per-machine tiny model the first time (minutes)


@pytest.fixture(scope="module")
def tiny():
    from cleaner.tiny.bootstrap import default_model_dir

    return load_policy(default_model_dir(log=lambda line: None))


def roll(tiny, saar: SaarConfig, seed: int):
    model, tokenizer = tiny
    problems = load_gym(TRACE_TASKS, size=6, seed=20_000 + seed)
    cfg = RolloutConfig(max_turns=4, max_response_tokens=384, temperature=1.0)

    async def main():
        engine = HFEngine(model, tokenizer, max_batch_size=128)
        async with Sandbox(workers=2, limits=Limits(timeout=4)) as sb:
            groups = await collect(
                Rollout(engine, sb, tokenizer, cfg, saar), problems, 4, seed, "t"
            )
            with MathVerifier() as verifier:
                return groups, await grade_groups(problems, groups, verifier, sb)

    return asyncio.run(main())


def test_the_tiny_model_lands_in_the_band_through_the_rollout_engine(tiny):
    groups, verdicts = roll(tiny, SaarConfig(enabled=False), seed=0)
    s = summarize(groups, verdicts)
    assert 0.15 <= s.tool_failures <= 0.6 and 0.2 <= s.accuracy.mean <= 0.7, s


def test_online_saar_grafts_both_ways_and_leaves_no_error_before_giving_up(tiny):
    groups, verdicts = roll(tiny, SaarConfig(), seed=1)
    s = summarize(groups, verdicts)
    assert s.shallow > 0 and s.deep > 0 and s.saar_recovered > 0, s
    for t in (t.trajectory for g in groups for t in g):
        failed = [i for i, turn in enumerate(t.turns) if turn.failed]
        if not t.saar.gave_up:
            assert failed == []
        for g in t.saar.grafts:  # a graft replaced a failure of the model's own code
            assert g.extra["replaced_code"] and g.extra["error_type"]
        grafted = [turn for turn in t.turns if turn.origin in ("shallow", "deep")]
        assert len(grafted) == len({g.turn for g in t.saar.grafts})
