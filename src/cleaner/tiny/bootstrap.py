"""`cleaner bootstrap`: build the embedded default model by supervised fine-tuning on synthetic traces.

Steps: generate traces (`traces.py`), train the tokenizer on their chat-template renderings, lay out
each trace's tokens exactly as a rollout produces them (the prompt from `apply_chat_template(...,
add_generation_prompt=True)`, each assistant turn's sampled text, tool results spliced with
`HermesFormat.observation_ids`), fit a tiny Qwen3 on the assistant-sampled tokens only, and save it
with `save_pretrained` plus a `bootstrap.json` that records the data mix, seeds, losses and timings.

The default model is cached per machine under the user cache directory, keyed by a hash of the
settings, and built atomically: in a temporary directory renamed into place, under a file lock, so
concurrent or killed builds never leave a half-written model behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import inspect
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cleaner.data import prompts
from cleaner.formats import HermesFormat, observation_text
from cleaner.tiny.model import ModelShape, build_model, parameter_count, save_model
from cleaner.tiny.tokenizer import build_tokenizer
from cleaner.tiny.traces import TOOLS, TraceMix, generate_traces
from cleaner.tokens import TokenTrajectory
from cleaner.trajectory import Trajectory

BUILD_VERSION = 1
"""Bump when trace generation or training changes what a given set of settings builds."""
CACHE_ENV = "CLEANER_CACHE_DIR"
HELD_OUT_OFFSET = 1_000
"""Held-out traces for the digit-accuracy diagnostic use seed + this."""


@dataclass(frozen=True)
class BootstrapSettings:
    """Everything that decides the built model; its hash names the cached copy."""

    seed: int = 0
    n_traces: int = 2000
    mix: TraceMix = field(default_factory=TraceMix)
    vocab_size: int = 2048
    shape: ModelShape = field(default_factory=ModelShape)
    short_prompt_epochs: int = 10
    """Epochs of the first stage, on bare-question prompts (0 skips it). Copying numbers from the
    question into code only emerges after ~1000 steps; short sequences make those steps cheap."""
    short_batch_tokens: int = 2048
    epochs: int = 1
    """Epochs of the second stage, in the rollout's token layout."""
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    batch_tokens: int = 4096
    """Padded tokens per optimiser step (sequences of similar length are batched together)."""
    layout_steps: int | None = 150
    """Cap on the second stage's steps: it adapts a model that already copies to the long prompt."""
    max_length: int = 1536
    held_out_traces: int = 32
    """Traces of another seed on which the digit-copying accuracy is measured."""
    max_steps: int | None = None
    """Stop each stage after this many optimiser steps (for quick test builds)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key(self) -> str:
        blob = json.dumps({"version": BUILD_VERSION, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- token layout


def render_conversation(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The trace as chat messages (assistant tool calls and tool results) for the chat template."""
    messages = list(trajectory.prompt)
    for turn in trajectory.turns:
        message: dict[str, Any] = {"role": "assistant", "content": turn.reasoning}
        if turn.code is not None:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": "code_interpreter", "arguments": {"code": turn.code}},
                }
            ]
        messages.append(message)
        if turn.observation is not None:
            messages.append({"role": "tool", "content": observation_text(turn.observation)})
    return messages


