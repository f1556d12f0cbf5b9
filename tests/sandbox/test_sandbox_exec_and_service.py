"""`exec_file` (what `cleaner exec` calls), the HTTP service and its client, and the fallback level."""

from __future__ import annotations

import json
import warnings

import pytest
from aiohttp.test_utils import TestServer

from cleaner.jsonl import RecordError
from cleaner.sandbox import (
    Limits,
    RemoteSandbox,
    Sandbox,
    SandboxUnavailable,
    SnapshotLost,
    SyncSandbox,
    connect,
    exec_file,
    make_app,
)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_exec_file_gives_every_id_exactly_one_line(tmp_path):
    records = [
        {"id": "ok", "code": "print(2 + 2)"},
        {"id": "s1", "code": "x = 10", "session": "A"},
        {"id": 7, "code": "print(1/0)"},
        {"id": "s2", "code": "x += 1\nprint(x)", "session": "A"},
        {"id": "other", "code": "print('x' in globals())", "session": "B"},
        {"id": "killer", "code": "import os, signal\nos.killpg(0, signal.SIGKILL)"},
        {"id": "loop", "code": "while True: pass", "meta": {"kept": True}},
        {"id": "s3", "code": "print(x)", "session": "A"},
        {"id": "in", "code": "print(sum(map(int, input().split())))", "stdin": "1 2 3\n"},
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, records)
    summary = exec_file(source, out, timeout=1.0, workers=2)
    lines = read_jsonl(out)
    assert [line["id"] for line in lines] == [r["id"] for r in records]
    by_id = {line["id"]: line for line in lines}
    assert by_id["ok"]["status"] == "ok" and by_id["ok"]["stdout"] == "4\n"
    assert by_id[7]["error_type"] == "ZeroDivisionError" and by_id[7]["line"] == 1
    assert by_id["s2"]["stdout"] == "11\n" and by_id["s3"]["stdout"] == "11\n"
    assert by_id["s2"]["session"] == "A"
    assert by_id["other"]["stdout"] == "False\n"
    assert by_id["killer"]["status"] in ("killed", "ok")
    assert by_id["loop"]["status"] == "timeout" and by_id["loop"]["meta"] == {"kept": True}
    assert by_id["in"]["stdout"] == "6\n"
    assert all(
        {"status", "stdout", "stderr", "duration_s", "isolation"} <= set(line) for line in lines
    )
    assert summary["calls"] == len(records) and sum(summary["status"].values()) == len(records)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("{not json", None),
        ('{"code": "print(1)"}', "id"),
        ('{"id": 1}', "code"),
        ('{"id": 1, "code": 5}', "code"),
        ('{"id": true, "code": "1"}', "id"),
        ('{"id": 1, "code": "1", "stdin": 5}', "stdin"),
    ],
)
def test_exec_file_malformed_line_names_file_and_line(tmp_path, line, field):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"id": 0, "code": "pass"}\n' + line + "\n")
    with pytest.raises(RecordError) as info:
        exec_file(source, out)
    assert info.value.line == 2 and str(source) in str(info.value)
    assert info.value.field == field
    assert not out.exists()


def test_exec_file_duplicate_ids_are_an_error(tmp_path):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [{"id": "a", "code": "1"}, {"id": "a", "code": "2"}])
    with pytest.raises(RecordError, match="duplicate"):
        exec_file(source, tmp_path / "out.jsonl")


@pytest.fixture
async def service():
    sandbox = Sandbox(workers=1, limits=Limits(timeout=5))
    server = TestServer(make_app(sandbox, max_in_flight=8))
    await server.start_server()
    try:
        yield str(server.make_url("/"))
    finally:
        await server.close()


async def test_service_serves_the_same_api(service):
    async with RemoteSandbox(service) as remote:
        r = await remote.run("print(6 * 7)")
        assert r.ok and r.stdout == "42\n" and r.isolation
        r = await remote.run("1/0")
        assert r.status == "error" and r.error_type == "ZeroDivisionError"
        assert (await remote.run("while True: pass", timeout=0.3)).status == "timeout"
        assert (await remote.run(123)).status == "invalid"
        assert (await remote.run("print(input()[::-1])", stdin="abc")).stdout == "cba\n"

        await remote.run("x = 1", session="s")
        token = await remote.snapshot("s")
        await remote.run("x = 2", session="s")
        await remote.restore("s", token)
        assert (await remote.run("print(x)", session="s")).stdout == "1\n"
        await remote.release("s", token)
        with pytest.raises(SnapshotLost):
            await remote.restore("s", token)
        await remote.close_session("s")
        health = await remote.health()
        assert health["workers"] == 1 and health["sessions"] == 0


