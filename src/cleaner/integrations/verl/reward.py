"""cleaner's grading as a verl `custom_reward_function`, for verl's own agent loops and reward
managers (the `cleaner_agent` loop grades inside itself and does not need this):

    reward.custom_reward_function.path=$(python -c "import cleaner.integrations.verl.reward as r; \\
        print(r.__file__)") reward.custom_reward_function.name=compute_score

Rows written by `cleaner to-verl` are graded as `cleaner train` grades them (math-verify, multiple
choice, reasoning-gym scorers, code tests in the sandbox); any other row as math against its
`ground_truth`. The score is the reward `cleaner train` uses (+1 / -1; for code the fraction of
tests passed, -1 without a code block); `acc` (solved or not) is logged beside it.
"""

from __future__ import annotations

import json
from typing import Any

from cleaner.data.problem import Problem
from cleaner.rewards.code import shared_sandbox
from cleaner.rewards.math import score_math
from cleaner.rewards.problem import score_problem


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, Any]:
    embedded = (extra_info or {}).get("cleaner_problem")
    if embedded:
        problem = Problem.from_dict(json.loads(embedded))
        sandbox = shared_sandbox() if problem.kind == "code" else None
        score = score_problem(problem, solution_str, sandbox=sandbox)
    else:
        score = score_math(solution_str, ground_truth)
    return {"score": score.reward, "acc": float(score.correct), "pred": score.predicted or ""}
