import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cleaner.tokens import TokenTrajectory
from cleaner.train.packing import TrainSequence, forward_logprobs, pack, pad
from tests.helpers import make_trajectory


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    return Qwen3ForCausalLM(config).eval()


def sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, 97, (n,), generator=g).tolist()
        mask = [0] * min(n, 3) + [1] * (n - 3)
        out.append(TrainSequence(ids, mask, [0] * n, [-1.0] * n, advantage=float(i)))
    return out


def alone(model, s):
    ids = torch.tensor([s.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_give_each_sequence_its_own_logprobs(model, attn):
    model.config._attn_implementation = attn
    seqs = sequences([30, 25, 5, 4, 24])
    batches = pack(seqs, max_tokens=70)
    # 30 opens a batch 30 wide; 25 is close enough for a second row; 24 would pass 70 tokens, so it
    # opens the next batch; 5 fills the gap beside 25; 4 is too narrow for the 24-wide batch
    assert [mb.lengths for mb in batches] == [[[30], [25, 5]], [[24]], [[4]]]
    assert [mb.order for mb in batches] == [[0, 1, 2], [4], [3]]
    assert all(mb.tokens <= 70 for mb in batches)
    got = {}
    with torch.no_grad():
        for mb in batches:
            lp, _ = forward_logprobs(model, mb)
            for i, piece in zip(mb.order, mb.split(lp), strict=True):
                got[i] = piece[:-1]  # a sequence's last position predicts nothing
    for i, s in enumerate(seqs):
        torch.testing.assert_close(got[i], alone(model, s), atol=1e-5, rtol=1e-5)
    for mb in batches:  # join is the inverse of split
        pieces = [torch.full((len(seqs[i]),), float(i)) for i in mb.order]
        assert [p.tolist() for p in mb.split(mb.join(pieces))] == [p.tolist() for p in pieces]


def test_padded_batches_agree_with_packed(model):
    model.config._attn_implementation = "sdpa"
    seqs = sequences([6, 11, 8])
    (padded,) = pad(seqs, batch_size=3)
    packed = pack(seqs, max_tokens=1000)
    with torch.no_grad():
        by_pad = dict(
            zip(padded.order, padded.split(forward_logprobs(model, padded)[0]), strict=True)
        )
        by_pack = {
            i: lp
            for mb in packed
            for i, lp in zip(mb.order, mb.split(forward_logprobs(model, mb)[0]), strict=True)
        }
    for i in range(len(seqs)):
        torch.testing.assert_close(by_pad[i][:-1], by_pack[i][:-1], atol=1e-5, rtol=1e-5)
    trained = sum(sum(s.loss_mask[1:]) for s in seqs)
    assert padded.loss_mask.sum() == sum(mb.loss_mask.sum() for mb in packed) == trained


def test_targets_are_shifted_and_the_boundary_is_masked():
    seqs = sequences([2, 8, 10])
    (mb,) = pack(seqs, max_tokens=100)
    assert mb.lengths == [[10], [8, 2]] and mb.order == [2, 1, 0]
    assert mb.targets[1, :7].tolist() == seqs[1].token_ids[1:]
    assert mb.loss_mask[1, 7].item() == 0  # last token of a sequence never predicts the next one
    assert mb.advantages[1].tolist() == [1.0] * 8 + [0.0] * 2
    assert mb.position_ids[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]


def test_from_trajectory_marks_grafted_tokens():
    tt = TokenTrajectory(make_trajectory())
    tt.append("prompt", [1, 2])
    tt.append("sampled", [3], [-0.1])
    tt.append("shallow", [4, 5], [-0.2, -0.3])
    tt.append("tool", [6])
    s = TrainSequence.from_trajectory(tt, advantage=0.5)
    assert s.loss_mask == [0, 0, 1, 1, 1, 0] and s.graft_mask == [0, 0, 0, 1, 1, 0]
    assert s.behavior_logprobs == [0.0, 0.0, -0.1, -0.2, -0.3, 0.0]
