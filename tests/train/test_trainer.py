"""End to end: `cleaner train` on a small real model, its artifacts, resuming after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from cleaner.cli import app

runner = CliRunner()


def said(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def overrides(model: Path, steps: int) -> list[str]:
    return [
        f"train.model={model}",
        "data.train=gym:gcd,lcm",
        "data.train_size=8",
        "data.eval=gym:gcd",
        "data.eval_size=1",
        "data.eval_samples=2",
        f"train.steps={steps}",
        "train.prompts_per_step=4",
        "train.group_size=3",
        "train.mini_batch_prompts=2",
        "train.lr=1e-3",
        "train.warmup_steps=0",
        "rollout.max_response_tokens=24",
        "train.overlong_buffer=16",
        "train.save_every=1",
        "train.eval_every=2",
        "train.sample_every=1",
        "sandbox.workers=1",
        "rollout.max_turns=2",
    ]


def weights(run: Path) -> dict:
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return load_file(ckpt / "model" / "model.safetensors")


def test_two_steps_change_the_weights_and_write_every_artifact(random_policy, tmp_path):
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--run-dir", str(run), *overrides(random_policy, 2)])
    assert result.exit_code == 0, result.output
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "report.md",
        "accuracy.png",
        "reward.png",
        "tool_failures.png",
        "saar.png",
        "samples/step_000001.md",
        "checkpoints/step_000002/optim.pt",
        "checkpoints/step_000002/rng.pt",
        "checkpoints/step_000002/state.json",
    ):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the evaluation before training
    assert {
        "reward/accuracy",
        "tool/failures_per_traj",
        "saar/recovered",
        "adv/nonzero_group_frac",
        "loss/clip_frac",
        "loss/entropy",
        "time/generation",
        "time/train",
    } <= rows[1].keys()
    assert (
        "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" not in rows[1]
    )
    before = load_file(random_policy / "model.safetensors")
    after = weights(run)
    assert any(not (before[k] == after[k]).all() for k in before)
    assert "step 2/2" in said(result)


def test_a_bad_config_fails_before_any_work(random_policy, tmp_path):
    result = runner.invoke(
        app, ["train", "--run-dir", str(tmp_path / "r"), "train.model=/nonexistent/model"]
    )
    assert result.exit_code == 2 and "not a transformers model directory" in said(result)
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(
        app, ["train", "--run-dir", str(blocker / "run"), *overrides(random_policy, 1)]
    )
    assert result.exit_code == 2 and "not writable" in said(result)
    result = runner.invoke(app, ["train", "train.prompts_per_step=5"])
    assert result.exit_code == 2 and "multiple of train.mini_batch_prompts" in said(result)
    result = runner.invoke(app, ["train", "--config", "no-such-recipe"])
    assert result.exit_code == 2 and "no such config file or shipped recipe" in said(result)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from cleaner.cli import app; app()", *args]


def test_resume_after_kill_reaches_the_same_result(random_policy, tmp_path):
    steps = 3
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(
        _cli("train", "--run-dir", str(straight), *overrides(random_policy, steps)),
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen(
        _cli("train", "--run-dir", str(killed), *overrides(random_policy, steps)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and not (
        latest.is_file() and latest.read_text().strip() == "step_000001"
    ):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run, after the first checkpoint
    proc.wait()
    done = subprocess.run(_cli("train", "--resume", str(killed)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming" in done.stderr
    a, b = weights(straight), weights(killed)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)

    def rows(run):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run / "metrics.jsonl").read_text().splitlines()
        ]

    assert rows(straight) == rows(killed) and len(rows(killed)) == steps + 1


def test_resume_refuses_a_directory_without_a_run(tmp_path):
    result = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "holds no run" in said(result)


@pytest.mark.parametrize("mode", ["mask_grafts", "behavior_is"])
def test_graft_modes_and_sft_run(random_policy, tmp_path, mode):
    run = tmp_path / mode
    extra = (
        [f"train.graft_mode={mode}"]
        if mode != "behavior_is"
        else ["train.graft_mode=behavior_is", "train.objective=sft"]
    )
    result = runner.invoke(
        app,
        [
            "train",
            "--run-dir",
            str(run),
            *overrides(random_policy, 1),
            "train.eval_every=0",
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "step_000001" / "model" / "model.safetensors").is_file()
