from __future__ import annotations

import json

import pytest

from cleaner.jsonl import RecordError
from cleaner.rewards.files import score_file


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def read_lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_math_file_scores_every_line_in_order(tmp_path):
    records = [
        {"id": "a", "response": "\\boxed{042}", "answer": "42", "model": "m1"},
        {"id": "b", "response": "I think 7", "answer": "7"},
        {"id": "c", "response": "\\boxed{0.25}", "answer": "\\frac{1}{4}"},
        {"id": "d", "response": "\\boxed{3}", "answer": 4},
    ] * 70  # more than one chunk
    write_lines(tmp_path / "in.jsonl", records)
    summary = score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "math")
    out = read_lines(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [r["id"] for r in records]
    assert [r["correct"] for r in out[:4]] == [True, False, True, False]
    assert [r["reward"] for r in out[:4]] == [1.0, -1.0, 1.0, -1.0]
    assert [r["score"] for r in out[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert out[0]["model"] == "m1" and out[0]["predicted"] == "042"
    assert out[1]["predicted"] is None and out[1]["note"] == "no boxed answer"
    assert "note" not in out[0]
    assert summary == {
        "kind": "math",
        "count": 280,
        "correct": 140,
        "accuracy": 0.5,
        "no_answer": 70,
        "timeouts": 0,
    }


def test_mcq_file(tmp_path):
    write_lines(
        tmp_path / "in.jsonl",
        [
            {"id": 1, "response": "\\boxed{(C)}", "answer": "C"},
            {"id": 2, "response": "\\boxed{A}", "answer": "C"},
        ],
    )
    summary = score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "mcq")
    assert [r["correct"] for r in read_lines(tmp_path / "out.jsonl")] == [True, False]
    assert summary["accuracy"] == 0.5


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"id": "x", "answer": "1"}, "response"),
        ({"id": "x", "response": 3, "answer": "1"}, "response"),
        ({"id": "x", "response": "r"}, "answer"),
        ({"id": "x", "response": "r", "answer": ""}, "answer"),
        ({"id": "x", "response": "r", "answer": True}, "answer"),
    ],
)
def test_malformed_line_names_file_line_and_field_and_writes_nothing(tmp_path, bad, field):
    write_lines(tmp_path / "in.jsonl", [{"id": "ok", "response": "\\boxed{1}", "answer": "1"}, bad])
    with pytest.raises(RecordError) as info:
        score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "math")
    assert (info.value.line, info.value.field) == (2, field)
    assert str(tmp_path / "in.jsonl") in str(info.value)
    assert not (tmp_path / "out.jsonl").exists()


def test_mcq_reference_must_be_a_letter(tmp_path):
    write_lines(tmp_path / "in.jsonl", [{"id": "x", "response": "\\boxed{A}", "answer": "42"}])
    with pytest.raises(RecordError) as info:
        score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "mcq")
    assert (info.value.line, info.value.field) == (1, "answer")


def test_unknown_kind(tmp_path):
    with pytest.raises(ValueError):
        score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "essay")
