"""An OpenAI-compatible completions server over the transformers engine (`cleaner serve`).

    POST /v1/completions   the OpenAI completions API, in the dialect vLLM speaks for RL:
                           `prompt` as token ids (or a string), `logprobs: 0` for the sampled
                           tokens' log-probs, `return_tokens_as_token_ids`, `return_token_ids`,
                           `top_k`, `seed`, `stream` (server-sent events, a chunk per decoding step)
    GET  /v1/models        the one model served
    GET  /health           {}

It lets a policy on one machine serve rollouts and evaluations run elsewhere, through the same
client (`OpenAIEngine`) that talks to vLLM or SGLang on GPUs, and it is what that client is tested
against. The OpenAI `user` field names the session whose cached prefix a request may reuse (the
rollout sends one per trajectory); without it a request starts from nothing.

Log-probs are those of `Generation`: log_softmax(logits / temperature) of the sampled token, before
top-k and top-p. A request the engine cannot honour exactly (several samples, stop strings, top
log-probs, echo) is refused with a 400 naming the field, never approximated.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from cleaner.engines.base import Generation, SamplingParams
from cleaner.engines.hf import HFEngine, load_policy

REFUSED = ("echo", "stop", "stop_token_ids", "suffix", "logit_bias")
"""Fields the server refuses unless they are absent or empty."""
FINISH_REASONS = {"eos": "stop", "length": "length", "call": "stop"}


class RequestError(ValueError):
    """A request the server cannot honour; the message names the field."""


def sampling_params(body: dict[str, Any], max_tokens_default: int) -> SamplingParams:
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise RequestError(f"{name}: one sample per request (send several requests)")
    for name in REFUSED:
        if body.get(name):
            raise RequestError(f"{name}: not supported by this server")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0):
        raise RequestError("logprobs: only 0 (the sampled token's log-prob) is supported")
    top_k = body.get("top_k", 0)
    try:
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=0 if top_k in (None, -1) else int(top_k),  # vLLM spells "off" -1
            max_new_tokens=int(body.get("max_tokens") or max_tokens_default),
            seed=None if body.get("seed") is None else int(body["seed"]),
        )
    except (TypeError, ValueError) as e:
        raise RequestError(f"sampling parameters: {e}") from e


def prompt_ids(body: dict[str, Any], tokenizer, vocab_size: int) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise RequestError("prompt: a string or a non-empty list of token ids (one prompt)")
    if not all(0 <= t < vocab_size for t in prompt):
        raise RequestError(f"prompt: token ids must lie in [0, {vocab_size})")
    return prompt


class CompletionServer:
    def __init__(self, engine: HFEngine, tokenizer, model_name: str, max_tokens: int = 1024):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.max_tokens = max_tokens
        self.in_flight: dict[str, asyncio.Task] = {}
        """The generation running for each session (`user`)."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model"}]}
        )

    def logprobs_block(self, body, ids, logprobs) -> dict[str, Any] | None:
        if body.get("logprobs") is None:
            return None
        if body.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{i}" for i in ids]
        else:
            tokens = self.tokenizer.convert_ids_to_tokens(list(ids))
        return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None}

    def choice(self, body, ids, logprobs, text, finish_reason) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": self.logprobs_block(body, ids, logprobs),
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(ids)
        return choice

    def envelope(self, request_id: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
        }

    @staticmethod
    def usage(prompt: list[int], generation: Generation) -> dict[str, Any]:
        return {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation.token_ids),
            "total_tokens": len(prompt) + len(generation.token_ids),
            "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            if body.get("model") not in (None, self.model_name):
                raise RequestError(f"model: this server serves {self.model_name!r}")
            params = sampling_params(body, self.max_tokens)
            prompt = prompt_ids(body, self.tokenizer, self.engine.vocab_size)
        except (RequestError, json.JSONDecodeError) as e:
            return web.json_response(
                {"error": {"message": str(e), "type": "BadRequestError"}}, status=400
            )
        session = body.get("user") or f"request-{uuid.uuid4().hex}"
        request_id = f"cmpl-{uuid.uuid4().hex}"
        if not body.get("stream"):
            generation = await self.generate(session, prompt, params, body, None)
            if isinstance(generation, web.Response):
                return generation
            choice = self.choice(
                body,
                generation.token_ids,
                generation.logprobs,
                generation.text,
                FINISH_REASONS[generation.finish_reason],
            )
            reply = self.envelope(request_id, choice)
            reply["usage"] = self.usage(prompt, generation)
            return web.json_response(reply)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks: asyncio.Queue = asyncio.Queue()

        def on_tokens(ids, logprobs, text):
            chunks.put_nowait(self.choice(body, ids, logprobs, text, None))

        task = asyncio.create_task(self.generate(session, prompt, params, body, on_tokens))
        task.add_done_callback(lambda _: chunks.put_nowait(None))
        try:
            while (choice := await chunks.get()) is not None:
                await response.write(sse(self.envelope(request_id, choice)))
            generation = task.result()
            if isinstance(generation, web.Response):  # refused after the stream began
                await response.write(sse(json.loads(generation.text)))
            else:
                last = self.choice(body, [], [], "", FINISH_REASONS[generation.finish_reason])
                final = self.envelope(request_id, last)
                if (body.get("stream_options") or {}).get("include_usage"):
                    final["usage"] = self.usage(prompt, generation)
                await response.write(sse(final))
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            task.cancel()  # the client went away (it found its tool call): stop generating
            raise
        return response

    async def generate(self, session, prompt, params, body, on_tokens):
        # A client that cut a stream (at a tool call) may send the session's next turn before this
        # server noticed it went away: the old generation is abandoned, so stop it first.
        previous = self.in_flight.get(session)
        if previous is not None and not previous.done():
            previous.cancel()
            await asyncio.wait([previous])
        self.in_flight[session] = asyncio.current_task()
        try:
            return await self.engine.generate(session, prompt, params, on_tokens=on_tokens)
        except (ValueError, RuntimeError) as e:
            return web.json_response(
                {"error": {"message": str(e), "type": "BadRequestError"}}, status=400
            )
        finally:
            if self.in_flight.get(session) is asyncio.current_task():
                del self.in_flight[session]
            if not body.get("user"):
                await self.engine.close(session)


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def serve(
    model: str, host: str = "127.0.0.1", port: int = 8000, max_batch_size: int = 64, device=None
) -> None:
    """Load a local transformers model directory and serve it until interrupted."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    policy, tokenizer = load_policy(model, device)

    async def app() -> web.Application:
        engine = HFEngine(policy, tokenizer, max_batch_size=max_batch_size)
        return CompletionServer(engine, tokenizer, model_name=str(model)).app()

    web.run_app(app(), host=host, port=port, print=None)
