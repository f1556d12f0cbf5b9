"""`cleaner_agent`: verl's agent loop running cleaner's rollout, online SAAR included.

verl keeps what it does at scale (FSDP or Megatron actors, vLLM or SGLang replicas sharing their
weights, the PPO/GRPO update); this loop replaces its tool agent loop for rows whose `agent_name`
is `cleaner_agent`. Each trajectory runs `cleaner.agent.Rollout` against verl's servers
(`VerlEngine`) and cleaner's sandbox, is graded by cleaner's rewards, and comes back as verl's
`AgentLoopOutput`: grafted turns in place of the failed ones (mask 1), tool output masked 0, the
sampling log-probs, and the reward (`reward_score`, which verl then uses instead of a reward
function). SAAR statistics ride in `extra_fields`. Rows of any split but `train` (`cleaner to-verl
--split test`: verl's validation files) run without SAAR, as `cleaner eval` does: evaluation
measures the policy, not the policy with a second chance.

Settings: verl's rollout config gives the sampling (temperature, top_p, top_k) and the response
budget (`response_length`); everything else comes from a cleaner config (a recipe name or YAML
file) and dotted overrides, passed as keyword arguments in the agent-loop config file:

    - name: cleaner_agent
      _target_: cleaner.integrations.verl.agent_loop.CleanerAgentLoop
      cleaner_config: qwen3-4b-cleaner            # optional
      overrides: ["saar.max_retries=2"]           # optional

The sandbox (one worker pool per agent-loop worker process, or `sandbox.url`) and the math verifier
are shared by every trajectory of the process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from cleaner.agent import Rollout
from cleaner.collect import grade
from cleaner.config import load_config, recipe_path
from cleaner.integrations.verl.convert import AGENT_NAME, agent_loop_output, problem_from_verl_row
from cleaner.integrations.verl.engine import VerlEngine
from cleaner.rewards.math import MathVerifier
from cleaner.sandbox import Limits, connect


@register(AGENT_NAME)
class CleanerAgentLoop(AgentLoopBase):
    shared: ClassVar[asyncio.Task | None] = None
    """(sandbox, math verifier) of this process, started by the first trajectory (verl makes an
    instance per trajectory, all on one event loop)."""

    def __init__(
        self,
        *args: Any,
        cleaner_config: str | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        recipe = recipe_path(Path(cleaner_config)) if cleaner_config else None
        self.cfg = load_config(recipe, list(overrides))
        verl_rollout = self.config.actor_rollout_ref.rollout
        self.response_length = int(verl_rollout.response_length)
        self.rollout_cfg = dataclasses.replace(
            self.cfg.rollout, max_response_tokens=self.response_length, engine_url=None
        )

    async def _start_shared(self) -> tuple[Any, MathVerifier]:
        sandbox = connect(
            self.cfg.sandbox.url,
            workers=self.cfg.sandbox.workers or None,
            isolation=self.cfg.sandbox.isolation,
            preload=tuple(self.cfg.sandbox.preload),
            limits=Limits(
                timeout=self.cfg.rollout.tool_timeout, memory_mb=self.cfg.sandbox.memory_mb
            ),
        )
        await sandbox.start()
        return sandbox, MathVerifier()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        cls = type(self)
        if cls.shared is None:  # one start however many trajectories arrive at once
            cls.shared = asyncio.ensure_future(self._start_shared())
        sandbox, verifier = await cls.shared
        problem = problem_from_verl_row(kwargs)
        top_k = int(sampling_params.get("top_k") or 0)
        rollout_cfg = dataclasses.replace(
            self.rollout_cfg,
            temperature=float(sampling_params.get("temperature", self.rollout_cfg.temperature)),
            top_p=float(sampling_params.get("top_p", self.rollout_cfg.top_p)),
            top_k=max(top_k, 0),  # verl spells "off" -1
        )
        training = (kwargs.get("extra_info") or {}).get("split", "train") == "train"
        saar = self.cfg.saar if training else dataclasses.replace(self.cfg.saar, enabled=False)
        engine = VerlEngine(self.server_manager, self.tokenizer)
        rollout = Rollout(engine, sandbox, self.tokenizer, rollout_cfg, saar)
        trajectory = await rollout.run(uuid.uuid4().hex, problem.prompt, seed=self.cfg.seed)
        score = await grade(problem, trajectory, verifier, sandbox)
        record = trajectory.trajectory
        stats = record.extra["rollout"]
        return AgentLoopOutput(
            **agent_loop_output(trajectory, self.response_length),
            reward_score=score.reward,
            metrics=AgentLoopMetrics(),
            extra_fields={
                "tool_calls": stats["tool_calls"],
                "tool_failures": stats["first_attempt_failures"],
                "saar_active": bool(record.saar and record.saar.active),
                "saar_recovered": len(record.saar.grafts) if record.saar else 0,
                "saar_gave_up": bool(record.saar and record.saar.gave_up),
                "finish": stats["finish"],
            },
        )
