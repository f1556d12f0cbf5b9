"""What every tool-call format shares: the parse result, incremental call detection, tool output text."""

from __future__ import annotations

from dataclasses import dataclass

from cleaner.trajectory import Observation

TOOL_NAME = "code_interpreter"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}
"""The tool as the chat template shows it to the model (the authors' `rstar_code_judge.yaml`)."""

DEFAULT_MAX_OBSERVATION_CHARS = 256
"""Tool output shown to the model keeps this many characters, head and tail (the reference recipes)."""


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant message split into reasoning and tool call.

    `code` is None for a final-answer turn. A call that was opened but cannot be parsed keeps its raw
    text in `code` and says why in `invalid`: the rollout turns it into an `invalid` observation,
    never an exception.
    """

    reasoning: str
    code: str | None
    invalid: str | None = None


def split_call(text: str, opener: str, closer: str) -> tuple[str, str | None, bool]:
    """(reasoning before the first call, the call's body or None without a call, whether it closed).
    An unclosed call's body runs to the end of the text."""
    at = text.find(opener)
    if at < 0:
        return text, None, False
    start = at + len(opener)
    end = text.find(closer, start)
    return text[:at].rstrip(), text[start:] if end < 0 else text[start:end], end >= 0


class CallDetector:
    """Finds the moment a complete tool call has been generated, fed one text delta at a time.

    Each delta is scanned once (plus a lookback the length of the closing marker), so detection stays
    linear in the generated text however it is chunked.
    """

    def __init__(self, opener: str, closer: str):
        self.opener, self.closer = opener, closer
        self.text = ""
        self._scanned = 0  # text[:_scanned] holds no complete call
        self._open_at: int | None = None
        self.end: int | None = None  # offset just past the first complete call, once seen

    def feed(self, delta: str) -> int | None:
        """Append generated text; return the end offset of the first complete call, if there is one."""
        if self.end is not None:
            return self.end
        self.text += delta
        if self._open_at is None:
            start = max(0, self._scanned - len(self.opener) + 1)
            at = self.text.find(self.opener, start)
            if at < 0:
                self._scanned = len(self.text)
                return None
            self._open_at = at
            self._scanned = at + len(self.opener)
        start = max(self._open_at + len(self.opener), self._scanned - len(self.closer) + 1)
        at = self.text.find(self.closer, start)
        if at < 0:
            self._scanned = len(self.text)
            return None
        self.end = at + len(self.closer)
        return self.end

    @property
    def call_open(self) -> bool:
        """A call has started but not finished (a generation that stops here made a malformed call)."""
        return self._open_at is not None and self.end is None


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of `text` within `max_chars`, saying how much was cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n... ({len(text) - max_chars} characters omitted) ...\n{text[len(text) - tail :]}"


def observation_text(obs: Observation, max_chars: int = DEFAULT_MAX_OBSERVATION_CHARS) -> str:
    """The text the model reads for one tool result.

    Success shows stdout (and stderr, where warnings go); an empty success says so instead of showing
    nothing, because silent tool output is a known way for models to lose track. A failure shows the
    error text (exception type, line and message) and never the harness's own traceback.
    """
    if obs.ok:
        text = obs.stdout + (obs.stderr if obs.stderr else "")
        if not text.strip():
            text = "[executed successfully with no output; use print() to show values]"
    else:
        text = obs.stderr or obs.stdout
        if not text.strip():
            text = {
                "timeout": "TimeoutError: execution time limit exceeded",
                "killed": f"Killed: {obs.reason or 'resource limit exceeded'}",
                "invalid": "InvalidToolCall: the tool call could not be parsed",
            }.get(obs.status, f"{obs.error_type or 'Error'}")
    return truncate_middle(text, max_chars)
