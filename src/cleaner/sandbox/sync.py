"""Choosing the embedded pool or the service, and a blocking wrapper for code without an event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from cleaner.sandbox.local import Sandbox
from cleaner.sandbox.result import ExecResult
from cleaner.sandbox.service import RemoteSandbox

URL_VARIABLE = "CLEANER_SANDBOX_URL"


def connect(url: str | None = None, **options: Any) -> Sandbox | RemoteSandbox:
    """The service client when a URL is given (or set in CLEANER_SANDBOX_URL), else an embedded pool.

    `options` are `Sandbox`'s keyword arguments; they are ignored by the client (the server has its own).
    """
    url = url or os.environ.get(URL_VARIABLE)
    if url:
        return RemoteSandbox(url)
    return Sandbox(**options)


class SyncSandbox:
    """The same API, blocking: runs the async sandbox on a private event loop in a background thread.

    >>> with SyncSandbox() as sb:
    ...     sb.run("print(6 * 7)").stdout
    '42\\n'
    """

    def __init__(self, sandbox: Sandbox | RemoteSandbox | None = None, **options: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="cleaner-sandbox", daemon=True
        )
        self._thread.start()
        # Built on the loop's thread: asyncio objects belong to the loop that made them.
        self.sandbox = sandbox if sandbox is not None else self._call(_build(options))

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, code: str, **kwargs: Any) -> ExecResult:
        return self._call(self.sandbox.run(code, **kwargs))

    def snapshot(self, session: str) -> int:
        return self._call(self.sandbox.snapshot(session))

    def restore(self, session: str, token: int) -> None:
        self._call(self.sandbox.restore(session, token))

    def release(self, session: str, token: int) -> None:
        self._call(self.sandbox.release(session, token))

    def close_session(self, session: str) -> None:
        self._call(self.sandbox.close_session(session))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self.sandbox.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


async def _build(options: dict[str, Any]) -> Sandbox | RemoteSandbox:
    return connect(**options)
