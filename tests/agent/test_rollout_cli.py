"""`cleaner rollout` end to end on a small real model: the transformers engine, the sandbox, grading."""

import json

from typer.testing import CliRunner

from cleaner.cli import app
from cleaner.tokens import TokenTrajectory

runner = CliRunner()


def test_rollout_writes_trajectories_and_is_reproducible(random_policy, tmp_path):
    args = [
        "rollout",
        "--model",
        str(random_policy),
        "--data",
        "gym:gcd",
        "--size",
        "2",
        "--n",
        "3",
        "rollout.max_response_tokens=32",
        "sandbox.workers=1",
    ]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    result = runner.invoke(app, [*args, "-o", str(first), "--tokens"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(records) == 6 and len({r["id"] for r in records}) == 6
    assert all(
        r["schema"] == "cleaner.trajectory/1" and r["reward"] in (-1.0, 1.0) for r in records
    )
    tt = TokenTrajectory.from_dict(records[0])
    assert tt.prompt_length > 0 and len(tt.token_ids) - tt.prompt_length <= 32
    assert " ".join(result.output.split()).count("accuracy (avg@k, 95% CI)") == 1
    assert runner.invoke(app, [*args, "-o", str(second), "--tokens"]).exit_code == 0
    assert first.read_text() == second.read_text()  # same seed, same trajectories


def test_rollout_reports_a_missing_model(tmp_path):
    result = runner.invoke(
        app, ["rollout", "--model", str(tmp_path / "none"), "-o", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code == 2 and "no config.json" in " ".join(result.output.split())
