"""The embedded sandbox: a pool of warm workers on this machine, with sessions and snapshots."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from typing import Any

from cleaner.sandbox.isolation import Isolation, choose
from cleaner.sandbox.result import ExecResult
from cleaner.sandbox.worker import CONTROL_TIMEOUT_S, Worker, WorkerDied

HOST_GRACE_S = 5.0
"""How much longer than a call's timeout the host waits for the zygote before killing the worker."""


class SnapshotLost(RuntimeError):
    """A snapshot could not be taken, or no longer exists (released, its worker died, or model code
    broke the interpreter's channel); the session's state was not snapshotted or restored."""


@dataclass(frozen=True)
class Limits:
    """Per-call limits. The defaults suit model code in RL rollouts."""

    timeout: float = 10.0
    """Wall-clock seconds per call."""
    memory_mb: int = 2048
    """RLIMIT_AS of each process running model code. Never applied to the stack."""
    max_output_bytes: int = 1 << 20
    """Per stream; beyond it the call is killed (`reason: output limit`) and the flag set."""
    max_processes: int = 64
    """Processes and threads model code may add (RLIMIT_NPROC, and the worker's pids cgroup)."""
    open_files: int = 256
    file_mb: int = 64
    """Largest file model code may write (RLIMIT_FSIZE)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "open_files": self.open_files,
            "file_mb": self.file_mb,
        }


@dataclass
class _Session:
    worker: Worker
    generation: int
    """The worker generation that holds this session's state."""
    snapshots: set[int] = field(default_factory=set)
    has_state: bool = False


