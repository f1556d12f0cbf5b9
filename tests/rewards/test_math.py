from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cleaner.rewards.math import MathVerifier, score_math, score_math_async


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=2, timeout=5.0) as v:
        yield v


MATCHES = [
    # AIME: integers, with or without leading zeros
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{042}", "42"),
    ("\\boxed{007}", "7"),
    ("\\boxed{42}", "042"),
    ("\\boxed{42.0}", "42"),
    # fractions and decimals
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac12"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),
    ("\\boxed{-\\frac{2}{6}}", "-\\frac{1}{3}"),
    # radicals
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{\\sqrt{4}}", "2"),
    # sets and intervals
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
    ("\\boxed{3, 1, 2}", "1,2,3"),
    ("\\boxed{[0, 1)}", "[0,1)"),
    # algebra
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("\\boxed{x = 5}", "5"),
    # wrappers a model adds: quotes (the reference prompt shows them), $, units, \text, spacing
    ("\\boxed{'42'}", "42"),
    ('\\boxed{"42"}', "42"),
    ("\\boxed{$42$}", "42"),
    ("\\boxed{3\\text{ cm}}", "3"),
    ("\\boxed{\\text{1}}", "1"),
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{\\left(1, 2\\right)}", "(1,2)"),
    # box spellings
    ("\\boxed {42}", "42"),
    ("\\boxed 42", "42"),
    ("\\fbox{42}", "42"),
    # the last box counts
    ("First I thought \\boxed{41}, but then \\boxed{42}", "42"),
    # a boxed reference answer is unwrapped
    ("\\boxed{42}", "\\boxed{42}"),
    # an integer reference from a parquet column
    ("\\boxed{42}", 42),
]


@pytest.mark.parametrize("response, answer", MATCHES)
def test_equivalent_answers_score_plus_one(response, answer, verifier):
    score = score_math(response, answer, verifier=verifier)
    assert score.correct, score
    assert (score.reward, score.score) == (1.0, 1.0)


MISMATCHES = [
    ("The answer is 42.", "42", "no boxed answer"),
    ("", "42", "no boxed answer"),
    ("\\boxed{}", "42", "empty boxed answer"),
    ("\\boxed{ }", "42", "empty boxed answer"),
    ("\\boxed{43}", "42", None),
    ("\\boxed{-42}", "42", None),
    ("\\boxed{420}", "42", None),
    ("\\boxed{4.2}", "42", None),
    ("\\boxed{1,2}", "12", None),
    ("\\boxed{4 2}", "42", None),
    ("\\boxed{5, 6}", "5", None),
    ("\\boxed{(1,2)}", "[1,2]", None),
    ("\\boxed{[0,1]}", "[0,1)", None),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{1,2\\}", None),
    ("\\boxed{3.14}", "\\pi", None),
    ("\\boxed{0.333}", "\\frac{1}{3}", None),
    ("\\boxed{\\sqrt{3}}", "3", None),
    ("\\boxed{2\\sqrt{2}}", "2\\sqrt{3}", None),
    ("\\boxed{x^2+1}", "(x+1)^2", None),
    ("\\boxed{x}", "42", None),
    # the last box is wrong though an earlier one was right
    ("\\boxed{42} no wait, \\boxed{24}", "42", None),
    # a final box cut off by truncation does not fall back to an earlier one
    ("\\boxed{42} and finally \\boxed{4", "42", "no boxed answer"),
    # a bare number after the box is not the answer
    ("\\boxed{41} 42", "42", None),
]


@pytest.mark.parametrize("response, answer, note", MISMATCHES)
def test_wrong_or_missing_answers_score_minus_one(response, answer, note, verifier):
    score = score_math(response, answer, verifier=verifier)
    assert not score.correct, score
    assert (score.reward, score.score) == (-1.0, 0.0)
    assert score.note
    if note:
        assert score.note == note


def test_predicted_is_the_cleaned_last_box(verifier):
    assert (
        score_math("\\boxed{1} then \\boxed{'\\frac{a}{b}'}.", "2", verifier=verifier).predicted
        == "\\frac{a}{b}"
    )
    assert score_math("nothing", "2", verifier=verifier).predicted is None


def test_overlong_answer_is_refused_without_parsing(verifier):
    score = score_math("\\boxed{" + "1+" * 5000 + "1}", "10001", verifier=verifier)
    assert not score.correct and "longer than" in score.note


def test_empty_reference_is_a_caller_error(verifier):
    with pytest.raises(ValueError):
        score_math("\\boxed{1}", "  ", verifier=verifier)


def test_a_pathological_answer_costs_at_most_the_timeout_and_the_pool_recovers():
    with MathVerifier(workers=1, timeout=1.0) as v:
        score_math("\\boxed{2}", "\\sqrt{4}", verifier=v)  # start the worker outside the timed part
        start = time.monotonic()
        score = score_math("\\boxed{(x+1)^{999999}}", "x^{999999}+1", verifier=v)
        elapsed = time.monotonic() - start
        assert not score.correct and "timed out" in score.note
        assert elapsed < 3.5  # the 1 s timeout, plus killing the worker on a loaded machine
        # the hung worker was killed; a fresh one answers the next call
        assert score_math("\\boxed{0.5}", "\\frac{1}{2}", verifier=v).correct


def test_safe_from_many_threads(verifier):
    cases = [
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
        ("\\boxed{7}", "8", False),
        ("\\boxed{\\{3,4\\}}", "\\{4,3\\}", True),
    ] * 12
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda c: score_math(c[0], c[1], verifier=verifier).correct, cases))
    assert results == [expected for _, _, expected in cases]


async def test_safe_from_an_event_loop(verifier):
    cases = [
        ("\\boxed{\\frac{6}{8}}", "0.75", True),
        ("\\boxed{12}", "\\sqrt{144}", True),
        ("\\boxed{1}", "2", False),
    ] * 8
    scores = await asyncio.gather(*(score_math_async(r, a, verifier=verifier) for r, a, _ in cases))
    assert [s.correct for s in scores] == [expected for _, _, expected in cases]


def test_shared_verifier_is_used_by_default():
    assert score_math("\\boxed{\\frac{2}{4}}", "0.5").correct


def test_closed_verifier_refuses_work():
    v = MathVerifier(workers=1)
    v.close()
    with pytest.raises(RuntimeError):
        score_math("\\boxed{1}", "0.5", verifier=v)


def test_a_dead_worker_is_replaced():
    with MathVerifier(workers=1, timeout=5.0) as v:
        assert score_math("\\boxed{0.5}", "\\frac{1}{2}", verifier=v).correct
        worker = v._idle.get_nowait()
        worker.proc.kill()  # as the OOM killer would
        worker.proc.wait()
        v._idle.put(worker)
        score = score_math("\\boxed{0.5}", "\\frac{1}{3}", verifier=v)
        assert not score.correct and score.note == "math-verify worker died"
        assert score_math("\\boxed{0.5}", "\\frac{1}{2}", verifier=v).correct


def test_a_forked_child_starts_its_own_workers(verifier):
    import os

    assert score_math("\\boxed{0.5}", "\\frac{1}{2}", verifier=verifier).correct
    pid = os.fork()
    if pid == 0:  # the child must not talk to the parent's workers
        ok = score_math("\\boxed{0.25}", "\\frac{1}{4}", verifier=verifier).correct
        verifier.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert score_math("\\boxed{3}", "\\sqrt{9}", verifier=verifier).correct
