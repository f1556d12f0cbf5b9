"""`Engine` over verl's rollout servers: what lets CLEANER's rollout run inside a verl training job.

verl's agent loops sample through an `AsyncLLMServerManager` (vLLM or SGLang replicas that share the
trainer's weights): `await manager.generate(request_id, prompt_ids=..., sampling_params=...)` gives
a `TokenOutput` with `token_ids` and `log_probs`. The request id picks the replica (sticky), so one id
per trajectory keeps its turns on the server that caches its prefix. That server cannot stop at a
tool call, so the whole turn is generated and then cut right after the first complete call, found
by the same `CallDetector` the embedded engine uses: the tokens after it were never executed, and
the trajectory must hold what the agent acted on. (With Qwen's hermes calls a turn ends at the
call anyway: `</tool_call><|im_end|>`.)

Nothing here imports verl; the manager is whatever has that `generate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cleaner.engines.base import DetectorFactory, Generation, SamplingParams
from cleaner.engines.text import TextStream


class VerlEngine:
    """`Engine` over a verl `AsyncLLMServerManager`."""

    def __init__(self, server_manager: Any, tokenizer: Any, eos_token_ids: Sequence[int] = ()):
        """`eos_token_ids`: the ids that end a turn besides the tokenizer's `eos_token_id`."""
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.eos_token_ids = {*eos_token_ids} | (
            {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        )

    async def generate(
        self,
        session: str,
        context_ids: Sequence[int],
        params: SamplingParams,
        detector_factory: DetectorFactory | None = None,
    ) -> Generation:
        """See `Engine.generate`. `seed` is not passed on: verl's servers draw their own."""
        output = await self.server_manager.generate(
            session,
            prompt_ids=list(context_ids),
            sampling_params={
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k or -1,
                "max_tokens": params.max_new_tokens,
                "logprobs": True,
            },
        )
        ids, logprobs = list(output.token_ids), output.log_probs
        if logprobs is None or len(logprobs) != len(ids):
            raise ValueError(
                "verl's rollout server returned no log-prob per token: "
                "set actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        stream = TextStream(self.tokenizer)
        detector = detector_factory() if detector_factory is not None else None
        text: list[str] = []
        for n, token in enumerate(ids, start=1):
            if token in self.eos_token_ids:
                return self._generation(ids[:n], logprobs[:n], text, "eos", len(context_ids))
            delta = stream.push(token)
            text.append(delta)
            if delta and detector is not None and detector.feed(delta) is not None:
                return self._generation(ids[:n], logprobs[:n], text, "call", len(context_ids))
        text.append(stream.flush())
        return self._generation(ids, logprobs, text, "length", len(context_ids))

    @staticmethod
    def _generation(ids, logprobs, text, finish, context_length) -> Generation:
        return Generation(
            token_ids=ids,
            logprobs=[float(x) for x in logprobs],
            text="".join(text),
            finish_reason=finish,
            prefill_tokens=context_length,  # the server's prefix cache is not reported back
        )

    async def close(self, session: str) -> None:
        """See `Engine.close`: the servers keep no per-session state to free."""
