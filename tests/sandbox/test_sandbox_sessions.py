"""Stateless and stateful runs, snapshots for SAAR, results and observations, the async API."""

from __future__ import annotations

import asyncio

import pytest

from cleaner.sandbox import ExecResult, Limits, Sandbox, SnapshotLost
from cleaner.trajectory import Observation, Turn


def test_stateless_calls_share_nothing(sb):
    assert sb.run("x = 41").ok
    r = sb.run("print(x)")
    assert r.status == "error" and r.error_type == "NameError" and r.line == 1


def test_session_variables_persist_and_sessions_are_separate(sb):
    first = sb.run("x = 41", session="a")
    assert first.ok and first.session_started and not first.state_lost
    sb.run("x = 1", session="b")
    r = sb.run("x += 1\nprint(x)", session="a")
    assert r.stdout == "42\n" and not r.session_started
    assert sb.run("print(x)", session="b").stdout == "1\n"
    sb.close_session("a")
    sb.close_session("b")
    again = sb.run("print('x' in globals())", session="a")
    assert again.stdout == "False\n" and again.session_started
    sb.close_session("a")


def test_error_text_shows_only_the_cells_frames(sb):
    r = sb.run("import json\ndef parse(s):\n    return json.loads(s)\nparse('{')")
    assert r.status == "error" and r.error_type == "JSONDecodeError" and r.line == 3
    assert 'File "<cell>", line 4' in r.stderr and 'File "<cell>", line 3' in r.stderr
    assert "json/decoder.py" not in r.stderr and "zygote" not in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("json.decoder.JSONDecodeError: Expecting")


def test_print_last_expression(sb):
    assert sb.run("x = 6\nx * 7", print_last_expr=True).stdout == "42\n"
    assert sb.run("x = 6\nx * 7").stdout == ""
    assert sb.run("None", print_last_expr=True).stdout == ""
    assert sb.run("print('a')", print_last_expr=True).stdout == "a\n"
    assert sb.run("import sympy\nsympy.Rational(1, 3) + 1", print_last_expr=True).stdout == "4/3\n"


def test_invalid_calls(sb):
    r = sb.run(None)
    assert r.status == "invalid" and "string" in r.reason
    assert sb.run("print('a\x00')").status == "invalid"


def test_snapshot_restore_undoes_a_failed_call_repeatedly(sb):
    sid = "saar"
    sb.run("data = [1, 2, 3]", session=sid)
    token = sb.snapshot(sid)
    failed = sb.run("data.append(4)\ndata.clear()\ndata[0]", session=sid)
    assert failed.status == "error" and failed.error_type == "IndexError"
    for attempt in range(3):
        sb.restore(sid, token)
        r = sb.run("data.append(10)\nprint(data)", session=sid)
        assert r.stdout == "[1, 2, 3, 10]\n", attempt
    sb.release(sid, token)
    with pytest.raises(SnapshotLost):
        sb.restore(sid, token)
    # The live state after the last correction is kept.
    assert sb.run("print(data)", session=sid).stdout == "[1, 2, 3, 10]\n"
    sb.close_session(sid)


def test_snapshot_survives_a_timeout_of_the_live_interpreter(sb):
    sid = "timeout"
    sb.run("keep = 'before'", session=sid)
    token = sb.snapshot(sid)
    r = sb.run("keep = 'during'\nwhile True: pass", session=sid, timeout=0.5)
    assert r.status == "timeout" and r.state_lost
    sb.restore(sid, token)
    r = sb.run("print(keep)", session=sid)
    assert r.stdout == "before\n" and not r.session_started
    sb.close_session(sid)


def test_session_killed_by_timeout_restarts_and_says_so(sb):
    sid = "restart"
    sb.run("x = 1", session=sid)
    r = sb.run("while True: pass", session=sid, timeout=0.5)
    assert r.status == "timeout" and r.state_lost
    r = sb.run("print('x' in globals())", session=sid)
    assert r.ok and r.stdout == "False\n" and r.session_started
    sb.close_session(sid)


