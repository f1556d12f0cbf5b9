from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sandbox():
    from cleaner.sandbox.sync import SyncSandbox

    with SyncSandbox(workers=1) as sb:
        yield sb


@pytest.fixture(scope="session")
def traces(sandbox):
    """150 traces at a high failure rate, so every kind of failure and correction shows up."""
    from cleaner.tiny.traces import TraceMix, generate_traces

    mix = TraceMix(failure_rate=0.4, double_failure_rate=0.3, rewrite_rate=0.4)
    return generate_traces(150, seed=7, mix=mix, sandbox=sandbox)
