from __future__ import annotations

import json

import pytest

from cleaner.data import (
    TOOL_TASKS,
    Problem,
    load_gym,
    load_humaneval,
    read_problems,
    write_problems,
)
from cleaner.jsonl import RecordError
from cleaner.rewards.gym import score_gym


def test_humaneval_has_its_164_problems():
    problems = load_humaneval()
    assert len(problems) == 164
    assert len({p.id for p in problems}) == 164
    assert problems[0].id == "HumanEval/0" and problems[-1].id == "HumanEval/163"
    first = problems[0]
    assert first.kind == "code" and first.source == "humaneval"
    assert (
        first.tests["type"] == "functional" and first.tests["entry_point"] == "has_close_elements"
    )
    assert "def check(candidate)" in first.tests["test"]
    assert "def has_close_elements(" in first.question
    assert first.question.endswith("submit your code within ```python\n# YOUR CODE HERE\n```.")
    assert "return" in first.metadata["canonical_solution"]


def test_gym_is_reproducible_under_a_seed():
    first = load_gym(size=5, seed=7)
    again = load_gym(size=5, seed=7)
    assert [p.to_dict() for p in first] == [p.to_dict() for p in again]
    assert len(first) == 5 * len(TOOL_TASKS)
    other = load_gym(size=5, seed=8)
    assert [p.question for p in other] != [p.question for p in first]


def test_a_task_does_not_depend_on_its_neighbours():
    alone = load_gym("lcm", size=4, seed=3)
    mixed = [p for p in load_gym(["gcd", "lcm"], size=4, seed=3) if p.metadata["task"] == "lcm"]
    assert [p.to_dict() for p in alone] == [p.to_dict() for p in mixed]


def test_gym_problems_round_trip_through_jsonl_and_still_score(tmp_path):
    problems = load_gym(size=3, seed=2)
    assert write_problems(problems, tmp_path / "p.jsonl") == len(problems)
    loaded = list(read_problems(tmp_path / "p.jsonl"))
    assert [p.to_dict() for p in loaded] == [p.to_dict() for p in problems]
    for p in loaded:
        assert score_gym(
            f"\\boxed{{{p.answer}}}", p.metadata["task"], p.metadata["entry"]
        ).correct, p.id


def test_gym_prompt_asks_for_a_boxed_answer():
    (problem,) = load_gym("gcd", size=1, seed=0)
    assert problem.question.startswith(
        "Analyze and solve the following math problem step by step. \n\nFind the"
    )
    assert "\\boxed{'The final answer goes here.'}" in problem.question
    assert problem.id == "gym/gcd/0/0"


def test_gym_config_reaches_the_generator():
    problems = load_gym(
        "basic_arithmetic",
        size=5,
        seed=1,
        config={"basic_arithmetic": {"min_terms": 5, "max_terms": 5}},
    )
    assert all(p.metadata["entry"]["metadata"]["num_terms"] == 5 for p in problems)


def test_unknown_gym_task():
    with pytest.raises(ValueError):
        load_gym("no_such_task", size=1, seed=0)


@pytest.mark.parametrize(
    "record, field",
    [
        (
            {
                "id": "x",
                "kind": "essay",
                "prompt": [{"role": "user", "content": "q"}],
                "answer": "1",
            },
            "kind",
        ),
        ({"id": "x", "kind": "math", "prompt": [{"role": "user", "content": "q"}]}, "answer"),
        (
            {"id": "x", "kind": "mcq", "prompt": [{"role": "user", "content": "q"}], "answer": " "},
            "answer",
        ),
        (
            {
                "id": "x",
                "kind": "code",
                "prompt": [{"role": "user", "content": "q"}],
                "tests": {"type": "x"},
            },
            "tests",
        ),
        (
            {"id": "x", "kind": "gym", "prompt": [{"role": "user", "content": "q"}], "answer": "1"},
            "metadata",
        ),
        ({"id": "x", "kind": "math", "prompt": [], "answer": "1"}, "prompt"),
        ({"id": "x", "kind": "math", "prompt": [{"content": "q"}], "answer": "1"}, "prompt"),
        ({"kind": "math", "prompt": [{"role": "user", "content": "q"}], "answer": "1"}, "id"),
    ],
)
def test_problem_validation_names_the_field(tmp_path, record, field):
    with pytest.raises(RecordError) as info:
        Problem.from_dict(record)
    assert info.value.field == field
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(RecordError) as info:
        list(read_problems(path))
    assert (info.value.line, info.value.field) == (1, field)
