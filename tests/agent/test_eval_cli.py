"""`cleaner eval`: avg@k and pass@k with intervals per benchmark, a JSON file, the trajectories."""

import json

from typer.testing import CliRunner

from cleaner.cli import app
from cleaner.trajectory import read_trajectories

runner = CliRunner()


def test_eval_writes_results_and_trajectories_per_benchmark(random_policy, tmp_path):
    out = tmp_path / "eval"
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(random_policy),
            "--data",
            "gym:gcd",
            "--data",
            "gym:lcm",
            "--size",
            "2",
            "--samples",
            "3",
            "-o",
            str(out),
            "rollout.max_response_tokens=24",
            "sandbox.workers=1",
        ],
    )
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert (results["samples"], results["top_p"], results["saar"]) == (3, 0.6, False)
    for name in ("gym:gcd", "gym:lcm"):
        r = results["benchmarks"][name]
        assert r["trajectories"] == 6 and r["k"] == 3
        assert 0.0 <= r["avg@k"]["low"] <= r["avg@k"]["mean"] <= r["avg@k"]["high"] <= 1.0
        assert r["avg@k"]["problems"] == 2 and "pass@3" in r
    saved = list(read_trajectories(out / "gym_gcd.jsonl"))
    assert len(saved) == 6 and all(
        t.saar is None for t in saved
    )  # SAAR off at evaluation by default
    assert "gym:lcm" in result.output
