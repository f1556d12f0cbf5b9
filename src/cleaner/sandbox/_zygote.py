"""The warm parent that runs inside the sandbox: it imports the heavy modules once and forks per call.

Standard library only, run as a script (`python -I _zygote.py`), never imported by the host. It talks
to the host over one Unix socket (fd given on the command line) with length-prefixed JSON frames, one
request at a time.

Process tree inside one worker (in namespace mode the zygote is pid 1 of the worker's pid namespace,
so signals from model code cannot kill it and every process dies with it):

    zygote (pid 1, keeps CAP_SYS_ADMIN to make pid namespaces; model code never has it)
      +- template: imported numpy and sympy, forks every process below (as the zygote's children)
      +- interpreter of a stateless call: pid 1 of its own pid and user namespaces, exits after it
      +- init of session "a": pid 1 of the session's pid and user namespaces, never runs model code,
           |  starts interpreters and reaps them on request
           +- live interpreter
           +- snapshot: a frozen fork of the live interpreter; forks a new live one on restore

Every interpreter serves the same tiny loop on its own socket: `run` (a cell, with the output pipes
passed as fds) and `fork` (make a copy that serves a new socket). A snapshot is an interpreter that the
zygote does not send cells to; a restore asks it to fork a new live copy. Pids of forked copies come
from the kernel (SCM_CREDENTIALS), not from what the copy says. After every request the zygote kills
any process that is not a registered interpreter (detached daemons, stray children), and removes the
scratch files no interpreter owns. Without pid namespaces (the fallback) the same tree is flat.
"""

import ast
import builtins
import ctypes
import gc
import json
import linecache
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
import types

CELL = "<cell>"
HEADER = struct.Struct("!I")
MAX_FDS = 4
MAX_MESSAGE = 16384
# Run once in the zygote after importing a module: lazily initialised parts (sympy's polys, ntheory,
# solvers; numpy's linalg) are then ready in every fork instead of being built again per call.
WARMUP = {
    "numpy": "import numpy as np\nnp.linalg.eigvalsh(np.eye(3)); np.random.default_rng(0).random(3); np.fft.fft(np.ones(4))",
    "sympy": (
        "import sympy\ny = sympy.Symbol('y')\n"
        "sympy.factor(y**2 - 4); sympy.factorint(10**6 + 3); sympy.simplify(sympy.sin(y)**2 + sympy.cos(y)**2)\n"
        "sympy.solve(y**2 - 3, y); sympy.integrate(y**3, y); sympy.expand((y + 1)**3); sympy.Rational(2, 5) + 1\n"
        "sympy.sqrt(12); sympy.Matrix([[1, 2], [3, 4]]).det(); sympy.isprime(97); sympy.N(sympy.pi, 20)\n"
        "sympy.core.cache.clear_cache()"
    ),
}
SESSION_PROCESSES = 32
"""Room in a session's process limit for its own interpreters: init, live, snapshots."""
CHANNEL_LOST = 75
"""Exit code of an interpreter whose reply channel model code closed."""
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- framing (same format as the host)


def send_frame(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    msg = HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], list(fds))
    else:
        sock.sendall(msg)


def recv_exact(sock, n, fds):
    buf = b""
    while len(buf) < n:
        chunk, new_fds, _, _ = socket.recv_fds(sock, n - len(buf), MAX_FDS)
        fds.extend(new_fds)
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def recv_frame(sock):
    """One frame and the fds that came with it; EOFError when the peer is gone."""
    fds = []
    (size,) = HEADER.unpack(recv_exact(sock, HEADER.size, fds))
    return json.loads(recv_exact(sock, size, fds)), fds


# ---------------------------------------------------------------- processes and namespaces

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_PARENT = 0x00008000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def fork_into_new_pid_namespace():
    """fork(), but the child is pid 1 of a new pid namespace (raw clone, with Python's fork hooks).

    Model code in one call or session then cannot see or signal the processes of another, and all
    its processes die with it. Needs CAP_SYS_ADMIN, which only the zygote has. (os.fork cannot do
    it: after unshare(CLONE_NEWPID) every later child would join the same namespace.) glibc's cached
    thread id in the child is the parent's; in namespace mode both are pid 1, so it is right.
    """
    return raw_clone(CLONE_NEWPID | signal.SIGCHLD)


def fork_sibling(new_pid_namespace):
    """fork(), but the child is our parent's, not ours (CLONE_PARENT): the template forks the
    zygote's interpreters, and the zygote waits for them. With `new_pid_namespace`, the child is
    pid 1 of a new pid namespace. Where raw clone is not known (other architectures), a double
    fork: the orphan goes to the zygote, a child subreaper."""
    if SYS_CLONE is not None:
        return raw_clone(CLONE_PARENT | signal.SIGCHLD | (CLONE_NEWPID if new_pid_namespace else 0))
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        child = os.fork()
        if child:
            os.write(write_end, struct.pack("i", child))
            os._exit(0)
        os.close(read_end)
        os.close(write_end)
        return 0
    os.close(write_end)
    os.waitpid(middle, 0)
    data = os.read(read_end, 4)
    os.close(read_end)
    if len(data) != 4:
        raise OSError("fork failed")
    return struct.unpack("i", data)[0]


