"""What a run leaves for people: readable trajectories, PNG plots and a short `report.md`."""

from __future__ import annotations

import json
import math
from pathlib import Path

from cleaner.formats import observation_text
from cleaner.trajectory import Trajectory

PLOTS = {
    "accuracy.png": ("accuracy", ["reward/accuracy", "eval/accuracy"]),
    "reward.png": ("reward", ["reward/mean"]),
    "tool_failures.png": (
        "tool failures per trajectory (first attempts)",
        ["tool/failures_per_traj", "eval/failures_per_traj"],
    ),
    "saar.png": (
        "SAAR events per trajectory",
        ["saar/recovered", "saar/gave_up", "saar/shallow", "saar/deep"],
    ),
}


def render_trajectory(t: Trajectory) -> str:
    """Markdown for one trajectory: prompt, each turn with its code and what the tool said."""
    lines = [f"## {t.id}  (reward {t.reward})", ""]
    for m in t.prompt:
        lines += [f"**{m['role']}**: {m.get('content', '')}", ""]
    for i, turn in enumerate(t.turns):
        origin = f" [{turn.origin}]" if turn.origin and turn.origin != "sampled" else ""
        lines += [f"**turn {i}{origin}**: {turn.reasoning}", ""]
        if turn.code is not None:
            lines += ["```python", turn.code, "```", ""]
        if turn.observation is not None:
            lines += [
                f"-> `{turn.observation.status}`",
                "```",
                observation_text(turn.observation),
                "```",
                "",
            ]
    if t.saar is not None and t.saar.grafts:
        lines.append(
            "grafts: "
            + ", ".join(
                f"turn {g.turn} {g.kind} (sim {g.similarity:.2f}, attempt {g.attempt})"
                for g in t.saar.grafts
            )
            + (" - gave up" if t.saar.gave_up else "")
        )
    return "\n".join(lines)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(run_dir: Path) -> list[Path]:
    """One PNG per plot in PLOTS, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    written = []
    for name, (title, keys) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if key in r and not math.isnan(r[key])]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(run_dir / name, dpi=100)
        plt.close(fig)
        written.append(run_dir / name)
    return written


def write_report(run_dir: Path) -> Path:
    """report.md: first and last values of the headline metrics, and the plots."""
    rows = read_metrics(run_dir)
    keys = [
        "reward/accuracy",
        "reward/mean",
        "tool/failures_per_traj",
        "saar/recovered",
        "saar/gave_up",
        "saar/purified_token_frac",
        "adv/nonzero_group_frac",
        "eval/accuracy",
        "eval/failures_per_traj",
        "time/step",
    ]
    lines = [
        f"# Run report: {run_dir.name}",
        "",
        f"{len(rows)} steps logged.",
        "",
        "| metric | first | last |",
        "|---|---|---|",
    ]
    for key in keys:
        values = [r[key] for r in rows if key in r]
        if values:
            lines.append(f"| {key} | {values[0]:.4g} | {values[-1]:.4g} |")
    lines += ["", *(f"![{name}]({name})" for name in PLOTS)]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
