"""Roll out problems with a model and grade the trajectories: what `cleaner rollout`, `cleaner eval`
and the trainer share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cleaner.agent import Rollout
from cleaner.data import Problem
from cleaner.evaluate import Estimate, avg_at_k, pass_at_k_estimate
from cleaner.rewards.answer import Score
from cleaner.rewards.math import MathVerifier
from cleaner.rewards.problem import score_problem_async
from cleaner.tokens import TokenTrajectory


def final_response(t: TokenTrajectory) -> str:
    """The answer turn's text; empty when the trajectory ended without one (no answer, no credit)."""
    turns = t.trajectory.turns
    return turns[-1].reasoning if turns and turns[-1].code is None else ""


async def grade(
    problem: Problem, t: TokenTrajectory, verifier: MathVerifier, sandbox: Any
) -> Score:
    """The outcome of one trajectory: its final answer against the problem (code runs in `sandbox`)."""
    return await score_problem_async(problem, final_response(t), sandbox=sandbox, verifier=verifier)


async def grade_groups(
    problems: list[Problem],
    groups: list[list[TokenTrajectory]],
    verifier: MathVerifier,
    sandbox: Any,
) -> list[list[Score]]:
    """Grade every trajectory concurrently; each trajectory's reward is set to its outcome reward."""
    flat = [(p, t) for p, group in zip(problems, groups, strict=True) for t in group]
    scores = await asyncio.gather(*(grade(p, t, verifier, sandbox) for p, t in flat))
    for (_, t), s in zip(flat, scores, strict=True):
        t.trajectory.reward = s.reward
    n = len(groups[0]) if groups else 0
    return [list(scores[i * n : (i + 1) * n]) for i in range(len(groups))]


async def collect(
    rollout: Rollout,
    problems: list[Problem],
    n: int,
    seed: int,
    tag: str,
    on_done: Callable[[TokenTrajectory], None] | None = None,
) -> list[list[TokenTrajectory]]:
    """`n` trajectories a problem, all running concurrently; `on_done` sees each as it finishes."""

    async def one(i: int, k: int, p: Problem) -> TokenTrajectory:
        t = await rollout.run(f"{tag}/{i}/{k}", p.prompt, seed=seed)
        t.trajectory.extra["problem"] = p.id
        if on_done is not None:
            on_done(t)
        return t

    flat = await asyncio.gather(*(one(i, k, p) for i, p in enumerate(problems) for k in range(n)))
    return [flat[i * n : (i + 1) * n] for i in range(len(problems))]


@dataclass
class Summary:
    """What `cleaner rollout` and `cleaner eval` print."""

    trajectories: int
    accuracy: Estimate
    pass_at_k: Estimate
    k: int
    tool_calls: float
    tool_failures: float
    """per trajectory, first attempts"""
    saar_recovered: int
    saar_gave_up: int
    shallow: int
    deep: int

    def to_dict(self) -> dict[str, Any]:
        def est(e: Estimate) -> dict[str, float]:
            return {"mean": e.mean, "low": e.low, "high": e.high, "problems": e.problems}

        return {
            "trajectories": self.trajectories,
            "avg@k": est(self.accuracy),
            f"pass@{self.k}": est(self.pass_at_k),
            "k": self.k,
            "tool_calls_per_traj": self.tool_calls,
            "tool_failures_per_traj": self.tool_failures,
            "saar": {
                "recovered": self.saar_recovered,
                "gave_up": self.saar_gave_up,
                "shallow": self.shallow,
                "deep": self.deep,
            },
        }


def summarize(groups: list[list[TokenTrajectory]], verdicts: list[list[Score]]) -> Summary:
    flat = [t.trajectory for g in groups for t in g]
    n = max(len(flat), 1)
    stats = [t.extra["rollout"] for t in flat]
    grafts = [g for t in flat if t.saar for g in t.saar.grafts]
    correct = [[v.correct for v in vs] for vs in verdicts]
    k = min((len(c) for c in correct), default=1) or 1
    return Summary(
        trajectories=len(flat),
        accuracy=avg_at_k(correct),
        pass_at_k=pass_at_k_estimate(correct, k),
        k=k,
        tool_calls=sum(s["tool_calls"] for s in stats) / n,
        tool_failures=sum(s["first_attempt_failures"] for s in stats) / n,
        saar_recovered=sum(
            not t.turns[i].failed for t in flat if t.saar for i in {g.turn for g in t.saar.grafts}
        ),
        saar_gave_up=sum(bool(t.saar and t.saar.gave_up) for t in flat),
        shallow=sum(g.kind == "shallow" for g in grafts),
        deep=sum(g.kind == "deep" for g in grafts),
    )
