"""Score a response to a `Problem` with the reward its kind calls for."""

from __future__ import annotations

import asyncio

from cleaner.data.problem import Problem
from cleaner.rewards.answer import Score
from cleaner.rewards.choice import GPQA_CHOICES, score_choice
from cleaner.rewards.code import DEFAULT_TIMEOUT_S, score_code, score_code_sync
from cleaner.rewards.gym import score_gym
from cleaner.rewards.math import MathVerifier, score_math
from cleaner.sandbox import RemoteSandbox, Sandbox, SyncSandbox


def score_problem(
    problem: Problem,
    response: str,
    *,
    verifier: MathVerifier | None = None,
    sandbox: SyncSandbox | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Score:
    """math, mcq and gym problems here; code problems run their tests in `sandbox`, which they need
    (model code never runs without one being asked for). On an event loop use `score_problem_async`."""
    if problem.kind == "math":
        return score_math(response, problem.answer, verifier=verifier)
    if problem.kind == "mcq":
        return score_choice(
            response, problem.answer, choices=problem.metadata.get("choices", GPQA_CHOICES)
        )
    if problem.kind == "gym":
        return score_gym(response, problem.metadata["task"], problem.metadata["entry"])
    if problem.kind == "code":
        if sandbox is None:
            raise ValueError(
                f"{problem.id}: code problems are scored by running their tests in the sandbox: "
                "pass sandbox=SyncSandbox() (or cleaner.rewards.code.shared_sandbox())"
            )
        return score_code_sync(response, problem.tests, sandbox, timeout=timeout)
    raise ValueError(f"{problem.id}: unknown problem kind {problem.kind!r}")


async def score_problem_async(
    problem: Problem,
    response: str,
    *,
    sandbox: Sandbox | RemoteSandbox | None = None,
    verifier: MathVerifier | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Score:
    """`score_problem` for rollouts: code awaits `sandbox` (required for code problems); the other
    kinds run in a thread, never on the loop."""
    if problem.kind == "code":
        if sandbox is None:
            raise ValueError(f"{problem.id}: code problems need a sandbox to run their tests")
        return await score_code(response, problem.tests, sandbox, timeout=timeout)
    return await asyncio.to_thread(score_problem, problem, response, verifier=verifier)
