import dataclasses

import pytest

from cleaner.rewards.gym import score_gym
from cleaner.saar import purify, similarity
from cleaner.tiny.traces import (
    EXPECTED_ERROR,
    FAILURE_KINDS,
    TRACE_TASKS,
    TraceMix,
    generate_traces,
    trace_problems,
)
from cleaner.trajectory import Trajectory


def test_every_trace_ends_with_an_answer_the_task_scorer_accepts(traces):
    traces, stats = traces
    assert stats.traces == len(traces) == 150
    assert set(stats.per_task) == set(TRACE_TASKS)
    problems = {p.id: p for p in trace_problems(150, seed=7)}
    for trace in traces:
        final = trace.turns[-1]
        assert final.code is None and final.observation is None
        assert "The answer is \\boxed{" in final.reasoning
        problem = problems[trace.id]
        assert trace.prompt == problem.prompt and trace.answer == problem.answer
        score = score_gym(final.reasoning, problem.metadata["task"], problem.metadata["entry"])
        assert score.correct and score.score == 1.0, (trace.id, final.reasoning)
        # the boxed value is what the last tool call really printed
        assert trace.turns[-2].observation.stdout.strip() in final.reasoning


def test_failures_are_real_sandbox_errors_of_the_intended_type(traces):
    traces, _ = traces
    seen = set()
    for trace in traces:
        kinds = trace.extra["attempts"]
        assert len(kinds) == len(trace.turns) - 1
        for kind, turn in zip(kinds, trace.turns, strict=False):
            if kind in FAILURE_KINDS:
                assert turn.failed and turn.observation.status == "error"
                assert turn.observation.error_type in EXPECTED_ERROR[kind]
                # the error text is the interpreter's own, not written by the generator
                assert f"{turn.observation.error_type}:" in turn.observation.stderr
                seen.add(kind)
            else:
                assert turn.observation.ok and turn.observation.stdout.strip()
    assert seen == set(FAILURE_KINDS)


def test_corrections_run_and_name_the_problem(traces):
    traces, stats = traces
    failing = [t for t in traces if t.failed_calls]
    assert failing and stats.failing_traces == len(failing)
    assert set(stats.corrections) == {"fix", "rewrite"}
    assert any(t.failed_calls == 2 for t in failing)  # two failures before the fix
    for trace in failing:
        tool_turns = trace.turns[:-1]
        assert all(t.failed for t in tool_turns[:-1]) and not tool_turns[-1].failed
        for failed, correction in zip(tool_turns, tool_turns[1:], strict=False):
            # the correction's reasoning names the error it answers
            assert failed.observation.error_type in correction.reasoning or (
                failed.observation.error_type == "NameError"
                and "not defined" in correction.reasoning
            )


def test_fixes_are_shallow_and_rewrites_mostly_deep_so_purify_grafts_both(traces):
    traces, _ = traces
    fix_sims, rewrite_sims = [], []
    kinds = set()
    for trace in traces:
        if not trace.failed_calls:
            continue
        before, after = trace.turns[-3], trace.turns[-2]
        (fix_sims if trace.extra["attempts"][-1] == "fix" else rewrite_sims).append(
            similarity(before.code, after.code)
        )
        purified = purify(trace)
        assert purified.failed_calls == 0 and not purified.saar.gave_up
        kinds.update(g.kind for g in purified.saar.grafts)
    assert min(fix_sims) >= 0.5
    assert sum(s < 0.5 for s in rewrite_sims) >= 0.75 * len(rewrite_sims)
    assert kinds == {"shallow", "deep"}


def test_failure_rate_matches_the_parameter(traces, sandbox):
    _, stats = traces
    # 150 traces at 0.4: three standard deviations is about 0.12
    assert abs(stats.failing_traces / stats.traces - 0.4) < 0.12
    clean, clean_stats = generate_traces(
        20, seed=3, mix=TraceMix(failure_rate=0.0), sandbox=sandbox
    )
    assert clean_stats.failing_traces == 0 and all(t.failed_calls == 0 for t in clean)
    broken, broken_stats = generate_traces(
        20, seed=3, mix=TraceMix(failure_rate=1.0), sandbox=sandbox
    )
    assert broken_stats.failing_traces == 20


def test_traces_are_reproducible_and_round_trip_as_records(sandbox):
    first, _ = generate_traces(12, seed=11, mix=TraceMix(failure_rate=0.5), sandbox=sandbox)
    second, _ = generate_traces(12, seed=11, mix=TraceMix(failure_rate=0.5), sandbox=sandbox)
    assert [t.to_dict() for t in first] == [t.to_dict() for t in second]
    for trace in first:
        assert Trajectory.from_dict(trace.to_dict()).to_dict() == trace.to_dict()


def test_rates_are_validated():
    with pytest.raises(ValueError, match="failure_rate"):
        TraceMix(failure_rate=1.5)
    assert dataclasses.asdict(TraceMix())["failure_rate"] == TraceMix().failure_rate


def test_cleaner_purify_reads_the_traces_and_grafts_every_failure_away(traces, tmp_path):
    from cleaner.jsonl import atomic_writer, dump_line
    from cleaner.purify import purify_file

    traces, stats = traces
    raw = tmp_path / "traces.jsonl"
    with atomic_writer(raw) as out:
        for trace in traces:
            out.write(dump_line(trace.to_dict()))
    summary = purify_file(raw, tmp_path / "purified.jsonl")
    assert summary.trajectories == len(traces)
    assert summary.failed_calls == sum(t.failed_calls for t in traces) > 0
    assert summary.failed_calls_after == 0 and summary.gave_up == 0
    assert summary.shallow > 0 and summary.deep > 0
