"""An engine on a server: the OpenAI completions API as vLLM, SGLang and `cleaner serve` speak it.

    engine = OpenAIEngine("http://gpu-node:8000")       # then Rollout(engine, ...) as with HFEngine

Each request sends the trajectory's whole context as token ids (`prompt`), streams the answer, and
reads back token ids and the sampled tokens' log-probs (`logprobs: 0`, `return_tokens_as_token_ids`,
and `return_token_ids` where the server knows it), so nothing is re-tokenized and a rollout records
exactly what was sampled. Tool calls are found by the same `CallDetector` as the embedded engine:
when a call is complete the stream is closed, which makes vLLM abort the request. The trajectory's
session goes in the OpenAI `user` field; servers reuse cached prefixes by content anyway (vLLM's
automatic prefix caching), and `cleaner serve` by session.

What the server must honour for the numbers to mean what `Generation` says: `logprobs` of the
sampled token after temperature and before top-k/top-p. `cleaner serve` does; vLLM's default
(`--logprobs-mode raw_logprobs`) gives them before temperature, which is the same at temperature 1
(the training and evaluation setting of the reference recipes) and not otherwise.

Errors: a 4xx answer is the request's fault and raises `ValueError` with the server's message; a
refused connection or a 5xx is retried a few times with backoff, then `EngineUnavailable` is raised
(an unreachable server is an infrastructure failure, not something to train on).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp

from cleaner.engines.base import (
    DetectorFactory,
    EngineUnavailable,
    Generation,
    SamplingParams,
)

__all__ = ["EngineUnavailable", "OpenAIEngine"]


class OpenAIEngine:
    """`Engine` over an OpenAI-compatible `/v1/completions` endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 3600.0,
        max_connections: int = 256,
        retries: int = 4,
        backoff_s: float = 0.5,
    ):
        """`model`: the served model's name; None asks the server (`/v1/models`). A refused
        connection or a 5xx is tried `retries` times in all, waiting `backoff_s`, then twice that..."""
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self.retries, self.backoff_s = retries, backoff_s
        self._session: aiohttp.ClientSession | None = None

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                timeout=self.timeout,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        if self.model is None:
            models = await self._request("GET", "/v1/models", None)
            self.model = models["data"][0]["id"]
        return self._session

    async def _request(self, method: str, path: str, body: dict | None) -> dict:
        for attempt in range(self.retries):
            try:
                async with self._session.request(method, self.base_url + path, json=body) as r:
                    if r.status < 500:
                        await _raise_for_client_error(r)
                        return await r.json()
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise EngineUnavailable(f"{self.base_url}{path}: no answer after {self.retries} attempts")

    async def generate(
        self,
        session: str,
        context_ids: Sequence[int],
        params: SamplingParams,
        detector_factory: DetectorFactory | None = None,
    ) -> Generation:
        """See `Engine.generate`."""
        client = await self._client()
        body = {
            "model": self.model,
            "prompt": list(context_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,
            "seed": params.seed,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": session,
        }
        for attempt in range(self.retries):
            try:
                async with client.post(self.base_url + "/v1/completions", json=body) as response:
                    if response.status < 500:
                        await _raise_for_client_error(response)
                        stream = _Stream(detector_factory)
                        return await stream.read(response, len(context_ids))
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise EngineUnavailable(f"{self.base_url}: no completion after {self.retries} attempts")

    async def close(self, session: str) -> None:
        """See `Engine.close`: servers keep no per-session state that needs freeing."""

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._session is not None:
            await self._session.close()


async def _raise_for_client_error(response: aiohttp.ClientResponse) -> None:
    if response.status >= 400:
        text = await response.text()
        try:
            text = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise ValueError(f"{response.url}: {response.status}: {text}")


class _Stream:
    """Reads one streamed completion into a `Generation`, stopping at a complete tool call."""

    def __init__(self, detector_factory: DetectorFactory | None):
        self.detector = detector_factory() if detector_factory is not None else None
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.finish: str | None = None
        self.cached_tokens = 0

    async def read(self, response: aiohttp.ClientResponse, context_length: int) -> Generation:
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ValueError(f"{response.url}: {chunk['error'].get('message', chunk)}")
            usage = chunk.get("usage") or {}
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens"
            ) or self.cached_tokens
            for choice in chunk.get("choices") or []:
                if self.take(choice):  # a complete tool call: closing the stream aborts the rest
                    response.close()
                    return self.generation(context_length, "call")
        if self.finish is None:
            raise ValueError(f"{response.url}: the stream ended without a finish reason")
        if self.finish == "length":
            return self.generation(context_length, "length")
        return self.generation(context_length, "eos")

    def take(self, choice: dict[str, Any]) -> bool:
        """Add a chunk's tokens; True when the tool call is complete."""
        block = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            ids = [_token_id(token) for token in block.get("tokens") or []]
        logprobs = block.get("token_logprobs") or []
        if len(logprobs) != len(ids) or any(lp is None for lp in logprobs):
            raise ValueError(
                "the server must return a log-prob for every sampled token (this engine asks "
                "for logprobs=0): a rollout without them cannot be trained on"
            )
        self.token_ids += ids
        self.logprobs += [float(lp) for lp in logprobs]
        text = choice.get("text") or ""
        self.text.append(text)
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        return bool(text) and self.detector is not None and self.detector.feed(text) is not None

    def generation(self, context_length: int, finish_reason) -> Generation:
        cached = min(self.cached_tokens, context_length)
        return Generation(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text="".join(self.text),
            finish_reason=finish_reason,
            cached_tokens=cached,
            prefill_tokens=context_length - cached,
        )


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(
            f"the server sent token {token!r}, not an id: it must honour return_tokens_as_token_ids"
        )
    return int(token.removeprefix("token_id:"))
