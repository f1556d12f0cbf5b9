"""A quick, honest check of a bootstrapped model: sample it on held-out problems with real tool calls.

This is a check, not the rollout engine (that is `cleaner rollout`): batches of problems through
`model.generate`, one assistant turn per round, stopping at `</tool_call>` or the end of the turn, running the model's own code in
the sandbox and splicing the observation's tokens, up to a few tool calls. No SAAR, no error ever
injected: every failure counted here is raised by code the model wrote (or a call it malformed).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleaner.data.gym import load_gym
from cleaner.formats import HermesFormat, observation_text
from cleaner.rewards.gym import score_gym
from cleaner.tiny.traces import TASK_CONFIG, TOOLS, TRACE_TASKS
from cleaner.trajectory import Observation, Trajectory, Turn

HELD_OUT_SEED = 1_000_003
"""Problems for checks come from this seed; bootstrap traces use small seeds."""


@dataclass
class CheckResult:
    trajectories: list[Trajectory]
    temperature: float
    seconds: float
    generated_tokens: int
    error_types: Counter = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        n = max(1, len(self.trajectories))
        trajectories = self.trajectories
        return {
            "problems": len(trajectories),
            "temperature": self.temperature,
            "accuracy": round(sum(t.reward == 1.0 for t in trajectories) / n, 3),
            "answered": round(sum(t.answer is not None for t in trajectories) / n, 3),
            "tool_calls_per_trajectory": round(sum(t.tool_calls for t in trajectories) / n, 3),
            "tool_failures_per_trajectory": round(sum(t.failed_calls for t in trajectories) / n, 3),
            "trajectories_with_a_failure": round(
                sum(t.failed_calls > 0 for t in trajectories) / n, 3
            ),
            "recovered_after_failure": sum(
                t.failed_calls > 0 and t.reward == 1.0 for t in trajectories
            ),
            "error_types": dict(self.error_types.most_common()),
            "seconds": round(self.seconds, 1),
            "generated_tokens_per_second": round(self.generated_tokens / max(self.seconds, 1e-9)),
        }


def check_model(
    model_or_path,
    tokenizer=None,
    *,
    n_problems: int = 70,
    seed: int = HELD_OUT_SEED,
    temperature: float = 1.0,
    max_tool_calls: int = 4,
    max_new_tokens: int = 256,
    tasks: tuple[str, ...] = TRACE_TASKS,
    batch_size: int = 32,
    sandbox=None,
) -> CheckResult:
    """Sample one trajectory per held-out problem (an even mix of `tasks`) and score it.

    `model_or_path` is a model directory (loaded with the Auto classes) or a model, then with its
    `tokenizer`. Sampling is seeded (`seed`), so a check is reproducible on one machine.
    """
    import torch

    from cleaner.sandbox.sync import SyncSandbox
    from cleaner.tiny.model import load_model

    if isinstance(model_or_path, (str, os.PathLike, Path)):
        model, tokenizer = load_model(model_or_path)
    else:
        model = model_or_path
    model.eval()
    per_task = -(-n_problems // len(tasks))
    problems = load_gym(list(tasks), size=per_task, seed=seed, config=TASK_CONFIG)
    problems = problems[::per_task] + [p for i, p in enumerate(problems) if i % per_task]
    problems = problems[:n_problems]  # round-robin over tasks when n_problems is not a multiple

    fmt = HermesFormat()
    stop_ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("</tool_call>")]
    own = sandbox is None
    sandbox = sandbox or SyncSandbox(workers=1)
    torch.manual_seed(seed)
    result = CheckResult([], temperature, 0.0, 0)
    started = time.monotonic()
    contexts = [
        tokenizer.apply_chat_template(
            p.prompt, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in problems
    ]
    turns: list[list[Turn]] = [[] for _ in problems]
    open_rows = list(range(len(problems)))
    try:
        # All open trajectories advance one assistant turn per round, in batches.
        for round_index in range(max_tool_calls + 1):
            still_open = []
            for at in range(0, len(open_rows), batch_size):
                rows = open_rows[at : at + batch_size]
                samples = _sample(
                    model,
                    tokenizer,
                    [contexts[r] for r in rows],
                    stop_ids,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                )
                for row, new in zip(rows, samples, strict=True):
                    result.generated_tokens += len(new)
                    text = tokenizer.decode(new, skip_special_tokens=False)
                    if not new or new[-1] != stop_ids[1]:  # an answer, or out of tokens
                        turns[row].append(Turn(text.removesuffix(tokenizer.eos_token)))
                        continue
                    parsed = fmt.parse(text)
                    if parsed.invalid:
                        observation = Observation("invalid", reason=parsed.invalid)
                    else:
                        observation = sandbox.run(parsed.code).to_observation()
                        observation.extra = {}
                    if not observation.ok:
                        result.error_types[observation.error_type or observation.status] += 1
                    turns[row].append(Turn(parsed.reasoning, parsed.code, observation))
                    shown = observation_text(observation)
                    contexts[row] = contexts[row] + new + fmt.observation_ids(tokenizer, shown)
                    if round_index < max_tool_calls:
                        still_open.append(row)
            open_rows = still_open
    finally:
        if own:
            sandbox.close()
    for problem, problem_turns in zip(problems, turns, strict=True):
        last = problem_turns[-1]
        final = last.reasoning if last.code is None else ""
        score = score_gym(final, problem.metadata["task"], problem.metadata["entry"])
        result.trajectories.append(
            Trajectory(
                id=problem.id,
                prompt=problem.prompt,
                turns=problem_turns,
                answer=score.predicted,
                reward=1.0 if score.correct else 0.0,
                extra={"task": problem.metadata["task"], "reference": problem.answer},
            )
        )
    result.seconds = time.monotonic() - started
    return result


def _sample(model, tokenizer, contexts, stop_ids, *, temperature, max_new_tokens):
    """One assistant turn for each context (left-padded batch); each cut after its stop token."""
    import torch

    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=attention,
            # plain sampling from the full distribution (no top-k/top-p), or greedy at 0
            **(
                {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0
                else {"do_sample": False}
            ),
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=pad,
        )
    samples = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        samples.append(row[:end])
    return samples
