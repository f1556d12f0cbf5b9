"""Score a response to a `Problem` with the reward its kind calls for."""

from __future__ import annotations

from cleaner.data.problem import Problem
from cleaner.rewards.answer import Score
from cleaner.rewards.choice import GPQA_CHOICES, score_choice
from cleaner.rewards.gym import score_gym
from cleaner.rewards.math import MathVerifier, score_math


def score_problem(
    problem: Problem, response: str, *, verifier: MathVerifier | None = None
) -> Score:
    """math, mcq and gym problems; code problems are graded by running their tests in the sandbox."""
    if problem.kind == "math":
        return score_math(response, problem.answer, verifier=verifier)
    if problem.kind == "mcq":
        return score_choice(
            response, problem.answer, choices=problem.metadata.get("choices", GPQA_CHOICES)
        )
    if problem.kind == "gym":
        return score_gym(response, problem.metadata["task"], problem.metadata["entry"])
    raise ValueError(f"{problem.id}: {problem.kind} problems are scored by the sandbox, not here")
