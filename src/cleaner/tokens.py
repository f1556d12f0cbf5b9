"""The trajectory at token level: what the trainer consumes.

A token trajectory is the message-level `Trajectory` plus the exact token ids the model saw, as
segments. Each segment says where its tokens came from (`origin`), which decides the loss mask:
only tokens the model sampled (`sampled`, or grafted in by SAAR: `shallow`, `deep`) are trained on;
prompt, chat-template and tool-output tokens are not. Segments are spliced, never rebuilt by
re-tokenizing rendered text (the source of chat-template drift bugs in every framework that did).

On disk a token trajectory is an ordinary `cleaner.trajectory/1` record with an extra `tokens` key,
so every message-level tool reads it and keeps the tokens, and the conversion is lossless both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cleaner.jsonl import RecordError
from cleaner.trajectory import Trajectory

SEGMENT_ORIGINS = ("prompt", "template", "tool", "sampled", "shallow", "deep")
TRAINED_ORIGINS = frozenset({"sampled", "shallow", "deep"})


@dataclass
class Segment:
    """A run of tokens with one origin.

    `logprobs` are the sampling log-probabilities, one per token, for model-sampled segments. For a
    grafted segment they are the log-probs under which the correction was actually sampled (with the
    error in context), which is what the trainer needs to measure how much purification shifts them.
    `turn` is the index of the message-level turn the tokens belong to (None for the prompt).
    """

    origin: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    turn: int | None = None

    def __post_init__(self):
        if self.origin not in SEGMENT_ORIGINS:
            raise ValueError(
                f"segment origin must be one of {', '.join(SEGMENT_ORIGINS)}; got {self.origin!r}"
            )
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} log-probs for {len(self.token_ids)} tokens")

    @property
    def trained(self) -> bool:
        return self.origin in TRAINED_ORIGINS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"origin": self.origin, "token_ids": self.token_ids}
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.turn is not None:
            out["turn"] = self.turn
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Segment:
        if not isinstance(data, dict):
            raise RecordError("expected an object", field=where)
        ids = data.get("token_ids")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise RecordError("expected an array of integers", field=f"{where}.token_ids")
        logprobs = data.get("logprobs")
        if logprobs is not None and (
            not isinstance(logprobs, list) or not all(isinstance(x, (int, float)) for x in logprobs)
        ):
            raise RecordError("expected an array of numbers", field=f"{where}.logprobs")
        turn = data.get("turn")
        if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool)):
            raise RecordError("expected an integer", field=f"{where}.turn")
        try:
            return cls(
                data.get("origin"),
                ids,
                None if logprobs is None else [float(x) for x in logprobs],
                turn,
            )
        except ValueError as e:
            raise RecordError(str(e), field=where) from None


@dataclass
class TokenTrajectory:
    """A message-level trajectory and the exact tokens behind it."""

    trajectory: Trajectory
    segments: list[Segment] = field(default_factory=list)

    def append(
        self,
        origin: str,
        token_ids: list[int],
        logprobs: list[float] | None = None,
        turn: int | None = None,
    ) -> None:
        if token_ids:
            self.segments.append(Segment(origin, list(token_ids), logprobs, turn))

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [int(s.trained) for s in self.segments for _ in s.token_ids]

    @property
    def origins(self) -> list[str]:
        return [s.origin for s in self.segments for _ in s.token_ids]

    @property
    def sampling_logprobs(self) -> list[float | None]:
        """Per token: the log-prob it was sampled with, None where there is none (prompt, tool...)."""
        out: list[float | None] = []
        for s in self.segments:
            out.extend(s.logprobs if s.logprobs is not None else [None] * len(s.token_ids))
        return out

    @property
    def prompt_length(self) -> int:
        """Tokens before the first model-sampled one."""
        n = 0
        for s in self.segments:
            if s.trained:
                break
            n += len(s.token_ids)
        return n

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.trajectory.to_dict(),
            "tokens": {"segments": [s.to_dict() for s in self.segments]},
        }

    @classmethod
    def from_dict(cls, data: Any) -> TokenTrajectory:
        if not isinstance(data, dict):
            raise RecordError("expected an object")
        tokens = data.get("tokens")
        if not isinstance(tokens, dict) or not isinstance(tokens.get("segments"), list):
            raise RecordError("a token trajectory needs tokens.segments", field="tokens")
        record = {k: v for k, v in data.items() if k != "tokens"}
        trajectory = Trajectory.from_dict(record)
        segments = [
            Segment.from_dict(s, f"tokens.segments[{i}]") for i, s in enumerate(tokens["segments"])
        ]
        for i, s in enumerate(segments):
            if s.turn is not None and not 0 <= s.turn < len(trajectory.turns):
                raise RecordError(
                    f"turn {s.turn} does not exist ({len(trajectory.turns)} turns)",
                    field=f"tokens.segments[{i}].turn",
                )
        return cls(trajectory, segments)
