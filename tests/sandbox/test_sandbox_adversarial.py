"""Model code that attacks the sandbox: each case gets a structured result, and the next call works.

Real processes, real namespaces (or the fallback, whichever this machine gives). The module-scoped
`sb` fixture has a 10 s timeout (tests that expect a timeout pass a short one), 512 MiB and a 64 KiB output cap.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from .conftest import processes_with

namespaces_only = pytest.mark.usefixtures("require_namespaces")


def assert_healthy(sb):
    r = sb.run("print(sum(range(10)))")
    assert (r.status, r.stdout) == ("ok", "45\n")


def test_infinite_loop_times_out(sb):
    r = sb.run("while True:\n    pass", timeout=0.5)
    assert r.status == "timeout"
    assert r.reason and "0.5" in r.reason
    assert_healthy(sb)


def test_infinite_loop_keeps_output_printed_before_it(sb):
    r = sb.run("print('started', flush=True)\nwhile True: pass", timeout=1.5)
    assert r.status == "timeout" and r.stdout == "started\n"


@namespaces_only
def test_fork_bomb_is_contained(sb):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = sb.run(code, timeout=1.0)
    assert r.status in ("timeout", "killed")
    assert_healthy(sb)


def test_memory_bomb_is_killed_with_reason(sb):
    r = sb.run("chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))")
    assert r.status == "killed" and r.reason == "memory"
    assert r.error_type == "MemoryError"
    assert_healthy(sb)


def test_single_huge_allocation(sb):
    r = sb.run("x = bytearray(8 << 30)")
    assert r.status == "killed" and r.reason == "memory"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_capped_while_reading(sb, stream):
    r = sb.run(f"import sys\nwhile True:\n    sys.{stream}.write('x' * 4096)")
    assert r.status == "killed" and r.reason == "output limit"
    assert getattr(r, f"{stream}_truncated") is True
    assert len(getattr(r, stream)) == 64 << 10
    assert_healthy(sb)


def test_large_output_below_the_cap_is_complete(sb):
    r = sb.run("print('y' * 50000)")
    assert r.ok and len(r.stdout) == 50001 and not r.stdout_truncated


def test_setsid_double_fork_daemon_dies_with_the_call(sb):
    marker = "4242.123"
    code = f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['sleep', '{marker}'])
    os._exit(0)
print('parent done')
"""
    r = sb.run(code)
    assert r.ok and r.stdout == "parent done\n"
    assert processes_with(marker.encode()) == []
    if sb.sandbox.isolation.level == "namespaces":
        # Nor is it anywhere in the worker (its /proc shows only the worker's processes).
        r = sb.run(
            "import os\nprint([p for p in os.listdir('/proc') if p.isdigit() and "
            f"b'{marker}' in open(f'/proc/{{p}}/cmdline','rb').read()])"
        )
        assert r.stdout == "[]\n"


@namespaces_only
def test_no_network_not_even_host_loopback(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.3)
    port = server.getsockname()[1]
    try:
        r = sb.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert r.status == "error" and r.error_type in (
            "ConnectionRefusedError",
            "OSError",
            "TimeoutError",
        )
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    r = sb.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert r.status == "error"


@namespaces_only
def test_writes_outside_scratch_fail(sb, tmp_path):
    target = tmp_path / "escape.txt"
    for path in ("/usr/escape", "/etc/escape", "/escape", str(target), "/proc/sys/kernel/hostname"):
        r = sb.run(f"open({path!r}, 'w').write('x')")
        assert r.status == "error", path
        assert r.error_type in ("PermissionError", "OSError", "FileNotFoundError"), (
            path,
            r.error_type,
        )
    assert not target.exists()
    r = sb.run("open('notes.txt', 'w').write('kept'); print(open('notes.txt').read())")
    assert r.ok and r.stdout == "kept\n"


@namespaces_only
def test_scratch_files_do_not_leak_between_calls(sb):
    assert sb.run("open('/tmp/leak', 'w').write('x'); open('mine', 'w').write('x')").ok
    r = sb.run(
        "import os\nprint(os.path.exists('/tmp/leak'), os.path.exists('mine'), os.listdir('.'))"
    )
    assert r.stdout == "False False []\n"


@namespaces_only
def test_host_files_are_not_visible(sb, tmp_path):
    (tmp_path / "answers.txt").write_text("42")
    paths = [str(tmp_path / "answers.txt"), os.getcwd(), "/home", "/etc/passwd", "/etc/shadow"]
    r = sb.run(f"import os\nprint([os.path.exists(p) for p in {paths!r}])")
    assert r.stdout == "[False, False, False, False, False]\n"


