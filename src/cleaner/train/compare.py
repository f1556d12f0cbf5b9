"""`cleaner compare`: CLEANER against the same run without SAAR and against SFT on the purified
trajectories, several seeds each, on one recipe (the embedded default unless told otherwise).

Each (variant, seed) is an ordinary run directory under the comparison folder, so an interrupted
comparison resumes run by run. The output is one table and one figure with error bars (mean and
standard deviation over seeds): accuracy and tool failures per trajectory over steps, and the step at
which each variant first reaches the baseline's final accuracy.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleaner.config import load_config
from cleaner.train import checkpoint, trainer
from cleaner.train.report import read_metrics

VARIANTS: dict[str, list[str]] = {
    "cleaner": ["saar.enabled=true", "train.objective=grpo"],
    "no-saar": ["saar.enabled=false", "train.objective=grpo"],
    "sft-purified": ["saar.enabled=true", "train.objective=sft"],
}
"""The three arms: the method, its baseline (DAPO without rollback), and the imitation control."""

BASELINE = "no-saar"


def run_all(
    recipe: Path,
    out_dir: Path,
    seeds: list[int],
    overrides: list[str],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train every (variant, seed) that is not finished yet, then summarise."""
    for name, variant in VARIANTS.items():
        for seed in seeds:
            run_dir = out_dir / f"{name}-seed{seed}"
            cfg = load_config(recipe, [*overrides, *variant, f"seed={seed}"])
            done = checkpoint.latest(run_dir)
            if (
                done is not None
                and json.loads((done / "state.json").read_text())["step"] >= cfg.train.steps
            ):
                log(f"{run_dir.name}: done")
                continue
            log(f"{run_dir.name}: training")
            if (run_dir / "config.yaml").exists():
                trainer.resume(run_dir, log=log)
            else:
                trainer.start(cfg, run_dir, log=log)
    return summarise(out_dir, seeds)


def _series(rows: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in rows if key in r and not math.isnan(r[key])}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(out_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """Per variant: curves (mean, sd over seeds) and the steps to reach the baseline's final accuracy."""
    metrics = {
        name: [read_metrics(out_dir / f"{name}-seed{s}") for s in seeds] for name in VARIANTS
    }
    acc_key = (
        "eval/accuracy"
        if any("eval/accuracy" in r for runs in metrics.values() for rows in runs for r in rows)
        else "reward/accuracy"
    )
    # Evaluation runs without SAAR in every arm, so its failures compare like with like; during
    # training a SAAR arm's failed corrections are not first attempts, a baseline's retries are.
    fail_key = "eval/failures_per_traj" if acc_key == "eval/accuracy" else "tool/failures_per_traj"
    curves: dict[str, dict[str, list]] = {}
    for name, runs in metrics.items():
        curves[name] = {}
        for key in (acc_key, fail_key):
            per_seed = [_series(rows, key) for rows in runs]
            steps = sorted(set().union(*per_seed)) if per_seed else []
            curves[name][key] = [
                (step, *_mean_sd([s[step] for s in per_seed if step in s])) for step in steps
            ]
    baseline_final = [
        list(_series(rows, acc_key).values())[-1]
        for rows in metrics[BASELINE]
        if _series(rows, acc_key)
    ]
    target = statistics.fmean(baseline_final) if baseline_final else float("nan")
    table = {}
    for name, runs in metrics.items():
        finals = [
            list(_series(rows, acc_key).values())[-1] for rows in runs if _series(rows, acc_key)
        ]
        failures = [
            list(_series(rows, fail_key).values())[-1] for rows in runs if _series(rows, fail_key)
        ]
        reach = [
            next((step for step, v in sorted(_series(rows, acc_key).items()) if v >= target), None)
            for rows in runs
        ]
        table[name] = {
            "final_accuracy": _mean_sd(finals),
            "final_tool_failures": _mean_sd(failures),
            "steps_to_baseline_final": reach,
            "seeds": len(runs),
        }
    summary = {
        "accuracy_metric": acc_key,
        "failures_metric": fail_key,
        "baseline": BASELINE,
        "baseline_final_accuracy": target,
        "table": table,
        "curves": curves,
    }
    (out_dir / "compare.json").write_text(json.dumps(summary, indent=2))
    _figure(out_dir, curves, acc_key, fail_key)
    return summary


def _figure(out_dir: Path, curves: dict, acc_key: str, fail_key: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in (
        (axes[0], acc_key, "accuracy"),
        (axes[1], fail_key, "tool failures per trajectory"),
    ):
        for name, per_key in curves.items():
            points = [p for p in per_key.get(key, []) if not math.isnan(p[1])]
            if points:
                steps, means, sds = zip(*points, strict=True)
                ax.errorbar(steps, means, yerr=sds, label=name, capsize=2, marker="o", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "compare.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