def trace_tokens(
    tokenizer, trajectory: Trajectory, *, tools: list[dict[str, Any]] | None = TOOLS
) -> TokenTrajectory:
    """The trace's tokens in the rollout's layout, as segments (the loss mask follows from them).

    prompt: the chat template with the generation prompt; sampled: each assistant turn's text as the
    model writes it (a tool call ends at `</tool_call>`, where the rollout stops; a final answer ends
    with the end-of-turn token the model emits); tool: the spliced result, end of turn and next
    assistant header; template: the newline the template puts after the last end-of-turn.
    """
    fmt = HermesFormat()
    tokens = TokenTrajectory(trajectory)
    prompt_ids = tokenizer.apply_chat_template(
        trajectory.prompt,
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    tokens.append("prompt", prompt_ids)
    for index, turn in enumerate(trajectory.turns):
        text = fmt.render(turn.reasoning, turn.code)
        if turn.code is None:
            text += tokenizer.eos_token
        tokens.append("sampled", tokenizer.encode(text, add_special_tokens=False), turn=index)
        if turn.observation is not None:
            shown = observation_text(turn.observation)
            tokens.append("tool", fmt.observation_ids(tokenizer, shown), turn=index)
    if trajectory.turns and trajectory.turns[-1].code is None:
        tokens.append("template", tokenizer.encode("\n", add_special_tokens=False))
    return tokens


# ----------------------------------------------------------------------------- training


def _batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length so that padded batches stay within `batch_tokens`."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _masked_loss(model, ids, attention, labels, shared_prefix: int = 0):
    """Token-mean cross-entropy of the trained next tokens.

    Every sequence starts with the same system block (the tool schema and the prompt's opening), so
    its `shared_prefix` tokens are run once per batch and their keys and values repeated for every
    row: the same result as running each row in full, at a fraction of the cost. The output head is
    applied only where a trained token is predicted.
    """
    import torch
    from transformers import DynamicCache

    body, rows = model.model, ids.shape[0]
    # transformers renamed `past_key_values` to `cache` in 5.x; accept both spellings.
    cache_arg = (
        "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"
    )
    cache = None
    if shared_prefix:
        cache = DynamicCache()
        body(input_ids=ids[:1, :shared_prefix], use_cache=True, **{cache_arg: cache})
        cache.batch_repeat_interleave(rows)
    positions = torch.arange(shared_prefix, ids.shape[1]).expand(rows, -1)
    hidden = body(
        input_ids=ids[:, shared_prefix:],
        attention_mask=attention,
        position_ids=positions,
        use_cache=cache is not None,
        **{cache_arg: cache},
    ).last_hidden_state
    targets = labels[:, shared_prefix + 1 :]
    where = targets != -100
    logits = model.lm_head(hidden[:, :-1][where])
    return torch.nn.functional.cross_entropy(logits.float(), targets[where])


def shared_prefix_length(examples: list[tuple[list[int], list[int]]]) -> int:
    """Tokens every example starts with, stopping before the first trained token of any of them."""
    first, length = examples[0][0], len(examples[0][0])
    for ids, mask in examples:
        length = min(length, mask.index(1) if 1 in mask else len(ids))
        length = next((i for i in range(length) if ids[i] != first[i]), length)
    return length


def train_sft(
    model,
    examples: list[tuple[list[int], list[int]]],
    *,
    epochs: int,
    learning_rate: float,
    batch_tokens: int,
    warmup_steps: int,
    pad_id: int,
    seed: int = 0,
    max_steps: int | None = None,
    evaluate: Callable[[], float] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fit `model` on (token ids, loss mask) pairs: token-mean cross-entropy on masked-in tokens,
    AdamW with linear warm-up and cosine decay, batches of similar-length sequences."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    lengths = [len(ids) for ids, _ in examples]
    shared_prefix = shared_prefix_length(examples)
    total = len(_batches(lengths, batch_tokens, random.Random(0))) * epochs
    if max_steps is not None:
        total = min(total, max_steps)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to a tenth
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    step, started, epoch_losses, trained_tokens = 0, time.monotonic(), [], 0
    for epoch in range(epochs):
        loss_sum, token_sum = 0.0, 0
        for batch in _batches(lengths, batch_tokens, rng):
            if step >= total:
                break
            ids, attention, labels = _pad([examples[i] for i in batch], pad_id)
            loss = _masked_loss(model, ids, attention, labels, shared_prefix)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            n = int((labels[:, 1:] != -100).sum())
            loss_sum, token_sum = loss_sum + loss.item() * n, token_sum + n
            trained_tokens += int(attention.sum())
            step += 1
        if token_sum:
            epoch_losses.append(round(loss_sum / token_sum, 4))
            score = "" if evaluate is None else f", held-out digit accuracy {evaluate()}"
            log(
                f"epoch {epoch + 1}/{epochs}: loss {epoch_losses[-1]:.4f} "
                f"({step} steps, {time.monotonic() - started:.0f} s{score})"
            )
            model.train()
        if step >= total:
            break
    seconds = time.monotonic() - started
    model.eval()
    return {
        "steps": step,
        "epoch_losses": epoch_losses,
        "seconds": round(seconds, 1),
        "tokens_per_second": round(trained_tokens / max(seconds, 1e-9)),
    }


def _pad(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded ids, attention mask, and labels (-100 wherever the loss mask is 0)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (seq, mask) in enumerate(examples):
        seq_t = torch.tensor(seq)
        ids[row, : len(seq)] = seq_t
        attention[row, : len(seq)] = 1
        labels[row, : len(seq)] = torch.where(torch.tensor(mask, dtype=torch.bool), seq_t, -100)
    return ids, attention, labels


def digit_accuracy(model, tokenizer, examples: list[tuple[list[int], list[int]]]) -> float:
    """Teacher-forced: the fraction of trained digit tokens the model predicts exactly (argmax).

    Digits in the assistant's text are copied from the question or the tool output, so this
    measures whether the model has learned to copy numbers, which accuracy depends on.
    """
    import torch

    digit_ids = {i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isdigit()}
    right = total = 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), 16):
            ids, attention, labels = _pad(examples[start : start + 16], tokenizer.pad_token_id)
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
            targets = labels[:, 1:]
            is_digit = torch.isin(targets, torch.tensor(sorted(digit_ids)))
            right += int((logits.argmax(-1)[is_digit] == targets[is_digit]).sum())
            total += int(is_digit.sum())
    return round(right / max(total, 1), 3)


def short_prompt(trajectory: Trajectory) -> Trajectory:
    """The trace with the bare question as its prompt (no reference-prompt wrapping).

    Used only for the first training stage, rendered without the tool schema: sequences a third as
    long, so the model gets many cheap steps to learn the copying of numbers (question -> code ->
    output -> answer) before it adapts to the full rollout layout.
    """
    content = trajectory.prompt[-1]["content"]
    if content.startswith(prompts.MATH_INTRO) and prompts.TOOL_HINT in content:
        content = content[len(prompts.MATH_INTRO) : content.index(prompts.TOOL_HINT)]
    return dataclasses.replace(trajectory, prompt=[{"role": "user", "content": content}])


# ----------------------------------------------------------------------------- building


def build(
    out_dir: str | os.PathLike,
    settings: BootstrapSettings,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Generate, tokenize, train and save into `out_dir` (which must not hold a model yet)."""
    import torch

    timings: dict[str, float] = {}
    clock = time.monotonic()
    from cleaner.sandbox.sync import SyncSandbox

    with SyncSandbox(workers=1) as sandbox:
        traces, stats = generate_traces(
            settings.n_traces, seed=settings.seed, mix=settings.mix, sandbox=sandbox
        )
        held_out, _ = generate_traces(
            settings.held_out_traces,
            seed=settings.seed + HELD_OUT_OFFSET,
            mix=settings.mix,
            sandbox=sandbox,
        )
    timings["traces_s"] = round(time.monotonic() - clock, 1)
    log(f"{stats.traces} traces ({stats.failing_traces} with failures) in {timings['traces_s']} s")

    clock = time.monotonic()
    probe = build_tokenizer(["x"], vocab_size=300)  # only for its chat template
    corpus = [
        probe.apply_chat_template(
            render_conversation(t), tools=TOOLS, tokenize=False, add_generation_prompt=False
        )
        for t in traces
    ]
    tokenizer = build_tokenizer(corpus, vocab_size=settings.vocab_size)

    def examples_of(trajectories, *, short: bool = False):
        out = []
        for trace in trajectories:
            if short:
                tokens = trace_tokens(tokenizer, short_prompt(trace), tools=None)
            else:
                tokens = trace_tokens(tokenizer, trace)
            out.append(
                (tokens.token_ids[: settings.max_length], tokens.loss_mask[: settings.max_length])
            )
        return out

    examples, held_out_examples = examples_of(traces), examples_of(held_out)
    held_out_short = examples_of(held_out, short=True)
    lengths = sorted(len(ids) for ids, _ in examples)
    timings["tokenize_s"] = round(time.monotonic() - clock, 1)

    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))
    model = build_model(tokenizer, settings.shape, seed=settings.seed)
    log(
        f"tiny Qwen3: {parameter_count(model) / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}, "
        f"{sum(lengths)} tokens in {len(examples)} sequences"
    )
    stages = []
    common = dict(
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_steps,
        pad_id=tokenizer.pad_token_id,
        seed=settings.seed,
        max_steps=settings.max_steps,
        log=log,
    )
    if settings.short_prompt_epochs:
        log("stage 1: bare-question prompts")
        short = train_sft(
            model,
            examples_of(traces, short=True),
            epochs=settings.short_prompt_epochs,
            batch_tokens=settings.short_batch_tokens,
            evaluate=lambda: digit_accuracy(model, tokenizer, held_out_short),
            **common,
        )
        short["held_out_digit_accuracy"] = digit_accuracy(model, tokenizer, held_out_short)
        # the same model on the long prompt, before it has seen one
        short["held_out_digit_accuracy_rollout_layout"] = digit_accuracy(
            model, tokenizer, held_out_examples
        )
        stages.append({"stage": "short_prompt", **short})
    log("stage 2: the rollout layout")
    layout_steps = [n for n in (settings.layout_steps, settings.max_steps) if n is not None]
    full = train_sft(
        model,
        examples,
        epochs=settings.epochs,
        batch_tokens=settings.batch_tokens,
        **{**common, "max_steps": min(layout_steps, default=None)},
    )
    full["held_out_digit_accuracy"] = digit_accuracy(model, tokenizer, held_out_examples)
    stages.append({"stage": "rollout_layout", **full})
    log(f"held-out digit accuracy {full['held_out_digit_accuracy']}")
    timings["train_s"] = round(sum(stage.pop("seconds") for stage in stages), 1)

    save_model(model, tokenizer, out_dir)
    report = {
        "build_version": BUILD_VERSION,
        "settings": settings.to_dict(),
        "data": {
            **stats.to_dict(),
            "failed_calls_per_trace": round(sum(t.failed_calls for t in traces) / len(traces), 3),
            "sequence_tokens": {
                "total": sum(lengths),
                "median": lengths[len(lengths) // 2],
                "max": lengths[-1],
                "trained": sum(sum(m) for _, m in examples),
            },
        },
        "model": {"parameters": parameter_count(model), "vocab_size": len(tokenizer)},
        "training": stages,
        "final_loss": stages[-1]["epoch_losses"][-1] if stages[-1]["epoch_losses"] else None,
        "timings": timings,
    }
    (Path(out_dir) / "bootstrap.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def bootstrap(
    out_dir: str | os.PathLike,
    *,
    seed: int | None = None,
    n_traces: int | None = None,
    failure_rate: float | None = None,
    settings: BootstrapSettings | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Build the tiny model into `out_dir` and return its path.

    `seed`, `n_traces` and `failure_rate`, when given, override `settings` (the defaults otherwise). The model is
    built in a temporary directory next to `out_dir` and renamed into place when complete.
    """
    settings = _with_overrides(settings or BootstrapSettings(), seed, n_traces, failure_rate)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        build(staging, settings, log=log)
        _move_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _with_overrides(
    settings: BootstrapSettings,
    seed: int | None,
    n_traces: int | None,
    failure_rate: float | None,
) -> BootstrapSettings:
    mix = settings.mix
    if failure_rate is not None:
        mix = dataclasses.replace(mix, failure_rate=failure_rate)
    return dataclasses.replace(
        settings,
        seed=settings.seed if seed is None else seed,
        n_traces=settings.n_traces if n_traces is None else n_traces,
        mix=mix,
    )


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished build to `out`; an existing `out` is swapped out first, then removed."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, out)


# ----------------------------------------------------------------------------- the cached default


def cache_root() -> Path:
    """$CLEANER_CACHE_DIR, else $XDG_CACHE_HOME/cleaner, else ~/.cache/cleaner."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cleaner"


def default_model_dir(
    settings: BootstrapSettings | None = None,
    *,
    build_if_missing: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """The cached default model for `settings`, built once per machine (the first call takes minutes).

    Concurrent callers wait on a lock file for the one that builds; a killed build leaves only a
    temporary directory that is never mistaken for a model.
    """
    settings = settings or BootstrapSettings()
    path = cache_root() / f"tiny-{settings.key()}"
    if (path / "bootstrap.json").exists() or not build_if_missing:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name(path.name + ".lock")):
        if not (path / "bootstrap.json").exists():
            log(f"building the default tiny model in {path} (once per machine)")
            bootstrap(path, seed=settings.seed, settings=settings, overwrite=True, log=log)
    return path


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- the CLI entry


def bootstrap_command(
    out: str | None = None,
    *,
    seed: int = 0,
    n_traces: int | None = None,
    failure_rate: float | None = None,
    force: bool = False,
    check: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    """What `cleaner bootstrap` runs: build (or find) the tiny model and print where it is.

    Without `out` the per-machine cached default is used (built only if missing, or rebuilt with
    `force`). `check` > 0 samples that many held-out problems afterwards and prints the figures.
    """
    settings = _with_overrides(BootstrapSettings(), seed, n_traces, failure_rate)
    if out is None and force:
        path = default_model_dir(settings, build_if_missing=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_name(path.name + ".lock")):
            bootstrap(path, seed=seed, settings=settings, overwrite=True, log=log)
    elif out is None:
        path = default_model_dir(settings, log=log)
    else:
        path = bootstrap(out, seed=seed, settings=settings, overwrite=force, log=log)
    report = json.loads((path / "bootstrap.json").read_text())
    log(
        f"model: {path} ({report['model']['parameters'] / 1e6:.2f}M parameters, "
        f"final loss {report['final_loss']})"
    )
    if check > 0:
        from cleaner.tiny.check import check_model

        summary = check_model(path, n_problems=check).summary()
        log(json.dumps(summary, indent=2))
        staged = path / ".check.json.tmp"
        staged.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(staged, path / "check.json")
    return path