def raw_clone(flags):
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = libc.syscall(SYS_CLONE, flags, 0, 0, 0, 0)
    errno = ctypes.get_errno()
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
    else:
        ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(errno, os.strerror(errno))
    return pid


NO_CAPABILITIES = (CapHeader(CAPABILITY_VERSION_3, 0), (CapData * 2)())
"""capset's arguments, made once in the template rather than in every fork."""


def drop_capabilities():
    """Give up every capability (the zygote keeps CAP_SYS_ADMIN to make pid namespaces; model code
    must not have it)."""
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = NO_CAPABILITIES
    if libc.capset(ctypes.byref(header), data) != 0:
        os._exit(71)


def recv_hello(sock):
    """The first frame of a new interpreter, and its pid in the zygote's pid namespace, checked and
    translated by the kernel (SCM_CREDENTIALS), whatever the frame itself claims."""
    sock.settimeout(10)
    data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(12))
    pid = None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:12])[0]
    if not data or pid is None:
        raise EOFError("no hello")
    (size,) = HEADER.unpack_from(data)
    data += recv_exact(sock, HEADER.size + size - len(data), [])
    sock.settimeout(None)
    return json.loads(data[HEADER.size :]), pid


def credentials_socketpair():
    """A socket pair whose first end receives the sender's pid with every message."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return ours, theirs


def enter_own_user_namespace():
    """A user namespace of its own, mapping only our uid: RLIMIT_NPROC then counts the processes of
    this call or session alone, not those of every session that shares the worker's uid."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        return False
    # /proc/self of a process that is not dumpable belongs to root: dumpable while writing the maps.
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    write_file("/proc/self/setgroups", b"deny")
    write_file("/proc/self/uid_map", b"%d %d 1" % (uid, uid))
    write_file("/proc/self/gid_map", b"%d %d 1" % (gid, gid))
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return True


def write_file(path, data):
    """os.open, not open(): the io stack touches pages that every fresh fork would have to copy.
    (Everything a forked interpreter does before model code runs is paid again on every call.)"""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def become_child(keep_fds, scratch, uid, own_user_namespace=False):
    """Set up a process forked from the zygote: only `keep_fds`, no capabilities, own session."""
    highest = 3
    for fd in sorted(keep_fds):
        os.closerange(highest, fd)
        highest = fd + 1
    os.closerange(highest, 1 << 16)
    if own_user_namespace:
        enter_own_user_namespace()
    drop_capabilities()
    # When the worker's memory cgroup is full, the kernel should kill model code, not the zygote or
    # the template. (/proc/self of a process that is not dumpable belongs to root: dumpable while
    # writing, as for the uid map.)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        write_file("/proc/self/oom_score_adj", b"1000")
    except OSError:
        pass
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.setsid()
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def serve_group(sock, uid):
    """The init of a session's pid namespace: starts fresh interpreters in it and reaps on request.
    It never runs model code; when its socket closes (the session ends) it exits, and with it every
    process of the session."""
    # Also without a pid namespace (fallback), forked copies orphaned in the session come here.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    while True:
        try:
            request, fds = recv_frame(sock)
        except (EOFError, OSError):
            os._exit(0)
        if request["op"] == "spawn":
            (interp_fd,) = fds
            if os.fork() == 0:
                sock.close()
                become_child([interp_fd, *unused_stream_fds()], request["scratch"], uid)
                interp_sock = socket.socket(fileno=interp_fd)
                send_frame(interp_sock, {"hello": True})
                serve_interpreter(interp_sock, fresh_globals())
            os.close(interp_fd)
        elif request["op"] == "reap":
            statuses = {}
            try:
                while True:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if not pid:
                        break
                    statuses[str(pid)] = status
            except ChildProcessError:
                pass
            send_frame(sock, {"statuses": statuses})
            continue
        send_frame(sock, {})


# ---------------------------------------------------------------- inside an interpreter process