def test_os_exit_in_a_session_loses_state_and_says_so(sb):
    sid = "exit"
    sb.run("x = 1", session=sid)
    r = sb.run("import os\nos._exit(0)", session=sid)
    assert r.ok and r.state_lost and r.exit_code == 0
    r = sb.run("x = 2\nprint(x)", session=sid)
    assert r.stdout == "2\n" and r.session_started
    sb.close_session(sid)


def test_sys_exit_in_a_session_keeps_state(sb):
    sid = "sysexit"
    sb.run("x = 1", session=sid)
    r = sb.run("import sys\nsys.exit(3)", session=sid)
    assert r.status == "error" and r.error_type == "SystemExit" and not r.state_lost
    assert sb.run("print(x)", session=sid).stdout == "1\n"
    sb.close_session(sid)


def test_snapshot_of_an_unstarted_session_is_the_empty_state(sb):
    sid = "empty"
    token = sb.snapshot(sid)
    sb.run("x = 1", session=sid)
    sb.restore(sid, token)
    assert sb.run("print('x' in globals())", session=sid).stdout == "False\n"
    sb.close_session(sid)


def test_session_threads_keep_running_between_cells(sb):
    sid = "threads"
    sb.run(
        "import threading, time\nticks = []\nthreading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.01) for _ in range(1000)], daemon=True).start()",
        session=sid,
    )
    r = sb.run("import time\nn = len(ticks)\ntime.sleep(0.1)\nprint(len(ticks) > n)", session=sid)
    assert r.stdout == "True\n"
    sb.close_session(sid)


def test_result_to_observation():
    result = ExecResult(
        status="error",
        stdout="",
        stderr="NameError: name 'x' is not defined\n",
        error_type="NameError",
        line=1,
        duration_s=0.01,
        isolation="namespaces",
    )
    obs = result.to_observation()
    assert isinstance(obs, Observation)
    assert (obs.status, obs.error_type) == ("error", "NameError")
    assert obs.extra == {"line": 1, "duration_s": 0.01, "isolation": "namespaces"}
    # It fits a trajectory turn, and survives the round trip through the interchange format.
    turn = Turn(reasoning="", code="print(x)", observation=obs)
    assert Turn.from_dict(turn.to_dict()).observation == obs
    assert ExecResult.from_dict(result.to_dict()) == result


def test_real_results_convert(sb):
    for code in ("print(1)", "1/0", "while True: pass"):
        obs = sb.run(code, timeout=0.5).to_observation()
        assert Observation.from_dict(obs.to_dict()) == obs
        assert "duration_s" in obs.extra and "isolation" in obs.extra


async def test_async_api_runs_calls_in_parallel_and_sessions_in_order():
    async with Sandbox(workers=2, limits=Limits(timeout=10)) as sandbox:
        stateless = [sandbox.run(f"print({i} * {i})") for i in range(12)]
        results = await asyncio.gather(*stateless)
        assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]

        async def trajectory(name: str) -> list[str]:
            out = []
            for step in range(4):
                code = "n = 0" if step == 0 else "n += 1\nprint(n)"
                out.append((await sandbox.run(code, session=name)).stdout)
            await sandbox.close_session(name)
            return out

        traces = await asyncio.gather(*(trajectory(f"t{i}") for i in range(6)))
        assert all(t == ["", "1\n", "2\n", "3\n"] for t in traces)
        assert sandbox.sessions == []


async def test_async_snapshot_api():
    async with Sandbox(workers=1) as sandbox:
        await sandbox.run("x = 1", session="s")
        token = await sandbox.snapshot("s")
        await sandbox.run("x = 2", session="s")
        await sandbox.restore("s", token)
        assert (await sandbox.run("print(x)", session="s")).stdout == "1\n"
        await sandbox.release("s", token)
        await sandbox.close_session("s")


