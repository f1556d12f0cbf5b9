import json

from typer.testing import CliRunner

from cleaner.cli import app
from tests.train.test_trainer import overrides

runner = CliRunner()


def test_compare_runs_every_arm_and_seed_and_summarises(random_policy, tmp_path):
    out = tmp_path / "cmp"
    args = [*overrides(random_policy, 2), "train.eval_every=1"]
    result = runner.invoke(app, ["compare", "--output", str(out), "--seeds", "2", *args])
    assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == [
        "cleaner-seed0",
        "cleaner-seed1",
        "no-saar-seed0",
        "no-saar-seed1",
        "sft-purified-seed0",
        "sft-purified-seed1",
    ]
    summary = json.loads((out / "compare.json").read_text())
    assert summary["accuracy_metric"] == "eval/accuracy" and (out / "compare.png").is_file()
    assert set(summary["table"]) == {"cleaner", "no-saar", "sft-purified"}
    curve = summary["curves"]["cleaner"]["eval/accuracy"]
    assert [step for step, _, _ in curve] == [0, 1, 2]
    # the arms differ where they should
    cfg = (out / "no-saar-seed1" / "config.yaml").read_text()
    assert "enabled: false" in cfg and "seed: 1" in cfg
    assert "objective: sft" in (out / "sft-purified-seed0" / "config.yaml").read_text()
    # a second call finds every run finished and only summarises
    again = runner.invoke(app, ["compare", "--output", str(out), "--seeds", "2", *args])
    assert again.exit_code == 0 and again.output.count(": done") == 6
