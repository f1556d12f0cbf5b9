"""`cleaner train`: GRPO/DAPO on self-purified trajectories (CLEANER), one step top to bottom:

    problems -> rollouts with online SAAR -> rewards (+ overlong shaping) -> group advantages
             -> [dynamic sampling] -> old log-probs recomputed on the purified sequences
             -> mini-batch updates of the clipped surrogate (graft option applied) -> metrics

The policy generates through the embedded engine, which holds the very model being trained, so
rollouts always use the current weights. Everything a run needs to continue lives in its run
directory: the resolved config, metrics, samples and atomic checkpoints; `resume` picks up from the
last checkpoint and, with the same seed, reaches the same result as a run that was never stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from cleaner.agent import Rollout
from cleaner.collect import collect, final_response, grade_groups
from cleaner.config import Config, ConfigError, load_config, to_dict
from cleaner.data import TOOL_TASKS, Problem, load_benchmark
from cleaner.jsonl import dump_line
from cleaner.rewards.math import MathVerifier
from cleaner.tokens import TokenTrajectory
from cleaner.train import checkpoint
from cleaner.train.grpo import (
    graft_logprob_shift,
    graft_weights,
    group_advantages,
    informative_groups,
    kl_penalty,
    overlong_penalty,
    policy_loss,
    sft_loss,
)
from cleaner.train.packing import TrainSequence, forward_logprobs, pack

EVAL_SEED_OFFSET = 10_000
"""Generated evaluation problems use seed + this, so they never coincide with training problems."""


# --- setting up -------------------------------------------------------------------------------------


def load_problems(spec: str, size: int, seed: int, root: str | None = None) -> list[Problem]:
    """'gym' (every tool task), 'gym:a,b', a benchmark name (files under `root`), or a problems file."""
    if spec == "gym":
        spec = "gym:" + ",".join(TOOL_TASKS)
    try:
        problems = load_benchmark(spec, root=root, size=size, seed=seed)
    except ValueError as e:
        raise ConfigError(f"data: {e}") from None
    if not problems:
        raise ConfigError(f"data: {spec!r} holds no problems")
    return problems


def resolve_model_path(name: str, log: Callable[[str], None]) -> Path:
    if name == "tiny":
        from cleaner.tiny.bootstrap import default_model_dir

        return default_model_dir(log=log)
    path = Path(name)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"train.model: {name!r} is not a transformers model directory (no config.json)"
        )
    return path


def resolve_device(cfg: Config) -> tuple[torch.device, torch.dtype | None]:
    """The device, and the autocast dtype (None: plain float32)."""
    name = cfg.train.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("train.device: CUDA was asked for but is not available")
    device = torch.device(name)
    dtype = cfg.train.dtype
    if dtype == "auto":
        dtype = (
            "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
        )
    return device, None if dtype == "float32" else getattr(torch, dtype)


def preflight(cfg: Config, run_dir: Path) -> None:
    """Fail before any work on what can be checked cheaply: the run directory and the model path."""
    if cfg.rollout.engine_url:
        raise ConfigError(
            "rollout.engine_url: training samples from the weights it trains, not from a server "
            "(use it with `cleaner rollout` and `cleaner eval`)"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run directory {run_dir} is not writable: {e.strerror}") from None
    if cfg.train.model != "tiny":
        resolve_model_path(cfg.train.model, print)


class ProblemSampler:
    """Seeded epochs over the problems; its state is two integers, saved in every checkpoint."""

    def __init__(self, problems: list[Problem], seed: int, epoch: int = 0, position: int = 0):
        self.problems, self.seed, self.epoch, self.position = problems, seed, epoch, position

    def _order(self) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(f"{self.seed}/epoch/{self.epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out, order = [], self._order()
        while len(out) < n:
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            out.append(self.problems[order[self.position]])
            self.position += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


# --- one step ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Scored:
    problem: Problem
    group: int
    trajectory: TokenTrajectory
    reward: float
    correct: bool
    response_tokens: int


async def score_groups(
    problems: list[Problem],
    groups: list[list[TokenTrajectory]],
    cfg: Config,
    verifier: MathVerifier,
    sandbox: Any,
) -> list[Scored]:
    """Outcome rewards plus DAPO's overlong shaping; each trajectory records its final reward."""
    verdicts = await grade_groups(problems, groups, verifier, sandbox)
    scored = []
    for g, (problem, group, scores) in enumerate(zip(problems, groups, verdicts, strict=True)):
        for t, score in zip(group, scores, strict=True):
            length = len(t.token_ids) - t.prompt_length
            reward = score.reward + overlong_penalty(
                length,
                cfg.rollout.max_response_tokens,
                cfg.train.overlong_buffer,
                cfg.train.overlong_penalty,
            )
            t.trajectory.reward = reward
            scored.append(Scored(problem, g, t, reward, score.correct, length))
    return scored