@pytest.mark.slow
def test_opening_and_closing_1000_sessions_leaks_nothing(sb):
    workers = sb.sandbox.workers

    def zygote_processes() -> list[int]:
        return [sb._call(w.request({"op": "ping"}, 30))["pids"] for w in workers]

    async def churn(start: int) -> None:
        for i in range(start, 1000, 8):
            sid = f"churn{i}"
            await sb.sandbox.run("x = list(range(100))", session=sid)
            if i % 10 == 0:
                await sb.sandbox.snapshot(sid)
            await sb.sandbox.close_session(sid)

    async def all_churn() -> None:
        await asyncio.gather(*(churn(k) for k in range(8)))

    sb.run("pass")
    before = zygote_processes()
    sb._call(all_churn())
    sb.run("pass")
    assert zygote_processes() == before
    assert sb.sandbox.sessions == []
    if sb.sandbox.isolation.level == "namespaces":
        # The only scratch directory left is the one of the call that looks.
        r = sb.run("import os\nprint(os.listdir('/tmp/work') == [os.path.basename(os.getcwd())])")
        assert r.stdout == "True\n"


def test_exit_of_a_restored_interpreter_is_reported_exactly(sb):
    sid = "restored-exit"
    sb.run("x = 1", session=sid)
    token = sb.snapshot(sid)
    sb.restore(sid, token)
    r = sb.run("import os\nos._exit(4)", session=sid)
    assert r.status == "error" and r.exit_code == 4 and r.state_lost
    sb.restore(sid, token)
    r = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", session=sid)
    assert r.status == "killed" and r.reason == "signal SIGKILL"
    sb.restore(sid, token)
    assert sb.run("print(x)", session=sid).stdout == "1\n"
    sb.close_session(sid)


async def test_saar_flows_in_parallel_keep_their_own_state():
    """What online SAAR does, for several trajectories at once: snapshot before every call, restore
    and retry after a failure, release when the call succeeded."""
    async with Sandbox(workers=2, limits=Limits(timeout=10)) as sandbox:

        async def trajectory(k: int) -> list[str]:
            sid = f"saar{k}"
            await sandbox.run(f"total = {k}", session=sid)
            outputs = []
            for step in range(3):
                token = await sandbox.snapshot(sid)
                failed = await sandbox.run(f"total += 1000\nraise ValueError({step})", session=sid)
                assert failed.error_type == "ValueError" and failed.line == 2
                await sandbox.restore(sid, token)
                fixed = await sandbox.run("total += 1\nprint(total)", session=sid)
                outputs.append(fixed.stdout)
                await sandbox.release(sid, token)
            await sandbox.close_session(sid)
            return outputs

        results = await asyncio.gather(*(trajectory(k) for k in range(6)))
        assert results == [[f"{k + 1}\n", f"{k + 2}\n", f"{k + 3}\n"] for k in range(6)]


async def test_saar_flows_survive_timeouts_exits_and_attacks_around_them():
    """Concurrent sessions, each going through every kind of failed call (error, timeout, exit) with
    a restore after it, while stateless calls on the same workers try to kill everything."""
    failures = {
        "error": ("total += 100\n1/0", None),
        "timeout": ("total += 100\nwhile True: pass", 0.5),
        "exit": ("total += 100\nimport os\nos._exit(2)", None),
    }
    async with Sandbox(workers=2, limits=Limits(timeout=10)) as sandbox:

        async def trajectory(k: int) -> str:
            sid = f"mixed{k}"
            await sandbox.run("total = 0", session=sid)
            kinds = list(failures)[k % 3 :] + list(failures)[: k % 3]
            for kind in kinds:
                token = await sandbox.snapshot(sid)
                code, timeout = failures[kind]
                failed = await sandbox.run(code, session=sid, timeout=timeout)
                assert failed.status in ("error", "timeout"), (kind, failed)
                await sandbox.run("import os, signal\nos.kill(-1, signal.SIGKILL)")
                await sandbox.restore(sid, token)
                assert (await sandbox.run("total += 1", session=sid)).ok
                await sandbox.release(sid, token)
            out = (await sandbox.run("print(total)", session=sid)).stdout
            await sandbox.close_session(sid)
            return out

        assert await asyncio.gather(*(trajectory(k) for k in range(6))) == ["3\n"] * 6


