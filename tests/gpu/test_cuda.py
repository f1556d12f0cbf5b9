"""Checks that need a CUDA device, deselected by default (`-m 'not gpu'` in pytest's options).

On a machine with a GPU: `python -m pytest -m gpu tests/gpu` (a few minutes; vLLM's check runs
where vllm is installed: `pip install 'cleaner[gpu]'`). They cover what CPU runs cannot: the
engine's bfloat16 autocast on CUDA, a training run on CUDA end to end, and `OpenAIEngine` against
a real `vllm serve`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from cleaner.cli import app
from cleaner.engines import SamplingParams
from cleaner.engines.hf import HFEngine, load_policy
from cleaner.engines.remote import EngineUnavailable, OpenAIEngine
from tests.engines.conftest import reference_logprobs
from tests.train.test_trainer import overrides

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_engine_samples_in_bfloat16_on_cuda_as_the_trainer_computes(random_policy):
    model, tokenizer = load_policy(random_policy, "cuda")
    engine = HFEngine(model, tokenizer, autocast_dtype=torch.bfloat16)
    context = [5, 6, 7, 8, 9, 10, 11, 12]
    generation = asyncio.run(
        engine.generate("s", context, SamplingParams(temperature=0, max_new_tokens=8))
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = reference_logprobs(model, context, generation.token_ids)
    assert generation.logprobs == pytest.approx(expected, abs=5e-2)


def test_training_runs_on_cuda_and_writes_its_checkpoint(random_policy, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), *overrides(random_policy, 2), "train.device=cuda"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "step_000002" / "model" / "model.safetensors").is_file()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_openai_engine_against_a_real_vllm_server():
    from cleaner.tiny.bootstrap import default_model_dir

    policy = default_model_dir(log=lambda line: None)  # head_dim 32: vLLM's kernels take it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(policy), "--port", str(port), "--dtype", "float32"]
    command += ["--gpu-memory-utilization", "0.3", "--max-model-len", "2048"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    model, tokenizer = load_policy(policy, "cuda")
    context = [5, 6, 7, 8, 9, 10, 11, 12]
    params = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8)

    async def ask():
        client = OpenAIEngine(f"http://127.0.0.1:{port}", retries=1)
        try:
            return await client.generate("s", context, params)
        finally:
            await client.aclose()

    try:
        remote = None
        for _ in range(300):  # vLLM takes a minute or two to start
            try:
                remote = asyncio.run(ask())
                break
            except EngineUnavailable:
                assert server.poll() is None, server.stdout.read().decode()[-4000:]
                time.sleep(1)
        assert remote is not None, "vllm serve did not answer"
        embedded = asyncio.run(HFEngine(model, tokenizer).generate("s", context, params))
        assert remote.token_ids == embedded.token_ids  # top_k=1: the argmax, on either engine
        # vLLM's default log-probs are raw (before temperature): equal to ours at temperature 1
        assert remote.logprobs == pytest.approx(embedded.logprobs, abs=1e-3)
    finally:
        server.terminate()
        server.wait(timeout=60)