async def test_client_gives_up_after_bounded_retries():
    async with RemoteSandbox("http://127.0.0.1:9", retries=1) as remote:
        with pytest.raises(SandboxUnavailable, match="2 attempts"):
            await remote.run("pass")


def test_connect_uses_the_client_when_a_url_is_configured(monkeypatch):
    monkeypatch.setenv("CLEANER_SANDBOX_URL", "http://127.0.0.1:9")
    assert isinstance(connect(), RemoteSandbox)
    monkeypatch.delenv("CLEANER_SANDBOX_URL")
    assert isinstance(connect(url="http://example:1"), RemoteSandbox)


def test_fallback_level_warns_runs_and_reports_itself():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sandbox = SyncSandbox(workers=1, isolation="none", limits=Limits(timeout=5, memory_mb=512))
    try:
        assert any("WITHOUT namespaces" in str(w.message) for w in caught)
        r = sandbox.run("import sympy\nprint(sympy.sqrt(8))")
        assert r.ok and r.stdout == "2*sqrt(2)\n"
        assert r.isolation.startswith("rlimits")
        assert sandbox.run("while True: pass", timeout=0.3).status == "timeout"
        assert sandbox.run("x = bytearray(8 << 30)").reason == "memory"
        # A detached daemon still dies with the call (the zygote is a child subreaper).
        code = "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '4343.5'])\n    os._exit(0)"
        assert sandbox.run(code).ok
        from .conftest import processes_with

        assert processes_with(b"4343.5") == []
        assert sandbox.run("x = 1", session="s").ok
        assert sandbox.run("print(x)", session="s").stdout == "1\n"
    finally:
        sandbox.close()


def test_serve_runs_a_service_until_interrupted(tmp_path):
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from cleaner.sandbox import serve; serve('127.0.0.1', {port}, workers=1)",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/health", timeout=1
                ) as response:
                    health = json.load(response)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(
                server.stderr.read().decode() if server.poll() is not None else "no service"
            )
        assert health["workers"] == 1
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/run", data=json.dumps({"code": "print(3 * 3)"}).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response)["stdout"] == "9\n"
        # `cleaner exec` against the service: the same lines as embedded.
        source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        write_jsonl(
            source,
            [
                {"id": "a", "code": "x = 2", "session": "s"},
                {"id": "b", "code": "print(x + 1)", "session": "s"},
            ],
        )
        exec_file(source, out, url=f"http://127.0.0.1:{port}")
        assert [line["stdout"] for line in read_jsonl(out)] == ["", "3\n"]
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) is not None


def test_exec_file_with_a_progress_bar(tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [{"id": i, "code": f"print({i})"} for i in range(5)])
    exec_file(source, out, workers=1, progress=True)
    assert [line["stdout"] for line in read_jsonl(out)] == [f"{i}\n" for i in range(5)]


async def test_service_refuses_beyond_its_bound_instead_of_queueing():
    import asyncio

    sandbox = Sandbox(workers=1, limits=Limits(timeout=5))
    server = TestServer(make_app(sandbox, max_in_flight=1))
    await server.start_server()
    try:
        url = str(server.make_url("/"))
        async with RemoteSandbox(url, retries=0) as impatient, RemoteSandbox(url) as patient:
            slow = asyncio.create_task(patient.run("import time\ntime.sleep(1)\nprint('slow')"))
            while (await patient.health())["in_flight"] == 0:  # wait until it is admitted
                await asyncio.sleep(0.01)
            with pytest.raises(SandboxUnavailable, match="busy"):
                await impatient.run("print('refused')")
            assert (await slow).stdout == "slow\n"
            # A client that retries gets through once there is room.
            assert (await patient.run("print('later')")).stdout == "later\n"
    finally:
        await server.close()
