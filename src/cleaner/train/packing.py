"""Trajectories as training tensors: padding-free packed micro-batches, and the log-probs of a batch.

Packing puts several trajectories end to end in one row and restarts `position_ids` at each one;
transformers then builds a block-diagonal causal mask (no attention across trajectories), so no
compute is spent on padding. `pad` builds the usual padded batches, the baseline of
`benchmarks/train.py` and a fallback for models whose attention cannot take packed rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cleaner.tokens import TokenTrajectory
from cleaner.train.grpo import entropy, token_logprobs


@dataclass
class TrainSequence:
    """One trajectory as the loss sees it; every list has one entry per token."""

    token_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the model sampled (or SAAR grafted in), 0 on prompt, template and tool tokens."""
    graft_mask: list[int]
    """1 on tokens SAAR grafted in (origin shallow or deep): sampled with the error in view."""
    behavior_logprobs: list[float]
    """The log-probs tokens were sampled with (0 where there are none)."""
    advantage: float

    @classmethod
    def from_trajectory(cls, t: TokenTrajectory, advantage: float) -> TrainSequence:
        return cls(
            token_ids=t.token_ids,
            loss_mask=t.loss_mask,
            graft_mask=[int(o in ("shallow", "deep")) for o in t.origins],
            behavior_logprobs=[0.0 if lp is None else lp for lp in t.sampling_logprobs],
            advantage=advantage,
        )

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class MicroBatch:
    """[rows, time] tensors. Position t holds input token t and the target token t + 1, with the
    target's masks, behaviour log-prob and advantage; `position_ids` restart at each packed sequence."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    targets: torch.Tensor
    loss_mask: torch.Tensor
    graft_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    advantages: torch.Tensor
    lengths: list[list[int]]
    """The lengths of the sequences in each row, in layout order."""
    order: list[int]
    """For each sequence in layout order, its index in the list that was packed."""

    @property
    def sequences(self) -> int:
        return sum(len(row) for row in self.lengths)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-token [rows, time] values cut into one 1-D tensor per sequence, in layout order."""
        out = []
        for r, row in enumerate(self.lengths):
            out.extend(values[r, : sum(row)].split(row))
        return out

    def join(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of `split`: per-sequence 1-D tensors (layout order) as this batch's [rows, time]."""
        out = torch.zeros(self.input_ids.shape, dtype=pieces[0].dtype, device=pieces[0].device)
        k = 0
        for r, row in enumerate(self.lengths):
            out[r, : sum(row)] = torch.cat(pieces[k : k + len(row)])
            k += len(row)
        return out

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()
        }
        return MicroBatch(**moved)


def _row(seqs: list[TrainSequence], length: int | None = None) -> dict[str, list]:
    """Concatenate sequences into one row of inputs and shifted targets; pad to `length` if given."""
    row: dict[str, list] = {
        k: []
        for k in (
            "input_ids",
            "position_ids",
            "targets",
            "loss_mask",
            "graft_mask",
            "behavior_logprobs",
            "advantages",
            "attention_mask",
        )
    }
    for s in seqs:
        n = len(s)
        row["input_ids"] += s.token_ids
        row["position_ids"] += list(range(n))
        row["targets"] += s.token_ids[1:] + [0]
        row["loss_mask"] += s.loss_mask[1:] + [
            0
        ]  # the last token predicts nothing of this sequence
        row["graft_mask"] += s.graft_mask[1:] + [0]
        row["behavior_logprobs"] += s.behavior_logprobs[1:] + [0.0]
        row["advantages"] += [s.advantage] * n
        row["attention_mask"] += [1] * n
    if length is not None:
        pad = length - len(row["input_ids"])
        for key in row:
            row[key] += [0.0 if key in ("behavior_logprobs", "advantages") else 0] * pad
        row["position_ids"][len(row["position_ids"]) - pad :] = list(range(pad))
    return row


def _tensors(
    rows: list[dict[str, list]],
    lengths: list[list[int]],
    indices: list[list[int]],
    with_attention_mask: bool,
) -> MicroBatch:
    def stack(key, dtype):
        return torch.tensor([r[key] for r in rows], dtype=dtype)

    return MicroBatch(
        input_ids=stack("input_ids", torch.long),
        position_ids=stack("position_ids", torch.long),
        attention_mask=stack("attention_mask", torch.long) if with_attention_mask else None,
        targets=stack("targets", torch.long),
        loss_mask=stack("loss_mask", torch.float32),
        graft_mask=stack("graft_mask", torch.float32),
        behavior_logprobs=stack("behavior_logprobs", torch.float32),
        advantages=stack("advantages", torch.float32),
        lengths=lengths,
        order=[i for row in indices for i in row],
    )


def pack(seqs: list[TrainSequence], max_tokens: int, narrower: float = 0.8) -> list[MicroBatch]:
    """Pack sequences, longest first, into micro-batches of rows of one width.

    A micro-batch's width is its first (longest) sequence's length. A sequence goes into the first
    row with room in any micro-batch (a gap in a wider row costs nothing to fill), else into a new
    row of the newest micro-batch if that stays within `max_tokens` and the sequence is at least
    `narrower` times its width, else it opens the next, narrower micro-batch. Widths stay close to
    the sequences they hold because attention without a variable-length kernel (SDPA, eager) costs
    the square of the row width whatever the block-diagonal mask hides. `MicroBatch.order` maps each packed
    sequence back to its index in `seqs`; the layout depends only on the lengths.
    """
    batches: list[list[list[int]]] = []
    room: list[list[int]] = []  # free tokens of every row, by batch
    width = 0
    for i in sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i)):
        n = len(seqs[i])
        slot = next(
            ((b, r) for b, rows in enumerate(room) for r, free in enumerate(rows) if free >= n),
            None,
        )
        if slot is None:
            if batches and n >= narrower * width and (len(room[-1]) + 1) * width <= max_tokens:
                batches[-1].append([])
                room[-1].append(width)
            else:
                width = n
                batches.append([[]])
                room.append([width])
            slot = (len(batches) - 1, len(room[-1]) - 1)
        b, r = slot
        batches[b][r].append(i)
        room[b][r] -= n
    out = []
    for rows in batches:
        length = max(sum(len(seqs[i]) for i in row) for row in rows)
        out.append(
            _tensors(
                [_row([seqs[i] for i in row], length) for row in rows],
                [[len(seqs[i]) for i in row] for row in rows],
                [list(row) for row in rows],
                with_attention_mask=False,
            )
        )
    return out


def pad(seqs: list[TrainSequence], batch_size: int) -> list[MicroBatch]:
    """Padded micro-batches of `batch_size` sequences each, in order (right padding, attention mask)."""
    out = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        length = max(len(s) for s in chunk)
        out.append(
            _tensors(
                [_row([s], length) for s in chunk],
                [[len(s)] for s in chunk],
                [[i + j] for j in range(len(chunk))],
                with_attention_mask=True,
            )
        )
    return out


def forward_logprobs(
    model, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every target token under the model (and per-token entropy if asked)."""
    logits = model(
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        attention_mask=mb.attention_mask,
        use_cache=False,
    ).logits
    logprobs = token_logprobs(logits, mb.targets, temperature)
    return logprobs, (entropy(logits, temperature) if with_entropy else None)
