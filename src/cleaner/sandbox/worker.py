"""One sandboxed worker process (a zygote) seen from the host: start it, talk to it, replace it.

The host keeps its own deadline on every request: if the zygote does not answer in time (model code
stopped it, or it died), the whole worker is killed, which kills every process in its pid namespace,
and the call gets a `killed` result. The next request starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from typing import Any

from cleaner.sandbox.isolation import (
    SANDBOX_ENV,
    Isolation,
    WorkerCgroup,
    bwrap_command,
    fallback_command,
    scratch_dir_for_fallback,
)

HEADER = struct.Struct("!I")
START_TIMEOUT_S = 120.0
"""Starting a worker imports numpy and sympy: about a second, much more on a loaded machine."""
CONTROL_TIMEOUT_S = 30.0
"""Snapshot, restore, release, close: a fork and a kill, milliseconds normally."""
_worker_names = itertools.count()


class WorkerDied(RuntimeError):
    """The worker died or stopped answering; it has been killed and will be restarted on next use."""


class Worker:
    """A zygote in its sandbox, serving one request at a time (callers hold `lock`)."""

    def __init__(
        self,
        isolation: Isolation,
        *,
        preload: tuple[str, ...],
        scratch_mb: int,
        max_pids: int,
        memory_mb: int,
    ):
        self.isolation = isolation
        self.preload = preload
        self.scratch_mb = scratch_mb
        self.max_pids = max_pids
        self.memory_mb = memory_mb
        """The whole worker's memory bound (its cgroup), when cgroups are writable."""
        self.lock = asyncio.Lock()
        self.pending = 0
        """Callers waiting for or holding the lock: the pool sends new work to the least loaded."""
        self.last_reply = 0.0
        """When it last answered: after a reply the zygote still cleans up and forks a spare."""
        self.generation = 0
        """Incremented at every (re)start: sessions of an older generation lost their state."""
        self.sessions: set[str] = set()
        self.process: asyncio.subprocess.Process | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.cgroup: WorkerCgroup | None = None
        self.fallback_scratch: str | None = None
        self.preloaded: list[str] = []
        """The modules the zygote imported (a missing one is skipped, not fatal)."""
        self.stderr_tail = b""
        self._stderr_task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        host_sock, child_sock = socket.socketpair()
        if self.isolation.level == "namespaces":
            scratch_root = "/tmp/work"
        else:
            self.fallback_scratch = scratch_dir_for_fallback()
            scratch_root = self.fallback_scratch
        config = json.dumps(
            {
                "preload": list(self.preload),
                "scratch_root": scratch_root,
                "uid": self.isolation.uid,
                "private_tmp": self.isolation.level == "namespaces",
            }
        )
        if self.isolation.level == "namespaces":
            cmd = bwrap_command(self.isolation, self.scratch_mb, child_sock.fileno(), config)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        else:
            cmd = fallback_command(child_sock.fileno(), config)
            env = dict(SANDBOX_ENV, HOME=scratch_root, TMPDIR=scratch_root)
        if self.isolation.cgroups:
            self.cgroup = WorkerCgroup(
                f"cleaner-{os.getpid()}-{next(_worker_names)}",
                self.isolation.cgroups,
                max_pids=self.max_pids,
                memory_mb=self.memory_mb,
            )
        try:
            self.process = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=[child_sock.fileno()],
                env=env,
                start_new_session=True,
                preexec_fn=self._prepare_child,
            )
        except (OSError, subprocess.SubprocessError) as e:
            host_sock.close()
            await self.kill()
            raise WorkerDied(f"worker did not start: {e}") from e
        finally:
            child_sock.close()
        self._stderr_task = asyncio.create_task(self._keep_stderr_tail())
        self.reader, self.writer = await asyncio.open_unix_connection(sock=host_sock)
        try:
            ready = await asyncio.wait_for(self._read_frame(), START_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            await self.kill()
            raise WorkerDied(
                f"worker did not start: {self.stderr_tail.decode(errors='replace')[-2000:]}"
            ) from e
        self.preloaded = ready.get("preloaded", [])
        self.generation += 1

    def _prepare_child(self) -> None:
        """Between fork and exec: join the cgroup (as root), then stage paths and drop privileges."""
        if self.cgroup:
            self.cgroup.enter()
        if self.isolation.level == "namespaces":
            self.isolation.launch.prepare()

    async def _keep_stderr_tail(self) -> None:
        assert self.process and self.process.stderr
        while chunk := await self.process.stderr.read(4096):
            self.stderr_tail = (self.stderr_tail + chunk)[-8192:]

    async def _read_frame(self) -> dict[str, Any]:
        assert self.reader
        (size,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
        return json.loads(await self.reader.readexactly(size))

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; on a missed deadline or EOF kill the worker."""
        if not self.alive:
            await self.start()
        assert self.writer
        data = json.dumps(message).encode()
        try:
            self.writer.write(HEADER.pack(len(data)) + data)
            await self.writer.drain()
            reply = await asyncio.wait_for(self._read_frame(), timeout)
            self.last_reply = time.monotonic()
            return reply
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            why = "stopped answering" if isinstance(e, asyncio.TimeoutError) else "died"
            await self.kill()
            raise WorkerDied(f"worker {why}") from e

    async def kill(self) -> None:
        """Kill the worker and everything in it; remove its cgroup and scratch files.

        Safe to call twice at once (a failed request and `close`): each resource is taken before
        the first await, so only one caller cleans it up.
        """
        writer, self.writer, self.reader = self.writer, None, None
        if writer:
            writer.close()
        process = self.process
        if process and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        stderr_task, self._stderr_task = self._stderr_task, None
        if stderr_task:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stderr_task, 5)
        cgroup, self.cgroup = self.cgroup, None
        if cgroup:
            await self._empty_cgroup(cgroup)
            cgroup.remove()
        scratch, self.fallback_scratch = self.fallback_scratch, None
        if scratch:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
        self.sessions.clear()

    @staticmethod
    async def _empty_cgroup(cgroup: WorkerCgroup) -> None:
        """In fallback mode processes can outlive the zygote; the cgroup finds them all."""
        for _ in range(200):
            pids = cgroup.processes()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        await self.kill()
