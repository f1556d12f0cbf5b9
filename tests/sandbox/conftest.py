"""Fixtures for the sandbox tests: real workers, and a check that nothing is left behind on the host."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from cleaner.sandbox import Limits, SyncSandbox


def host_descendants() -> list[int]:
    """Pids of every process below this test process (bwrap, zygotes, anything model code started)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def processes_with(marker: bytes) -> list[int]:
    """Host processes whose command line contains `marker` (model code names its daemons with one)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if marker in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                pass
    return found


def leftovers() -> list[str]:
    """Files the sandbox may create on the host: cgroups and fallback scratch directories."""
    mine = f"cleaner-{os.getpid()}-"
    found = [
        str(p)
        for controller in ("pids", "memory")
        for p in Path("/sys/fs/cgroup", controller).glob(mine + "*")
    ]
    found += [str(p) for p in Path(tempfile.gettempdir()).glob(f"cleaner-sandbox-{os.getpid()}-*")]
    return found


@pytest.fixture(scope="module")
def sb():
    """Two warm workers with short limits (512 MiB: a memory bomb fills it fast), shared by a module.

    CLEANER_TEST_ISOLATION=none runs the suite on the fallback level (attacks that would reach the
    host then skip)."""
    with SyncSandbox(
        workers=2,
        isolation=os.environ.get("CLEANER_TEST_ISOLATION", "auto"),
        limits=Limits(timeout=10.0, memory_mb=512, max_output_bytes=64 << 10),
        scratch_mb=64,
    ) as sandbox:
        yield sandbox


def sandbox_processes() -> list[int]:
    """Our descendants that belong to a sandbox: bwrap, zygotes, interpreters, their children."""
    found = []
    for pid in host_descendants():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"zygote.py" in cmdline or b"bwrap" in cmdline:
            found.append(pid)
    return found


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    """After each module (its sandboxes closed): no process or file it started is left. Compared
    with what existed before, so a sandbox that other tests of this session keep open is not ours."""
    processes, files = set(sandbox_processes()), set(leftovers())
    yield
    assert set(sandbox_processes()) - processes == set(), "sandbox processes left running"
    assert set(leftovers()) - files == set(), "files left on the host"


@pytest.fixture
def require_namespaces(sb):
    """Skip attacks that are only safe, or only contained, with namespace isolation: on the fallback
    level they would reach the host (kill(-1) as root, a disk fill in the host's /tmp)."""
    if sb.sandbox.isolation.level != "namespaces":
        pytest.skip(
            f"needs namespace isolation; this machine gives {sb.sandbox.isolation.describe()}"
        )
