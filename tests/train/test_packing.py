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
        mask = [0] * 3 + [1] * (n - 3)
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
    seqs = sequences([5, 17, 9, 30, 4, 12, 3])
    batches = pack(seqs, max_tokens=70)
    # rows as wide as the longest sequence (30): [5, 17], [9], [30], [4, 12, 3]; two rows a batch
    assert [mb.lengths for mb in batches] == [[[5, 17], [9]], [[30], [4, 12, 3]]]
    assert all(mb.tokens <= 70 for mb in batches)
    got = []
    with torch.no_grad():
        for mb in batches:
            lp, _ = forward_logprobs(model, mb)
            got += [
                piece[:-1] for piece in mb.split(lp)
            ]  # a sequence's last position predicts nothing
    for s, g in zip(seqs, got, strict=True):
        torch.testing.assert_close(g, alone(model, s), atol=1e-5, rtol=1e-5)
    flat = torch.arange(sum(len(s) for s in seqs), dtype=torch.float32).split(
        [len(s) for s in seqs]
    )
    joined = [mb.join(list(flat[:3]) if i == 0 else list(flat[3:])) for i, mb in enumerate(batches)]
    assert [p.tolist() for i, mb in enumerate(batches) for p in mb.split(joined[i])] == [
        p.tolist() for p in flat
    ]


def test_padded_batches_agree_with_packed(model):
    model.config._attn_implementation = "sdpa"
    seqs = sequences([6, 11, 3 + 5])
    (padded,) = pad(seqs, batch_size=3)
    (packed,) = pack(seqs, max_tokens=1000)
    with torch.no_grad():
        lp_pad, _ = forward_logprobs(model, padded)
        lp_pack, _ = forward_logprobs(model, packed)
    flat_pad = lp_pad[padded.loss_mask.bool()]
    flat_pack = lp_pack[packed.loss_mask.bool()]
    torch.testing.assert_close(flat_pad, flat_pack, atol=1e-5, rtol=1e-5)
    assert (
        padded.loss_mask.sum() == packed.loss_mask.sum() == sum(sum(s.loss_mask[1:]) for s in seqs)
    )


def test_targets_are_shifted_and_the_boundary_is_masked():
    seqs = sequences([4, 5, 9])
    (mb,) = pack(seqs, max_tokens=100)
    assert mb.lengths == [[4, 5], [9]]
    assert mb.targets[0, :3].tolist() == seqs[0].token_ids[1:]
    assert mb.loss_mask[0, 3].item() == 0  # last token of a sequence never predicts the next one
    assert mb.advantages[0].tolist() == [0.0] * 4 + [1.0] * 5
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4]


def test_from_trajectory_marks_grafted_tokens():
    tt = TokenTrajectory(make_trajectory())
    tt.append("prompt", [1, 2])
    tt.append("sampled", [3], [-0.1])
    tt.append("shallow", [4, 5], [-0.2, -0.3])
    tt.append("tool", [6])
    s = TrainSequence.from_trajectory(tt, advantage=0.5)
    assert s.loss_mask == [0, 0, 1, 1, 1, 0] and s.graft_mask == [0, 0, 0, 1, 1, 0]
    assert s.behavior_logprobs == [0.0, 0.0, -0.1, -0.2, -0.3, 0.0]