async def test_fresh_interpreters_start_with_the_preloaded_modules_and_no_others():
    from cleaner.sandbox import Sandbox

    async with Sandbox(workers=1, preload=("fractions", "no_such_module_here")) as sb:
        r = await sb.run("import sys; print('fractions' in sys.modules, 'sympy' in sys.modules)")
        assert r.stdout == "True False\n"
        assert sb.workers[0].preloaded == ["fractions"]  # a missing module is skipped, not fatal


async def test_a_killed_template_is_replaced_without_failing_a_call_or_a_session():
    """The template (what interpreters are forked from) is the biggest process of a worker, the
    kernel's pick when memory runs out were it not for the interpreters' OOM scores: losing it costs
    a restart of it, not a call or a session."""
    import os
    import signal
    from pathlib import Path

    from cleaner.sandbox import Sandbox

    def below(root: int) -> list[int]:
        children: dict[int, list[int]] = {}
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
        out, todo = [], [root]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    def processes(worker) -> dict[int, tuple[int, str]]:
        """pid -> (parent pid, OOM score adjustment) of the worker's Python processes."""
        found = {}
        for pid in below(worker.process.pid):
            try:
                if b"zygote.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    found[pid] = (parent, Path(f"/proc/{pid}/oom_score_adj").read_text().strip())
            except OSError:
                continue
        return found

    def template(worker) -> int:
        found = processes(worker)
        # the zygote's child that kept the zygote's OOM score: interpreters and session inits raise
        # theirs, so the kernel kills model code first when memory runs out
        (pid,) = [p for p, (parent, score) in found.items() if parent in found and score == "0"]
        assert {score for p, (_, score) in found.items() if p != pid and found[p][0] in found} <= {
            "1000"
        }
        return pid

    async with Sandbox(workers=1) as sb:
        assert (await sb.run("x = 41", session="s")).ok
        first = template(sb.workers[0])
        os.kill(first, signal.SIGKILL)
        results = [await sb.run("print(6 * 7)") for _ in range(3)]
        assert [(r.status, r.stdout) for r in results] == [("ok", "42\n")] * 3
        kept = await sb.run("print(x + 1)", session="s")
        assert (kept.status, kept.stdout, kept.state_lost) == ("ok", "42\n", False)
        assert template(sb.workers[0]) != first


def test_standard_input(sb):
    text = "3 4\nsecond line\n"
    r = sb.run("a, b = map(int, input().split()); print(a * b); print(input().upper())", stdin=text)
    assert (r.status, r.stdout) == ("ok", "12\nSECOND LINE\n")
    r = sb.run("import sys, os; print(len(sys.stdin.read()), len(os.read(0, 100)))", stdin=text)
    assert r.stdout == f"{len(text)} 0\n"  # one file behind sys.stdin and fd 0, read once
    r = sb.run("import os; print(repr(open(0).read()))", stdin="é\n")
    assert r.stdout == "'é\\n'\n"
    assert sb.run("print(repr(input()))").error_type == "EOFError"  # no input: empty
    assert sb.run("print(1)", stdin=5).status == "invalid"


def test_a_sessions_cells_read_their_own_input_only(sb):
    assert sb.run("first = input()", session="in", stdin="one\nleft over\n").ok
    r = sb.run("import os; print(first, repr(os.read(0, 100)))", session="in")
    assert r.stdout == "one b''\n"  # the unread rest of the previous cell's input is gone
    r = sb.run("print(first, input())", session="in", stdin="two\n")
    assert r.stdout == "one two\n"
    sb.close_session("in")