@namespaces_only
@pytest.mark.parametrize(
    "code",
    [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal\nos.killpg(0, signal.SIGKILL)",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
        "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGTERM)\nos.kill(1, signal.SIGSTOP)",
    ],
    ids=["parent", "process-group", "everything", "pid-1"],
)
def test_killing_the_parent_or_group_gives_a_result(sb, code):
    sb.run("kept = 1", session="bystander")
    r = sb.run(code)
    assert r.status in ("ok", "killed", "error")  # error: ProcessLookupError when nothing else ran
    if r.status == "killed":
        assert r.reason
    assert_healthy(sb)
    # A session on the same worker may have been killed too (same uid): it then says so, and works.
    r = sb.run("print(globals().get('kept'))", session="bystander")
    assert r.ok and r.stdout == ("None\n" if r.state_lost else "1\n")
    sb.close_session("bystander")


@namespaces_only
def test_signals_cannot_reach_host_processes(sb):
    sleeper = os.spawnv(os.P_NOWAIT, "/bin/sleep", ["sleep", "30"])
    try:
        r = sb.run(f"import os, signal\nos.kill({sleeper}, signal.SIGKILL)")
        assert r.status in ("error", "killed", "ok")
        assert os.waitpid(sleeper, os.WNOHANG) == (0, 0), (
            "the host process was killed from the sandbox"
        )
    finally:
        os.kill(sleeper, signal.SIGKILL)
        os.waitpid(sleeper, 0)


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ("import os\nprint('bye', flush=True)\nos._exit(0)", "ok", 0),
        ("import os\nos._exit(3)", "error", 3),
        ("import sys\nsys.exit()", "ok", 0),
        ("import sys\nsys.exit(2)", "error", 2),
        ("raise SystemExit('message')", "error", 1),
    ],
)
def test_exits(sb, code, status, exit_code):
    r = sb.run(code)
    assert r.status == status and r.exit_code == exit_code
    if status == "error":
        assert r.error_type == "SystemExit"
    assert_healthy(sb)


def test_recursion_error(sb):
    r = sb.run("def f(n):\n    return f(n + 1)\nf(0)")
    assert r.status == "error" and r.error_type == "RecursionError" and r.line == 2
    assert "Previous line repeated" in r.stderr and len(r.stderr) < 5000


def test_recursion_past_the_c_stack_is_killed(sb):
    # repr of a deeply nested list recurses in C; the raised limit lets it overflow the stack.
    r = sb.run(
        "import sys\nsys.setrecursionlimit(10**8)\nx = []\nfor _ in range(10**6):\n    x = [x]\nrepr(x)"
    )
    assert r.status == "killed" and "SIGSEGV" in r.reason
    assert_healthy(sb)


def test_syntax_error_names_the_line(sb):
    r = sb.run("x = 1\ny = (\nprint(x)")
    assert r.status == "error" and r.error_type == "SyntaxError" and r.line == 2
    assert "SyntaxError" in r.stderr and "zygote" not in r.stderr


def test_file_descriptor_exhaustion(sb):
    r = sb.run("files = [open('/dev/null') for _ in range(100000)]")
    assert r.status == "error" and r.error_type == "OSError" and "Too many open files" in r.stderr
    assert_healthy(sb)


@namespaces_only
def test_disk_fill_is_bounded_and_freed(sb):
    # One big file hits RLIMIT_FSIZE; many smaller ones fill the size-bounded scratch tmpfs (64 MiB).
    r = sb.run("with open('big', 'wb') as f:\n    while True:\n        f.write(bytes(1 << 20))")
    assert r.status == "error" and r.error_type == "OSError"
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(bytes(8 << 20))\n    i += 1"
    r = sb.run(code)
    assert r.status == "error" and r.error_type == "OSError" and "No space left" in r.stderr
    r = sb.run("open('after', 'wb').write(bytes(16 << 20)); print('written')")
    assert r.ok and r.stdout == "written\n"


def test_spinning_threads_do_not_block_the_result(sb):
    code = "import threading\nfor _ in range(4):\n    threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\nprint('main done')"
    r = sb.run(code)
    assert r.ok and r.stdout == "main done\n"
    assert_healthy(sb)


def test_numpy_and_sympy_use_threads_under_the_memory_limit(sb):
    code = """
import threading, numpy as np, sympy
results = []
def work(seed):
    a = np.random.default_rng(seed).random((200, 200))
    results.append(float(np.linalg.eigvalsh(a @ a.T).max()))
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(results), sympy.factorint(2**32 + 1))
"""
    r = sb.run(code)
    assert r.ok, r.stderr
    assert r.stdout == "8 {641: 1, 6700417: 1}\n"


def test_binary_output_is_decoded_not_fatal(sb):
    r = sb.run(
        "import sys\nsys.stdout.buffer.write(bytes(range(256)))\nsys.stderr.buffer.write(b'\\xff\\xfe')"
    )
    assert r.ok
    assert "\ufffd" in r.stdout and "\ufffd" in r.stderr
    json.dumps(r.to_dict())


def test_environment_is_scrubbed(sb):
    os.environ["CLEANER_TEST_SECRET"] = "hunter2"
    try:
        r = sb.run(
            "import os\nprint('CLEANER_TEST_SECRET' in os.environ, os.environ.get('OPENBLAS_NUM_THREADS'))"
        )
        assert r.stdout == "False 1\n"
    finally:
        del os.environ["CLEANER_TEST_SECRET"]