def fresh_globals():
    """The namespace model code runs in, installed as __main__ so pickling and imports of it work."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module.__dict__


def compile_cell(code, print_last_expr):
    """Compile a cell; with print_last_expr, a final bare expression is printed (if not None)."""
    if not print_last_expr:
        return compile(code, CELL, "exec"), None  # no Python AST objects: cheaper in a fresh fork
    tree = ast.parse(code, CELL, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), CELL, "eval")
    return compile(tree, CELL, "exec"), last


def user_traceback(exc):
    """The text shown to the model: only the cell's own frames, then `Type: message`."""
    if isinstance(exc, SyntaxError) and exc.filename == CELL:
        return "".join(traceback.format_exception_only(type(exc), exc))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == CELL]
    text = "".join(traceback.format_exception_only(type(exc), exc))
    if frames:
        listing = "".join(traceback.StackSummary.from_list(frames).format())
        text = "Traceback (most recent call last):\n" + listing + text
    return text[-MAX_MESSAGE:]


def error_line(exc):
    if isinstance(exc, SyntaxError) and exc.filename == CELL:
        return exc.lineno
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == CELL]
    return lines[-1] if lines else None


def set_limits(limits):
    """rlimits for model code, soft == hard so it cannot lift them; the stack limit is left alone.

    A session's interpreter keeps its limits across cells; a limit that cannot be raised stays lower.
    """

    def lower(kind, value):
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    if limits["memory_mb"]:
        lower(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    lower(resource.RLIMIT_FSIZE, limits["file_mb"] << 20)
    lower(resource.RLIMIT_NOFILE, limits["open_files"])
    if limits.get("nproc"):
        lower(resource.RLIMIT_NPROC, limits["nproc"])
    # CPU time accumulates over a session's cells: allow this cell its timeout on top of what is used,
    # as a soft limit (the wall-clock deadline is the real bound; this one stops threads left spinning).
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(usage.ru_utime + usage.ru_stime + limits["timeout"]) + 2
    # A stateless call's interpreter is pid 1 of its namespace and ignores SIGXCPU; the hard limit's
    # SIGKILL still applies. A session keeps its hard limit open for later cells.
    hard = cpu + 1 if limits.get("stateless") else resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, hard))


def new_streams():
    """stdout and stderr on fds 1 and 2, stdin from /dev/null."""
    out = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    err = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    return out, err, open(os.devnull)


unused_streams = []
"""Streams the template made before forking, for an interpreter's first cell: made once, not on every
call (the io stack writes to pages each fresh fork would copy)."""


def unused_stream_fds():
    """Fds a forked interpreter must keep open for `unused_streams` (its stdin)."""
    return [unused_streams[0][2].fileno()] if unused_streams else []


fd0_replaced = []
"""Not empty once a cell of this interpreter had its own input on fd 0."""


