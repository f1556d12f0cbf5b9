"""Outcome rewards on a response's final answer: math (math-verify), multiple choice, reasoning-gym.

Each returns a `Score` (correct, reward +1/-1, score in [0, 1], the extracted answer, a note) and
runs in bounded time. The code reward (`score_code`) runs the response's last python block against
the problem's tests in the sandbox; its verdict is decided outside the process running the code.
"""

from cleaner.rewards.answer import Score, clean_answer, last_boxed
from cleaner.rewards.choice import choice_letter, score_choice
from cleaner.rewards.code import (
    close_shared_sandbox,
    last_python_block,
    score_code,
    score_code_sync,
    shared_sandbox,
)
from cleaner.rewards.files import score_file
from cleaner.rewards.gym import score_gym
from cleaner.rewards.math import (
    MathVerifier,
    close_shared_verifier,
    score_math,
    score_math_async,
    shared_verifier,
)
from cleaner.rewards.problem import score_problem, score_problem_async

__all__ = [
    "MathVerifier",
    "Score",
    "choice_letter",
    "clean_answer",
    "close_shared_sandbox",
    "close_shared_verifier",
    "last_python_block",
    "last_boxed",
    "score_choice",
    "score_code",
    "score_code_sync",
    "score_file",
    "score_gym",
    "score_math",
    "score_math_async",
    "score_problem",
    "score_problem_async",
    "shared_sandbox",
    "shared_verifier",
]
