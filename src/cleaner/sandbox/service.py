"""The sandbox as an HTTP service (`cleaner sandbox serve`), and the client that speaks to it.

Endpoints (JSON in, JSON out; the bodies mirror `Sandbox`'s methods):

    POST /run            {"code", "session"?, "timeout"?, "print_last_expr"?, "stdin"?} -> an ExecResult
    POST /snapshot       {"session"}            -> {"token"}
    POST /restore        {"session", "token"}   -> {} or 410 {"error"} when the snapshot is gone
    POST /release        {"session", "token"}   -> {}
    POST /close_session  {"session"}            -> {}
    GET  /health                                -> {"isolation", "workers", "sessions", "in_flight"}

Bounded concurrency: at most `max_in_flight` requests are admitted; beyond that the service answers
503 at once instead of queueing without bound. A call's timeout is clamped to `max_timeout`. The
client retries a refused or failed connection a few times with backoff, never without bound, then
raises `SandboxUnavailable`: an unreachable sandbox is an infrastructure failure, not model behaviour,
so it is not turned into a result the model would be trained on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
from aiohttp import web

from cleaner.sandbox.local import Limits, Sandbox, SnapshotLost
from cleaner.sandbox.result import ExecResult

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """The sandbox service could not be reached or refused the call after the allowed retries."""


# ---------------------------------------------------------------------------- server


def make_app(
    sandbox: Sandbox, *, max_in_flight: int = 256, max_timeout: float = 60.0
) -> web.Application:
    """The aiohttp application serving `sandbox`; the sandbox is closed with the application."""
    in_flight = 0

    async def admitted(call):
        """Run `call()` if there is room, else refuse at once (503) rather than queue without bound."""
        nonlocal in_flight
        if in_flight >= max_in_flight:
            raise web.HTTPServiceUnavailable(text="busy")
        in_flight += 1
        try:
            return await call()
        finally:
            in_flight -= 1

    async def body(request: web.Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"invalid JSON: {e}") from None
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(text="expected a JSON object")
        return data

    def session_of(data: dict[str, Any], required: bool = True) -> str | None:
        session = data.get("session")
        if session is None and not required:
            return None
        if not isinstance(session, str):
            raise web.HTTPBadRequest(text="session must be a string")
        return session

    def token_of(data: dict[str, Any]) -> int:
        token = data.get("token")
        if not isinstance(token, int) or isinstance(token, bool):
            raise web.HTTPBadRequest(text="token must be an integer")
        return token

    async def run(request: web.Request) -> web.Response:
        data = await body(request)
        timeout = data.get("timeout")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise web.HTTPBadRequest(text="timeout must be a positive number")
        timeout = min(timeout or sandbox.limits.timeout, max_timeout)
        print_last_expr = data.get("print_last_expr")
        result = await admitted(
            lambda: sandbox.run(
                data.get("code"),
                session=session_of(data, required=False),
                timeout=timeout,
                print_last_expr=bool(print_last_expr) if print_last_expr is not None else None,
                stdin=data.get("stdin"),
            ),
        )
        return web.json_response(result.to_dict())

    async def snapshot(request: web.Request) -> web.Response:
        data = await body(request)
        token = await admitted(lambda: sandbox.snapshot(session_of(data)))
        return web.json_response({"token": token})

    async def restore(request: web.Request) -> web.Response:
        data = await body(request)
        try:
            await admitted(lambda: sandbox.restore(session_of(data), token_of(data)))
        except SnapshotLost as e:
            return web.json_response({"error": str(e)}, status=410)
        return web.json_response({})

    async def release(request: web.Request) -> web.Response:
        data = await body(request)
        await sandbox.release(session_of(data), token_of(data))
        return web.json_response({})

    async def close_session(request: web.Request) -> web.Response:
        data = await body(request)
        await sandbox.close_session(session_of(data))
        return web.json_response({})

    async def health(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "isolation": sandbox.isolation.describe(),
                "workers": len(sandbox.workers),
                "sessions": len(sandbox.sessions),
                "in_flight": in_flight,
            }
        )

    async def on_startup(app: web.Application) -> None:
        await sandbox.start()

    async def on_cleanup(app: web.Application) -> None:
        await sandbox.close()

    app = web.Application(client_max_size=16 << 20)
    app.add_routes(
        [
            web.post("/run", run),
            web.post("/snapshot", snapshot),
            web.post("/restore", restore),
            web.post("/release", release),
            web.post("/close_session", close_session),
            web.get("/health", health),
        ]
    )
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def serve(
    host: str = "127.0.0.1",
    port: int = 8470,
    *,
    workers: int | None = None,
    timeout: float = 10.0,
    memory_mb: int = 2048,
    isolation: str = "auto",
    print_last_expr: bool = False,
    max_in_flight: int = 256,
) -> None:
    """Run the sandbox service until interrupted (blocking): `cleaner sandbox serve`."""
    sandbox = Sandbox(
        workers=workers,
        isolation=isolation,
        limits=Limits(timeout=timeout, memory_mb=memory_mb),
        print_last_expr=print_last_expr,
    )
    log.info(
        "sandbox service on http://%s:%d (isolation %s)", host, port, sandbox.isolation.describe()
    )
    web.run_app(make_app(sandbox, max_in_flight=max_in_flight), host=host, port=port, print=None)


# ---------------------------------------------------------------------------- client


class RemoteSandbox:
    """The `Sandbox` API over HTTP. Same methods, same results; `isolation` is the server's."""

    def __init__(self, url: str, *, retries: int = 3, request_timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.retries = retries
        self.request_timeout = request_timeout
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RemoteSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout)
            )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _post(self, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        await self.start()
        assert self._http is not None
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
            try:
                async with self._http.post(self.url + path, json=payload) as response:
                    if response.status == 503:
                        last_error = "service busy (503)"
                        continue
                    if response.status >= 400 and response.status != 410:
                        raise SandboxUnavailable(
                            f"{path}: HTTP {response.status}: {await response.text()}"
                        )
                    return response.status, await response.json()
            except (TimeoutError, aiohttp.ClientConnectionError) as e:
                last_error = f"{type(e).__name__}: {e}"
        raise SandboxUnavailable(
            f"{self.url}{path}: {last_error} after {self.retries + 1} attempts"
        )

    async def run(
        self,
        code: str,
        *,
        session: str | None = None,
        timeout: float | None = None,
        print_last_expr: bool | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        payload = {
            "code": code,
            "session": session,
            "timeout": timeout,
            "print_last_expr": print_last_expr,
            "stdin": stdin,
        }
        _, data = await self._post("/run", {k: v for k, v in payload.items() if v is not None})
        return ExecResult.from_dict(data)

    async def snapshot(self, session: str) -> int:
        _, data = await self._post("/snapshot", {"session": session})
        return int(data["token"])

    async def restore(self, session: str, token: int) -> None:
        status, data = await self._post("/restore", {"session": session, "token": token})
        if status == 410:
            raise SnapshotLost(data.get("error", "snapshot lost"))

    async def release(self, session: str, token: int) -> None:
        await self._post("/release", {"session": session, "token": token})

    async def close_session(self, session: str) -> None:
        await self._post("/close_session", {"session": session})

    async def health(self) -> dict[str, Any]:
        await self.start()
        assert self._http is not None
        with contextlib.suppress(aiohttp.ClientError):
            async with self._http.get(self.url + "/health") as response:
                return await response.json()
        raise SandboxUnavailable(f"{self.url}/health unreachable")
