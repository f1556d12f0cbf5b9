from __future__ import annotations

import pytest

from cleaner.data.gym import TOOL_TASKS, load_gym
from cleaner.rewards.gym import score_gym


@pytest.mark.parametrize("task", TOOL_TASKS)
def test_reference_answers_get_full_credit_and_wrong_ones_do_not(task):
    for problem in load_gym(task, size=10, seed=11):
        entry = problem.metadata["entry"]
        right = score_gym(f"So the answer is \\boxed{{{problem.answer}}}.", task, entry)
        assert right.correct and right.reward == 1.0 and right.score == 1.0, (problem.id, right)
        wrong = score_gym("\\boxed{not an answer}", task, entry)
        assert not wrong.correct and wrong.reward == -1.0, (problem.id, wrong)


def test_no_box_no_credit():
    problem = load_gym("gcd", size=1, seed=1)[0]
    score = score_gym(f"The GCD is {problem.answer}", "gcd", problem.metadata["entry"])
    assert not score.correct and score.note == "no boxed answer"


def test_scorer_exceptions_score_as_wrong():
    problem = load_gym("prime_factorization", size=1, seed=1)[0]
    # reasoning-gym's scorer raises ValueError on int("xyz")
    score = score_gym("\\boxed{xyz × 3}", "prime_factorization", problem.metadata["entry"])
    assert not score.correct and "rejected" in score.note


def test_partial_credit_is_not_correct():
    problem = load_gym("basic_arithmetic", size=1, seed=2)[0]
    entry = dict(problem.metadata["entry"], answer="123")
    score = score_gym("\\boxed{123.5}", "basic_arithmetic", entry)
    assert not score.correct and score.reward == -1.0 and 0.0 <= score.score < 1.0


def test_unknown_task():
    with pytest.raises(ValueError):
        score_gym("\\boxed{1}", "no_such_task", {"question": "", "answer": "1", "metadata": {}})
