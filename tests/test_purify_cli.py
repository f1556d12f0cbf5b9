import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from cleaner.cli import app
from cleaner.trajectory import Turn, read_trajectories
from tests.helpers import OK, err, make_trajectory

runner = CliRunner()


def write_raw(path, n=3):
    with open(path, "w") as f:
        for k in range(n):
            t = make_trajectory(
                Turn(
                    "Compute.", "print(sum(range(10))", err("SyntaxError", "'(' was never closed")
                ),
                Turn("Fix the parenthesis.", "print(sum(range(10)))", OK),
                Turn("Now square it.", "print(45 ** 2", err("SyntaxError", "'(' was never closed")),
                Turn("Different approach.", "import math\nprint(math.pow(45, 2))", OK),
                Turn("\\boxed{2025}"),
                id=f"p{k}",
                source={"run": k},
            )
            f.write(json.dumps(t.to_dict()) + "\n")
        f.write(
            json.dumps(
                make_trajectory(
                    Turn("a", "print(q)", err()), Turn("I give up. \\boxed{0}"), id="lost"
                ).to_dict()
            )
            + "\n"
        )


def test_purify_writes_purified_records_and_a_summary(tmp_path):
    src, out = tmp_path / "raw.jsonl", tmp_path / "out" / "pure.jsonl"
    write_raw(src)
    result = runner.invoke(app, ["purify", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    records = list(read_trajectories(out))
    assert [r.id for r in records] == ["p0", "p1", "p2", "lost"]
    p0 = records[0]
    assert [t.code for t in p0.turns] == [
        "print(sum(range(10)))",
        "import math\nprint(math.pow(45, 2))",
        None,
    ]
    assert [t.origin for t in p0.turns] == ["shallow", "deep", "sampled"]
    assert p0.turns[0].reasoning == "Compute." and p0.turns[1].reasoning == "Different approach."
    assert p0.extra == {"source": {"run": 0}}
    assert records[3].saar.gave_up and records[3].failed_calls == 1
    for label, value in [
        ("trajectories", 4),
        ("failed calls", 7),
        ("recovered", 6),
        ("shallow grafts", 3),
        ("deep grafts", 3),
        ("gave up", 1),
        ("failed calls left", 1),
    ]:
        assert any(
            label in line and line.split("│")[-2].strip() == str(value)
            for line in result.output.splitlines()
        ), (label, result.output)


def test_gamma_and_similarity_options_reach_the_rule(tmp_path):
    src = tmp_path / "raw.jsonl"
    write_raw(src, n=1)
    for gamma, kinds in [("0", {"shallow"}), ("1.01", {"deep"})]:
        out = tmp_path / f"out{gamma}.jsonl"
        assert (
            runner.invoke(
                app,
                ["purify", str(src), "-o", str(out), "--gamma", gamma, "--similarity-on", "call"],
            ).exit_code
            == 0
        )
        assert {g.kind for r in read_trajectories(out) for g in r.saar.grafts} == kinds


def test_a_malformed_record_fails_naming_the_line_and_leaves_no_output(tmp_path):
    src, out = tmp_path / "raw.jsonl", tmp_path / "pure.jsonl"
    write_raw(src, n=2)
    with open(src, "a") as f:
        f.write(
            '{"id": "bad", "prompt": [], "turns": [{"reasoning": "r", "code": "x", '
            '"observation": {"status": "exploded"}}]}\n'
        )
    result = runner.invoke(app, ["purify", str(src), "-o", str(out)])
    assert result.exit_code == 1
    assert f"{src}:4: turns[0].observation.status: must be one of" in " ".join(
        result.output.split()
    )
    assert not out.exists() and os.listdir(tmp_path) == ["raw.jsonl"]


def test_missing_input_and_bad_option(tmp_path):
    assert (
        runner.invoke(
            app, ["purify", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o")]
        ).exit_code
        == 2
    )
    src = tmp_path / "raw.jsonl"
    write_raw(src, n=1)
    assert (
        runner.invoke(
            app, ["purify", str(src), "-o", str(tmp_path / "o"), "--similarity-on", "x"]
        ).exit_code
        == 2
    )


def test_memory_stays_flat_while_streaming(tmp_path):
    """Peak memory of a separate process on 20x more records grows by far less than the input."""
    one = json.dumps(
        make_trajectory(
            Turn("a" * 2000, "print(x)", err()), Turn("b", "x=1\nprint(x)", OK)
        ).to_dict()
    )
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the (large) forking test process.
    script = (
        "import re, sys\nfrom cleaner.purify import purify_file\n"
        "purify_file(sys.argv[1], sys.argv[2])\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
    )
    peaks = {}
    for n in (500, 10_000):
        src = tmp_path / f"{n}.jsonl"
        src.write_text((one + "\n") * n)
        done = subprocess.run(
            [sys.executable, "-c", script, str(src), str(tmp_path / f"o{n}.jsonl")],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[n] = int(done.stdout.strip())  # KiB
        assert sum(1 for _ in open(tmp_path / f"o{n}.jsonl")) == n
    input_growth_kib = (10_000 - 500) * len(one) / 1024
    assert peaks[10_000] - peaks[500] < input_growth_kib / 4, (peaks, input_growth_kib)
