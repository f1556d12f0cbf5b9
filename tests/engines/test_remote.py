"""`OpenAIEngine` against a real HTTP server (`cleaner serve`'s app on a loopback port): the same
generations as the embedded engine, tool calls cut the stream, bad requests name their field."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from typer.testing import CliRunner

from cleaner.cli import app
from cleaner.engines import SamplingParams
from cleaner.engines.hf import HFEngine
from cleaner.engines.remote import EngineUnavailable, OpenAIEngine
from cleaner.engines.server import CompletionServer
from cleaner.formats import get_format
from cleaner.jsonl import read_jsonl
from tests.engines.conftest import chain_model

TOLERANCE = 1e-5
runner = CliRunner()


@pytest.fixture
async def served(model, chatml_tokenizer):
    """(the engine behind the server, a client of it)."""
    engine = HFEngine(model, chatml_tokenizer)
    server = TestServer(CompletionServer(engine, chatml_tokenizer, "tiny").app())
    await server.start_server()
    client = OpenAIEngine(str(server.make_url("/")))
    yield engine, client
    await client.aclose()
    await server.close()


async def serve_chain(chatml_tokenizer, ids):
    engine = HFEngine(chain_model(len(chatml_tokenizer), ids), chatml_tokenizer)
    server = TestServer(CompletionServer(engine, chatml_tokenizer, "chain").app())
    await server.start_server()
    return engine, server, OpenAIEngine(str(server.make_url("/v1")))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=12),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=12, seed=3),
    ],
    ids=["greedy", "seeded"],
)
async def test_a_remote_generation_is_the_embedded_engines(served, params):
    engine, client = served
    context = [random.Random(0).randrange(10, 300) for _ in range(9)]
    direct = await engine.generate("direct", context, params)
    remote = await client.generate("remote", context, params)
    assert remote.token_ids == direct.token_ids
    assert remote.logprobs == pytest.approx(direct.logprobs, abs=TOLERANCE)
    assert (remote.text, remote.finish_reason) == (direct.text, direct.finish_reason)
    assert client.model == "tiny"  # asked the server


async def test_a_session_reuses_its_prefix_on_the_server(served):
    _, client = served
    context = list(range(20, 40))
    first = await client.generate("s", context, SamplingParams(temperature=0, max_new_tokens=3))
    assert (first.cached_tokens, first.prefill_tokens) == (0, 20)
    longer = context + first.token_ids + [50, 51]
    second = await client.generate("s", longer, SamplingParams(temperature=0, max_new_tokens=3))
    assert second.cached_tokens >= 20
    assert second.cached_tokens + second.prefill_tokens == len(longer)


async def test_the_stream_is_cut_right_after_a_complete_tool_call(chatml_tokenizer):
    script = ["Let", "<tool_call>", "print", "(", "1", ")", "</tool_call>", "on", "e"]
    ids = chatml_tokenizer.convert_tokens_to_ids(script)
    engine, server, client = await serve_chain(chatml_tokenizer, ids)
    try:
        params = SamplingParams(max_new_tokens=50, seed=0)
        remote = await client.generate("s", ids[:1], params, get_format("hermes").detector)
        assert remote.finish_reason == "call"
        assert remote.token_ids == ids[1:7]
        assert remote.text == "<tool_call>print(1)</tool_call>"
        assert len(remote.logprobs) == 6
        # The next turn comes at once, before the server may have seen the cut stream go away.
        following = await client.generate("s", ids[:7], params, get_format("hermes").detector)
        assert following.token_ids[:2] == ids[7:9]
    finally:
        await client.aclose()
        await server.close()


async def test_end_of_sequence_and_length(chatml_tokenizer):
    encode = chatml_tokenizer.convert_tokens_to_ids
    ids = [*encode(["Let", "print", "(", "1"]), chatml_tokenizer.eos_token_id, encode("on")]
    engine, server, client = await serve_chain(chatml_tokenizer, ids)
    try:
        eos = await client.generate("a", ids[:1], SamplingParams(max_new_tokens=50))
        assert (eos.finish_reason, eos.token_ids, eos.text) == ("eos", ids[1:5], "print(1")
        short = await client.generate("b", ids[:1], SamplingParams(max_new_tokens=2))
        assert (short.finish_reason, short.token_ids) == ("length", ids[1:3])
    finally:
        await client.aclose()
        await server.close()


async def test_requests_the_server_cannot_honour_are_refused_naming_the_field(served):
    engine, client = served
    await client.generate("warm", [20, 21], SamplingParams(max_new_tokens=1))  # learns the name
    with pytest.raises(ValueError, match=r"prompt: token ids must lie in \[0, "):
        await client.generate("s", [10**6], SamplingParams(max_new_tokens=2))
    url = client.base_url + "/v1/completions"
    async with aiohttp.ClientSession() as http:
        for body, field in [
            ({"prompt": [20], "n": 2}, "n"),
            ({"prompt": [20], "logprobs": 5}, "logprobs"),
            ({"prompt": [20], "stop": ["x"]}, "stop"),
            ({"prompt": [20], "temperature": -1}, "temperature"),
            ({"prompt": [20], "model": "other"}, "model"),
            ({"prompt": []}, "prompt"),
        ]:
            async with http.post(url, json=body) as r:
                assert r.status == 400, body
                assert field in (await r.json())["error"]["message"], body


async def test_a_plain_completion_request_gets_text_ids_and_usage(served):
    _, client = served
    async with aiohttp.ClientSession() as http:
        body = {"prompt": [20, 21, 22], "max_tokens": 4, "temperature": 0, "logprobs": 0}
        body |= {"return_token_ids": True}
        async with http.post(client.base_url + "/v1/completions", json=body) as r:
            reply = await r.json()
    choice = reply["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) == 4
    assert reply["usage"]["prompt_tokens"] == 3 and reply["usage"]["completion_tokens"] == 4


async def test_an_unreachable_server_raises_after_a_few_retries():
    # The discard port: nothing listens there.
    client = OpenAIEngine("http://127.0.0.1:9", model="m", retries=3, backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailable, match="after 3 attempts"):
            await client.generate("s", [1, 2], SamplingParams(max_new_tokens=2))
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def served_policy(random_policy):
    """`cleaner serve` of the random policy, in a subprocess on a free port: its URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "cleaner.cli", "serve", str(random_policy)]
    server = subprocess.Popen(
        [*command, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"

    async def ready():
        async with aiohttp.ClientSession() as http, http.get(url + "/health") as r:
            return r.status == 200

    try:
        for _ in range(120):
            try:
                if asyncio.run(ready()):
                    break
            except aiohttp.ClientConnectionError:
                assert server.poll() is None, server.stdout.read().decode()
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_a_rollout_through_cleaner_serve_samples_what_the_embedded_engine_does(
    random_policy, served_policy, tmp_path
):
    """Seeded sampling depends on the seed and the context only: the same trajectories, token for
    token, whether the policy runs in the process or behind `cleaner serve`."""
    args = ["rollout", "--model", str(random_policy), "--data", "gym:gcd", "--size", "2"]
    args += ["--n", "2", "--tokens", "rollout.max_response_tokens=32", "sandbox.workers=1"]
    embedded, remote = tmp_path / "embedded.jsonl", tmp_path / "remote.jsonl"
    result = runner.invoke(app, [*args, "-o", str(embedded)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, [*args, "-o", str(remote), f"rollout.engine_url={served_policy}"])
    assert result.exit_code == 0, result.output
    pairs = zip(read_jsonl(embedded), read_jsonl(remote), strict=True)
    for (_, a), (_, b) in pairs:
        segments_a, segments_b = a.pop("tokens")["segments"], b.pop("tokens")["segments"]
        assert a == b  # the turns, tool results, reward and rollout statistics
        assert len(segments_a) == len(segments_b)
        for x, y in zip(segments_a, segments_b, strict=True):
            assert (x["origin"], x["token_ids"]) == (y["origin"], y["token_ids"])
            # Batched differently on the server: the same numbers up to float rounding.
            assert x.get("logprobs") == pytest.approx(y.get("logprobs"), abs=TOLERANCE)


def test_training_refuses_a_server(tmp_path):
    result = runner.invoke(app, ["train", "--run-dir", str(tmp_path), "rollout.engine_url=x"])
    assert result.exit_code != 0 and "rollout.engine_url" in result.output


def test_an_unreachable_engine_url_is_a_clear_cli_error(random_policy, tmp_path):
    args = ["rollout", "--model", str(random_policy), "--data", "gym:gcd", "--size", "1"]
    args += ["--n", "1", "-o", str(tmp_path / "r.jsonl"), "rollout.engine_url=http://127.0.0.1:9"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "127.0.0.1:9" in result.output and "attempts" in result.output
    assert not (tmp_path / "r.jsonl").exists()


async def test_a_sessions_new_request_supersedes_the_one_its_client_abandoned(served):
    """A client that cut a stream moves on to the session's next turn at once; the server may not
    have noticed yet. The old generation is stopped, not reported as a conflict."""
    _, client = served
    url = client.base_url + "/v1/completions"
    body = {"prompt": [20, 21], "max_tokens": 400, "stream": True, "user": "t", "logprobs": 0}
    async with aiohttp.ClientSession() as http:
        first = await http.post(url, json=body)
        await first.content.readline()  # streaming: the generation is under way
        second_body = body | {"prompt": [20, 21, 22], "max_tokens": 3, "stream": False}
        async with http.post(url, json=second_body) as second:
            assert second.status == 200, await second.text()
            assert len((await second.json())["choices"][0]["logprobs"]["tokens"]) == 3
        first.close()
