"""reasoning-gym tasks as problems: procedural, seeded, reproducible, graded by the task's own scorer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cleaner.data import prompts
from cleaner.data.problem import Problem

TOOL_TASKS = (
    "basic_arithmetic",
    "gcd",
    "lcm",
    "prime_factorization",
    "count_primes",
    "base_conversion",
    "gsm_symbolic",
)
"""Tasks where running Python helps: exact arithmetic, number theory, base conversion, word problems."""


def _plain(value: Any) -> Any:
    """JSON-ready copy of an entry (reasoning-gym metadata holds tuples), so problems round-trip."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    return value


def load_gym(
    tasks: str | Sequence[str] = TOOL_TASKS,
    *,
    size: int,
    seed: int,
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Problem]:
    """`size` problems from each reasoning-gym task in `tasks`; the same seed gives the same problems.

    Every task is generated with `seed` itself, so a task's problems do not depend on which other
    tasks are in the list. `config` maps a task name to keyword arguments of its generator
    (difficulty ranges and the like).
    """
    import reasoning_gym

    if isinstance(tasks, str):
        tasks = [tasks]
    if size < 1:
        raise ValueError("size must be >= 1")
    problems = []
    for task in tasks:
        dataset = reasoning_gym.create_dataset(
            task, size=size, seed=seed, **dict((config or {}).get(task, {}))
        )
        for index, entry in enumerate(dataset):
            problems.append(
                Problem(
                    id=f"gym/{task}/{seed}/{index}",
                    kind="gym",
                    prompt=prompts.user(prompts.gym_prompt(entry["question"])),
                    answer=str(entry["answer"]),
                    source=f"gym/{task}",
                    metadata={"task": task, "entry": _plain(entry)},
                )
            )
    return problems
