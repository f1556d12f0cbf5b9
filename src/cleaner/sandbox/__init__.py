"""The interpreter sandbox: run untrusted model code, fast, isolated, stateless or in sessions.

Quick use (async, one coroutine per trajectory in a rollout):

    from cleaner.sandbox import Sandbox

    async with Sandbox() as sb:                      # a pool of warm workers, one per core
        r = await sb.run("import sympy; print(sympy.factorint(360))")
        r.status, r.stdout, r.error_type, r.line     # 'ok', '{2: 3, 3: 2, 5: 1}\\n', None, None
        r.to_observation()                           # cleaner.trajectory.Observation

`run(code, session=None, timeout=None, stdin=None, print_last_expr=None)`: `stdin` is what the
cell reads from standard input (`input()`, `sys.stdin`, fd 0); without it, standard input is empty.

Blocking code uses `SyncSandbox()` (same methods, no await). `connect(url)` returns the HTTP client
(`RemoteSandbox`) when a URL is given or CLEANER_SANDBOX_URL is set, else an embedded `Sandbox`: the
same API either way. `serve(host, port)` runs the service; `exec_file(in, out)` is `cleaner exec`.

Results (`ExecResult`) are decided by the host: status `ok | error | timeout | killed | invalid`,
stdout and stderr (capped while reading, with `stdout_truncated` / `stderr_truncated`), `error_type`
and `line` of an exception (its traceback, with the cell's own frames only, ends `stderr`), `reason`
for `killed` and `timeout`, `duration_s`, `exit_code` after `sys.exit`/`os._exit`, and `isolation`.

Sessions (stateful, as in Jupyter): pass any string as `session=`; variables persist across its
calls; sessions are separate. A session whose interpreter dies (timeout, memory, os._exit) answers
with `state_lost=True`, and its next call runs in a fresh interpreter (`session_started=True`).
`close_session(id)` frees it. Snapshots, for online SAAR (undo a failed call before its correction):

    token = await sb.snapshot(sid)          # a frozen fork of the interpreter, state before the call
    r = await sb.run(code, session=sid)
    while not r.ok and attempts_left:
        await sb.restore(sid, token)        # back to the pre-failure state; the token stays valid
        r = await sb.run(correction, session=sid)
    await sb.release(sid, token)            # free the frozen copy

A snapshot survives the death of the live interpreter (a timeout), so a timed-out call can still be
undone. `restore` raises `SnapshotLost` if the snapshot was released or its worker died.

How it works: each worker is a zygote with a template process that imported (and exercised) numpy
and sympy once and forks a fresh interpreter per stateless call, so a fresh state costs a fork, not
an interpreter start; a session is a long-lived fork, a snapshot a fork of that. The template does
nothing but fork (the zygote's bookkeeping would dirty pages every fork then copies) and keeps its
heap in 2 MiB pages where the kernel allows, so a fork copies fewer page-table entries. In namespace mode each
worker runs in bubblewrap (user, pid, network, mount, IPC, UTS namespaces; started as an unprivileged
host uid, uid 65534 inside; read-only root with only /usr and the Python installation; a
size-bounded scratch tmpfs; no network; a cleared environment; pids and memory cgroups when
writable), the zygote is pid 1 of the worker, and every call and every session gets a pid namespace
and a user namespace of its own: model code cannot see or signal another trajectory's processes,
its process limit counts its own processes only, and everything it started dies with the call (or
with the session); after every call the zygote also kills any process that is not an interpreter. Model code runs without capabilities, under rlimits (address
space 2 GiB by default, CPU, file size, open files, processes; the stack is left alone) with one
BLAS thread. Where namespaces do not work, `isolation="auto"` falls back to rlimits + setsid + a
separate uid with a loud warning; every result says which level was in force (see
`cleaner.sandbox.isolation`).

Who decides a verdict: the zygote, which model code cannot signal (pid 1 ignores them), trace or
read (not dumpable), and the host above it, which kills the whole worker when the zygote misses its
deadline. A stateless call counts as finished only when its process has exited; a session's cell when
the interpreter replies with that cell's nonce. Timeouts, kills, memory and output verdicts are never
taken from inside.

Known limits: a stateless call's code runs as pid 1 of its namespace (`os.getpid()` is 1; signals
it sends itself without a handler are ignored, as for any init), and /proc shows the worker's pid
namespace, so `/proc/<os.getpid()>` is not its own (`/proc/self` is). Processes started by a cell do
not outlive it, in sessions too (nothing runs between calls but interpreters); threads of a session
do, bounded by its CPU limit. A session's rlimits are fixed by its first cell (a lowered hard limit
cannot rise). A worker runs one request at a time and a session stays on its worker, so a long cell
delays the other sessions of that worker (more workers than cores is allowed). In the fallback level
calls and sessions share one pid namespace and can signal each other; the victim session then
reports `state_lost` and continues in a fresh interpreter.
"""

from cleaner.sandbox.execfile import exec_file
from cleaner.sandbox.isolation import IsolationUnavailable
from cleaner.sandbox.local import Limits, Sandbox, SnapshotLost
from cleaner.sandbox.result import ExecResult
from cleaner.sandbox.service import RemoteSandbox, SandboxUnavailable, make_app, serve
from cleaner.sandbox.sync import SyncSandbox, connect

__all__ = [
    "ExecResult",
    "IsolationUnavailable",
    "Limits",
    "RemoteSandbox",
    "Sandbox",
    "SandboxUnavailable",
    "SnapshotLost",
    "SyncSandbox",
    "connect",
    "exec_file",
    "make_app",
    "serve",
]
