"""SAAR, Similarity-Aware Adaptive Rollback (CLEANER, arXiv 2601.15141), as pure functions.

When a tool call fails and the model then fixes it, the fix is grafted in place of the failure:

- **shallow** graft (the fix is a small edit, `similarity >= gamma`): keep the failed turn's
  reasoning, take the correction's code;
- **deep** graft (the fix is a rewrite): take the correction's reasoning and code.

The grafted turn carries the correction's observation, so the error and the failed code leave the
history. The same `graft` serves online SAAR (during rollout) and offline purification of recorded
trajectories (`purify`). No I/O, no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Literal

from cleaner.formats.hermes import render_call
from cleaner.trajectory import Graft, SaarRecord, Trajectory, Turn

SimilarityOn = Literal["code", "call"]


def similarity(old: str, new: str) -> float:
    """Ratcliff/Obershelp ratio in [0, 1], with difflib's defaults (as the paper)."""
    return difflib.SequenceMatcher(None, old, new).ratio()


def code_similarity(current: Turn, correction: Turn, on: SimilarityOn = "code") -> float:
    """Similarity of two tool calls: of their code, or of their rendered tool-call text (`call`,
    which is what the authors' implementation compares)."""
    if current.code is None or correction.code is None:
        raise ValueError("similarity needs two turns with code")
    if on == "code":
        return similarity(current.code, correction.code)
    if on == "call":
        return similarity(render_call(current.code), render_call(correction.code))
    raise ValueError(f"similarity_on must be 'code' or 'call', got {on!r}")


def graft(
    current: Turn, correction: Turn, gamma: float = 0.5, similarity_on: SimilarityOn = "code"
) -> tuple[Turn, str, float]:
    """Graft `correction` in place of the failed `current` turn; return (turn, kind, similarity).

    Shallow (`sim >= gamma`) keeps the current reasoning; deep takes the correction's. Either way the
    code and the observation are the correction's, and the extra keys of the turn whose reasoning
    survives are kept.
    """
    sim = code_similarity(current, correction, similarity_on)
    kind = "shallow" if sim >= gamma else "deep"
    base = current if kind == "shallow" else correction
    grafted = dataclasses.replace(
        base,
        code=correction.code,
        observation=correction.observation,
        origin=kind,
        extra=dict(base.extra),
    )
    return grafted, kind, sim


def purify(
    trajectory: Trajectory,
    gamma: float = 0.5,
    max_retries: int = 3,
    similarity_on: SimilarityOn = "code",
) -> Trajectory:
    """Offline SAAR on a recorded raw trajectory (SPEC section 2).

    The turns after a failure are the model's correction attempts. Each is grafted in place of the
    failure until one runs (recovered: purified) or SAAR gives up (after `max_retries` grafts, at the
    end of the trajectory, or when the model answers without code): then the last grafted turn keeps
    its error, and the rest of the trajectory stays raw.

    A trajectory that already carries a SAAR record (purified offline, or rolled out with online
    SAAR) is returned unchanged: SAAR's decisions for it are made, so purifying twice equals once.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if trajectory.saar is not None:
        return trajectory

    turns = trajectory.turns
    out: list[Turn] = []
    grafts: list[Graft] = []
    active, gave_up = True, False
    i = 0
    while i < len(turns):
        t = turns[i]
        if not (active and t.failed):
            out.append(dataclasses.replace(t, origin=t.origin or "sampled"))
            i += 1
            continue
        cur, retries, j = dataclasses.replace(t, origin=t.origin or "sampled"), 0, i + 1
        while True:
            if retries == max_retries or j == len(turns) or turns[j].code is None:
                out.append(cur)  # give up: the error stays, the rest is raw
                active, gave_up, i = False, True, j
                break
            cur, kind, sim = graft(cur, turns[j], gamma, similarity_on)
            retries += 1
            j += 1
            grafts.append(Graft(turn=len(out), kind=kind, similarity=sim, attempt=retries))
            if not turns[j - 1].failed:
                out.append(cur)  # recovered: the failure and the failed attempts are gone
                i = j
                break

    return dataclasses.replace(
        trajectory, turns=out, saar=SaarRecord(active=True, grafts=grafts, gave_up=gave_up)
    )
