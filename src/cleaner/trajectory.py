"""The trajectory: the one currency that flows through rollout, purification, reward and training.

Message level, as in SPEC section 3 (`cleaner.trajectory/1`): a prompt, then turns of
(reasoning, code, observation). Every record type keeps the keys it does not know in `extra`, and
writes them back, so tools that rewrite records never lose what another tool added.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cleaner.jsonl import RecordError, read_jsonl

SCHEMA = "cleaner.trajectory/1"

STATUSES = ("ok", "error", "timeout", "killed", "invalid")
"""`ok`; `error`: an exception (`error_type` names it); `timeout`; `killed`: memory, output cap or
signal (`reason` says which); `invalid`: the tool call could not be parsed."""

TURN_ORIGINS = ("sampled", "shallow", "deep")
"""How a turn came to be: sampled as is, or the result of a shallow or deep SAAR graft."""

GRAFT_KINDS = ("shallow", "deep")


class _Fields:
    """Typed access to one JSON object, with errors that name the field's full path."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise RecordError(f"expected an object, got {_json_type(data)}", field=where or None)
        self.data, self.where, self.used = data, where, set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(
        self,
        key: str,
        types: type | tuple[type, ...],
        *,
        required: bool = False,
        default: Any = None,
    ):
        self.used.add(key)
        if key not in self.data:
            if required:
                raise RecordError("missing", field=self.path(key))
            return default
        value = self.data[key]
        if value is None and not required:
            return default
        # bool is an int in Python; JSON true is not a number.
        if not isinstance(value, types) or (
            isinstance(value, bool) and bool not in _as_tuple(types)
        ):
            names = " or ".join(_type_name(t) for t in _as_tuple(types))
            raise RecordError(f"expected {names}, got {_json_type(value)}", field=self.path(key))
        return value

    def choice(
        self,
        key: str,
        choices: tuple[str, ...],
        *,
        required: bool = False,
        default: str | None = None,
    ):
        value = self.get(key, str, required=required, default=default)
        if value is not None and value not in choices:
            raise RecordError(
                f"must be one of {', '.join(choices)}; got {value!r}", field=self.path(key)
            )
        return value

    def extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.used}


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _type_name(t: type) -> str:
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        list: "array",
        dict: "object",
    }.get(t, t.__name__)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _type_name(type(value))


@dataclass
class Observation:
    """What the tool returned for one call; decided by the host, never trusted from the sandbox."""

    status: str
    stdout: str = ""
    stderr: str = ""
    error_type: str | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_dict(cls, data: Any, where: str = "observation") -> Observation:
        f = _Fields(data, where)
        return cls(
            status=f.choice("status", STATUSES, required=True),
            stdout=f.get("stdout", str, default=""),
            stderr=f.get("stderr", str, default=""),
            error_type=f.get("error_type", str),
            reason=f.get("reason", str),
            extra=f.extra(),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "stdout": self.stdout, "stderr": self.stderr}
        if self.error_type is not None:
            out["error_type"] = self.error_type
        if self.reason is not None:
            out["reason"] = self.reason
        return {**out, **self.extra}


