from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cleaner.data import load_table, read_rows
from cleaner.jsonl import RecordError

ROWS = [
    {"uid": "p1", "question": "What is 2+2?", "meta": {"gold": "4"}},
    {"uid": "p2", "question": "What is 3*3?", "meta": {"gold": "9"}},
]
FIELDS = {"id": "uid", "question": "question", "answer": "meta.gold"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(params=["jsonl", "parquet", "datasets"])
def table(request, tmp_path):
    """The same two rows as JSONL, as Parquet and as a datasets folder."""
    if request.param == "jsonl":
        return write_jsonl(tmp_path / "rows.jsonl", ROWS)
    if request.param == "parquet":
        path = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path)
        return path
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "rows_ds"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    return path


def test_read_rows_numbers_rows_from_one(table):
    assert [(n, r["uid"]) for n, r in read_rows(table)] == [(1, "p1"), (2, "p2")]


def test_load_table_with_a_field_mapping(table):
    problems = load_table(
        table, kind="math", fields=FIELDS, prompt=lambda q: f"Solve: {q}", source="toy"
    )
    assert [(p.id, p.answer, p.source) for p in problems] == [
        ("p1", "4", "toy"),
        ("p2", "9", "toy"),
    ]
    assert problems[0].prompt == [{"role": "user", "content": "Solve: What is 2+2?"}]


def test_load_table_limit_and_default_ids(tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", ROWS)
    problems = load_table(
        path, kind="math", fields={"question": "question", "answer": "meta.gold"}, limit=1
    )
    assert [p.id for p in problems] == ["toy/0"]


def test_messages_column_is_used_as_is_and_json_text_is_read(tmp_path):
    rows = [
        {
            "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            "reward_model": json.dumps({"ground_truth": "7"}),
        }
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    (problem,) = load_table(
        path, kind="math", fields={"question": "prompt", "answer": "reward_model.ground_truth"}
    )
    assert problem.prompt == rows[0]["prompt"] and problem.answer == "7" and problem.question == "u"


def test_code_tests_column(tmp_path):
    tests = {"type": "stdio", "cases": [{"input": "1\n", "output": "1\n"}]}
    path = write_jsonl(tmp_path / "code.jsonl", [{"q": "echo", "t": json.dumps(tests)}])
    (problem,) = load_table(path, kind="code", fields={"question": "q", "tests": "t"})
    assert problem.tests == tests


@pytest.mark.parametrize(
    "row, field",
    [
        ({"uid": "p3", "meta": {"gold": "1"}}, "question"),
        ({"uid": "p3", "question": "", "meta": {"gold": "1"}}, "question"),
        ({"uid": "p3", "question": "q", "meta": {}}, "meta.gold"),
        ({"uid": "p3", "question": "q", "meta": "{broken"}, "meta.gold"),
        ({"uid": "p3", "question": ["not", "messages"], "meta": {"gold": "1"}}, "prompt"),
    ],
)
def test_malformed_row_names_file_row_and_field(tmp_path, row, field):
    path = write_jsonl(tmp_path / "bad.jsonl", [*ROWS, row])
    with pytest.raises(RecordError) as info:
        load_table(path, kind="math", fields=FIELDS)
    assert (info.value.line, info.value.field) == (3, field)
    assert str(path) in str(info.value)


def test_malformed_parquet_row(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["a", None, "c"], "answer": ["1", "2", "3"]}), path)
    with pytest.raises(RecordError) as info:
        load_table(path, kind="math", fields={"question": "question", "answer": "answer"})
    assert (info.value.line, info.value.field) == (2, "question")


def test_code_problem_without_tests(tmp_path):
    path = write_jsonl(tmp_path / "code.jsonl", [{"q": "echo", "t": json.dumps({"type": "unit"})}])
    with pytest.raises(RecordError) as info:
        load_table(path, kind="code", fields={"question": "q", "tests": "t"})
    assert (info.value.line, info.value.field) == (1, "tests")


def test_not_a_table(tmp_path):
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(RecordError, match="Parquet"):
        list(read_rows(tmp_path / "x.parquet"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(RecordError, match="unknown format"):
        list(read_rows(tmp_path / "x.csv"))
    with pytest.raises(FileNotFoundError):
        list(read_rows(tmp_path / "missing.jsonl"))


def test_field_mapping_is_checked():
    with pytest.raises(ValueError):
        load_table("x.jsonl", kind="math", fields={"answer": "a"})
    with pytest.raises(ValueError):
        load_table("x.jsonl", kind="math", fields={"question": "q", "solution": "s"})
