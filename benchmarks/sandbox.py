"""Sandbox speed: warm forks vs a fresh interpreter per call, under the same isolation, in one run.

    python benchmarks/sandbox.py [--workers N] [--calls N] [--isolation auto|namespaces|none]

Prints calls/s and latency (p50/p99) for trivial and sympy-using snippets, stateless and stateful,
the same for a fresh `python` per call (inside the same bubblewrap sandbox when namespaces are used),
their ratios, the overhead of a stateful cell, and the memory an idle session adds.

Targets (issue 3, 2 cores): >= 50x the fresh-interpreter throughput on sympy snippets, >= 200 trivial
calls/s, p99 under 25 ms, stateful cell overhead under 1 ms, an idle session under 30 MB resident.
Throughput depends on what else the machine runs: the load average is printed, and for stateless
calls so is the CPU time a call costs (host and worker), with the rate that implies on idle cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from cleaner.sandbox import Limits, Sandbox
from cleaner.sandbox.isolation import bwrap_command

TRIVIAL = "print(1 + 1)"
# Two sympy snippets: a light one, where the import is nearly all the work of a fresh interpreter,
# and a heavier one that also computes (factoring) for a few milliseconds.
SYMPY_LIGHT = "import sympy\nprint(sympy.sqrt(8) + sympy.Rational(1, 3))"
SYMPY = "import sympy\nx = sympy.symbols('x')\nprint(sympy.factor(x**4 - 1), sympy.factorint(2**32 + 1))"
SNIPPETS = (("trivial", TRIVIAL), ("sympy-light", SYMPY_LIGHT), ("sympy", SYMPY))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(name: str, latencies: list[float], elapsed: float) -> dict[str, float]:
    row = {
        "calls/s": len(latencies) / elapsed,
        "p50 ms": 1000 * percentile(latencies, 0.50),
        "p99 ms": 1000 * percentile(latencies, 0.99),
    }
    print(
        f"  {name:<44} {row['calls/s']:8.1f} calls/s   p50 {row['p50 ms']:8.2f} ms   p99 {row['p99 ms']:8.2f} ms"
    )
    return row


async def load(call, total: int, in_flight: int) -> tuple[list[float], float]:
    """Run `call()` `total` times with `in_flight` concurrent callers; latencies and wall time."""
    latencies: list[float] = []
    remaining = iter(range(total))

    async def caller() -> None:
        for _ in remaining:
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return latencies, time.perf_counter() - start


async def fresh_interpreter(sandbox: Sandbox, code: str) -> None:
    """The baseline: a new `python` for the call, in the same sandbox as a worker (or none)."""
    isolation = sandbox.isolation
    if isolation.level == "namespaces":
        cmd = bwrap_command(isolation, 64, 0, "{}")
        cmd = cmd[: cmd.index(sys.executable)] + [sys.executable, "-I", "-c", code]
        preexec = isolation.launch.prepare
    else:
        cmd, preexec = [sys.executable, "-I", "-c", code], None
    process = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
        preexec_fn=preexec,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of processes and of their children that they reaped (utime, stime, cutime, cstime)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def host_and_worker_cpu(sandbox: Sandbox) -> float:
    """This process's CPU plus each worker's: its zygote, which reaps every stateless call's
    interpreter, and the live processes under it (the template the interpreters are forked from)."""
    zygotes = [p for w in sandbox.workers if w.process for p in children(w.process.pid)]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    live = [p for z in zygotes for p in descendants(z)]
    return usage.ru_utime + usage.ru_stime + cpu_seconds(zygotes + live)


def children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
                out.append(int(name))
    return out


def unique_memory_kb(pids: list[int]) -> int:
    """Private (unshared) resident memory of processes, from smaps_rollup."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--calls", type=int, default=1000, help="calls per warm measurement")
    parser.add_argument(
        "--fresh-calls", type=int, default=12, help="calls per fresh-interpreter measurement"
    )
    parser.add_argument("--isolation", default="auto")
    args = parser.parse_args()
    workers, n = args.workers, args.calls
    cores = os.cpu_count() or 1
    in_flight = 2 * workers

    async with Sandbox(
        workers=workers, isolation=args.isolation, limits=Limits(timeout=30)
    ) as sandbox:
        print(f"load average {os.getloadavg()[0]:.1f} at the start")
        print(
            f"isolation {sandbox.isolation.describe()}, {workers} workers, {os.cpu_count()} cores, "
            f"{in_flight} calls in flight for throughput"
        )
        for _ in range(4 * workers):  # warm up: first forks, page cache
            await sandbox.run(SYMPY)

        print("fresh interpreter per call (baseline)")
        fresh = {}
        for name, code in SNIPPETS:
            lat, el = await load(
                lambda code=code: fresh_interpreter(sandbox, code), args.fresh_calls, workers
            )
            fresh[name] = report(f"fresh python, {name}", lat, el)

        print("warm fork per call (stateless)")
        warm, cpu_ms = {}, {}
        for name, code in SNIPPETS:
            cpu_before = host_and_worker_cpu(sandbox)
            lat, el = await load(lambda code=code: sandbox.run(code), n, in_flight)
            cpu_ms[name] = 1000 * (host_and_worker_cpu(sandbox) - cpu_before) / n
            warm[name] = report(f"stateless, {name}, {in_flight} in flight", lat, el)
            print(
                f"  {'':<44} {cpu_ms[name]:8.2f} ms CPU a call (host + worker): "
                f"{cores * 1000 / cpu_ms[name]:.0f} calls/s on {cores} idle cores"
            )
        lat, el = await load(lambda: sandbox.run(TRIVIAL), n // 2, workers)
        warm["trivial-latency"] = report(
            f"stateless, trivial, {workers} in flight (latency)", lat, el
        )

        print("sessions (stateful)")
        counter = iter(range(10**9))

        async def session_cell(code: str) -> None:
            await sandbox.run(code, session=f"bench{next(counter) % in_flight}")

        for i in range(in_flight):
            await sandbox.run("import sympy", session=f"bench{i}")
        stateful = {}
        for name, code in SNIPPETS:
            lat, el = await load(lambda code=code: session_cell(code), n, in_flight)
            stateful[name] = report(f"stateful, {name}, {in_flight} in flight", lat, el)
        cells = []
        for _ in range(n):
            r = await sandbox.run("pass", session="bench0")
            cells.append(r.duration_s)
        lat, el = await load(lambda: sandbox.run("pass", session="bench0"), n, 1)
        stateful["cell"] = report("stateful, empty cell, one at a time", lat, el)
        overhead_ms = 1000 * statistics.median(cells)
        print(
            f"  stateful cell overhead inside the worker (send, run, capture, reply): {overhead_ms:.3f} ms median"
        )
        for i in range(in_flight):
            await sandbox.close_session(f"bench{i}")

        print("memory of idle sessions")
        roots = [w.process.pid for w in sandbox.workers if w.process]
        before = unique_memory_kb([p for r in roots for p in descendants(r)])
        idle = 40
        for i in range(idle):
            await sandbox.run(
                "import sympy, numpy\nx = sympy.Symbol('x')\ny = [i for i in range(1000)]",
                session=f"idle{i}",
            )
        after = unique_memory_kb([p for r in roots for p in descendants(r)])
        per_session_mb = (after - before) / idle / 1024
        print(
            f"  {idle} idle sessions (sympy and numpy imported): {per_session_mb:.2f} MB private memory each "
            "(the rest of their resident pages are shared with the zygote)"
        )
        for i in range(idle):
            await sandbox.close_session(f"idle{i}")

    print("ratios and targets")
    sympy_ratio = warm["sympy"]["calls/s"] / fresh["sympy"]["calls/s"]
    light_ratio = warm["sympy-light"]["calls/s"] / fresh["sympy-light"]["calls/s"]
    trivial_ratio = warm["trivial"]["calls/s"] / fresh["trivial"]["calls/s"]
    checks = [
        (
            f"sympy (light) throughput vs fresh interpreter: {light_ratio:.1f}x (>= 50)",
            light_ratio >= 50,
        ),
        (
            f"sympy (factoring) throughput vs fresh interpreter: {sympy_ratio:.1f}x (>= 50)",
            sympy_ratio >= 50,
        ),
        (f"trivial throughput vs fresh interpreter: {trivial_ratio:.1f}x", True),
        (
            f"trivial calls/s: {warm['trivial']['calls/s']:.0f} measured (>= 200); "
            f"{cores * 1000 / cpu_ms['trivial']:.0f} by CPU cost on idle cores",
            warm["trivial"]["calls/s"] >= 200,
        ),
        (
            f"p99 at {workers} in flight: {warm['trivial-latency']['p99 ms']:.1f} ms (< 25)",
            warm["trivial-latency"]["p99 ms"] < 25,
        ),
        (
            f"stateful cell overhead: {overhead_ms:.3f} ms in the worker, "
            f"{stateful['cell']['p50 ms']:.3f} ms round trip (< 1)",
            stateful["cell"]["p50 ms"] < 1,
        ),
        (f"idle session: {per_session_mb:.1f} MB (< 30)", per_session_mb < 30),
    ]
    for text, met in checks:
        print(f"  [{'met' if met else 'MISSED'}] {text}")


if __name__ == "__main__":
    asyncio.run(main())
