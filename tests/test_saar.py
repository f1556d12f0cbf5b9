import dataclasses
import difflib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.formats.hermes import render_call
from cleaner.saar import code_similarity, graft, purify, similarity
from cleaner.trajectory import Observation, SaarRecord, Trajectory, Turn
from tests.helpers import OK, err, make_trajectory


def final(text="The answer is \\boxed{3}."):
    return Turn(text, None, None)


# --- similarity and graft -----------------------------------------------------------------------


def test_similarity_is_difflib_ratio_with_defaults():
    a, b = "print(x)", "x = 3\nprint(x)"
    assert similarity(a, b) == difflib.SequenceMatcher(None, a, b).ratio()
    assert similarity(a, a) == 1.0 and similarity("abc", "xyz") == 0.0


def test_call_mode_compares_the_rendered_tool_call():
    cur, fix = Turn("r", "print(x)", err()), Turn("s", "import math\nprint(math.pi)", OK)
    on_call = code_similarity(cur, fix, "call")
    assert on_call == similarity(
        render_call("print(x)"), render_call("import math\nprint(math.pi)")
    )
    assert on_call > code_similarity(cur, fix, "code")  # the shared JSON wrapper raises it
    with pytest.raises(ValueError):
        code_similarity(cur, fix, "tokens")


def test_shallow_graft_keeps_reasoning_and_takes_the_fix():
    cur = Turn(
        "Compute the sum.",
        "print(sum(range(10))",
        err("SyntaxError", "'(' was never closed"),
        extra={"kept": 1},
    )
    fix = Turn("I missed a parenthesis.", "print(sum(range(10)))", OK, extra={"dropped": 1})
    out, kind, sim = graft(cur, fix, gamma=0.5)
    assert kind == "shallow" and sim > 0.9
    assert (out.reasoning, out.code, out.observation, out.origin) == (
        cur.reasoning,
        fix.code,
        OK,
        "shallow",
    )
    assert out.extra == {"kept": 1} and not out.failed


def test_deep_graft_takes_reasoning_and_code_of_the_fix():
    cur = Turn("Use a loop.", "for i in rang(5): s += i", err())
    fix = Turn("Use the formula instead.", "n = 4\nprint(n * (n + 1) // 2)", OK, extra={"k": 2})
    out, kind, sim = graft(cur, fix, gamma=0.5)
    assert kind == "deep" and sim < 0.5
    assert (out.reasoning, out.code, out.observation, out.origin, out.extra) == (
        fix.reasoning,
        fix.code,
        OK,
        "deep",
        {"k": 2},
    )


def test_similarity_equal_to_gamma_is_shallow():
    cur, fix = Turn("a", "abcd", err()), Turn("b", "abxy", OK)
    sim = similarity("abcd", "abxy")
    assert graft(cur, fix, gamma=sim)[1] == "shallow"
    assert graft(cur, fix, gamma=sim + 1e-9)[1] == "deep"


# --- offline purification: the SPEC rule case by case -------------------------------------------


def test_spec_example_is_purified():
    t = make_trajectory(
        Turn("Let me compute it.", "print(x)", err()),
        Turn("x was never defined.", "x = 3\nprint(x)", OK),
        final(),
    )
    p = purify(t)
    assert len(p.turns) == 2 and p.failed_calls == 0
    assert p.turns[0].code == "x = 3\nprint(x)" and p.turns[0].observation == OK
    assert p.turns[0].origin == p.saar.grafts[0].kind
    assert p.turns[1] == dataclasses.replace(final(), origin="sampled")
    assert p.saar.grafts[0].turn == 0 and p.saar.grafts[0].attempt == 1 and not p.saar.gave_up


