"""The generation interface every backend implements: token ids in, sampled ids and log-probs out.

A caller (the rollout) holds each trajectory's context as token ids and sends the full context with
every request, under a session name that stays the same for the whole trajectory. The engine keeps
what it has already computed for that session and reuses the longest common prefix, so a request only
pays for the tokens that are new since the session's last request. That is what makes SAAR cheap: a
correction prefills only the error message, and after a graft only the grafted turn and the next
observation are computed, never the history. When the context diverges from what the engine holds
(after a graft the failed call and its error leave the context), everything past the divergence is
dropped, because those keys and values were computed with the error in view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from cleaner.formats import CallDetector

FinishReason = Literal["eos", "call", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation.

    `temperature` 0 means greedy. `top_k` 0 and `top_p` 1 switch those filters off. With a `seed`, the
    generation depends only on the seed, the context and these parameters, not on what else the
    engine is running; draw a fresh seed for every request (from a per-trajectory RNG, say), since two
    requests with one seed use the same random stream.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 1024
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off); got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One sampled continuation of a context.

        `logprobs[i]` is the log-probability of `token_ids[i]` under log_softmax(logits / temperature),
        taken before top-k and top-p truncation: exactly what a trainer recomputes from the model's logits
        at the same temperature. (For greedy decoding, temperature 0, it is log_softmax(logits).)

        `finish_reason`: `eos` (the last token is an end-of-sequence token; it is in `token_ids` and has
        a log-prob, since the model must learn to stop, but its text is not in `text`), `call` (a complete
        tool call was generated; `text` may run a few characters past its end when the closing marker
        ends inside a token), or `length` (`max_new_tokens` or the model's context window was reached;
    with no tokens at all when the context already fills the window).

        `cached_tokens` + `prefill_tokens` == len(context): how many context tokens were reused from what
        the engine held for the session, and how many it had to compute for this request.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    cached_tokens: int = 0
    prefill_tokens: int = 0


DetectorFactory = Callable[[], CallDetector]
TokenCallback = Callable[[Sequence[int], Sequence[float], str], None]
"""Called with the ids, log-probs and text a generation added since the previous call."""


class EngineUnavailable(RuntimeError):
    """A generation server could not be reached, or kept failing, after the allowed retries: an
    infrastructure failure, never turned into a trajectory."""


class Engine(Protocol):
    """A generation backend shared by many concurrent trajectories (coroutines)."""

    async def generate(
        self,
        session: str,
        context_ids: Sequence[int],
        params: SamplingParams,
        detector_factory: DetectorFactory | None = None,
    ) -> Generation:
        """Continue `context_ids`, the session's full context (prompt and everything since).

        Generation stops at an end-of-sequence token, at `max_new_tokens`, or, with a
        `detector_factory` (a format's `detector`), as soon as a complete tool call has been
        generated. One request per session at a time.
        """
        ...

    async def close(self, session: str) -> None:
        """Forget the session and free what the engine holds for it."""
        ...
