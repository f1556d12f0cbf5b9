from __future__ import annotations

import pytest

from cleaner.rewards.choice import choice_letter, score_choice

ACCEPTED_AS_B = [
    "\\boxed{B}",
    "\\boxed{b}",
    "\\boxed{(B)}",
    "\\boxed{[B]}",
    "\\boxed{B.}",
    "\\boxed{B)}",
    "\\boxed{B:}",
    "\\boxed{ B }",
    "\\boxed{'B'}",
    "\\boxed{$B$}",
    "\\boxed{\\text{B}}",
    "\\boxed{\\textbf{(B)}}",
    "\\boxed{\\mathrm{B}}",
    "\\boxed{Option B}",
    "\\boxed{Answer: B}",
    "\\boxed{The answer is B}",
    "\\boxed{B) 3.5 eV}",
    "\\boxed{(B) 3.5 eV}",
    "\\boxed{B. The reaction is exothermic}",
    "I first thought \\boxed{A} but it is \\boxed{B}",
]


@pytest.mark.parametrize("response", ACCEPTED_AS_B)
def test_spellings_of_an_option_letter(response):
    score = score_choice(response, "B")
    assert score.correct, score
    assert (score.reward, score.predicted) == (1.0, "B")


REFUSED = [
    "The answer is B.",  # no box
    "\\boxed{}",
    "\\boxed{A, B}",
    "\\boxed{A and B}",
    "\\boxed{A or B}",
    "\\boxed{B/C}",
    "\\boxed{BC}",
    "\\boxed{B) but also C)}",
    "\\boxed{(B)(C)}",
    "\\boxed{B.5}",
    "\\boxed{E}",  # not one of A-D
    "\\boxed{Both}",
    "\\boxed{3.5 eV}",
    "\\boxed{2}",
    "\\boxed{B} and then \\boxed{C}",  # the last box decides
    "\\boxed{B} \\boxed{",  # last box cut off
]


@pytest.mark.parametrize("response", REFUSED)
def test_ambiguous_wrong_or_missing_letters_score_minus_one(response):
    score = score_choice(response, "B")
    assert not score.correct, score
    assert score.reward == -1.0
    assert score.note


def test_wrong_letter_is_reported():
    score = score_choice("\\boxed{C}", "B")
    assert not score.correct and score.predicted == "C" and "C" in score.note


def test_reference_letter_is_normalised_and_validated():
    assert score_choice("\\boxed{D}", "(D)").correct
    with pytest.raises(ValueError):
        score_choice("\\boxed{A}", "the first one")


def test_more_choices_than_gpqa():
    assert score_choice("\\boxed{J}", "J", choices="ABCDEFGHIJ").correct
    assert choice_letter("J") is None


@pytest.mark.parametrize(
    "text, letter", [("A", "A"), ("(c)", "C"), ("\\text{D}", "D"), ("AB", None), ("", None)]
)
def test_choice_letter(text, letter):
    assert choice_letter(text) == letter