class Sandbox:
    """Runs untrusted Python: stateless calls, or stateful sessions keyed by any string id.

    Async; one worker runs one call at a time, and calls on different workers run in parallel.
    Use `async with Sandbox() as sb:` or call `close()`; `SyncSandbox` wraps it for blocking code.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        isolation: str = "auto",
        limits: Limits | None = None,
        print_last_expr: bool = False,
        preload: tuple[str, ...] = ("numpy", "sympy"),
        scratch_mb: int = 256,
        max_pids: int = 1024,
        worker_memory_mb: int | None = None,
    ):
        self.isolation: Isolation = choose(isolation)
        self.limits = limits or Limits()
        self.print_last_expr = print_last_expr
        size = workers or os.cpu_count() or 1
        if worker_memory_mb is None:
            # Three quarters of the machine, shared by the workers; never less than one call's limit.
            physical_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
            worker_memory_mb = max(physical_mb * 3 // 4 // size, self.limits.memory_mb + 512)
        self.workers = [
            Worker(
                self.isolation,
                preload=preload,
                scratch_mb=scratch_mb,
                max_pids=max_pids,
                memory_mb=worker_memory_mb,
            )
            for _ in range(size)
        ]
        self._sessions: dict[str, _Session] = {}
        self._closed = False

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Start every worker now (otherwise each starts on first use)."""
        await asyncio.gather(*(self._started(w) for w in self.workers))

    async def _started(self, worker: Worker) -> None:
        async with worker.lock:
            if not worker.alive:
                await worker.start()

    async def close(self) -> None:
        """Kill every worker and everything in it. The sandbox cannot be used afterwards."""
        self._closed = True
        for worker in self.workers:
            await worker.stop()
        self._sessions.clear()

    # ------------------------------------------------------------------ calls

    async def run(
        self,
        code: str,
        *,
        session: str | None = None,
        timeout: float | None = None,
        print_last_expr: bool | None = None,
        limits: Limits | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run `code`; with `session`, in that session's interpreter (created on first use).
        `stdin`: what the cell reads from standard input (`input()`, `sys.stdin`, fd 0); without
        it standard input is empty."""
        limits = limits or self.limits
        if timeout is not None:
            limits = replace(limits, timeout=timeout)
        if not isinstance(code, str):
            return self._invalid(f"code must be a string, got {type(code).__name__}", session)
        if "\x00" in code:
            return self._invalid("code contains a NUL character", session)
        if stdin is not None and not isinstance(stdin, str):
            return self._invalid(f"stdin must be a string, got {type(stdin).__name__}", session)
        request = {
            "op": "run",
            "code": code,
            "session": session,
            "limits": limits.to_wire(),
            "max_output_bytes": limits.max_output_bytes,
            "print_last_expr": self.print_last_expr if print_last_expr is None else print_last_expr,
            "stdin": stdin,
        }
        worker = self._session_worker(session) if session is not None else self._least_loaded()
        worker.pending += 1
        try:
            async with worker.lock:
                self._check_open()
                lost_before = session is not None and self._claim(session, worker)
                try:
                    reply = await worker.request(request, limits.timeout + HOST_GRACE_S)
                except WorkerDied as e:
                    return ExecResult(
                        status="killed",
                        reason=str(e),
                        duration_s=limits.timeout,
                        isolation=self.isolation.describe(),
                        session=session,
                        state_lost=session is not None,
                    )
        finally:
            worker.pending -= 1
        if "error" in reply:
            raise RuntimeError(f"sandbox harness error: {reply['error']}")
        result = ExecResult.from_dict(
            {**reply, "isolation": self.isolation.describe(), "session": session}
        )
        result.state_lost = result.state_lost or lost_before
        return result

    def _invalid(self, reason: str, session: str | None) -> ExecResult:
        return ExecResult(
            status="invalid", reason=reason, isolation=self.isolation.describe(), session=session
        )

    # ------------------------------------------------------------------ sessions

    async def snapshot(self, session: str) -> int:
        """Freeze a copy of the session's interpreter state (a fork); returns a token for `restore`.

        A session that has not run anything yet is started, so its empty state can be restored.
        """
        reply = await self._control(session, {"op": "snapshot", "session": session})
        if "error" in reply:
            raise SnapshotLost(f"session {session!r}: {reply['error']}")
        token = reply["token"]
        self._sessions[session].snapshots.add(token)
        return token

    async def restore(self, session: str, token: int) -> None:
        """Make the session's state what it was at `snapshot` time. The token stays valid (restore again
        for the next attempt); the current interpreter is discarded."""
        record = self._sessions.get(session)
        if (
            record is None
            or token not in record.snapshots
            or record.generation != record.worker.generation
        ):
            raise SnapshotLost(
                f"snapshot {token} of session {session!r} does not exist (released or lost)"
            )
        reply = await self._control(session, {"op": "restore", "session": session, "token": token})
        if "error" in reply:
            raise SnapshotLost(f"snapshot {token} of session {session!r}: {reply['error']}")

    async def release(self, session: str, token: int) -> None:
        """Free a snapshot (its process) when no more restores will need it."""
        record = self._sessions.get(session)
        if record is None or token not in record.snapshots:
            return
        record.snapshots.discard(token)
        await self._control(session, {"op": "release", "session": session, "token": token})

    async def close_session(self, session: str) -> None:
        """End a session: its interpreter, its snapshots and its scratch files."""
        record = self._sessions.pop(session, None)
        if record is None:
            return
        worker = record.worker
        worker.pending += 1
        try:
            async with worker.lock:
                worker.sessions.discard(session)
                if worker.alive and record.generation == worker.generation:
                    try:
                        await worker.request({"op": "close", "session": session}, CONTROL_TIMEOUT_S)
                    except WorkerDied:
                        pass
        finally:
            worker.pending -= 1

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    async def _control(self, session: str, request: dict[str, Any]) -> dict[str, Any]:
        worker = self._session_worker(session)
        worker.pending += 1
        try:
            async with worker.lock:
                self._check_open()
                self._claim(session, worker)
                try:
                    reply = await worker.request(request, CONTROL_TIMEOUT_S)
                except WorkerDied as e:
                    raise SnapshotLost(f"session {session!r}: {e}") from e
        finally:
            worker.pending -= 1
        return reply

    def _session_worker(self, session: str) -> Worker:
        record = self._sessions.get(session)
        if record is not None:
            return record.worker
        # New sessions go where the fewest sessions live.
        worker = min(self.workers, key=lambda w: (len(w.sessions), w.pending))
        worker.sessions.add(session)
        self._sessions[session] = _Session(worker, worker.generation)
        return worker

    def _claim(self, session: str, worker: Worker) -> bool:
        """Called under the worker's lock, before a request. A session whose worker died since its
        last request starts over; returns True when that threw away state it had."""
        record = self._sessions.setdefault(session, _Session(worker, worker.generation))
        # A dead worker is restarted by the request, as the next generation.
        current = worker.generation if worker.alive else worker.generation + 1
        lost = False
        if record.generation != current:
            lost = record.has_state
            record.generation = current
            record.snapshots.clear()
        record.has_state = True
        worker.sessions.add(session)
        return lost

    def _least_loaded(self) -> Worker:
        # Among the least loaded, the one idle longest: it has finished its cleanup and spare fork.
        return min(self.workers, key=lambda w: (w.pending, w.last_reply))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the sandbox is closed")
