"""The rollout: one coroutine per trajectory. Generate a turn, run its tool call, purify online with
SAAR (CLEANER, SPEC section 2), repeat until the model answers or a budget runs out.

The context is kept as token ids and only ever extended by splicing: sampled ids as sampled, tool
results as the chat template renders them (`fmt.observation_ids`). When SAAR grafts a correction in
place of a failed call, the failed call and its error leave the context, the interpreter goes back to
its state before the failed call, and generation continues from the purified ids. The engine is given
the full context of each request and reuses the prefix it already holds for the trajectory, so a
correction prefills only the error message, and a graft only the grafted turn.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field, replace
from typing import Any

from cleaner.config import RolloutConfig, SaarConfig
from cleaner.engines.base import Engine, Generation, SamplingParams
from cleaner.formats import TOOL_SCHEMA, get_format, observation_text
from cleaner.saar import graft
from cleaner.tokens import Segment, TokenTrajectory
from cleaner.trajectory import Graft, Observation, SaarRecord, Trajectory, Turn

GIVE_UP_HINT = "\n[Previous corrections failed as well. Try a different approach.]"
"""Appended to the error that stays visible when SAAR gives up after two or more retries (the
authors add such a hint)."""


@dataclass
class _Step:
    """One turn of the trajectory as it stands, with the exact tokens behind it."""

    turn: Turn
    sampled: list[Segment]
    """The assistant's tokens: one segment, or two for a shallow graft (kept reasoning, grafted call)."""
    tool_ids: list[int] = field(default_factory=list)
    """The tool result, with its chat-template tokens, spliced after the call; empty for an answer."""
    finish: str = ""
    """Why generation of this turn stopped: `call`, `eos` or `length`."""

    @property
    def ids(self) -> list[int]:
        return [t for s in self.sampled for t in s.token_ids] + self.tool_ids


@dataclass
class RolloutStats:
    """What happened on the way, before purification hid it: the numbers people plot."""

    tool_calls: int = 0
    """Tool calls of the turns the model took (first attempts; corrections not counted)."""
    first_attempt_failures: int = 0
    failure_types: dict[str, int] = field(default_factory=dict)
    """Every failed execution, corrections included, by exception type or status."""
    executions: int = 0
    corrections: int = 0
    """Correction turns SAAR sampled."""
    finish: str = ""
    """`eos` (answered), `length`, `max_turns` or `max_tool_calls`."""

    def count_failure(self, obs: Observation) -> None:
        kind = obs.error_type or obs.status
        self.failure_types[kind] = self.failure_types.get(kind, 0) + 1


