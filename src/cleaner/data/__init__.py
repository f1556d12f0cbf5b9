"""Problems for rollouts and evaluation: the paper's benchmarks, its training set, HumanEval,
reasoning-gym tasks, and any JSONL / Parquet / `datasets` table with a declared field mapping."""

from __future__ import annotations

import os
from pathlib import Path

from cleaner.data.benchmarks import (
    EVAL_FILES,
    load_aime2024,
    load_aime2025,
    load_gpqa_diamond,
    load_humaneval,
    load_livecodebench_v6,
    load_open_agentrl_30k,
)
from cleaner.data.gym import TOOL_TASKS, load_gym
from cleaner.data.problem import KINDS, Problem, read_problems, write_problems
from cleaner.data.tables import load_table, read_rows

BENCHMARKS = (
    "aime2024",
    "aime2025",
    "gpqa-diamond",
    "livecodebench-v6",
    "humaneval",
    "open-agentrl-30k",
)


def load_benchmark(
    name: str, *, root: str | os.PathLike | None = None, size: int = 100, seed: int = 0
) -> list[Problem]:
    """Problems by name, for `cleaner eval --data NAME|PATH`.

    Names: aime2024, aime2025, gpqa-diamond, livecodebench-v6 (files under `root`, an
    Open-AgentRL-Eval folder), open-agentrl-30k (`root` is its folder or file), humaneval (from the
    package), `gym:TASK[,TASK...]` (`size` problems a task, `seed`). Anything else is a path to a
    problems JSONL file written by `write_problems`.
    """
    loaders = {
        "aime2024": load_aime2024,
        "aime2025": load_aime2025,
        "gpqa-diamond": load_gpqa_diamond,
        "livecodebench-v6": load_livecodebench_v6,
        "open-agentrl-30k": load_open_agentrl_30k,
    }
    if name == "humaneval":
        return load_humaneval()
    if name.startswith("gym:"):
        return load_gym([t for t in name[4:].split(",") if t], size=size, seed=seed)
    if name in loaders:
        if root is None:
            raise ValueError(
                f"{name} is read from local files: give the folder that holds them (root)"
            )
        return loaders[name](root)
    if Path(name).suffix == ".jsonl":
        return list(read_problems(name))
    raise ValueError(
        f"unknown data {name!r}: expected one of {', '.join(BENCHMARKS)}, gym:TASK, or a .jsonl file"
    )


__all__ = [
    "BENCHMARKS",
    "EVAL_FILES",
    "KINDS",
    "TOOL_TASKS",
    "Problem",
    "load_aime2024",
    "load_aime2025",
    "load_benchmark",
    "load_gpqa_diamond",
    "load_gym",
    "load_humaneval",
    "load_livecodebench_v6",
    "load_open_agentrl_30k",
    "load_table",
    "read_problems",
    "read_rows",
    "write_problems",
]