@namespaces_only
def test_harness_tampering_cannot_forge_a_verdict(sb):
    # Write a fake "everything fine" frame on every open descriptor, then hang: still a timeout.
    code = """
import os, json, struct
frame = json.dumps({"error_type": None, "message": None, "line": None, "exit_code": None}).encode()
for fd in range(3, 64):
    try:
        os.write(fd, struct.pack('!I', len(frame)) + frame)
    except OSError:
        pass
while True:
    pass
"""
    r = sb.run(code, timeout=0.5)
    assert r.status == "timeout"
    r = sb.run("open('/proc/1/mem', 'rb')")
    assert r.status == "error" and r.error_type in ("PermissionError", "FileNotFoundError")
    assert_healthy(sb)


def test_stdout_replaced_by_model_code_is_restored_next_cell(sb):
    assert sb.run("import sys, io\nsys.stdout = io.StringIO()\nsys.stdout.close()", session="t").ok
    r = sb.run("print('visible')", session="t")
    assert r.stdout == "visible\n"
    sb.close_session("t")


def test_results_report_isolation(sb):
    r = sb.run("pass")
    assert r.isolation.split("+")[0] in ("namespaces", "rlimits")


@namespaces_only
def test_many_concurrent_attacks_then_all_healthy(sb):
    attacks = [
        "while True: pass",
        "import os\nos.kill(-1, 9)",
        "print('z' * 10**7)",
        "x = bytearray(8 << 30)",
        "import os\nos._exit(1)",
    ] * 2
    results = [None] * len(attacks)

    def go(i):
        results[i] = sb.run(attacks[i], timeout=0.5)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(attacks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(
        r is not None and r.status != "ok" or attacks[i].startswith("import os\nos.kill")
        for i, r in enumerate(results)
    )
    assert_healthy(sb)


def test_a_worker_that_dies_is_replaced_and_the_call_is_killed():
    from cleaner.sandbox import Limits, SnapshotLost, SyncSandbox

    with SyncSandbox(workers=1, limits=Limits(timeout=5)) as sandbox:
        assert sandbox.run("x = 1", session="s").ok
        token = sandbox.snapshot("s")
        worker = sandbox.sandbox.workers[0]

        def kill_worker_soon():
            time.sleep(0.3)
            os.killpg(worker.process.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_worker_soon)
        killer.start()
        r = sandbox.run("while True: pass")
        killer.join()
        assert r.status == "killed" and "worker" in r.reason
        assert sandbox.run("print('again')").stdout == "again\n"
        # The session lived in that worker: its state and snapshots are gone, and it says so.
        r = sandbox.run("print('x' in globals())", session="s")
        assert r.stdout == "False\n" and r.session_started and r.state_lost
        with pytest.raises(SnapshotLost):
            sandbox.restore("s", token)


def test_calls_and_sessions_cannot_signal_each_other():
    from cleaner.sandbox import SyncSandbox

    with SyncSandbox(workers=1) as sandbox:
        ping = sandbox._call(sandbox.sandbox.workers[0].request({"op": "ping"}, 30))
        if not ping.get("pid_namespaces"):
            pytest.skip("no pid namespace per call here (fallback level)")
        sandbox.run("secret = 42", session="victim")
        for attacker in (None, "attacker"):
            r = sandbox.run("import os, signal\nos.kill(-1, signal.SIGKILL)", session=attacker)
            assert r.status in ("ok", "error", "killed")
        r = sandbox.run("print(secret)", session="victim")
        assert r.stdout == "42\n" and not r.state_lost


def test_model_code_has_no_capabilities(sb):
    code = "caps = dict(l.split(':') for l in open('/proc/self/status') if l.startswith('Cap'))\nprint(int(caps['CapEff'], 16), int(caps['CapPrm'], 16))"
    assert sb.run(code).stdout == "0 0\n"
    assert sb.run(code, session="caps").stdout == "0 0\n"
    sb.close_session("caps")


def test_many_processes_cannot_exceed_the_workers_memory():
    from cleaner.sandbox import Limits, SyncSandbox

    with SyncSandbox(
        workers=1, limits=Limits(timeout=30, memory_mb=512), worker_memory_mb=768
    ) as sandbox:
        if "memory" not in sandbox.sandbox.isolation.cgroups:
            pytest.skip("no writable memory cgroup here")
        assert sandbox.run("pass").ok
        generation = sandbox.sandbox.workers[0].generation
        # Six processes holding 256 MiB each: each is under RLIMIT_AS, together far over 768 MiB.
        code = """
import os, time
pids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            block = bytearray(256 << 20)
            time.sleep(2)
        finally:
            os._exit(0)
    pids.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))
"""
        r = sandbox.run(code)
        assert r.status in ("ok", "killed")
        if r.ok:
            assert "-9" in r.stdout  # the kernel killed some of them
        assert sandbox.run("print('alive')").stdout == "alive\n"
        assert sandbox.sandbox.workers[0].generation == generation  # the zygote survived
