from __future__ import annotations

import pytest

from cleaner.rewards.answer import clean_answer, last_boxed, verdict


@pytest.mark.parametrize(
    "text, content",
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{1} b \\boxed{2} c", "2"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed {7}", "7"),
        ("\\boxed 7 is it", "7"),
        ("$\\boxed 7$", "7"),
        ("\\fbox{x}", "x"),
        ("\\boxed{}", ""),
        ("no box here", None),
        ("\\boxed{12", None),
        ("\\boxed{1} \\boxed{2", None),
        ("\\boxed", None),
        ("\\boxedfoo{3}", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        (" 42 ", "42"),
        ("'42'", "42"),
        ('"x+1"', "x+1"),
        ("$5$", "5"),
        ("42.", "42"),
        ("'$3$'.", "3"),
        ("4.2", "4.2"),
    ],
)
def test_clean_answer(raw, cleaned):
    assert clean_answer(raw) == cleaned


def test_verdict_rewards():
    assert (verdict(True, "1").reward, verdict(False, "1", "why").reward) == (1.0, -1.0)
    assert verdict(True, "1", "ignored").note == ""
    assert verdict(False, "1", score=0.5).score == 0.5
