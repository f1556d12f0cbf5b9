"""JSONL in and out: streaming reads that name file and line, writes that leave no partial file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class RecordError(ValueError):
    """A malformed input record; the message names the file, the line and the field."""

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        line: int | None = None,
        field: str | None = None,
    ):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = ":".join(str(p) for p in (path, line) if p is not None)
        what = f"{field}: {message}" if field else message
        super().__init__(f"{where}: {what}" if where else what)


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; one line in memory at a time."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(
                    f"invalid JSON ({e.msg} at column {e.colno})", path=path, line=lineno
                ) from None
            if not isinstance(record, dict):
                kind = {
                    list: "array",
                    str: "string",
                    int: "number",
                    float: "number",
                    bool: "boolean",
                }.get(type(record), "null")
                raise RecordError(f"expected a JSON object, got {kind}", path=path, line=lineno)
            yield lineno, record


def dump_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[TextIO]:
    """Write to a temporary file beside `path` and rename it into place only on success.

    On any exception the temporary file is removed, so a failed run never leaves a partial output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
