import json

import pytest

from cleaner.jsonl import RecordError
from cleaner.tokens import Segment, TokenTrajectory
from cleaner.trajectory import Trajectory, Turn
from tests.helpers import OK, err, make_trajectory


def sample() -> TokenTrajectory:
    traj = make_trajectory(Turn("a", "print(x)", err()), Turn("b", "x=1\nprint(x)", OK), Turn("c"))
    tt = TokenTrajectory(traj)
    tt.append("prompt", [1, 2, 3])
    tt.append("shallow", [10, 11], [-0.5, -1.25], turn=0)
    tt.append("tool", [4, 5, 6], turn=0)
    tt.append("sampled", [12], [-0.1], turn=2)
    tt.append("template", [7], turn=2)
    tt.append("sampled", [], turn=2)  # empty segments are not kept
    return tt


def test_flat_views_line_up():
    tt = sample()
    assert tt.token_ids == [1, 2, 3, 10, 11, 4, 5, 6, 12, 7]
    assert tt.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]
    assert tt.origins[3:5] == ["shallow", "shallow"]
    assert tt.sampling_logprobs == [None, None, None, -0.5, -1.25, None, None, None, -0.1, None]
    assert tt.prompt_length == 3 and len(tt.segments) == 5


def test_record_round_trip_is_lossless_and_readable_as_a_trajectory():
    tt = sample()
    record = json.loads(json.dumps(tt.to_dict()))
    assert TokenTrajectory.from_dict(record) == tt
    as_messages = Trajectory.from_dict(
        record
    )  # message-level tools keep the tokens as an extra key
    assert as_messages.extra["tokens"] == record["tokens"]
    assert as_messages.to_dict() == record


def test_segments_check_their_invariants():
    with pytest.raises(ValueError, match="origin"):
        Segment("generated", [1])
    with pytest.raises(ValueError, match="2 log-probs for 1 tokens"):
        Segment("sampled", [1], [-1.0, -2.0])


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("tokens"), "tokens"),
        (
            lambda r: r["tokens"]["segments"][1].__setitem__("token_ids", [1, "2"]),
            "tokens.segments[1].token_ids",
        ),
        (lambda r: r["tokens"]["segments"][1].__setitem__("turn", 9), "tokens.segments[1].turn"),
        (lambda r: r["tokens"]["segments"][1].__setitem__("logprobs", [0.0]), "tokens.segments[1]"),
        (lambda r: r["tokens"]["segments"][0].__setitem__("origin", "x"), "tokens.segments[0]"),
    ],
)
def test_malformed_token_records_name_the_field(mutate, field):
    record = json.loads(json.dumps(sample().to_dict()))
    mutate(record)
    with pytest.raises(RecordError) as info:
        TokenTrajectory.from_dict(record)
    assert info.value.field == field
