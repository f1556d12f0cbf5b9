"""Score a JSONL file of responses (the math, mcq and code kinds of `cleaner score`)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cleaner.jsonl import RecordError, atomic_writer, dump_line, read_jsonl
from cleaner.rewards.answer import Score
from cleaner.rewards.choice import choice_letter, score_choice
from cleaner.rewards.code import DEFAULT_TIMEOUT_S, score_code
from cleaner.rewards.math import DEFAULT_WORKERS, MathVerifier, score_math, shared_verifier
from cleaner.sandbox import connect

FILE_KINDS = ("math", "mcq", "code")
_CHUNK = 256  # records in flight at once: enough to keep the workers busy, bounded memory


def _scored_record(kind: str, record: dict[str, Any], verifier: MathVerifier) -> dict[str, Any]:
    if kind == "math":
        score = score_math(record["response"], record["answer"], verifier=verifier)
    else:
        score = score_choice(record["response"], record["answer"])
    return {**record, **_fields(score)}


def _fields(score: Score) -> dict[str, Any]:
    out = {
        "correct": score.correct,
        "score": score.score,
        "reward": score.reward,
        "predicted": score.predicted,
    }
    if score.note:
        out["note"] = score.note
    return out


def _checked(path: str | os.PathLike, kind: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, record in read_jsonl(path):
        if not isinstance(record.get("response"), str):
            raise RecordError("missing or not a string", path=path, line=lineno, field="response")
        if kind == "code":
            problem = _tests_problem(record.get("tests"))
            if problem:
                raise RecordError(problem, path=path, line=lineno, field="tests")
            yield lineno, record
            continue
        answer = record.get("answer")
        if (
            isinstance(answer, bool)
            or not isinstance(answer, (str, int, float))
            or str(answer).strip() == ""
        ):
            raise RecordError(
                "missing, empty or not a string or number", path=path, line=lineno, field="answer"
            )
        if kind == "mcq" and choice_letter(str(answer)) is None:
            raise RecordError(
                f"{answer!r} is not an option letter (A-D)",
                path=path,
                line=lineno,
                field="answer",
            )
        yield lineno, {**record, "answer": str(answer)}


def _tests_problem(tests: Any) -> str | None:
    """What is wrong with a code record's `tests`, None if nothing."""
    if not isinstance(tests, dict):
        return "missing or not an object"
    if tests.get("type") == "functional":
        for key in ("entry_point", "test"):
            if not isinstance(tests.get(key), str) or not tests[key].strip():
                return f"a functional test needs a non-empty {key!r} string"
        return None
    if tests.get("type") == "stdio":
        cases = tests.get("cases")
        if not isinstance(cases, list) or not cases:
            return "a stdio test needs a non-empty 'cases' list"
        if not all(isinstance(c, dict) and {"input", "output"} <= c.keys() for c in cases):
            return "every stdio case needs 'input' and 'output'"
        return None
    return "'type' must be functional or stdio"


def _score_code_file(
    in_path: str | os.PathLike, out_path: str | os.PathLike, timeout: float
) -> dict[str, Any]:
    count = correct = no_answer = timeouts = 0
    total = 0.0
    records = _checked(in_path, "code")

    async def run() -> None:
        nonlocal count, correct, no_answer, timeouts, total
        # The first chunk is read (and checked) before a sandbox starts; an empty file needs none.
        chunk = list(itertools.islice(records, _CHUNK))
        if not chunk:
            with atomic_writer(out_path):
                return
        async with connect() as sandbox:  # the service when CLEANER_SANDBOX_URL is set
            with atomic_writer(out_path) as out:
                while chunk:
                    scores = await asyncio.gather(
                        *(
                            score_code(r["response"], r["tests"], sandbox, timeout=timeout)
                            for _, r in chunk
                        )
                    )
                    for (_, record), score in zip(chunk, scores, strict=True):
                        fields = {"correct": score.correct, "score": score.score}
                        fields["reward"] = score.reward
                        if score.note:
                            fields["note"] = score.note
                        out.write(dump_line({**record, **fields}))
                        count += 1
                        correct += score.correct
                        total += score.score
                        no_answer += score.predicted is None
                        timeouts += "timeout" in score.note
                    chunk = list(itertools.islice(records, _CHUNK))

    asyncio.run(run())
    return {
        "kind": "code",
        "count": count,
        "correct": correct,
        "accuracy": correct / count if count else 0.0,
        "mean_score": total / count if count else 0.0,
        "no_answer": no_answer,
        "timeouts": timeouts,
    }


def score_file(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    kind: str,
    *,
    workers: int = DEFAULT_WORKERS,
    verifier: MathVerifier | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Score every `{"id", "response", "answer"}` line of `in_path` into `out_path`.

    `kind="code"` reads `{"id", "response", "tests"}` lines (tests as in `cleaner.data.problem`)
    and runs them in the sandbox (the service when CLEANER_SANDBOX_URL is set, else an embedded
    pool), `timeout` seconds a run: `score` is the fraction of tests passed, `correct` all of them,
    `reward` that fraction or -1 without a python block; the summary adds `mean_score`.

    Output lines are the input lines, in order, with `correct`, `score` (1 or 0), `reward`
    (+1 / -1), `predicted` (the extracted answer, null if none) and, when wrong, `note` added.
    The output appears only when every line was scored; a malformed line raises RecordError
    naming the file, line and field. Returns a summary: count, correct, accuracy, no_answer,
    timeouts.
    """
    if kind not in FILE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(FILE_KINDS)}; got {kind!r}")
    if kind == "code":
        return _score_code_file(in_path, out_path, timeout)
    verifier = verifier or shared_verifier()
    count = correct = no_answer = timeouts = 0
    records = _checked(in_path, kind)
    with atomic_writer(out_path) as out, ThreadPoolExecutor(max_workers=workers) as pool:
        while chunk := list(itertools.islice(records, _CHUNK)):
            for scored in pool.map(lambda item: _scored_record(kind, item[1], verifier), chunk):
                out.write(dump_line(scored))
                count += 1
                correct += scored["correct"]
                no_answer += scored["predicted"] is None
                timeouts += "timed out" in scored.get("note", "")
    return {
        "kind": kind,
        "count": count,
        "correct": correct,
        "accuracy": correct / count if count else 0.0,
        "no_answer": no_answer,
        "timeouts": timeouts,
    }
