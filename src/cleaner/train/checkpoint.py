"""Checkpoints that survive `kill -9` at any moment.

A checkpoint is a directory `checkpoints/step_NNNNNN/` holding the model (safetensors, via
`save_pretrained`, so it loads like any transformers model), the tokenizer, the optimizer and
scheduler states, the RNG states and the trainer's own state (step, data order, metrics so far).
It is written under a temporary name and renamed into place, and `latest` (a one-line file) is
replaced atomically afterwards, so a reader sees either the previous checkpoint or the new one,
never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save(
    run_dir: Path,
    step: int,
    *,
    model,
    tokenizer,
    optimizer,
    scheduler,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write the checkpoint of `step` and point `latest` at it; keep the `keep` most recent."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}.", dir=root))
    try:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            tmp / "optim.pt",
        )
        torch.save(
            {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            },
            tmp / "rng.pt",
        )
        (tmp / "state.json").write_text(json.dumps(state))
        for dirpath, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    os.fsync(f.fileno())
        if (
            final.exists()
        ):  # a previous attempt at this step finished but `latest` was not moved yet
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST, final.name + "\n")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    """The most recent complete checkpoint, or None."""
    pointer = run_dir / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_states(path: Path, *, optimizer, scheduler) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states from a checkpoint; return the trainer state.
    (The model is loaded from `path / "model"` with `from_pretrained` by the caller.)"""
    optim = torch.load(path / "optim.pt", weights_only=False)
    optimizer.load_state_dict(optim["optimizer"])
    scheduler.load_state_dict(optim["scheduler"])
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "state.json").read_text())