def test_recovery_after_several_attempts_counts_attempts():
    t = make_trajectory(
        Turn("a", "print(y)", err()),
        Turn("b", "print(y + 1)", err()),
        Turn("c", "y = 1\nprint(y + 1)", OK),
        final(),
    )
    p = purify(t, max_retries=3)
    assert [g.attempt for g in p.saar.grafts] == [1, 2]
    assert {g.turn for g in p.saar.grafts} == {0}
    assert len(p.turns) == 2 and p.turns[0].code == "y = 1\nprint(y + 1)" and not p.saar.gave_up


def test_gives_up_after_max_retries_and_stays_raw():
    fails = [Turn(f"try {k}", f"print(z{k})", err()) for k in range(4)]
    later_fail, later_fix = (
        Turn("again", "1/0", err("ZeroDivisionError", "division by zero")),
        Turn("ok", "print(1)", OK),
    )
    t = make_trajectory(
        *fails, Turn("fixed", "z = 1\nprint(z)", OK), later_fail, later_fix, final()
    )
    p = purify(t, max_retries=3)
    assert p.saar.gave_up
    assert [g.attempt for g in p.saar.grafts] == [1, 2, 3]
    assert (
        p.turns[0].failed and p.turns[0].code == "print(z3)"
    )  # the last grafted turn keeps its error
    assert [turn.code for turn in p.turns[1:]] == ["z = 1\nprint(z)", "1/0", "print(1)", None]
    assert p.turns[2].failed  # SAAR is off after giving up: the later failure stays


def test_gives_up_when_the_model_answers_without_code():
    t = make_trajectory(Turn("a", "print(x)", err()), final("I cannot run it. \\boxed{3}"))
    p = purify(t)
    assert p.saar.gave_up and p.saar.grafts == []
    assert [turn.code for turn in p.turns] == ["print(x)", None]


def test_gives_up_at_the_end_of_the_trajectory():
    p = purify(make_trajectory(Turn("a", "print(x)", err())))
    assert p.saar.gave_up and len(p.turns) == 1 and p.turns[0].failed


def test_max_retries_zero_never_grafts():
    t = make_trajectory(Turn("a", "print(x)", err()), Turn("b", "x=1\nprint(x)", OK))
    p = purify(t, max_retries=0)
    assert p.saar.gave_up and p.saar.grafts == [] and len(p.turns) == 2


def test_graft_turn_indices_refer_to_the_output():
    t = make_trajectory(
        Turn("ok first", "print(1)", OK),
        Turn("a", "print(x)", err()),
        Turn("b", "x=1\nprint(x)", OK),
        Turn("c", "print(q)", err()),
        Turn("d", "q=2\nprint(q)", OK),
    )
    p = purify(t)
    assert [g.turn for g in p.saar.grafts] == [1, 2]
    assert [turn.origin for turn in p.turns] == [
        "sampled",
        p.saar.grafts[0].kind,
        p.saar.grafts[1].kind,
    ]


def test_a_trajectory_with_a_saar_record_is_not_purified_again():
    t = make_trajectory(
        Turn("a", "print(x)", err()), Turn("b", "x=1\nprint(x)", OK), saar=SaarRecord(active=False)
    )
    assert purify(t) is t


# --- properties ---------------------------------------------------------------------------------

codes = st.sampled_from(
    [
        "print(x)",
        "x = 1\nprint(x)",
        "import math\nprint(math.sqrt(2))",
        "1/0",
        "print(sum(range(10))",
        "for i in range(3): print(i)",
        "y = [1, 2]\nprint(y[5])",
    ]
)
reasonings = st.text(alphabet="abc xyz.", max_size=12)
observations = st.sampled_from(
    [
        OK,
        err(),
        err("ZeroDivisionError", "division by zero"),
        Observation("timeout", stderr="TimeoutError"),
        Observation("invalid"),
        Observation("killed", reason="memory"),
    ]
)
extras = st.dictionaries(st.sampled_from(["k1", "k2", "tokens"]), st.integers(), max_size=2)
tool_turns = st.builds(Turn, reasonings, codes, observations, st.none(), extras)
final_turns = st.builds(Turn, reasonings, st.none(), st.none(), st.none(), extras)
trajectories = st.builds(
    lambda turns, extra: Trajectory("p", [{"role": "user", "content": "q"}], turns, extra=extra),
    st.lists(st.one_of(tool_turns, tool_turns, final_turns), max_size=10),
    extras,
)
params = st.tuples(st.floats(0, 1.2), st.integers(0, 4), st.sampled_from(["code", "call"]))


