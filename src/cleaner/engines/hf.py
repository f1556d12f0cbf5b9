"""The transformers backend: batched sampling over all live requests, with per-session prefix reuse.

One scheduler task drives the model; each `generate` coroutine queues a request and awaits its
result. Every step advances all running requests by one token in a single forward pass over a
batched KV cache that persists across steps: one row (slot) per request, in buffers with spare
room, so that steps, joins and departures copy nothing but the rows concerned.

Layout. Each step appends the same number of columns to every row; a row's new tokens sit at the
right end of those columns, with padding to their left. A boolean `valid` matrix (rows x columns)
marks the columns that hold a row's real tokens; the attention mask is built from it (a query sees
the valid columns up to its own), and position ids are passed explicitly (a token's position is the
number of real tokens before it), so padding anywhere in a row, holes in the middle included,
changes nothing: the logits are those of a plain forward pass over the row's real tokens
(tests/engines check this to 1e-5). A request that joins takes a free row and its tokens are
written so that they end at the batch's last column; a request that leaves frees its row. Columns
that no row uses any more are dropped when the buffers are next reallocated (when they run out of
room), so the cache stays about as wide as the longest live row.

Sessions. Between requests a session is parked: its keys and values are kept compact (real columns
only) together with the token ids they were computed from. A new request keeps the longest common
prefix of those ids and its context (always leaving at least one token to run, for the logits) and
prefills the rest. Newly admitted requests are prefilled together in their own forward passes
(chunked), then moved into the running batch: on CPU, a step where one request joins with 40 new
tokens while 15 decode costs 6 ms this way against 32 ms in one mixed forward pass, where every
decoding row is padded to 40 tokens (the embedded model's shape, 600 cached tokens).

Tested on CPU only; the code is device-agnostic (`device`, `dtype`), but CUDA is untested. The
attention implementation must take a 4-D mask: `sdpa` (the default) or `eager`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.cache_utils import Cache, DynamicLayer

from cleaner.engines.base import (
    DetectorFactory,
    FinishReason,
    Generation,
    SamplingParams,
    TokenCallback,
)
from cleaner.engines.text import TextStream
from cleaner.formats import CallDetector

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Keys and values of one sequence, per layer, each of shape (1, kv_heads, tokens, head_dim)."""


