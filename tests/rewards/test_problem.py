from __future__ import annotations

import pytest

from cleaner.data import Problem, load_gym, load_humaneval
from cleaner.rewards import score_problem


def problem(kind, answer, **extra):
    return Problem(
        id="p", kind=kind, prompt=[{"role": "user", "content": "q"}], answer=answer, **extra
    )


def test_each_kind_gets_its_reward():
    assert score_problem(problem("math", "\\frac{1}{2}"), "\\boxed{0.5}").correct
    assert not score_problem(problem("math", "2"), "\\boxed{B}").correct
    assert score_problem(problem("mcq", "B"), "\\boxed{(B)}").correct
    assert not score_problem(problem("mcq", "B"), "\\boxed{0.5}").correct
    assert score_problem(problem("mcq", "F", metadata={"choices": "ABCDEF"}), "\\boxed{F}").correct
    gym = load_gym("lcm", size=1, seed=4)[0]
    assert score_problem(gym, f"\\boxed{{{gym.answer}}}").correct


def test_code_is_left_to_the_sandbox():
    with pytest.raises(ValueError, match="sandbox"):
        score_problem(load_humaneval()[0], "```python\npass\n```")