def stdin_file(text):
    """A file holding `text`, at offset 0, as an fd: the standard input of one cell."""
    fd = os.memfd_create("stdin")
    data = memoryview(text.encode("utf-8", "surrogateescape"))
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_cell(code, out_fd, err_fd, namespace, limits, print_last_expr, stdin_fd=None):
    """Run one cell with fds 1 and 2 pointing at the host's pipes, and fd 0 at its input (or
    /dev/null); return the interpreter's account."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    # Fresh stream objects every cell: a previous cell may have replaced or closed sys.stdout.
    sys.stdout, sys.stderr, sys.stdin = unused_streams.pop() if unused_streams else new_streams()
    if stdin_fd is not None:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)
        fd0_replaced.append(True)
    elif fd0_replaced:  # a session's earlier cell had input: this one reads none of it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        fd0_replaced.clear()
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    outcome = {"error_type": None, "message": None, "line": None, "exit_code": None}
    try:
        set_limits(limits)
        body, last = compile_cell(code, print_last_expr)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as e:
        outcome["exit_code"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if outcome["exit_code"] != 0:
            outcome.update(error_type="SystemExit", message=f"SystemExit: {e.code}\n")
    except BaseException as e:  # noqa: BLE001 - every exception of model code is a result
        outcome.update(error_type=type(e).__name__, message=user_traceback(e), line=error_line(e))
        del e
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a broken stream must not lose the result
            pass
    # Let go of the pipes so the host sees EOF once background processes are gone.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return outcome


def serve_interpreter(sock, namespace):
    """The loop of one interpreter process: run cells, or fork a copy that serves a new socket."""
    while True:
        try:
            request, fds = recv_frame(sock)
        except (EOFError, OSError):
            os._exit(0)
        op = request["op"]
        if op == "run":
            out_fd, err_fd, *stdin_fd = fds
            outcome = run_cell(
                request["code"],
                out_fd,
                err_fd,
                namespace,
                request["limits"],
                request["print_last_expr"],
                stdin_fd[0] if stdin_fd else None,
            )
            try:
                send_frame(sock, dict(outcome, nonce=request["nonce"]))
            except OSError:
                os._exit(CHANNEL_LOST)
            if request["exit_after"]:
                os._exit(0)
        elif op == "fork":
            (new_sock_fd,) = fds
            try:
                pid = os.fork()
            except OSError:
                pid = None  # (a process limit): no copy; the zygote sees the socket close
            if pid == 0:
                # Fork twice: the copy is orphaned at once and adopted by the session's init,
                # which reaps it (its exit status, no zombies under a frozen snapshot).
                try:
                    if os.fork() != 0:
                        os._exit(0)
                except OSError:
                    os._exit(1)
                sock.close()
                os.setsid()
                sock = socket.socket(fileno=new_sock_fd)
                send_frame(sock, {"hello": True})
                continue
            os.close(new_sock_fd)
            if pid:
                os.waitpid(pid, 0)


# ---------------------------------------------------------------- the template

PID = struct.Struct("i")
ROLES = {b"i": "interpreter", b"g": "group"}


def serve_template(sock, config):
    """The process every interpreter is forked from: it imported the heavy modules and does nothing
    else. It is a child of the zygote, whose bookkeeping (selectors, JSON, /proc scans) would
    otherwise write to pages shared with every fresh fork: each such write is a copy-on-write fault,
    and on the huge pages below it splits a 2 MiB mapping back into 4 KiB ones. So this loop is
    kept tiny, and the forks are made siblings (children of the zygote, which waits for them).

    Requests (SOCK_SEQPACKET, one message each): role byte, user-namespace byte, scratch path, and
    the new process's socket as an fd. Reply: its pid, or minus errno.
    """
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The dispositions model code starts with (the zygote ignores SIGINT), inherited by every fork.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pid_namespaces = pid_namespaces_work()
    # Not with a fallback uid: the interpreter's setuid needs that uid mapped.
    user_namespaces = config.get("uid") is None and user_namespaces_work()
    preloaded = []
    for name in config["preload"]:
        try:
            __import__(name)
            preloaded.append(name)
            if name in WARMUP:
                exec(WARMUP[name], {})
        except Exception:  # noqa: BLE001 - a missing optional module is not fatal
            pass
    # Drop the garbage of the imports, then keep what is left out of the collector: forks then
    # share its pages instead of copying them when a collection would touch every object.
    gc.collect()
    gc.freeze()
    collapse_heap_into_huge_pages()
    unused_streams.append(new_streams())
    hello = {
        "preloaded": preloaded,
        "pid_namespaces": pid_namespaces,
        "user_namespaces": user_namespaces,
    }
    sock.sendall(json.dumps(hello).encode())
    uid = config.get("uid")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        if len(fds) != 1 or message[:1] not in ROLES:
            for fd in fds:
                os.close(fd)
            sock.send(PID.pack(-22))
            continue
        try:
            pid = fork_sibling(pid_namespaces)
        except OSError as e:
            pid = -(e.errno or 1)
        if pid == 0:
            try:
                channel = socket.socket(fileno=fds[0])
                become_child(
                    [fds[0], *unused_stream_fds()],
                    message[2:].decode(),
                    uid,
                    own_user_namespace=message[1:2] == b"1",
                )
                if message[:1] == b"g":
                    serve_group(channel, uid)
                else:
                    serve_interpreter(channel, fresh_globals())
            finally:
                os._exit(70)
        os.close(fds[0])
        sock.send(PID.pack(pid))


class Template:
    """The zygote's handle on the template process."""

    def __init__(self, pid, sock, hello):
        self.pid, self.sock = pid, sock
        self.preloaded = hello["preloaded"]
        self.pid_namespaces = hello["pid_namespaces"]
        self.user_namespaces = hello["user_namespaces"]

    @classmethod
    def start(cls, config, host_fd):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                os.close(host_fd)
                serve_template(theirs, config)
            finally:
                os._exit(70)
        theirs.close()
        hello = ours.recv(65536)
        if not hello:
            raise TemplateFailed("the template process died while importing")
        return cls(pid, ours, json.loads(hello))

    def stop(self):
        """Kill it (not its process group: that is the zygote's) and close its socket."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.sock.close()

    def fork(self, role, scratch, channel, user_namespace):
        """A new process (`role`: interpreter or group) serving `channel`; its pid."""
        message = (b"g" if role == "group" else b"i") + (b"1" if user_namespace else b"0")
        try:
            socket.send_fds(self.sock, [message + scratch.encode()], [channel.fileno()])
            reply = self.sock.recv(PID.size)
        except OSError as e:
            raise TemplateLost from e
        if len(reply) != PID.size:
            raise TemplateLost
        (pid,) = PID.unpack(reply)
        if pid < 0:
            raise OSError(-pid, os.strerror(-pid))
        return pid


class TemplateLost(RuntimeError):
    """The template process is gone; the zygote starts another."""


class TemplateFailed(RuntimeError):
    """A template process died while importing: the worker cannot make interpreters."""


# ---------------------------------------------------------------- the zygote


class Interpreter:
    def __init__(self, pid, sock, scratch, inner_pid=None):
        self.pid, self.sock, self.scratch = pid, sock, scratch
        self.inner_pid = inner_pid or pid
        """Its pid in its session's pid namespace, where the session's init reaps it."""


class Zygote:
    def __init__(self, host_sock, config, template):
        self.host = host_sock
        self.config = config
        self.template = template
        # session id -> {"group": its init, "live": Interpreter | None, "snapshots": {token: Interpreter}}
        self.sessions = {}
        self.next_token = 1
        self.next_scratch = 1
        self.scratch_root = config["scratch_root"]
        self.uid = config.get("uid")  # fallback mode only: drop to this uid in interpreters
        self.orphans = {}  # pid -> wait status of children reaped by a sweep during this request
        self.spare = None  # a fresh interpreter forked ahead of time, off the latency path
        # One pid namespace per call and per session, when possible; likewise a user namespace
        # (per-call process counting).
        self.pid_namespaces = template.pid_namespaces
        self.user_namespaces = template.user_namespaces

    # ---- processes

    def registered_pids(self):
        return {self.template.pid} | {interp.pid for interp in self.interpreters()}

    def sweep(self):
        """Kill every descendant that is not a registered interpreter; reap everything that exited."""
        keep = self.registered_pids()
        for _ in range(100):
            strays = [pid for pid in descendants(os.getpid()) if pid not in keep]
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()
        self.reap()

    def clean_files(self):
        """Remove files no interpreter owns: the scratch of finished calls, and anything written to
        /tmp or /dev/shm (in namespace mode both are the worker's own tmpfs)."""
        keep = {interp.scratch for interp in self.interpreters()}
        for path in listdir_paths(self.scratch_root):
            if path not in keep:
                remove(path)
        if self.config.get("private_tmp"):
            for path in listdir_paths("/tmp") + listdir_paths("/dev/shm"):
                if path != self.scratch_root:
                    remove(path)

    def interpreters(self):
        found = [self.spare] if self.spare else []
        for session in self.sessions.values():
            found += [session.get("group"), session["live"], *session["snapshots"].values()]
        return [i for i in found if i is not None]

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.orphans[pid] = status

    def new_scratch(self):
        path = os.path.join(self.scratch_root, f"s{self.next_scratch}")
        self.next_scratch += 1
        os.mkdir(path, 0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        return path

    def fresh_interpreter(self):
        """The spare interpreter if there is one (and model code did not kill it), else a new fork."""
        interp, self.spare = self.spare, None
        if interp and is_running(interp.pid):
            return interp
        if interp:
            self.kill(interp)
        return self.spawn()

    def spawn(self, role="interpreter"):
        """A fresh interpreter for a stateless call (or a session's init, `role="group"`), forked
        by the template: pid 1 of its own pid namespace."""
        ours, theirs = socket.socketpair()
        scratch = self.new_scratch()
        try:
            try:
                pid = self.template.fork(role, scratch, theirs, self.user_namespaces)
            except TemplateLost:
                # Killed (the kernel's OOM killer, say): start another; sessions keep their state.
                self.template.stop()
                self.template = Template.start(self.config, self.host.fileno())
                pid = self.template.fork(role, scratch, theirs, self.user_namespaces)
        finally:
            theirs.close()
        return Interpreter(pid, ours, scratch)

    def start_group(self, session):
        """The session's pid namespace: an init process that makes its interpreters."""
        session["group"] = self.spawn("group")

    def group_request(self, session, request, fds=()):
        group = session["group"]
        group.sock.settimeout(10)
        send_frame(group.sock, request, fds)
        reply, _ = recv_frame(group.sock)
        group.sock.settimeout(None)
        return reply

    def session_interpreter(self, session):
        """A fresh interpreter in the session's pid namespace (started on first use)."""
        if session.get("group") is None or not is_running(session["group"].pid):
            if session.get("group"):
                self.kill(session["group"])
            self.start_group(session)
        ours, theirs = credentials_socketpair()
        scratch = session["group"].scratch
        self.group_request(session, {"op": "spawn", "scratch": scratch}, [theirs.fileno()])
        theirs.close()
        _, pid = recv_hello(ours)
        return Interpreter(pid, ours, scratch, inner_pid(pid))

    def fork_interpreter(self, parent):
        """Ask an interpreter to fork a copy of itself (state and all) serving a new socket."""
        ours, theirs = credentials_socketpair()
        send_frame(parent.sock, {"op": "fork"}, [theirs.fileno()])
        theirs.close()
        _, pid = recv_hello(ours)
        return Interpreter(pid, ours, parent.scratch, inner_pid(pid))

    def kill(self, interp):
        """Kill an interpreter and its process group (its files go in the next `clean_files`)."""
        for target in (
            lambda: os.killpg(interp.pid, signal.SIGKILL),
            lambda: os.kill(interp.pid, signal.SIGKILL),
        ):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        interp.sock.close()

    # ---- one cell

    def execute(self, interp, request, session=None):
        """Run a cell in `interp`, reading its output while it runs; decide the status here, outside it.

        A stateless call is complete when its process has exited (model code cannot fake that); a
        session's cell when a reply carrying this cell's nonce arrives (stray writes to the socket by
        model code are ignored). A timeout, a death or an output flood is decided here either way.
        """
        stateless = request.get("session") is None
        nonce = os.urandom(8).hex()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        limits = dict(
            request["limits"],
            nproc=self.nproc_limit(request["limits"], stateless),
            stateless=stateless,
        )
        start = time.monotonic()
        run = {
            "op": "run",
            "code": request["code"],
            "limits": limits,
            "print_last_expr": request["print_last_expr"],
            "nonce": nonce,
            "exit_after": stateless,
        }
        passed = [out_w, err_w]
        if request.get("stdin") is not None:
            passed.append(stdin_file(request["stdin"]))
        try:
            send_frame(interp.sock, run, passed)
        except OSError:
            pass  # it died already; the pidfd below says so
        for fd in passed:
            os.close(fd)
        cap = request["max_output_bytes"]
        timeout = request["limits"]["timeout"]
        deadline = start + timeout
        captured = {out_r: bytearray(), err_r: bytearray()}
        truncated = {out_r: False, err_r: False}
        replies = ReplyReader(interp.sock, nonce)
        selector = selectors.DefaultSelector()
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        selector.register(interp.sock, selectors.EVENT_READ)
        pidfd, exited = None, False
        try:
            pidfd = os.pidfd_open(interp.pid)
            selector.register(pidfd, selectors.EVENT_READ)
        except ProcessLookupError:
            exited = True
        except OSError:
            pass  # no pidfd (old kernel): poll the process instead
        poll = None if pidfd is not None else 0.01
        verdict = None  # (status, reason) decided here, when not a normal completion
        while verdict is None:
            if replies.outcome is not None and (exited or not stateless):
                break
            if exited:
                replies.read(selector)  # a reply sent just before exiting
                if replies.outcome is None:
                    verdict = ("exited", None)
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                verdict = ("timeout", f"exceeded {timeout:g} s")
                break
            for key, _ in selector.select(min(remaining, poll or remaining)):
                if key.fd == pidfd:
                    exited = True
                elif key.fileobj is interp.sock:
                    replies.read(selector)
                elif not read_capped(key.fd, captured, truncated, cap, selector):
                    verdict = ("killed", "output limit")
                    break
            if poll and not is_running(interp.pid):
                exited = True
        duration = time.monotonic() - start
        if verdict is None or verdict[0] == "exited":
            # Whatever is already in the pipes belongs to this cell.
            for fd in (out_r, err_r):
                if not truncated[fd] and not read_capped(
                    fd, captured, truncated, cap, None, drain=True
                ):
                    verdict = ("killed", "output limit")
        selector.close()
        for fd in (out_r, err_r, pidfd):
            if fd is not None:
                os.close(fd)
        interp.sock.setblocking(True)
        result = {
            "stdout": captured[out_r].decode("utf-8", "replace"),
            "stderr": captured[err_r].decode("utf-8", "replace"),
            "stdout_truncated": truncated[out_r],
            "stderr_truncated": truncated[err_r],
            "duration_s": round(duration, 6),
            "error_type": None,
            "line": None,
            "reason": None,
            "exit_code": None,
        }
        self.settle(result, verdict, replies.outcome, interp, session)
        return result, verdict is None and not exited

    def settle(self, result, verdict, outcome, interp, session):
        """Fill in status, error and reason: from the interpreter's reply after a normal completion,
        else from how its process ended, or from the verdict taken here (timeout, output limit)."""
        if verdict is None:
            result["status"] = "error" if outcome.get("error_type") else "ok"
            if outcome.get("error_type") == "MemoryError":
                result.update(status="killed", reason="memory")
            result.update(
                error_type=outcome.get("error_type"),
                line=outcome.get("line"),
                exit_code=outcome.get("exit_code"),
            )
            if outcome.get("message"):
                result["stderr"] += outcome["message"]
        elif verdict[0] == "exited":
            status = self.wait_status(interp, session)
            if status is not None and os.WIFEXITED(status):
                code = os.WEXITSTATUS(status)
                result.update(status="ok" if code == 0 else "error", exit_code=code)
                if code == CHANNEL_LOST:
                    result.update(
                        error_type="SystemExit", reason="model code closed the result channel"
                    )
                elif code != 0:
                    result.update(error_type="SystemExit", reason=f"exited with code {code}")
            else:
                signaled = status is not None and os.WIFSIGNALED(status)
                result.update(
                    status="killed",
                    reason=signal_reason(os.WTERMSIG(status) if signaled else signal.SIGKILL),
                )
        else:
            result["status"], result["reason"] = verdict

    def wait_status(self, interp, session):
        """The wait status of an interpreter that ended: ours to wait for (a stateless call), or
        collected by its session's init, which reaps on request."""
        for _ in range(200):
            if session is not None:
                status = self.reap_group(session).get(str(interp.inner_pid))
                if status is not None:
                    return status
            else:
                try:
                    done, status = os.waitpid(interp.pid, os.WNOHANG)
                    if done:
                        return status
                except ChildProcessError:
                    return self.orphans.pop(interp.pid, None)
            if not os.path.exists(f"/proc/{interp.pid}"):
                return None
            time.sleep(0.005)
        return None

    def nproc_limit(self, limits, stateless):
        """RLIMIT_NPROC for model code. It counts every task of the uid in the user namespace.

        With a user namespace per call and per session, that is the call's own processes (plus, in a
        session, its init and snapshots: SESSION_PROCESSES). Without, it counts the whole worker, and
        a session's limit, fixed at its first cell, would block it once other sessions start: then
        only stateless calls get one, and the worker's pids cgroup bounds sessions.
        """
        extra = limits.get("max_processes")
        if not extra:
            return None
        if self.user_namespaces:
            return extra + (1 if stateless else SESSION_PROCESSES)
        if not stateless:
            return None
        return count_tasks(self.uid if self.uid is not None else os.getuid()) + extra

    # ---- requests

    def handle(self, request):
        op = request["op"]
        if op == "run":
            return self.op_run(request)
        if op == "snapshot":
            session = self.session(request["session"])
            try:
                if session["live"] is None:
                    session["live"] = self.session_interpreter(session)
                snapshot = self.fork_interpreter(session["live"])
            except (OSError, EOFError, ValueError, KeyError) as e:
                return {"error": f"the interpreter could not be forked ({type(e).__name__})"}
            token = self.next_token
            self.next_token += 1
            session["snapshots"][token] = snapshot
            return {"token": token}
        if op == "restore":
            session = self.sessions.get(request["session"])
            snapshot = session and session["snapshots"].get(request["token"])
            if not snapshot:
                return {"error": "unknown snapshot"}
            try:
                new_live = self.fork_interpreter(snapshot)
            except (OSError, EOFError, ValueError, KeyError) as e:
                return {"error": f"the snapshot could not be forked ({type(e).__name__})"}
            if session["live"]:
                self.kill(session["live"])
            session["live"] = new_live
            self.reap_group(session)
            return {}
        if op == "release":
            session = self.sessions.get(request["session"])
            snapshot = session and session["snapshots"].pop(request["token"], None)
            if snapshot:
                self.kill(snapshot)
                self.reap_group(session)
            return {}
        if op == "close":
            session = self.sessions.pop(request["session"], None)
            if session:
                for interp in [
                    session.get("group"),
                    session["live"],
                    *session["snapshots"].values(),
                ]:
                    if interp:
                        self.kill(interp)
            return {}
        if op == "ping":
            return {
                "pids": len(descendants(os.getpid())),
                "pid_namespaces": self.pid_namespaces,
                "user_namespaces": self.user_namespaces,
            }
        return {"error": f"unknown op {op!r}"}

    def session(self, sid):
        return self.sessions.setdefault(sid, {"group": None, "live": None, "snapshots": {}})

    def reap_group(self, session):
        """Let the session's init collect its dead processes; their wait statuses by inner pid."""
        if session.get("group") and is_running(session["group"].pid):
            try:
                return self.group_request(session, {"op": "reap"}).get("statuses", {})
            except (OSError, EOFError, ValueError):
                pass
        return {}

    def op_run(self, request):
        sid = request.get("session")
        if sid is None:
            interp = self.fresh_interpreter()
            result, _ = self.execute(interp, request)
            self.kill(interp)
            return result
        session = self.session(sid)
        had_state = session["live"] is not None
        if had_state and not is_running(session["live"].pid):
            # Killed between cells (by model code of a call that shared this worker): start over.
            self.kill(session["live"])
            session["live"] = None
        fresh = session["live"] is None
        if fresh:
            session["live"] = self.session_interpreter(session)
        result, alive = self.execute(session["live"], request, session)
        result["session_started"] = fresh
        result["state_lost"] = had_state and fresh
        if not alive:
            # The interpreter is gone (timeout, kill, exit): the next cell starts from a fresh one.
            self.kill(session["live"])
            session["live"] = None
            self.reap_group(session)
            result["state_lost"] = True
        return result

    def serve(self):
        send_frame(
            self.host, {"ready": True, "pid": os.getpid(), "preloaded": self.config["preloaded"]}
        )
        while True:
            try:
                request, _ = recv_frame(self.host)
            except (EOFError, OSError):
                return
            self.orphans.clear()  # exit statuses matter only within the request that caused them
            try:
                reply = self.handle(request)
            except (TemplateLost, TemplateFailed):
                os._exit(1)  # the host sees the worker die, answers `killed` and starts a new one
            except Exception as e:  # noqa: BLE001 - a harness bug must reach the host, not hang it
                reply = {"error": f"{type(e).__name__}: {e}"}
            send_frame(self.host, reply)
            # Clean up and prepare the next interpreter while the host reads the reply. Only a cell
            # or a session's end can leave processes or files behind; snapshots and restores do not.
            if request["op"] in ("run", "close"):
                self.sweep()
                self.clean_files()
            if self.spare is None:
                try:
                    self.spare = self.spawn()
                except (TemplateLost, TemplateFailed):
                    os._exit(1)


def descendants(root):
    """Pids of all descendants of `root`, from /proc (the worker's own /proc in namespace mode)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
        if state != b"Z":
            children.setdefault(int(ppid), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def count_tasks(uid):
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    total += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return total


def inner_pid(pid):
    """The pid of a process in its own (innermost) pid namespace, from /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid


def process_state(pid):
    """(state letter, exit code field) from /proc/<pid>/stat; (None, None) when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None, None
    return fields[0].decode(), int(fields[49]) if len(fields) > 49 else None


def is_running(pid):
    """True unless the process is gone or a zombie."""
    return process_state(pid)[0] not in (None, "Z", "X")


def listdir_paths(directory):
    try:
        return [os.path.join(directory, name) for name in os.listdir(directory)]
    except OSError:
        return []


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


class ReplyReader:
    """Collects an interpreter's replies without ever blocking on it; keeps the one with our nonce."""

    def __init__(self, sock, nonce):
        self.sock, self.nonce = sock, nonce
        self.buffer = b""
        self.outcome = None
        sock.setblocking(False)

    def read(self, selector):
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                try:
                    selector.unregister(self.sock)
                except (KeyError, ValueError):
                    pass
                break
            self.buffer += chunk
            if len(self.buffer) > (4 << 20):
                self.buffer = b""  # garbage from model code; a real reply is far smaller
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            body, self.buffer = (
                self.buffer[HEADER.size : HEADER.size + size],
                self.buffer[HEADER.size + size :],
            )
            try:
                reply = json.loads(body)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("nonce") == self.nonce:
                self.outcome = reply


def read_capped(fd, captured, truncated, cap, selector, drain=False):
    """Read what is available from one output pipe; False once the stream went over its cap."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            if selector is not None:
                selector.unregister(fd)
            return True
        room = cap - len(captured[fd])
        captured[fd] += chunk[: max(room, 0)]
        if len(chunk) > room:
            truncated[fd] = True
            return False
        if not drain:
            return True


def signal_reason(sig):
    if sig == signal.SIGXCPU:
        return "cpu time limit"
    if sig == signal.SIGSEGV:
        return "signal SIGSEGV (stack overflow or crash)"
    try:
        return f"signal {signal.Signals(sig).name}"
    except ValueError:
        return f"signal {sig}"


def user_namespaces_work():
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if enter_own_user_namespace() else 1)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def pid_namespaces_work():
    if SYS_CLONE is None:
        return False
    try:
        pid = fork_into_new_pid_namespace()
    except OSError:
        return False
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return True


MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE_PAGE = 2 << 20


def collapse_heap_into_huge_pages():
    """Back the template's heap with 2 MiB pages where the kernel allows it (Linux 6.1+, THP not off).

    A fork copies one page-table entry per 4 KiB page the parent has written, and the call's exit
    frees them again: for a ~75 MB numpy+sympy template that is much of a stateless call's cost.
    With huge pages a fork copies one entry per 2 MiB; a write after the fork still copies 4 KiB.
    Measured here: a bare fork+exit of that template went from 3.2 to 2.2 ms. Best effort: an error
    leaves 4 KiB pages.
    """
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as f:
            regions = [line.split() for line in f]
    except OSError:
        return
    for fields in regions:
        path = fields[5] if len(fields) > 5 else ""
        if "w" not in fields[1] or path not in ("", "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start, end = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
        if end > start:
            libc.madvise(start, end - start, MADV_HUGEPAGE)
            libc.madvise(start, end - start, MADV_COLLAPSE)


def main():
    host_fd = int(sys.argv[1])
    config = json.loads(sys.argv[2])
    # Not dumpable: model code (same uid) cannot ptrace the zygote or open its /proc/<pid>/fd.
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # Fallback mode (not pid 1): orphans of model code are reparented here, where the sweep sees them.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.makedirs(config["scratch_root"], exist_ok=True)
    template = Template.start(config, host_fd)
    config["preloaded"] = template.preloaded
    Zygote(socket.socket(fileno=host_fd), config, template).serve()


if __name__ == "__main__":
    main()
