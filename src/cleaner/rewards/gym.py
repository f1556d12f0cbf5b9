"""reasoning-gym reward: the response's last `\\boxed{}`, graded by the task's own `score_answer`.

reasoning-gym scorers take the answer text and the dataset entry (question, answer, metadata) and
return a value in [0, 1]; some give partial credit for near misses. `correct` means full credit.
The scorers of the arithmetic tasks are plain string and number handling; the length cap bounds
their time, and any exception a scorer raises on a malformed answer scores as wrong.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from cleaner.rewards.answer import MAX_ANSWER_CHARS, Score, clean_answer, last_boxed, verdict


@functools.cache
def gym_scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    """The `score_answer` of reasoning-gym task `task` (ValueError for an unknown task)."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def score_gym(response: str, task: str, entry: Mapping[str, Any]) -> Score:
    """Score `response` on the reasoning-gym `entry` (a dict with question, answer, metadata) of `task`."""
    scorer = gym_scorer(task)
    boxed = last_boxed(response)
    if boxed is None:
        return verdict(False, None, "no boxed answer")
    predicted = clean_answer(boxed)
    if not predicted:
        return verdict(False, predicted, "empty boxed answer")
    if len(predicted) > MAX_ANSWER_CHARS:
        return verdict(
            False, predicted[:100], f"boxed answer longer than {MAX_ANSWER_CHARS} characters"
        )
    try:
        value = float(scorer(predicted, dict(entry)))
    except Exception as e:  # scorers parse the answer and raise on junk (int("xyz"))
        return verdict(False, predicted, f"{task} scorer rejected the answer: {type(e).__name__}")
    value = min(max(value, 0.0), 1.0)
    return verdict(value >= 1.0, predicted, f"{task} scorer gave {value:g}", score=value)
