from __future__ import annotations

import pytest

from cleaner.rewards.math import close_shared_verifier


@pytest.fixture(scope="module", autouse=True)
def no_math_workers_left_behind():
    """The shared math-verify pool lives until exit by design; a test module leaves none behind."""
    yield
    close_shared_verifier()
