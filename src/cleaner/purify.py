"""`cleaner purify`: offline SAAR over a JSONL file of raw trajectories, streamed record by record."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cleaner.jsonl import atomic_writer, dump_line
from cleaner.saar import SimilarityOn, purify
from cleaner.trajectory import Trajectory, read_trajectories


@dataclass
class PurifySummary:
    trajectories: int = 0
    failed_calls: int = 0
    """failed tool calls in the input (first attempts and corrections)"""
    failed_calls_after: int = 0
    """failed tool calls left in the output (only at or after a give-up point)"""
    recovered: int = 0
    """failures whose correction ran: grafted away"""
    shallow: int = 0
    deep: int = 0
    gave_up: int = 0
    """trajectories where SAAR gave up (the error stays visible)"""

    def add(self, raw: Trajectory, purified: Trajectory) -> None:
        self.trajectories += 1
        self.failed_calls += raw.failed_calls
        self.failed_calls_after += purified.failed_calls
        saar = purified.saar
        if saar is None:
            return
        self.shallow += sum(g.kind == "shallow" for g in saar.grafts)
        self.deep += sum(g.kind == "deep" for g in saar.grafts)
        self.recovered += sum(not purified.turns[t].failed for t in {g.turn for g in saar.grafts})
        self.gave_up += saar.gave_up


def purify_file(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    gamma: float = 0.5,
    max_retries: int = 3,
    similarity_on: SimilarityOn = "code",
) -> PurifySummary:
    """Purify every trajectory of `in_path` into `out_path`.

    Memory does not grow with the number of records. A malformed record raises `RecordError` naming
    the file and line, and no output file is left behind.
    """
    summary = PurifySummary()
    with atomic_writer(out_path) as out:
        for raw in read_trajectories(in_path):
            purified = purify(
                raw, gamma=gamma, max_retries=max_retries, similarity_on=similarity_on
            )
            summary.add(raw, purified)
            out.write(dump_line(purified.to_dict()))
    return summary
