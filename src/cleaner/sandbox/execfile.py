"""`cleaner exec`: run every code record of a JSONL file in the sandbox and write one result per id."""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass
from typing import Any

from cleaner.jsonl import RecordError, atomic_writer, dump_line, read_jsonl
from cleaner.sandbox.local import Limits, Sandbox
from cleaner.sandbox.result import ExecResult
from cleaner.sandbox.sync import connect


@dataclass
class Call:
    id: str | int
    code: str
    session: str | None
    stdin: str | None
    extra: dict[str, Any]


def read_calls(path: str | os.PathLike) -> list[Call]:
    """All records, validated before anything runs: a malformed line raises RecordError (file:line)."""
    calls, seen = [], set()
    for lineno, record in read_jsonl(path):
        ident = record.get("id")
        if not isinstance(ident, str | int) or isinstance(ident, bool):
            raise RecordError(
                "missing or not a string or integer", path=path, line=lineno, field="id"
            )
        if ident in seen:
            raise RecordError(f"duplicate id {ident!r}", path=path, line=lineno, field="id")
        seen.add(ident)
        code = record.get("code")
        if not isinstance(code, str):
            raise RecordError("missing or not a string", path=path, line=lineno, field="code")
        session = record.get("session")
        if session is not None and not isinstance(session, str | int):
            raise RecordError(
                "must be a string or integer", path=path, line=lineno, field="session"
            )
        stdin = record.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise RecordError("must be a string", path=path, line=lineno, field="stdin")
        extra = {k: v for k, v in record.items() if k not in ("id", "code", "session", "stdin")}
        session = None if session is None else str(session)
        calls.append(Call(ident, code, session, stdin, extra))
    return calls


def exec_file(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    timeout: float = 10.0,
    memory_mb: int = 2048,
    workers: int | None = None,
    isolation: str = "auto",
    progress: bool = False,
    url: str | None = None,
) -> dict[str, Any]:
    """Run IN's records and write OUT (atomically): one line per input id, in input order.

    Lines of one session run in order in one interpreter; sessions and stateless calls run in
    parallel. With `url` (or CLEANER_SANDBOX_URL set) the calls go to that sandbox service. Returns a summary: {"calls", "seconds", "isolation", "status": {status: count}}.
    """
    calls = read_calls(in_path)
    return asyncio.run(
        _exec_calls(
            calls,
            out_path,
            Limits(timeout=timeout, memory_mb=memory_mb),
            workers,
            isolation,
            progress,
            url,
        )
    )


async def _exec_calls(calls, out_path, limits, workers, isolation, progress, url) -> dict[str, Any]:
    start = time.monotonic()
    sandbox = connect(url, workers=workers, isolation=isolation, limits=limits)
    results: list[ExecResult | None] = [None] * len(calls)
    # A group is one session's calls (in order) or one stateless call.
    groups: dict[Any, list[int]] = collections.defaultdict(list)
    for index, call in enumerate(calls):
        groups[("session", call.session) if call.session is not None else ("call", index)].append(
            index
        )
    # Enough groups in flight to keep every worker busy; a remote service bounds itself.
    in_flight = asyncio.Semaphore(2 * len(sandbox.workers) if isinstance(sandbox, Sandbox) else 64)
    bar = ProgressBar(len(calls)) if progress else None

    async def run_group(key, indices: list[int]) -> None:
        async with in_flight:
            session = f"exec:{key[1]}" if key[0] == "session" else None
            for index in indices:
                call = calls[index]
                results[index] = await sandbox.run(
                    call.code, session=session, timeout=limits.timeout, stdin=call.stdin
                )
                if bar:
                    bar.advance()
            if session is not None:
                await sandbox.close_session(session)

    try:
        await sandbox.start()
        await asyncio.gather(*(run_group(key, indices) for key, indices in groups.items()))
    finally:
        await sandbox.close()
        if bar:
            bar.stop()
    counts: collections.Counter[str] = collections.Counter()
    with atomic_writer(out_path) as out:
        for call, result in zip(calls, results, strict=True):
            assert result is not None
            counts[result.status] += 1
            line = {"id": call.id, **call.extra, **result.to_dict()}
            if call.session is not None:
                line["session"] = call.session
            else:
                line.pop("session", None)
            out.write(dump_line(line))
    return {
        "calls": len(calls),
        "seconds": round(time.monotonic() - start, 3),
        "isolation": results[0].isolation if results else None,
        "status": dict(counts),
    }


class ProgressBar:
    """A rich progress bar on stderr (the caller decides whether it is a terminal)."""

    def __init__(self, total: int):
        from rich.progress import Progress

        self.progress = Progress(transient=True)
        self.task = self.progress.add_task("exec", total=total)
        self.progress.start()

    def advance(self) -> None:
        self.progress.advance(self.task)

    def stop(self) -> None:
        self.progress.stop()