class _WindowLayer(DynamicLayer):
    """One layer of a `_Slots` cache as the model sees it in one forward pass: rows [0, rows) and the
    live columns of the slot buffers, the new columns written in place after them (the buffers have
    room for them: `DynamicLayer` would concatenate, copying the whole cache at every step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, start: int, end: int):
        super().__init__()
        self._buffers, self._rows, self._start, self._end = (keys, values), rows, start, end
        self.keys, self.values = keys[:rows, :, start:end], values[:rows, :, start:end]
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = self._buffers
        rows, start, end = self._rows, self._start, self._end + key_states.shape[2]
        keys[:rows, :, self._end : end] = key_states
        values[:rows, :, self._end : end] = value_states
        self._end = end
        self.keys, self.values = keys[:rows, :, start:end], values[:rows, :, start:end]
        return self.keys, self.values


@dataclass(eq=False)
class _Session:
    tokens: list[int] = field(default_factory=list)  # the ids whose keys and values we hold
    kv: KV | None = None  # those keys and values while the session is parked (no request running)
    latest: _Request | None = None  # the last request submitted
    running: _Request | None = None  # the request in the batch, if any
    closed: bool = False
    last_used: int = 0


@dataclass(eq=False)
class _Request:
    session: _Session
    context: list[int]
    params: SamplingParams
    budget: int  # tokens it may generate: max_new_tokens, or less near the context window's end
    future: asyncio.Future
    stop_ids: frozenset[int]
    stream: TextStream
    detector: CallDetector | None
    generator: torch.Generator | None
    past: KV | None = None  # the session's reusable keys and values, until the request is packed
    feed: list[int] = field(default_factory=list)  # ids not yet run through the model
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    abandoned: bool = False  # its caller was cancelled
    kv_out: KV | None = None  # the session's keys and values when the request leaves the batch
    on_tokens: TokenCallback | None = None
    published: int = 0  # tokens (and text pieces) already handed to on_tokens

    def publish(self, final_text: str = "") -> None:
        """Hand `on_tokens` what was sampled since the last call (on the event loop)."""
        if self.on_tokens is None:
            return
        new = slice(self.published, len(self.token_ids))
        text = "".join(self.text[new.start :]) + final_text
        if new.start < new.stop or text:
            self.published = len(self.token_ids)
            self.on_tokens(self.token_ids[new], self.logprobs[new], text)

    def accept(self, token: int, logprob: float) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.feed = [token]
        if token in self.stop_ids:
            self.finish_reason = "eos"
            return
        delta = self.stream.push(token)
        self.text.append(delta)
        if delta and self.detector is not None and self.detector.feed(delta) is not None:
            self.finish_reason = "call"
        elif len(self.token_ids) >= self.budget:
            self.finish_reason = "length"

    def generation(self) -> Generation:
        assert self.finish_reason is not None
        tail = self.stream.flush()
        self.publish(tail)
        return Generation(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text="".join(self.text) + tail,
            finish_reason=self.finish_reason,
            cached_tokens=self.cached_tokens,
            prefill_tokens=len(self.context) - self.cached_tokens,
        )


@dataclass(frozen=True)
class _KVShape:
    layers: int
    heads: int  # key-value heads
    head_dim: int
    dtype: torch.dtype
    device: torch.device


class _Slots:
    """Requests that advance together, one row (slot) each in a batched KV cache (see the module
    notes). Every row's tokens end at column `end`; no row uses the columns before `start`."""

    def __init__(self, shape: _KVShape, rows: int, max_rows: int, left: int = 0, right: int = 0):
        self.shape, self.max_rows = shape, max_rows
        self.requests: list[_Request | None] = [None] * rows
        size = (rows, shape.heads, left + right, shape.head_dim)
        self.keys = [
            torch.zeros(size, dtype=shape.dtype, device=shape.device) for _ in range(shape.layers)
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.valid = torch.zeros(rows, left + right, dtype=torch.bool, device=shape.device)
        self.start = self.end = left

    @property
    def active(self) -> list[_Request]:
        return [r for r in self.requests if r is not None]

    def place(self, request: _Request, kv: KV | None) -> None:
        """Give the request a free row holding `kv` (its reusable keys and values, or None)."""
        length = 0 if kv is None else kv[0][0].shape[2]
        if None not in self.requests or length > self.end:
            rows = len(self.requests)
            if None not in self.requests:
                rows = min(max(1, 2 * rows), self.max_rows)
            spare = self.keys[0].shape[2] - self.end
            window = self.end - self.start
            self._reallocate(rows, left=max(0, length - window) + self._headroom(), right=spare)
        slot = self.requests.index(None)
        self.requests[slot] = request
        self.start = min(self.start, self.end - length)
        self.valid[slot] = False
        self.valid[slot, self.end - length : self.end] = True
        for layer, (k, v) in enumerate(kv or []):
            self.keys[layer][slot, :, self.end - length : self.end] = k[0]
            self.values[layer][slot, :, self.end - length : self.end] = v[0]

    def take(self, request: _Request, *, copy: bool) -> KV | None:
        """Free the request's row; its keys and values, real columns only. Without `copy` they may
        be views into the buffers (when contiguous, as outside a prefill), valid until the next
        forward pass: enough to place them in another `_Slots`, which copies them."""
        slot = self.requests.index(request)
        kv = self._extract(slot, copy)
        self.requests[slot] = None
        self.valid[slot] = False
        live = self.valid[:, self.start : self.end].any(dim=0).nonzero()
        self.start = self.end if len(live) == 0 else self.start + live[0].item()
        return kv

    def forward(self, model, cache_kwarg: str, feeds: list[list[int]]) -> torch.Tensor:
        """Run each row's feed (possibly empty; one per row) through the model, in one forward pass
        over the rows up to the last one in use; the logits after each row's last token, (rows,
        vocab): meaningless for a free row or an empty feed."""
        rows = max(slot for slot, r in enumerate(self.requests) if r is not None) + 1
        slot_feeds = feeds[:rows]
        n = max(len(f) for f in slot_feeds)
        if self.end + n > self.keys[0].shape[2]:
            headroom = self._headroom()
            self._reallocate(len(self.requests), left=headroom, right=n + headroom)

        device = self.valid.device
        ids = torch.tensor([[0] * (n - len(f)) + f for f in slot_feeds], device=device)
        lengths = torch.tensor([len(f) for f in slot_feeds], device=device)
        starts = torch.tensor(
            [len(r.session.tokens) if r is not None else 0 for r in self.requests[:rows]],
            device=device,
        )
        offset = torch.arange(n, device=device) - (n - lengths)[:, None]  # < 0 on padding
        positions = (starts[:, None] + offset).clamp(min=0)

        start, end = self.start, self.end
        self.valid[:rows, end : end + n] = offset >= 0
        valid = self.valid[:rows, start : end + n]
        query_cols = end - start + torch.arange(n, device=device)[:, None]
        key_cols = torch.arange(end + n - start, device=device)[None, :]
        # Each query sees the valid columns up to its own, and always its own column, so that a
        # padding query is never fully masked (a fully masked softmax row gives NaN).
        visible = (valid[:, None, :] & (key_cols <= query_cols)) | (key_cols == query_cols)
        mask = torch.zeros(visible.shape, dtype=self.shape.dtype, device=device)
        mask = mask.masked_fill(~visible, torch.finfo(self.shape.dtype).min)[:, None]
        cache = Cache(
            layers=[
                _WindowLayer(k, v, rows, start, end)
                for k, v in zip(self.keys, self.values, strict=True)
            ]
        )

        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kwarg: cache},
        )
        self.end += n
        for r, feed in zip(self.requests, slot_feeds, strict=False):
            if r is not None:
                r.session.tokens.extend(feed)
        return out.logits[:, -1].float()

    def _extract(self, slot: int, copy: bool) -> KV | None:
        columns = self.start + self.valid[slot, self.start : self.end].nonzero().squeeze(1)
        assert len(columns) == len(self.requests[slot].session.tokens)
        if len(columns) == 0:
            return None
        first, last = columns[0].item(), columns[-1].item()
        contiguous = last - first + 1 == len(columns)
        index = slice(first, last + 1) if contiguous else columns  # indexing by a tensor copies
        kv = [
            (k[slot : slot + 1, :, index], v[slot : slot + 1, :, index])
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        if copy and contiguous:
            kv = [(k.clone(), v.clone()) for k, v in kv]
        return kv

    def _headroom(self) -> int:
        """Spare columns to leave on each side when reallocating: on the right for the coming steps,
        on the left for requests joining with more tokens than the live rows hold."""
        return max(64, (self.end - self.start) // 4)

    def _reallocate(self, rows: int, left: int, right: int) -> None:
        """Move the live columns of every row into new buffers of `rows` rows, with `left` free
        columns before them and `right` after (the dead columns are dropped)."""
        window = self.end - self.start
        old_rows = len(self.requests)
        size = (rows, self.shape.heads, left + window + right, self.shape.head_dim)
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                new = old.new_zeros(size)
                new[:old_rows, :, left : left + window] = old[:, :, self.start : self.end]
                buffers[layer] = new
        valid = self.valid.new_zeros(rows, left + window + right)
        valid[:old_rows, left : left + window] = self.valid[:, self.start : self.end]
        self.valid = valid
        self.requests += [None] * (rows - old_rows)
        self.start, self.end = left, left + window


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _truncate(logprobs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf what top-k, then top-p over the renormalized top-k, leave out (per row)."""
    vocab = logprobs.shape[-1]
    ordered, order = logprobs.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logprobs.device)
    drop = rank >= torch.where(top_k > 0, top_k, vocab)[:, None]
    probs = ordered.masked_fill(drop, -torch.inf).softmax(dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
    drop |= (top_p[:, None] < 1) & (probs.cumsum(dim=-1) - probs >= top_p[:, None])
    return torch.full_like(logprobs, -torch.inf).scatter(
        -1, order, ordered.masked_fill(drop, -torch.inf)
    )


class HFEngine:
    """Generation on a transformers causal LM (see the module notes for the design).

    `max_batch_size` caps the requests in one forward pass; more wait their turn. Parked sessions
    keep their keys and values for prefix reuse until `close`; `max_parked_tokens` bounds the total,
    dropping the least recently used sessions' caches (they are recomputed if they come back).
    Prefills run in chunks of at most `prefill_chunk` tokens per request, which bounds the memory
    of the attention mask. `eos_token_ids` defaults to the tokenizer's and the generation config's.
    `autocast_dtype` runs the forward passes under `torch.autocast` (bfloat16 on GPUs: what the
    trainer computes in, so sampling and training see the same numbers); the decoding thread needs
    it passed here, since an autocast context does not cross threads.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int = 32,
        max_parked_tokens: int | None = None,
        prefill_chunk: int = 2048,
        eos_token_ids: Sequence[int] | None = None,
        autocast_dtype: torch.dtype | None = None,
    ):
        config = model.config
        if config._attn_implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"HFEngine needs attn_implementation 'sdpa' or 'eager' (it passes its own 4-D "
                f"attention mask); the model uses {config._attn_implementation!r}"
            )
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
            raise ValueError("HFEngine supports full-attention layers only (no sliding windows)")
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_parked_tokens = max_parked_tokens
        self.prefill_chunk = prefill_chunk
        self.autocast_dtype = autocast_dtype
        self.max_context = getattr(config, "max_position_embeddings", None)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.stop_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else _eos_ids(model, tokenizer)
        )
        # transformers 5 renamed `past_key_values` to `cache`
        parameters = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"

        self._sessions: dict[str, _Session] = {}
        self._waiting: deque[_Request] = deque()
        text_config = config.get_text_config()
        self._shape = _KVShape(
            layers=text_config.num_hidden_layers,
            heads=text_config.num_key_value_heads,
            head_dim=getattr(text_config, "head_dim", None)
            or text_config.hidden_size // text_config.num_attention_heads,
            dtype=model.dtype,
            device=self.device,
        )
        self._running = self._empty_batch()
        self._scheduler: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._clock = itertools.count()

    @classmethod
    def from_pretrained(
        cls, path: str, *, device: str = "cpu", dtype="auto", **options
    ) -> HFEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device), tokenizer, **options)

    async def generate(
        self,
        session: str,
        context_ids: Sequence[int],
        params: SamplingParams,
        detector_factory: DetectorFactory | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> Generation:
        """See `Engine.generate`. `on_tokens(ids, logprobs, text)` is called on the event loop with
        what each decoding step added, before the result is returned (a server streams with it)."""
        context = list(context_ids)
        if not context:
            raise ValueError("the context must hold at least one token")
        if not 0 <= min(context) <= max(context) < self.vocab_size:  # else the whole batch fails
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        budget = params.max_new_tokens
        if self.max_context is not None:
            budget = min(budget, self.max_context - len(context))
            if budget < 1:  # the context fills the model's window: a truncated trajectory
                return Generation([], [], "", "length")
        state = self._sessions.setdefault(session, _Session())
        if state.latest is not None and not state.latest.future.done():
            raise RuntimeError(f"session {session!r} already has a generation in flight")
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        request = _Request(
            session=state,
            context=context,
            params=params,
            budget=budget,
            future=asyncio.get_running_loop().create_future(),
            stop_ids=self.stop_ids,
            stream=TextStream(self.tokenizer),
            detector=detector_factory() if detector_factory is not None else None,
            generator=generator,
            on_tokens=on_tokens,
        )
        state.latest = request
        self._waiting.append(request)
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.create_task(self._schedule())
        return await request.future

    async def close(self, session: str) -> None:
        """See `Engine.close`. A generation still in flight finishes, but its cache is not kept."""
        state = self._sessions.pop(session, None)
        if state is None:
            return
        state.closed = True
        # A running session's token count is still the scheduler's; its cache is dropped at the end.
        if state.running is None:
            state.kv, state.tokens = None, []

    def reset_prefix_cache(self) -> None:
        """Forget the caches of all parked sessions: call it after the weights change, since keys and
        values computed by the old weights would otherwise be reused."""
        for state in self._sessions.values():
            if state.running is None:
                state.kv, state.tokens = None, []

    # --- the scheduler -------------------------------------------------------------------------------

    async def _schedule(self) -> None:
        # Sample in eval mode (no dropout) even from a model that a trainer left in training mode,
        # and give it back as it was when the engine goes idle.
        training = self.model.training
        self.model.eval()
        try:
            while self._waiting or self._running.active:
                admitted = self._admit()
                running = self._running.active
                for r in running:
                    r.abandoned = r.future.cancelled()
                try:
                    # The forward passes run off the event loop, so tools and other coroutines
                    # proceed meanwhile, on the engine's own thread: one step at a time, never
                    # queued behind other work.
                    loop = asyncio.get_running_loop()
                    done = await loop.run_in_executor(self._thread, self._step, admitted)
                except Exception as error:
                    self._fail(running + admitted, error)
                    continue
                for r in admitted + running:
                    if r not in done:
                        r.publish()
                for r in done:
                    self._finish(r)
        finally:
            self.model.train(training)
            self._scheduler = None

    def _admit(self) -> list[_Request]:
        """Take waiting requests while there is room; roll each session back to its reusable prefix."""
        admitted, deferred = [], []
        room = self.max_batch_size - len(self._running.active)
        while self._waiting and len(admitted) < room:
            r = self._waiting.popleft()
            state = r.session
            if r.future.cancelled():
                continue
            if state.running is not None:  # a cancelled request of the session is still leaving
                deferred.append(r)
                continue
            keep = min(_common_prefix_length(state.tokens, r.context), len(r.context) - 1)
            if keep and state.kv is not None:
                r.past = [(k[:, :, :keep], v[:, :, :keep]) for k, v in state.kv]
            else:
                keep = 0
            state.kv, state.tokens = None, r.context[:keep]
            state.last_used = next(self._clock)
            r.feed, r.cached_tokens = r.context[keep:], keep
            state.running = r
            admitted.append(r)
        self._waiting.extendleft(reversed(deferred))
        return admitted

    def _step(self, admitted: list[_Request]) -> list[_Request]:
        """Prefill the admitted requests and move them into the batch; advance every request in the
        batch by a token. Returns the requests that finished, each with its session's keys and values
        in `kv_out`."""
        autocast = torch.autocast(
            self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        )
        with torch.inference_mode(), autocast:
            done = []
            if admitted:
                fresh = _Slots(
                    self._shape,
                    rows=len(admitted),
                    max_rows=len(admitted),
                    left=max(len(r.session.tokens) for r in admitted),
                    right=min(self.prefill_chunk, max(len(r.feed) for r in admitted)),
                )
                for r in admitted:
                    fresh.place(r, r.past)
                    r.past = None
                self._sample(admitted, self._prefill(fresh))
                for r in admitted:
                    if r.finish_reason:  # parked: it must own its memory, not pin the batch's
                        r.kv_out = fresh.take(r, copy=True)
                        done.append(r)
                    else:
                        self._running.place(r, fresh.take(r, copy=False))

            requests = self._running.requests
            slots = [slot for slot, r in enumerate(requests) if r is not None]
            running = [requests[slot] for slot in slots]
            if running:
                feeds = [r.feed if r is not None else [] for r in requests]
                logits = self._running.forward(self.model, self._cache_kwarg, feeds)
                self._sample(running, logits[slots])
            for r in running:
                if r.finish_reason or r.abandoned:
                    r.kv_out = self._running.take(r, copy=True)
                    done.append(r)
            return done

    def _prefill(self, batch: _Slots) -> torch.Tensor:
        """Run the rows' feeds in chunks of at most `prefill_chunk` tokens (the attention mask of a
        chunk is chunk x context, per row); the logits after each row's last token, in row order."""
        requests = batch.requests  # every row of a prefill batch is in use, in admission order
        logits: list[torch.Tensor | None] = [None] * len(requests)
        while any(r.feed for r in requests):
            feeds = [r.feed[: self.prefill_chunk] for r in requests]
            for r in requests:
                r.feed = r.feed[self.prefill_chunk :]
            chunk_logits = batch.forward(self.model, self._cache_kwarg, feeds)
            for row, (r, feed) in enumerate(zip(requests, feeds, strict=True)):
                if feed and not r.feed:
                    logits[row] = chunk_logits[row]
        return torch.stack(logits)

    def _sample(self, requests: list[_Request], logits: torch.Tensor) -> None:
        """Sample a token per row; record it with its log-prob under logits / temperature."""
        params = [r.params for r in requests]
        temperature = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        logprobs = torch.log_softmax(logits / temperature[:, None], dim=-1)
        candidates = logprobs
        if any(p.top_k or p.top_p < 1 for p in params):
            top_k = torch.tensor([p.top_k for p in params], device=logits.device)
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            candidates = _truncate(logprobs, top_k, top_p)
        tokens = logits.argmax(dim=-1)
        for row, r in enumerate(requests):
            if not r.params.greedy:
                probs = candidates[row].exp()
                tokens[row] = torch.multinomial(probs, 1, generator=r.generator)[0]
        chosen = logprobs.gather(1, tokens[:, None])[:, 0]
        for r, token, logprob in zip(requests, tokens.tolist(), chosen.tolist(), strict=True):
            r.accept(token, logprob)

    def _finish(self, r: _Request) -> None:
        """Park the request's session (on the event loop) and hand the caller its result."""
        state = r.session
        state.running = None
        kv, r.kv_out = r.kv_out, None
        if not state.closed:
            state.kv = kv
            state.last_used = next(self._clock)
            self._evict()
        if not r.future.done():
            r.future.set_result(r.generation())

    def _empty_batch(self) -> _Slots:
        return _Slots(self._shape, rows=0, max_rows=self.max_batch_size)

    def _evict(self) -> None:
        if self.max_parked_tokens is None:
            return
        parked = sorted(
            (s for s in self._sessions.values() if s.kv is not None), key=lambda s: s.last_used
        )
        total = sum(len(s.tokens) for s in parked)
        for state in parked:
            if total <= self.max_parked_tokens:
                break
            total -= len(state.tokens)
            state.kv, state.tokens = None, []

    def _fail(self, requests: list[_Request], error: Exception) -> None:
        """A forward pass failed: fail its requests and start over with an empty batch."""
        self._running = self._empty_batch()
        for r in requests:
            r.session.running = None
            r.session.kv, r.session.tokens = None, []
            if not r.future.done():
                r.future.set_exception(error)


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return ids


def load_tokenizer(path: str | Path):
    """A model directory's tokenizer, which must carry a chat template (it renders the turns)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a transformers model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ValueError(f"{path}: the tokenizer has no chat template")
    return tokenizer


def load_policy(path: str | Path, device: str = "cpu"):
    """A transformers causal LM and its tokenizer (with its chat template) from a local directory."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").to(device).eval()
    return model, tokenizer