@dataclass
class Turn:
    """One assistant message: reasoning, an optional tool call (code) and what the tool returned."""

    reasoning: str
    code: str | None = None
    observation: Observation | None = None
    origin: str | None = None
    """`sampled`, `shallow` or `deep` once purified; None on a raw record."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """A tool call whose observation is not `ok` (exception, timeout, killed, malformed call)."""
        return self.code is not None and self.observation is not None and not self.observation.ok

    @classmethod
    def from_dict(cls, data: Any, where: str = "turn") -> Turn:
        f = _Fields(data, where)
        obs = f.get("observation", dict)
        turn = cls(
            reasoning=f.get("reasoning", str, default=""),
            code=f.get("code", str),
            observation=None if obs is None else Observation.from_dict(obs, f.path("observation")),
            origin=f.choice("origin", TURN_ORIGINS),
            extra=f.extra(),
        )
        if turn.code is None and turn.observation is not None:
            raise RecordError(
                "an observation needs a tool call (code is null)", field=f.path("observation")
            )
        return turn

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reasoning": self.reasoning,
            "code": self.code,
            "observation": None if self.observation is None else self.observation.to_dict(),
        }
        if self.origin is not None:
            out["origin"] = self.origin
        return {**out, **self.extra}


@dataclass
class Graft:
    """One SAAR graft: which output turn it replaced, how, how similar the codes were, which attempt."""

    turn: int
    kind: str
    similarity: float
    attempt: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Graft:
        f = _Fields(data, where)
        return cls(
            turn=f.get("turn", int, required=True),
            kind=f.choice("kind", GRAFT_KINDS, required=True),
            similarity=float(f.get("similarity", (int, float), required=True)),
            attempt=f.get("attempt", int, required=True),
            extra=f.extra(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "kind": self.kind,
            "similarity": self.similarity,
            "attempt": self.attempt,
            **self.extra,
        }


@dataclass
class SaarRecord:
    """What SAAR did to a trajectory: whether it was active, every graft, and whether it gave up."""

    active: bool = True
    grafts: list[Graft] = field(default_factory=list)
    gave_up: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str = "saar") -> SaarRecord:
        f = _Fields(data, where)
        grafts = f.get("grafts", list, default=[])
        return cls(
            active=f.get("active", bool, default=True),
            grafts=[Graft.from_dict(g, f"{f.path('grafts')}[{i}]") for i, g in enumerate(grafts)],
            gave_up=f.get("gave_up", bool, default=False),
            extra=f.extra(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "active": self.active,
            "grafts": [g.to_dict() for g in self.grafts],
            "gave_up": self.gave_up,
            **self.extra,
        }


@dataclass
class Trajectory:
    """A prompt and the turns the model took on it; optionally an answer, a reward and a SAAR record."""

    id: str
    prompt: list[dict[str, Any]]
    turns: list[Turn]
    answer: str | None = None
    reward: float | None = None
    saar: SaarRecord | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_calls(self) -> int:
        return sum(t.failed for t in self.turns)

    @property
    def tool_calls(self) -> int:
        return sum(t.code is not None for t in self.turns)

    @classmethod
    def from_dict(cls, data: Any) -> Trajectory:
        f = _Fields(data, "")
        schema = f.get("schema", str, default=SCHEMA)
        if schema != SCHEMA:
            raise RecordError(f"unsupported schema {schema!r}; expected {SCHEMA!r}", field="schema")
        ident = f.get("id", (str, int), required=True)
        prompt = f.get("prompt", list, required=True)
        for i, message in enumerate(prompt):
            m = _Fields(message, f"prompt[{i}]")
            m.get("role", str, required=True)
        turns = f.get("turns", list, required=True)
        answer = f.get("answer", (str, int, float))
        reward = f.get("reward", (int, float))
        saar = f.get("saar", dict)
        return cls(
            id=str(ident),
            prompt=prompt,
            turns=[Turn.from_dict(t, f"turns[{i}]") for i, t in enumerate(turns)],
            answer=None if answer is None else str(answer),
            reward=None if reward is None else float(reward),
            saar=None if saar is None else SaarRecord.from_dict(saar),
            extra=f.extra(),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "schema": SCHEMA,
            "prompt": self.prompt,
            "turns": [t.to_dict() for t in self.turns],
            "answer": self.answer,
            "reward": self.reward,
        }
        if self.saar is not None:
            out["saar"] = self.saar.to_dict()
        return {**out, **self.extra}


def read_trajectories(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Stream trajectories from a JSONL file; a malformed record raises RecordError naming file and line."""
    for lineno, record in read_jsonl(path):
        try:
            yield Trajectory.from_dict(record)
        except RecordError as e:
            raise RecordError(e.reason, path=path, line=lineno, field=e.field) from None
