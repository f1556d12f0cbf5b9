"""What one run returns: a structured result decided by the host, never a string to pattern-match."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from cleaner.trajectory import Observation

# Keys that Observation holds itself; everything else of a result goes to Observation.extra.
_OBSERVATION_KEYS = ("status", "stdout", "stderr", "error_type", "reason")


@dataclass
class ExecResult:
    """One cell's outcome.

    status: `ok`; `error` (an exception: `error_type`, `line`, and the user-frame traceback at the end
    of `stderr`); `timeout`; `killed` (`reason`: memory, output limit, a signal, the worker died);
    `invalid` (the call could not be run, e.g. the code was not a string).
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    error_type: str | None = None
    reason: str | None = None
    line: int | None = None
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    isolation: str = ""
    session: str | None = None
    session_started: bool = False
    """This cell ran in a fresh interpreter (the session's first cell, or the first after a loss)."""
    state_lost: bool = False
    """The session's earlier state is gone: this cell's interpreter died (timeout, kill, exit; the next
    cell starts fresh), or it was found dead before this cell, which then ran in a fresh one."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """All fields; None and False flags are left out to keep JSONL lines short."""
        always = ("status", "stdout", "stderr", "duration_s", "isolation")
        return {
            key: value
            for key, value in asdict(self).items()
            if key in always or (value is not None and value is not False)
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_observation(self) -> Observation:
        """The trajectory's view of this result; line, duration, flags and isolation go to `extra`."""
        data = self.to_dict()
        data.pop("session", None)
        extra = {k: v for k, v in data.items() if k not in _OBSERVATION_KEYS}
        return Observation(
            status=self.status,
            stdout=self.stdout,
            stderr=self.stderr,
            error_type=self.error_type,
            reason=self.reason,
            extra=extra,
        )
