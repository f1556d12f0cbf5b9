import json

import pytest

from cleaner.jsonl import RecordError
from cleaner.trajectory import Observation, Trajectory, Turn, read_trajectories

SPEC_EXAMPLE = {
    "id": "aime24-3/7",
    "schema": "cleaner.trajectory/1",
    "prompt": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
    "turns": [
        {
            "reasoning": "Let me compute it.",
            "code": "print(x)",
            "observation": {
                "status": "error",
                "stdout": "",
                "stderr": "NameError: name 'x' is not defined",
                "error_type": "NameError",
            },
        },
        {
            "reasoning": "x was never defined.",
            "code": "x = 3\nprint(x)",
            "observation": {"status": "ok", "stdout": "3\n", "stderr": ""},
        },
        {"reasoning": "The answer is \\boxed{3}.", "code": None, "observation": None},
    ],
    "answer": "3",
    "reward": 1.0,
}


def test_spec_example_round_trips_exactly():
    t = Trajectory.from_dict(SPEC_EXAMPLE)
    assert [turn.failed for turn in t.turns] == [True, False, False]
    assert t.tool_calls == 2 and t.failed_calls == 1
    assert t.to_dict() == SPEC_EXAMPLE


def test_unknown_keys_survive_everywhere():
    record = json.loads(json.dumps(SPEC_EXAMPLE))
    record["source"] = {"model": "qwen"}
    record["turns"][0]["tokens_used"] = 17
    record["turns"][0]["observation"]["duration_s"] = 0.01
    record["prompt"][1]["name"] = "kept"
    assert Trajectory.from_dict(record).to_dict() == record


def test_failed_means_code_and_a_non_ok_observation():
    assert Turn("r", "x", Observation("timeout")).failed
    assert Turn("r", "x", Observation("invalid")).failed
    assert not Turn("r", "x", Observation("ok")).failed
    assert not Turn("r", None, None).failed
    assert not Turn("r", "x", None).failed  # never executed: no evidence of failure


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda r: r.pop("turns"), "turns", "missing"),
        (lambda r: r.__setitem__("turns", {}), "turns", "expected array"),
        (
            lambda r: r["turns"][1]["observation"].__setitem__("status", "fine"),
            "turns[1].observation.status",
            "must be one of",
        ),
        (lambda r: r["turns"][0].__setitem__("code", 3), "turns[0].code", "expected string"),
        (
            lambda r: r["turns"][2].__setitem__("observation", {"status": "ok"}),
            "turns[2].observation",
            "needs a tool call",
        ),
        (lambda r: r.__setitem__("reward", "high"), "reward", "expected integer or number"),
        (lambda r: r.__setitem__("schema", "other/2"), "schema", "unsupported schema"),
        (lambda r: r["prompt"][0].pop("role"), "prompt[0].role", "missing"),
        (
            lambda r: r.__setitem__(
                "saar", {"grafts": [{"turn": 0, "kind": "medium", "similarity": 1, "attempt": 1}]}
            ),
            "saar.grafts[0].kind",
            "must be one of",
        ),
    ],
)
def test_malformed_records_name_file_line_and_field(tmp_path, mutate, field, message):
    bad = json.loads(json.dumps(SPEC_EXAMPLE))
    mutate(bad)
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(SPEC_EXAMPLE) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError) as info:
        list(read_trajectories(path))
    e = info.value
    assert (e.path, e.line, e.field) == (path, 3, field)
    assert message in e.reason
    assert str(e).startswith(f"{path}:3: {field}: ")


def test_invalid_json_and_non_objects_name_the_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(SPEC_EXAMPLE) + "\n{oops\n")
    with pytest.raises(RecordError, match=r"in.jsonl:2: invalid JSON"):
        list(read_trajectories(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(RecordError, match=r"in.jsonl:1: expected a JSON object, got array"):
        list(read_trajectories(path))
