"""Rows from JSONL, Parquet or a `datasets` folder, and problems from rows through a declared field mapping.

Errors name the file, the row (JSONL: its line; tables: 1 for the first row) and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cleaner.data.problem import Problem
from cleaner.jsonl import RecordError, read_jsonl

Column = str | tuple[str, ...]
"""A column name; `a.b` reaches into a struct (or JSON-string) column; a tuple lists alternatives."""


def read_rows(
    path: str | os.PathLike, *, split: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (row number, row) from a `.jsonl` file, a `.parquet` file or a `datasets.save_to_disk` folder."""
    path = Path(path)
    if path.is_dir():
        yield from _read_datasets_folder(path, split)
    elif path.suffix == ".parquet":
        yield from _read_parquet(path)
    elif path.suffix == ".jsonl":
        yield from read_jsonl(path)
    elif not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    else:
        raise RecordError(
            "unknown format: expected .jsonl, .parquet or a datasets folder", path=path
        )


def _read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends for a file that is not Parquet
        raise RecordError(f"not a readable Parquet file ({e})", path=path) from None
    row = 0
    for batch in table.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            row += 1
            yield row, record


def _read_datasets_folder(path: Path, split: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise RecordError(
            "reading a datasets folder needs the `datasets` package "
            "(pip install 'cleaner[datasets]')",
            path=path,
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise RecordError(
            f"not a datasets folder (written by save_to_disk): {e}", path=path
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None and len(loaded) == 1:
            split = next(iter(loaded))
        if split not in loaded:
            raise RecordError(f"choose a split: {', '.join(loaded)}", path=path, field="split")
        loaded = loaded[split]
    yield from enumerate(loaded, start=1)


def column(record: Mapping[str, Any], name: Column, *, required: bool = True) -> Any:
    """The value of `name` in `record` (RecordError with the field name when it is missing)."""
    for candidate in (name,) if isinstance(name, str) else name:
        value: Any = record
        for part in candidate.split("."):
            if isinstance(value, str) and value.lstrip().startswith("{"):
                value = _json(value, candidate)
            if not isinstance(value, Mapping) or part not in value:
                value = None
                break
            value = value[part]
        if value is not None:
            return value
    if required:
        names = name if isinstance(name, str) else " or ".join(name)
        raise RecordError("missing", field=names)
    return None


def json_value(value: Any, field: str) -> Any:
    """A column that holds JSON text (the LiveCodeBench parquet stores dicts so) as Python data."""
    return _json(value, field) if isinstance(value, str) else value


def _json(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"invalid JSON ({e.msg} at column {e.colno})", field=field) from None


def text(record: Mapping[str, Any], name: Column) -> str:
    """A required, non-empty text (or number) column, as a string."""
    value = column(record, name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int, float))
        or not str(value).strip()
    ):
        label = name if isinstance(name, str) else " or ".join(name)
        raise RecordError(f"expected non-empty text, got {type(value).__name__}", field=label)
    return str(value)


def rows_to_problems(
    path: str | os.PathLike,
    make: Callable[[int, dict[str, Any]], Problem],
    *,
    split: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Build one problem a row with `make(row_number, row)`, naming file and row on any RecordError."""
    problems = []
    for row, record in read_rows(path, split=split):
        if limit is not None and len(problems) >= limit:
            break
        try:
            problems.append(make(row, record))
        except RecordError as e:
            raise RecordError(e.reason, path=path, line=row, field=e.field) from None
    return problems


def load_table(
    path: str | os.PathLike,
    *,
    kind: str,
    fields: Mapping[str, Column],
    prompt: Callable[[str], str] | None = None,
    source: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Problems from any table, with a declared field mapping.

    `fields` maps `question` (required: text, or a list of chat messages used as is), `answer`
    (math, mcq), `tests` (code: a dict or JSON text in the Problem tests shape) and `id` (optional;
    default `<source>/<row index from 0>`) to column names. `prompt` turns the question text into
    the user message (default: the text as is).
    """
    unknown = set(fields) - {"question", "answer", "tests", "id"}
    if unknown or "question" not in fields:
        raise ValueError(
            f"fields needs 'question' and may have answer, tests, id; got {sorted(fields)}"
        )
    source = source or Path(path).stem

    def make(row: int, record: dict[str, Any]) -> Problem:
        question = column(record, fields["question"])
        if isinstance(question, list):
            messages = question
        else:
            question = text(record, fields["question"])
            messages = [{"role": "user", "content": prompt(question) if prompt else question}]
        ident = column(record, fields["id"], required=False) if "id" in fields else None
        answer = text(record, fields["answer"]) if "answer" in fields else None
        tests = json_value(column(record, fields["tests"]), "tests") if "tests" in fields else None
        return Problem(
            id=str(ident) if ident is not None else f"{source}/{row - 1}",
            kind=kind,
            prompt=messages,
            answer=answer,
            tests=tests,
            source=source,
        )

    return rows_to_problems(path, make, split=split, limit=limit)
