import pytest


@pytest.mark.slow
def test_the_default_model_lands_in_the_target_band(sandbox):
    """The per-machine default model (built here once, ~4 minutes on 2 idle cores; then cached)
    sampled at temperature 1.0 on held-out problems: tool failures per trajectory in [0.15, 0.6],
    accuracy in [0.2, 0.7], every error raised by the model's own code."""
    from cleaner.tiny.bootstrap import default_model_dir
    from cleaner.tiny.check import check_model

    path = default_model_dir(log=lambda line: None)
    result = check_model(path, n_problems=140, temperature=1.0, sandbox=sandbox)
    summary = result.summary()
    assert 0.15 <= summary["tool_failures_per_trajectory"] <= 0.6, summary
    assert 0.2 <= summary["accuracy"] <= 0.7, summary
    # every error is the model's own code failing: running that code again fails the same way
    failed = [t for trajectory in result.trajectories for t in trajectory.turns if t.failed]
    assert failed
    for turn in failed:
        if turn.observation.status == "error":
            assert sandbox.run(turn.code).error_type == turn.observation.error_type
        else:
            assert turn.observation.status == "invalid"  # a malformed call the model wrote
