"""Multiple-choice reward (GPQA style): the letter in the response's last `\\boxed{}`.

The reference prompt asks for "the final uppercase letter option of this problem" in the box. Accepted
spellings of option B: `B`, `b`, `(B)`, `[B]`, `B.`, `B)`, `B:`, `\\text{B}`, `\\textbf{(B)}`,
`'B'`, `Option B`, `Answer: B`, and a letter followed by its option text (`B) 3.5 eV`, `(B) 3.5 eV`).
Refused: anything naming two options (`A, B`, `A and B`, `B) not C`), a letter outside the choices,
a bare word (`Both`), no box.
"""

from __future__ import annotations

import re

from cleaner.rewards.answer import MAX_ANSWER_CHARS, Score, clean_answer, last_boxed, verdict

GPQA_CHOICES = "ABCD"

_WRAPPER = re.compile(r"^\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{(.*)\}$", re.S)
_PREFIX = re.compile(r"^(?:the\s+)?(?:option|answer|choice)\s*(?:is\s*)?:?\s*", re.I)
_LETTER = re.compile(
    r"^(?:\((?P<paren>[A-Za-z])\)|\[(?P<bracket>[A-Za-z])\]|(?P<bare>[A-Za-z])(?:[.:)]|$))(?P<rest>.*)$",
    re.S,
)


def choice_letter(answer: str, choices: str = GPQA_CHOICES) -> str | None:
    """The option letter `answer` names (uppercase), or None when it names none or several."""
    answer = clean_answer(answer)
    while True:
        unwrapped = _WRAPPER.match(answer)
        if unwrapped is None:
            break
        answer = clean_answer(unwrapped.group(1))
    answer = _PREFIX.sub("", answer, count=1)
    match = _LETTER.match(answer)
    if match is None:
        return None
    letter = (match["paren"] or match["bracket"] or match["bare"]).upper()
    rest = match["rest"]
    if letter not in choices or (rest and not rest[0].isspace()):
        return None
    # The option text may follow the letter, but naming another option makes it ambiguous.
    others = [
        c
        for c in choices
        if c != letter and re.search(rf"(?<![A-Za-z0-9]){c}(?![A-Za-z0-9])", rest)
    ]
    return None if others else letter


def score_choice(response: str, answer: str, *, choices: str = GPQA_CHOICES) -> Score:
    """Score `response` against the reference option letter `answer` (+1 when the letters agree)."""
    gold = choice_letter(str(answer), choices)
    if gold is None:
        raise ValueError(
            f"the reference answer {answer!r} is not one of the options {', '.join(choices)}"
        )
    boxed = last_boxed(response)
    if boxed is None:
        return verdict(False, None, "no boxed answer")
    predicted = clean_answer(boxed)
    if len(predicted) > MAX_ANSWER_CHARS:
        return verdict(
            False, predicted[:100], f"boxed answer longer than {MAX_ANSWER_CHARS} characters"
        )
    letter = choice_letter(predicted, choices)
    if letter is None:
        return verdict(
            False, predicted, f"boxed answer is not a single option letter ({', '.join(choices)})"
        )
    return verdict(letter == gold, letter, f"chose {letter}, the answer is {gold}")
