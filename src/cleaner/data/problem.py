"""The task a rollout consumes: a prompt, and what the response is graded against."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cleaner.jsonl import RecordError, atomic_writer, dump_line, read_jsonl

KINDS = ("math", "mcq", "code", "gym")
"""`math`: boxed answer vs `answer` (math-verify); `mcq`: boxed option letter vs `answer`;
`code`: the last fenced python block run against `tests`; `gym`: boxed answer graded by the
reasoning-gym task's scorer (`metadata["task"]`, `metadata["entry"]`)."""

TEST_TYPES = ("functional", "stdio")
"""`functional`: `{"type": "functional", "entry_point", "test"}` (HumanEval's fields: `test` defines
`check(candidate)`); `stdio`: `{"type": "stdio", "cases": [{"input", "output"}, ...]}`. Loaders may
add keys (`fn_name`, `import_prefix`) that a code grader can use."""


@dataclass
class Problem:
    id: str
    kind: str
    prompt: list[dict[str, Any]]
    """Chat messages, as the reference recipes give them: one user message carrying all instructions."""
    answer: str | None = None
    tests: dict[str, Any] | None = None
    source: str = ""
    """The benchmark or `data_source` the problem came from."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RecordError(f"must be one of {', '.join(KINDS)}; got {self.kind!r}", field="kind")
        if self.kind == "code":
            if not isinstance(self.tests, dict) or self.tests.get("type") not in TEST_TYPES:
                raise RecordError(
                    f"a code problem needs tests of type {' or '.join(TEST_TYPES)}", field="tests"
                )
        elif self.answer is None or not str(self.answer).strip():
            raise RecordError(f"a {self.kind} problem needs a reference answer", field="answer")
        if self.kind == "gym" and not {"task", "entry"} <= self.metadata.keys():
            raise RecordError(
                "a gym problem needs metadata.task and metadata.entry", field="metadata"
            )
        if not self.prompt or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in self.prompt
        ):
            raise RecordError(
                "must be a non-empty list of {role, content} messages", field="prompt"
            )

    @property
    def question(self) -> str:
        """The text of the last user message."""
        return next(m["content"] for m in reversed(self.prompt) if m["role"] == "user")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "prompt": self.prompt,
            "answer": self.answer,
            "tests": self.tests,
            "source": self.source,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        for key, types in (("id", (str, int)), ("kind", str), ("prompt", list)):
            if not isinstance(data.get(key), types):
                raise RecordError("missing or of the wrong type", field=key)
        answer = data.get("answer")
        return cls(
            id=str(data["id"]),
            kind=data["kind"],
            prompt=data["prompt"],
            answer=None if answer is None else str(answer),
            tests=data.get("tests"),
            source=str(data.get("source") or ""),
            metadata=dict(data.get("metadata") or {}),
        )


def read_problems(path: str | os.PathLike) -> Iterator[Problem]:
    """Stream problems from a JSONL file written by `write_problems`."""
    for lineno, record in read_jsonl(path):
        try:
            yield Problem.from_dict(record)
        except RecordError as e:
            raise RecordError(e.reason, path=path, line=lineno, field=e.field) from None


def write_problems(problems: Iterable[Problem], path: str | os.PathLike) -> int:
    """Write problems as JSONL (all or nothing); returns how many."""
    count = 0
    with atomic_writer(path) as out:
        for problem in problems:
            out.write(dump_line(problem.to_dict()))
            count += 1
    return count