def oracle(turns, gamma, max_retries, similarity_on):
    """The SPEC rule written independently, as a state machine over the turns."""
    out, state, cur, retries = [], "normal", None, 0
    for u in turns:
        if state == "correcting":
            if retries == max_retries or u.code is None:
                out.append(cur)
                state = "off"
            else:
                cur, _, _ = graft(cur, u, gamma, similarity_on)
                retries += 1
                if not u.failed:
                    out.append(cur)
                    state = "normal"
                continue
        if state == "normal" and u.failed:
            cur, retries, state = u, 0, "correcting"
        else:
            out.append(u)
    if state == "correcting":
        out.append(cur)
    return [(t.reasoning, t.code, t.observation) for t in out]


@settings(max_examples=300, deadline=None)
@given(trajectories, params)
def test_matches_an_independent_statement_of_the_rule(t, p):
    out = purify(t, *p)
    assert [(u.reasoning, u.code, u.observation) for u in out.turns] == oracle(t.turns, *p)


@settings(max_examples=300, deadline=None)
@given(trajectories, params)
def test_no_failed_turn_before_the_give_up_point(t, p):
    out = purify(t, *p)
    failed_at = [i for i, u in enumerate(out.turns) if u.failed]
    if not out.saar.gave_up:
        assert failed_at == []
    else:
        g = failed_at[0]  # the give-up turn; everything after it is raw input
        tail = t.turns[len(t.turns) - (len(out.turns) - g - 1) :] if len(out.turns) - g - 1 else []
        assert [(u.code, u.observation) for u in out.turns[g + 1 :]] == [
            (u.code, u.observation) for u in tail
        ]


@settings(max_examples=300, deadline=None)
@given(trajectories, params)
def test_turns_never_grow_and_each_graft_consumes_one_turn(t, p):
    out = purify(t, *p)
    assert len(out.turns) <= len(t.turns)
    assert len(t.turns) - len(out.turns) == len(out.saar.grafts)


@settings(max_examples=200, deadline=None)
@given(trajectories, params)
def test_without_failures_nothing_changes(t, p):
    t.turns = [u for u in t.turns if not u.failed]
    out = purify(t, *p)
    assert [dataclasses.replace(u, origin=None) for u in out.turns] == t.turns
    assert out.saar == SaarRecord(active=True, grafts=[], gave_up=False)


@settings(max_examples=200, deadline=None)
@given(trajectories, st.integers(0, 4))
def test_gamma_zero_only_shallow_gamma_above_one_only_deep(t, k):
    assert all(g.kind == "shallow" for g in purify(t, gamma=0.0, max_retries=k).saar.grafts)
    assert all(g.kind == "deep" for g in purify(t, gamma=1.0001, max_retries=k).saar.grafts)


@settings(max_examples=200, deadline=None)
@given(trajectories, params)
def test_purifying_twice_equals_once(t, p):
    once = purify(t, *p)
    assert purify(once, *p) == once
    if (
        not once.saar.gave_up
    ):  # even with the record stripped, a purified trajectory is a fixed point
        again = purify(dataclasses.replace(once, saar=None), *p)
        assert again.turns == once.turns


@settings(max_examples=200, deadline=None)
@given(trajectories, params)
def test_extra_keys_survive(t, p):
    out = purify(t, *p)
    assert out.extra == t.extra
    assert all(out.to_dict()[k] == v for k, v in t.extra.items())
    input_extras = [u.extra for u in t.turns]
    assert all(u.extra in input_extras for u in out.turns)