def trajectory_metrics(scored: list[Scored]) -> dict[str, float]:
    """Reward, tool use and SAAR counts, per trajectory."""
    n = max(len(scored), 1)
    stats = [s.trajectory.trajectory.extra["rollout"] for s in scored]
    saar = [s.trajectory.trajectory.saar for s in scored]
    grafts = [g for r in saar if r is not None for g in r.grafts]
    trained = sum(sum(s.trajectory.loss_mask) for s in scored)
    grafted = sum(sum(o in ("shallow", "deep") for o in s.trajectory.origins) for s in scored)
    out = {
        "reward/mean": sum(s.reward for s in scored) / n,
        "reward/accuracy": sum(s.correct for s in scored) / n,
        "reward/answered": sum(bool(final_response(s.trajectory)) for s in scored) / n,
        "tool/calls_per_traj": sum(r["tool_calls"] for r in stats) / n,
        "tool/failures_per_traj": sum(r["first_attempt_failures"] for r in stats) / n,
        "tool/executions_per_traj": sum(r["executions"] for r in stats) / n,
        "saar/active": sum(bool(r and r.active) for r in saar) / n,
        "saar/triggered": sum(
            bool(r and r.active and x["first_attempt_failures"])
            for r, x in zip(saar, stats, strict=True)
        )
        / n,
        "saar/recovered": sum(
            not s.trajectory.trajectory.turns[i].failed
            for s, r in zip(scored, saar, strict=True)
            if r
            for i in {g.turn for g in r.grafts}
        )
        / n,
        "saar/gave_up": sum(bool(r and r.gave_up) for r in saar) / n,
        "saar/shallow": sum(g.kind == "shallow" for g in grafts) / n,
        "saar/deep": sum(g.kind == "deep" for g in grafts) / n,
        "saar/purified_token_frac": grafted / max(trained, 1),
        "len/response_tokens": sum(s.response_tokens for s in scored) / n,
    }
    kinds: dict[str, int] = {}
    for r in stats:
        for kind, count in r["failure_types"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    out.update({f"tool/failures/{k}": v / n for k, v in sorted(kinds.items())})
    return out


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, *, log: Callable[[str], None] = print):
        self.cfg, self.run_dir, self.log = cfg, run_dir, log
        self.device, self.autocast = resolve_device(cfg)
        self.problems = load_problems(cfg.data.train, cfg.data.train_size, cfg.seed, cfg.data.root)
        self.eval_problems = (
            load_problems(
                cfg.data.eval, cfg.data.eval_size, cfg.seed + EVAL_SEED_OFFSET, cfg.data.root
            )
            if cfg.train.eval_every
            else []
        )
        self.sampler = ProblemSampler(self.problems, cfg.seed)
        self.step = 0
        self.model_path = resolve_model_path(cfg.train.model, log)

    # The heavy parts are built in `setup` so that a bad config fails before they load.
    def setup(self, resume_from: Path | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.cfg
        source = resume_from / "model" if resume_from else self.model_path
        torch.manual_seed(cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.float32, attn_implementation="sdpa"
        ).to(self.device)
        self.reference = None
        if cfg.train.kl_coef > 0:
            self.reference = (
                AutoModelForCausalLM.from_pretrained(
                    self.model_path, dtype=torch.float32, attn_implementation="sdpa"
                )
                .to(self.device)
                .eval()
            )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
        )
        warmup = cfg.train.warmup_steps
        updates_per_step = cfg.train.prompts_per_step // cfg.train.mini_batch_prompts
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda u: min(1.0, (u + 1) / (warmup * updates_per_step)) if warmup else 1.0,
        )
        if resume_from is not None:
            state = checkpoint.load_states(
                resume_from, optimizer=self.optimizer, scheduler=self.scheduler
            )
            self.step = state["step"]
            self.sampler = ProblemSampler(self.problems, cfg.seed, **state["sampler"])
        self.verifier = MathVerifier()

    # --- the loop -----------------------------------------------------------------------------------

    async def run(
        self, on_step: Callable[[int, dict[str, float]], None] | None = None
    ) -> dict[str, float]:
        from cleaner.engines.hf import HFEngine
        from cleaner.sandbox import Limits, connect

        cfg = self.cfg
        engine = HFEngine(
            self.model,
            self.tokenizer,
            max_batch_size=cfg.train.max_batch_size,
            autocast_dtype=self.autocast,
        )
        limits = Limits(timeout=cfg.rollout.tool_timeout, memory_mb=cfg.sandbox.memory_mb)
        sandbox = connect(
            cfg.sandbox.url,
            workers=cfg.sandbox.workers or None,
            isolation=cfg.sandbox.isolation,
            preload=tuple(cfg.sandbox.preload),
            limits=limits,
        )
        last: dict[str, float] = {}
        async with sandbox as sb:
            self.rollout = Rollout(engine, sb, self.tokenizer, cfg.rollout, cfg.saar)
            self.eval_rollout = Rollout(
                engine,
                sb,
                self.tokenizer,
                cfg.rollout,
                dataclasses.replace(cfg.saar, enabled=False),
            )
            # Where training starts from (the authors' val_before_train).
            if cfg.train.eval_every and self.step == 0:
                baseline = {"step": 0, **await self.evaluate()}
                self.write_metrics(baseline)
                if on_step:
                    on_step(0, baseline)
            while self.step < cfg.train.steps:
                metrics = await self.train_step()
                self.step += 1
                if cfg.train.eval_every and (
                    self.step % cfg.train.eval_every == 0 or self.step == cfg.train.steps
                ):
                    metrics.update(await self.evaluate())
                self.write_metrics(metrics)
                if self.step % cfg.train.save_every == 0 or self.step == cfg.train.steps:
                    self.save()
                last = metrics
                if on_step:
                    on_step(self.step, metrics)
        self.verifier.close()
        return last

    async def train_step(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        started = time.perf_counter()
        step_seed = random.Random(f"{cfg.seed}/step/{self.step}").getrandbits(62)
        problems = self.sampler.take(t.prompts_per_step)

        # 1. rollouts with online SAAR (the engine shares the weights being trained)
        self.model.eval()
        with self._autocast():
            groups = await collect(
                self.rollout, problems, t.group_size, step_seed, f"step{self.step}"
            )
        generated = time.perf_counter()

        # 2. rewards, with DAPO's overlong shaping
        scored = await score_groups(problems, groups, cfg, self.verifier, self.rollout.sandbox)
        metrics: dict[str, Any] = {"step": self.step + 1, **trajectory_metrics(scored)}

        # 3. group advantages; dynamic sampling drops the groups that teach nothing
        rewards, group_ids = [s.reward for s in scored], [s.group for s in scored]
        informative = informative_groups(rewards, group_ids)
        metrics["adv/nonzero_group_frac"] = len(informative) / len(problems)
        advantages = group_advantages(rewards, group_ids)
        keep = [i for i, s in enumerate(scored) if not t.dynamic_sampling or s.group in informative]
        sequences = [
            TrainSequence.from_trajectory(scored[i].trajectory, advantages[i]) for i in keep
        ]
        group_of = [scored[i].group for i in keep]
        self._write_samples(scored)

        # 4. updates: old log-probs on the purified sequences, then mini-batches of the surrogate
        if sequences:
            metrics.update(self.update(sequences, group_of))
        trained = time.perf_counter()
        tool_seconds = sum(
            (turn.observation.extra.get("duration_s", 0.0) if turn.observation else 0.0)
            for s in scored
            for turn in s.trajectory.trajectory.turns
        )
        metrics.update(
            {
                "time/generation": generated - started,
                "time/tools": tool_seconds,
                "time/train": trained - generated,
                "time/step": trained - started,
                "loss/lr": self.scheduler.get_last_lr()[0],
            }
        )
        return metrics

    def update(self, sequences: list[TrainSequence], group_of: list[int]) -> dict[str, float]:
        """Old log-probs once for the whole step (the policy the rollouts came from), then one
        optimizer update per mini-batch of `mini_batch_prompts` whole groups (verl's ppo_mini_batch)."""
        t = self.cfg.train
        old = self._logprobs_per_sequence(self.model, sequences)
        ref = (
            self._logprobs_per_sequence(self.reference, sequences)
            if self.reference is not None
            else None
        )
        shift = graft_logprob_shift(
            torch.cat(old),
            torch.tensor([x for s in sequences for x in s.behavior_logprobs[1:] + [0.0]]),
            torch.tensor(
                [x for s in sequences for x in s.graft_mask[1:] + [0]], dtype=torch.float32
            ),
        )
        groups = sorted(set(group_of))
        per_update = max(1, math.ceil(len(groups) * t.mini_batch_prompts / t.prompts_per_step))
        sums: dict[str, float] = {}
        updates = 0
        self.model.train()
        for u in range(0, len(groups), per_update):
            chosen = set(groups[u : u + per_update])
            index = [i for i, g in enumerate(group_of) if g in chosen]
            batches = pack([sequences[i] for i in index], t.micro_batch_tokens)
            stats = self._update_once(
                batches,
                _layout(batches, [old[i] for i in index]),
                _layout(batches, [ref[i] for i in index]) if ref is not None else None,
            )
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
        self.model.eval()
        out = {k: v / updates for k, v in sums.items()}
        out["saar/logprob_shift"] = shift
        return out

    def _logprobs_per_sequence(self, model, sequences: list[TrainSequence]) -> list[torch.Tensor]:
        """Each sequence's target log-probs under `model` (no gradient), as a list of 1-D tensors."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
        with torch.no_grad(), self._autocast():
            for mb in pack(sequences, self.cfg.train.micro_batch_tokens):
                logprobs, _ = forward_logprobs(
                    model, mb.to(self.device), self.cfg.rollout.temperature
                )
                for i, piece in zip(mb.order, mb.split(logprobs.float().cpu()), strict=True):
                    out[i] = piece
        return out

    def _update_once(self, batches, old, ref) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulated over its packed micro-batches."""
        t = self.cfg.train
        temperature = self.cfg.rollout.temperature
        old = [o.to(self.device) for o in old]
        ref = [r.to(self.device) for r in ref] if ref is not None else None
        masks = []
        for mb, o in zip(batches, old, strict=True):
            mb = mb.to(self.device)
            weights = graft_weights(t.graft_mode, mb.graft_mask, o, mb.behavior_logprobs, t.is_cap)
            masks.append(mb.loss_mask * (weights > 0))
        total_tokens = float(sum(m.sum() for m in masks).clamp(min=1))
        total_sequences = float(sum(mb.sequences for mb in batches))
        self.optimizer.zero_grad(set_to_none=True)
        sums = {
            "loss/policy": 0.0,
            "loss/clip_frac": 0.0,
            "loss/dual_clip_frac": 0.0,
            "loss/entropy": 0.0,
            "loss/approx_kl": 0.0,
            "loss/kl": 0.0,
        }
        for mb, o, mask, r in zip(batches, old, masks, ref or [None] * len(batches), strict=True):
            mb = mb.to(self.device)
            share = float(mask.sum()) / total_tokens
            with self._autocast():
                logprobs, ent = forward_logprobs(self.model, mb, temperature, with_entropy=True)
            logprobs, ent = logprobs.float(), ent.float()
            weights = graft_weights(t.graft_mode, mb.graft_mask, o, mb.behavior_logprobs, t.is_cap)
            if t.objective == "sft":
                loss = sft_loss(logprobs, mask, t.loss_aggregation, total_tokens, total_sequences)
                stats = {}
            else:
                loss, stats = policy_loss(
                    logprobs,
                    o,
                    mb.advantages,
                    mask,
                    clip_low=t.clip_low,
                    clip_high=t.clip_high,
                    dual_clip=t.dual_clip,
                    weights=weights,
                    aggregation=t.loss_aggregation,
                    total_tokens=total_tokens,
                    total_sequences=total_sequences,
                )
            mean_entropy = (ent * mask).sum() / mask.sum().clamp(min=1)
            if t.entropy_coef:
                loss = loss - t.entropy_coef * mean_entropy * share
            if r is not None:
                kl = (kl_penalty(logprobs, r) * mask).sum() / total_tokens
                loss = loss + t.kl_coef * kl
                sums["loss/kl"] += float(kl.detach())
            loss.backward()
            sums["loss/policy"] += float(loss.detach())
            sums["loss/entropy"] += float(mean_entropy.detach()) * share
            for k in ("clip_fraction", "dual_clip_fraction", "approx_kl"):
                if k in stats:
                    sums[
                        {
                            "clip_fraction": "loss/clip_frac",
                            "dual_clip_fraction": "loss/dual_clip_frac",
                            "approx_kl": "loss/approx_kl",
                        }[k]
                    ] += stats[k] * share
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        sums["loss/grad_norm"] = float(grad_norm)
        return sums

    # --- evaluation, logging, checkpoints -----------------------------------------------------------

    async def evaluate(self) -> dict[str, float]:
        """avg@k accuracy and tool use on held-out problems, SAAR off (the policy on its own)."""
        self.model.eval()
        k = self.cfg.data.eval_samples
        with self._autocast():
            groups = await collect(
                self.eval_rollout,
                self.eval_problems,
                k,
                self.cfg.seed + EVAL_SEED_OFFSET,
                f"eval{self.step}",
            )
        scored = await score_groups(
            self.eval_problems, groups, self.cfg, self.verifier, self.eval_rollout.sandbox
        )
        m = trajectory_metrics(scored)
        return {
            "eval/accuracy": m["reward/accuracy"],
            "eval/failures_per_traj": m["tool/failures_per_traj"],
            "eval/calls_per_traj": m["tool/calls_per_traj"],
        }

    def _autocast(self):
        if self.autocast is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(dump_line(metrics))
        if getattr(self, "_tb", None) is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        for k, v in metrics.items():
            if k != "step" and isinstance(v, (int, float)) and not math.isnan(v):
                self._tb.add_scalar(k, v, metrics["step"])
        self._tb.flush()

    def _write_samples(self, scored: list[Scored]) -> None:
        every = self.cfg.train.sample_every
        if not every or (self.step + 1) % every:
            return
        from cleaner.train.report import render_trajectory

        path = self.run_dir / "samples" / f"step_{self.step + 1:06d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        picks = scored[:: max(1, len(scored) // 4)][:4]
        path.write_text("\n\n".join(render_trajectory(s.trajectory.trajectory) for s in picks))

    def save(self) -> Path:
        return checkpoint.save(
            self.run_dir,
            self.step,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state={"step": self.step, "sampler": self.sampler.state()},
            keep=self.cfg.train.keep_checkpoints,
        )


# --- entry points -----------------------------------------------------------------------------------


def start(
    cfg: Config,
    run_dir: Path,
    *,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """A new run in `run_dir` (which must not hold one already)."""
    if (run_dir / "config.yaml").exists():
        raise ConfigError(
            f"{run_dir} already holds a run; resume it with --resume {run_dir}, or pick another"
        )
    preflight(cfg, run_dir)
    trainer = Trainer(cfg, run_dir, log=log)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    trainer.setup()
    return asyncio.run(trainer.run(on_step))


def resume(
    run_dir: Path,
    *,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Continue the run in `run_dir` from its last checkpoint (or from the start if it has none)."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} holds no run (no config.yaml)")
    cfg = load_config(config_path)
    preflight(cfg, run_dir)
    trainer = Trainer(cfg, run_dir, log=log)
    last = checkpoint.latest(run_dir)
    trainer.setup(resume_from=last)
    _truncate_metrics(run_dir / "metrics.jsonl", trainer.step if last else -1)
    log(
        f"resuming {run_dir} at step {trainer.step}"
        if last
        else f"no checkpoint in {run_dir}: starting over"
    )
    return asyncio.run(trainer.run(on_step))


def _layout(batches, per_sequence: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-sequence 1-D tensors (indexed as the packed list) laid out like each of `batches`."""
    return [mb.join([per_sequence[i] for i in mb.order]) for mb in batches]


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics of steps after the checkpoint: they will be produced again."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    checkpoint.write_text_atomic(path, "".join(line + "\n" for line in kept))
