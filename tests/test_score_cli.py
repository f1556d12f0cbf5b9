import json

from typer.testing import CliRunner

from cleaner.cli import app

runner = CliRunner()


def test_score_code_runs_tests_in_the_sandbox(tmp_path):
    tests = {
        "type": "stdio",
        "cases": [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6\n"}],
    }
    lines = [
        {
            "id": "right",
            "response": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
            "tests": tests,
        },
        {
            "id": "half",
            "response": "```python\na, b = map(int, input().split())\nprint(5)\n```",
            "tests": tests,
        },
        {"id": "none", "response": "I would add them.", "tests": tests},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = runner.invoke(app, ["score", str(src), "-o", str(out), "--kind", "code"])
    assert result.exit_code == 0, result.output
    scored = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert (scored["right"]["correct"], scored["right"]["score"]) == (True, 1.0)
    assert (scored["half"]["correct"], scored["half"]["score"]) == (False, 0.5)
    assert scored["none"]["score"] == 0.0


def test_score_math_and_a_bad_kind(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        json.dumps({"id": 1, "response": "so \\boxed{\\frac{1}{2}}", "answer": "0.5"}) + "\n"
    )
    assert runner.invoke(app, ["score", str(src), "-o", str(out), "--kind", "math"]).exit_code == 0
    assert json.loads(out.read_text())["correct"] is True
    assert runner.invoke(app, ["score", str(src), "-o", str(out), "--kind", "essay"]).exit_code == 2