class Rollout:
    """Turns prompts into token-level trajectories with one engine and one sandbox."""

    def __init__(
        self,
        engine: Engine,
        sandbox: Any,
        tokenizer: Any,
        rollout: RolloutConfig,
        saar: SaarConfig | None = None,
    ):
        self.engine, self.sandbox, self.tokenizer = engine, sandbox, tokenizer
        self.cfg = rollout
        self.saar = saar if saar is not None else SaarConfig(enabled=False)
        self.fmt = get_format(rollout.tool_format)
        opener = tokenizer.encode(self.fmt.opener, add_special_tokens=False)
        self._opener_id = opener[0] if len(opener) == 1 else None

    def prompt_ids(self, prompt: list[dict[str, Any]]) -> list[int]:
        tools = [TOOL_SCHEMA] if self.fmt.name == "hermes" else None
        return list(
            self.tokenizer.apply_chat_template(
                prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    async def run(
        self, trajectory_id: str, prompt: list[dict[str, Any]], seed: int
    ) -> TokenTrajectory:
        """One trajectory. `trajectory_id` must be unique among those running at the same time."""
        cfg = self.cfg
        rng = random.Random(f"{seed}/{trajectory_id}")
        saar_active = self.saar.enabled and rng.random() < self.saar.rollback_probability
        record = SaarRecord(active=saar_active)
        stats = RolloutStats()
        session = trajectory_id if cfg.stateful else None
        prompt_ids = self.prompt_ids(prompt)
        steps: list[_Step] = []
        try:
            while True:
                if len(steps) >= cfg.max_turns:
                    stats.finish = "max_turns"
                    break
                context = prompt_ids + [t for s in steps for t in s.ids]
                step = await self._sample(trajectory_id, context, len(prompt_ids), rng)
                if step is None:
                    stats.finish = "length"
                    break
                if (
                    step.turn.code is None
                    or step.finish == "length"
                    or (step.finish == "eos" and self.fmt.name == "markdown")
                ):
                    steps.append(step)  # an answer, or a turn cut short: nothing to run
                    stats.finish = step.finish
                    break
                if stats.executions >= cfg.max_tool_calls:
                    steps.append(step)
                    stats.finish = "max_tool_calls"
                    break
                stats.tool_calls += 1
                snapshot = await self._snapshot(session) if (saar_active and session) else None
                step = await self._execute(step, session, stats)
                kept = [step]
                if step.turn.failed:
                    stats.first_attempt_failures += 1
                    stats.count_failure(step.turn.observation)
                    # in stateful mode a correction needs the pre-failure state to run against
                    if saar_active and (snapshot is not None or session is None):
                        kept = await self._saar(
                            step,
                            context,
                            len(prompt_ids),
                            len(steps),
                            session,
                            snapshot,
                            record,
                            stats,
                            trajectory_id,
                            rng,
                        )
                        saar_active = not record.gave_up
                if snapshot is not None:
                    with contextlib.suppress(Exception):
                        await self.sandbox.release(session, snapshot)
                steps.extend(kept)
                if (
                    kept[-1].turn.code is None
                ):  # SAAR's correction answered instead of fixing the call
                    stats.finish = kept[-1].finish
                    break
        finally:
            if session is not None:
                await self.sandbox.close_session(session)
            await self.engine.close(trajectory_id)

        trajectory = Trajectory(
            id=trajectory_id,
            prompt=prompt,
            turns=[s.turn for s in steps],
            saar=record if self.saar.enabled else None,
            extra={"rollout": {**stats.__dict__, "seed": seed}},
        )
        out = TokenTrajectory(trajectory)
        out.append("prompt", prompt_ids)
        for i, s in enumerate(steps):
            for seg in s.sampled:
                out.segments.append(replace(seg, turn=i))
            out.append("tool", s.tool_ids, turn=i)
        return out

    # --- online SAAR (SPEC section 2, steps 2-5) ------------------------------------------------------

    async def _saar(
        self,
        failed: _Step,
        history: list[int],
        prompt_length: int,
        turn_index: int,
        session: str | None,
        snapshot: int | None,
        record: SaarRecord,
        stats: RolloutStats,
        trajectory_id: str,
        rng: random.Random,
    ) -> list[_Step]:
        """Correct the failed step; return the steps to keep in its place. `history` is the context
        before the failed turn; `snapshot` the interpreter state before its call (stateful mode)."""
        current = failed
        for attempt in range(1, self.saar.max_retries + 1):
            if stats.executions >= self.cfg.max_tool_calls:
                break
            # 2. show the error; sample a correction from the error-augmented context
            fix = await self._sample(trajectory_id, history + current.ids, prompt_length, rng)
            if fix is None:
                break
            stats.corrections += 1
            # 3. no code (or no room to finish it): keep the error and the correction as they are
            if fix.turn.code is None or fix.finish == "length":
                record.gave_up = True
                return [current, fix]
            # 4. restore the pre-failure state, graft in place of the failed turn, run the grafted code
            if snapshot is not None:
                try:
                    await self.sandbox.restore(session, snapshot)
                except Exception:  # the snapshot is gone (its worker died): the error stays
                    break
            turn, kind, sim = graft(
                current.turn, fix.turn, self.saar.gamma, self.saar.similarity_on
            )
            record.grafts.append(
                Graft(
                    turn=turn_index,
                    kind=kind,
                    similarity=sim,
                    attempt=attempt,
                    extra={
                        "replaced_code": current.turn.code,
                        "error_type": current.turn.observation.error_type
                        or current.turn.observation.status,
                    },
                )
            )
            grafted = _Step(turn, self._graft_tokens(current, fix, kind), finish=fix.finish)
            grafted = await self._execute(grafted, session, stats)  # unless the call was malformed
            if not grafted.turn.failed:
                return [grafted]  # purified: generation continues from here
            stats.count_failure(grafted.turn.observation)
            current = grafted
        # 5. give up: the last grafted turn keeps its error, with a hint after two or more retries
        record.gave_up = True
        if record.grafts and record.grafts[-1].attempt >= 2:
            text = (
                observation_text(current.turn.observation, self.cfg.observation_chars)
                + GIVE_UP_HINT
            )
            current = replace(current, tool_ids=self._observation_ids(text, current.finish))
        return [current]

    def _graft_tokens(self, current: _Step, fix: _Step, kind: str) -> list[Segment]:
        """The grafted turn's tokens, spliced, never re-tokenized. A deep graft takes all of the
        correction's tokens; a shallow one keeps the current turn's reasoning tokens (with their own
        origin: sampled before the failure, or grafted earlier) and takes the correction's call tokens.
        Grafted tokens keep the log-probs they were sampled with, the error in context."""
        (fix_seg,) = fix.sampled
        if kind == "deep":
            return [replace(fix_seg, origin="deep")]
        k = self._call_start(fix_seg.token_ids)
        call = Segment("shallow", fix_seg.token_ids[k:], _cut(fix_seg.logprobs, k, None))
        return [s for s in (self._reasoning_tokens(current), call) if s.token_ids]

    def _reasoning_tokens(self, step: _Step) -> Segment:
        """The tokens of a turn before its tool call."""
        first = step.sampled[0]
        if len(step.sampled) > 1:  # a shallow graft: already split into reasoning and call
            return first
        k = self._call_start(first.token_ids)
        return Segment(first.origin, first.token_ids[:k], _cut(first.logprobs, 0, k))

    def _call_start(self, ids: list[int]) -> int:
        """Index of the first token of the tool call among a turn's sampled ids."""
        if self._opener_id is not None and self._opener_id in ids:
            return ids.index(self._opener_id)
        # The opener is not one token: take the last token boundary at or before it in the text.
        at = self.tokenizer.decode(ids).find(self.fmt.opener)
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer.decode(ids[:mid])) <= at:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # --- the pieces -----------------------------------------------------------------------------------

    async def _sample(
        self, key: str, context: list[int], prompt_length: int, rng: random.Random
    ) -> _Step | None:
        """Generate one assistant turn after `context`; None when the response budget is spent."""
        budget = self.cfg.max_response_tokens - (len(context) - prompt_length)
        if budget <= 0:
            return None
        params = SamplingParams(
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            top_k=self.cfg.top_k,
            max_new_tokens=budget,
            seed=rng.getrandbits(63),
        )
        gen: Generation = await self.engine.generate(key, context, params, self.fmt.detector)
        parsed = self.fmt.parse(gen.text)
        turn = Turn(parsed.reasoning, parsed.code, origin="sampled")
        if parsed.invalid is not None and gen.finish_reason != "length":
            turn.observation = Observation(
                "invalid", stderr=f"InvalidToolCall: {parsed.invalid}", error_type="InvalidToolCall"
            )
        return _Step(
            turn,
            [Segment("sampled", list(gen.token_ids), list(gen.logprobs))],
            finish=gen.finish_reason,
        )

    async def _execute(self, step: _Step, session: str | None, stats: RolloutStats) -> _Step:
        """Run the step's code, unless its call was malformed, and splice the result's tokens."""
        turn = step.turn
        if turn.observation is None:
            stats.executions += 1
            try:
                result = await self.sandbox.run(
                    turn.code, session=session, timeout=self.cfg.tool_timeout
                )
                obs = result.to_observation()
            except Exception as e:  # a broken tool is an observation, never a crashed run
                obs = Observation("killed", stderr=f"SandboxError: {e}", reason="sandbox failure")
            turn = replace(turn, observation=obs)
        text = observation_text(turn.observation, self.cfg.observation_chars)
        return replace(step, turn=turn, tool_ids=self._observation_ids(text, step.finish))

    async def _snapshot(self, session: str) -> int | None:
        """The interpreter state before a call, or None when the sandbox cannot take one."""
        try:
            return await self.sandbox.snapshot(session)
        except Exception:
            return None

    def _observation_ids(self, text: str, finish: str) -> list[int]:
        return self.fmt.observation_ids(self.tokenizer, text, turn_ended=finish == "eos")


def _cut(values: list[float] | None, start: int, stop: int | None) -> list[float] | None:
    return None if values is None else values[start:stop]
