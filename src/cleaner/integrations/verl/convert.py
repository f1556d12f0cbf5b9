"""Between cleaner's currency and verl's: problems as verl dataset rows, trajectories as agent-loop
outputs. Pure functions, no verl import.

A verl row (what `RLHFDataset` reads from parquet) carries the chat `prompt`, `data_source`,
`reward_model.ground_truth`, `agent_name` (which agent loop runs it) and `extra_info`; the whole
cleaner `Problem` rides in `extra_info.cleaner_problem` as JSON, so the agent loop grades exactly as
`cleaner train` does (math-verify, multiple choice, reasoning-gym, sandboxed code tests), and rows
of any schema fit one parquet table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cleaner.data.problem import Problem
from cleaner.tokens import TokenTrajectory
from cleaner.trajectory import RecordError

AGENT_NAME = "cleaner_agent"


def to_verl_row(problem: Problem, index: int, split: str = "train") -> dict[str, Any]:
    return {
        "data_source": problem.source or problem.kind,
        "prompt": problem.prompt,
        "ability": problem.kind,
        "reward_model": {"style": "rule", "ground_truth": problem.answer or ""},
        "agent_name": AGENT_NAME,
        "extra_info": {
            "index": index,
            "split": split,
            "cleaner_problem": json.dumps(problem.to_dict()),
        },
    }


def to_verl_rows(problems: Iterable[Problem], split: str = "train") -> list[dict[str, Any]]:
    return [to_verl_row(p, i, split) for i, p in enumerate(problems)]


def problem_from_verl_row(row: dict[str, Any]) -> Problem:
    """The problem behind a row: the embedded cleaner problem, else a math problem built from the
    row's prompt and ground truth (verl's own math datasets: gsm8k, DAPO-Math...)."""
    extra = row.get("extra_info") or {}
    if extra.get("cleaner_problem"):
        return Problem.from_dict(json.loads(extra["cleaner_problem"]))
    prompt = row.get("raw_prompt", row.get("prompt"))
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if prompt is None or truth is None:
        raise RecordError(
            "a verl row needs extra_info.cleaner_problem, or a prompt and reward_model.ground_truth",
            field="extra_info",
        )
    return Problem(
        id=str(extra.get("index", "")),
        kind="math",
        prompt=[dict(m) for m in prompt],
        answer=str(truth),
        source=str(row.get("data_source") or ""),
    )


def agent_loop_output(t: TokenTrajectory, response_length: int) -> dict[str, Any]:
    """The fields of verl's `AgentLoopOutput` for a trajectory: prompt ids; then every later token
    (sampled, grafted, tool results and template) as the response, masked 1 where the policy is
    trained (sampled, shallow and deep grafts) and 0 on tool output; the log-prob each trained token
    was sampled with (0.0 elsewhere, where the mask hides it). Cut to `response_length` tokens."""
    ids, mask, logprobs = t.token_ids, t.loss_mask, t.sampling_logprobs
    start = t.prompt_length
    response_logprobs = [x if x is not None else 0.0 for x in logprobs[start:]]
    return {
        "prompt_ids": ids[:start],
        "response_ids": ids[start:][:response_length],
        "response_mask": mask[start:][:response_length],
        "response_logprobs": response_logprobs[:response_length],
        # verl counts messages: the user's, the assistant's and the tool's
        "num_turns": 1 + sum(1 + (turn.observation is not None) for turn in t.trajectory.turns),
    }
