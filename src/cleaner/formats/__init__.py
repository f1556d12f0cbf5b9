"""Tool-call formats: parse an assistant message incrementally, render turns and tool results."""

from __future__ import annotations

from cleaner.formats.base import (
    DEFAULT_MAX_OBSERVATION_CHARS,
    TOOL_NAME,
    TOOL_SCHEMA,
    CallDetector,
    ParsedTurn,
    observation_text,
    truncate_middle,
)
from cleaner.formats.hermes import HermesFormat
from cleaner.formats.markdown import MarkdownFormat

FORMATS = {"hermes": HermesFormat, "markdown": MarkdownFormat}


def get_format(name: str) -> HermesFormat | MarkdownFormat:
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r}; choose one of {', '.join(FORMATS)}"
        ) from None


__all__ = [
    "DEFAULT_MAX_OBSERVATION_CHARS",
    "TOOL_NAME",
    "TOOL_SCHEMA",
    "CallDetector",
    "ParsedTurn",
    "HermesFormat",
    "MarkdownFormat",
    "FORMATS",
    "get_format",
    "observation_text",
    "truncate_middle",
]
