"""The final answer of a response (its last `\\boxed{}`) and the score record every reward returns."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_ANSWER_CHARS = 2000
"""Longer boxed answers are refused unparsed: no real answer is that long, and it bounds parse time."""


@dataclass(frozen=True)
class Score:
    """The verdict on one response.

    `correct` is the outcome; `reward` is what RL trains on (+1 / -1, SPEC section 6); `score` is
    the graded value in [0, 1] (1 or 0 for math and choice, the task scorer's own value for gym);
    `predicted` is the extracted answer (None when there was none); `note` says why it failed.
    """

    correct: bool
    reward: float
    score: float
    predicted: str | None
    note: str = ""


def verdict(
    correct: bool, predicted: str | None, note: str = "", score: float | None = None
) -> Score:
    if score is None:
        score = 1.0 if correct else 0.0
    return Score(
        correct=correct,
        reward=1.0 if correct else -1.0,
        score=score,
        predicted=predicted,
        note="" if correct else note,
    )


_BOX = re.compile(r"\\(?:boxed|fbox)(?=[\s{])")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`.

    None when there is no box, or when the last one is cut off (unbalanced braces): a response
    truncated inside its final answer has not answered, whatever it boxed earlier.
    """
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    while i < len(text) and text[i] in " \t":
        i += 1
    if i == len(text):
        return None
    if text[i] != "{":
        # `\boxed 5`: TeX takes the next token.
        token = re.match(r"[^\s$]+", text[i:])
        return token.group(0) if token else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{" and text[j - 1] != "\\":
            depth += 1
        elif text[j] == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def clean_answer(answer: str) -> str:
    """Strip what wraps an answer but is not part of it: spaces, `$`, quotes, a final period.

    The reference prompt shows the format as `\\boxed{'The final answer goes here.'}`, so models
    often quote their answer.
    """
    answer = answer.strip()
    while True:
        before = answer
        answer = answer.strip().strip("$").strip()
        if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"`":
            answer = answer[1:-1]
        answer = answer.removesuffix(".").removesuffix("\\.")
        if answer == before:
            return answer
