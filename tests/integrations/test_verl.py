"""The verl bridge: `VerlEngine` over a server manager that samples with a real model (as verl's vLLM
replicas do: whole turns, token ids and log-probs), the row and output conversions, and, where verl
is installed, the `cleaner_agent` loop itself inside verl's `AgentLoopBase`."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cleaner.agent import Rollout
from cleaner.cli import app
from cleaner.config import RolloutConfig, SaarConfig
from cleaner.data import load_benchmark
from cleaner.engines import SamplingParams
from cleaner.engines.hf import HFEngine
from cleaner.formats import get_format
from cleaner.integrations.verl.convert import (
    agent_loop_output,
    problem_from_verl_row,
    to_verl_rows,
)
from cleaner.integrations.verl.engine import VerlEngine
from cleaner.sandbox import Sandbox
from cleaner.tokens import Segment, TokenTrajectory
from cleaner.trajectory import Observation, RecordError, Trajectory, Turn
from tests.engines.conftest import chain_model, tiny_qwen3


class ServerManager:
    """verl's `LLMServerClient.generate`, served by a transformers model: the whole turn, to
    `max_tokens` or the end-of-sequence token, with the sampled tokens' log-probs."""

    def __init__(self, engine: HFEngine, with_logprobs: bool = True):
        self.engine, self.with_logprobs, self.requests = engine, with_logprobs, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.requests.append((request_id, dict(sampling_params)))
        params = SamplingParams(
            temperature=sampling_params["temperature"],
            top_p=sampling_params["top_p"],
            top_k=max(sampling_params["top_k"], 0),
            max_new_tokens=sampling_params["max_tokens"],
        )
        g = await self.engine.generate(request_id, prompt_ids, params)
        return SimpleNamespace(
            token_ids=g.token_ids, log_probs=g.logprobs if self.with_logprobs else None
        )


async def test_a_turn_is_cut_right_after_its_first_complete_tool_call(chatml_tokenizer):
    script = ["Let", "<tool_call>", "print", "(", "1", ")", "</tool_call>", "on", "e", "Let"]
    ids = chatml_tokenizer.convert_tokens_to_ids(script)
    hf = HFEngine(chain_model(len(chatml_tokenizer), ids), chatml_tokenizer)
    manager = ServerManager(hf)
    engine = VerlEngine(manager, chatml_tokenizer)
    params = SamplingParams(temperature=0.5, top_k=0, max_new_tokens=9)
    generation = await engine.generate("traj-1", ids[:1], params, get_format("hermes").detector)
    assert generation.finish_reason == "call"
    assert generation.token_ids == ids[1:7] and len(generation.logprobs) == 6
    assert generation.text == "<tool_call>print(1)</tool_call>"
    request_id, sent = manager.requests[0]
    assert request_id == "traj-1"  # sticky: one trajectory, one replica and its prefix cache
    assert sent == {
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 9,
        "logprobs": True,
    }


async def test_end_of_sequence_length_and_missing_log_probs(chatml_tokenizer):
    encode = chatml_tokenizer.convert_tokens_to_ids
    ids = [*encode(["Let", "print", "(", "1"]), chatml_tokenizer.eos_token_id, encode("on")]
    hf = HFEngine(chain_model(len(chatml_tokenizer), ids), chatml_tokenizer)
    engine = VerlEngine(ServerManager(hf), chatml_tokenizer)
    eos = await engine.generate("a", ids[:1], SamplingParams(max_new_tokens=20))
    assert (eos.finish_reason, eos.token_ids, eos.text) == ("eos", ids[1:5], "print(1")
    short = await engine.generate("b", ids[:1], SamplingParams(max_new_tokens=2))
    assert (short.finish_reason, short.token_ids, short.text) == ("length", ids[1:3], "print(")
    blind = VerlEngine(ServerManager(hf, with_logprobs=False), chatml_tokenizer)
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        await blind.generate("c", ids[:1], SamplingParams(max_new_tokens=2))


async def test_a_rollout_over_verls_servers_matches_the_embedded_engine(chatml_tokenizer):
    """top_k=1, so both paths sample the same tokens; the verl path generates whole turns and cuts."""
    hf = HFEngine(tiny_qwen3(len(chatml_tokenizer), seed=3), chatml_tokenizer)
    cfg = RolloutConfig(top_k=1, max_response_tokens=48, max_turns=3)
    prompt = [{"role": "user", "content": "Let me compute it with Python."}]
    outputs = []
    async with Sandbox(workers=1) as sandbox:
        for engine in (hf, VerlEngine(ServerManager(hf), chatml_tokenizer)):
            rollout = Rollout(engine, sandbox, chatml_tokenizer, cfg, SaarConfig(enabled=False))
            outputs.append(await rollout.run("t", prompt, seed=0))
    embedded, verl = outputs
    assert verl.token_ids == embedded.token_ids and verl.loss_mask == embedded.loss_mask
    assert verl.sampling_logprobs == pytest.approx(embedded.sampling_logprobs, abs=1e-5)


def test_problems_travel_through_verl_rows_and_parquet(tmp_path):
    problems = load_benchmark("gym:gcd,basic_arithmetic", size=3, seed=1)
    rows = to_verl_rows(problems)
    assert [problem_from_verl_row(r) for r in rows] == problems
    assert {r["agent_name"] for r in rows} == {"cleaner_agent"}
    out = tmp_path / "train.parquet"
    result = CliRunner().invoke(
        app, ["to-verl", "-o", str(out), "--data", "gym:gcd,basic_arithmetic", "--size", "3"]
    )
    assert result.exit_code == 0, result.output
    read = pq.read_table(out).to_pylist()
    assert [problem_from_verl_row(r) for r in read] == problems


def test_a_plain_verl_math_row_becomes_a_math_problem_and_a_bare_row_is_refused():
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "2 + 2?"}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"index": 7},
    }
    problem = problem_from_verl_row(row)
    assert (problem.kind, problem.answer, problem.id, problem.source) == (
        "math",
        "4",
        "7",
        "openai/gsm8k",
    )
    with pytest.raises(RecordError, match="extra_info"):
        problem_from_verl_row({"data_source": "x"})


def test_a_trajectory_becomes_verls_response_with_grafts_trained_and_tool_output_masked():
    ok = Observation(status="ok", stdout="4\n")
    turns = [Turn(reasoning="r", code="print(2+2)", observation=ok), Turn(reasoning="\\boxed{4}")]
    t = TokenTrajectory(Trajectory(id="t", prompt=[{"role": "user", "content": "q"}], turns=turns))
    t.segments = [
        Segment("prompt", [1, 2, 3]),
        Segment("sampled", [10, 11], [-0.1, -0.2], 0),
        Segment("shallow", [12], [-0.3], 0),
        Segment("tool", [20, 21, 22], None, 0),
        Segment("deep", [13, 14], [-0.4, -0.5], 1),
    ]
    out = agent_loop_output(t, response_length=100)
    assert out["prompt_ids"] == [1, 2, 3]
    assert out["response_ids"] == [10, 11, 12, 20, 21, 22, 13, 14]
    assert out["response_mask"] == [1, 1, 1, 0, 0, 0, 1, 1]
    assert out["response_logprobs"] == [-0.1, -0.2, -0.3, 0.0, 0.0, 0.0, -0.4, -0.5]
    assert out["num_turns"] == 4  # user, assistant, tool, assistant
    cut = agent_loop_output(t, response_length=4)
    assert len(cut["response_ids"]) == len(cut["response_mask"]) == 4
    assert len(cut["response_logprobs"]) == 4


needs_verl = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is an optional extra (pip install 'cleaner[verl]'); its own pins conflict with "
    "the test environment's transformers, so this runs where verl is installed",
)


@needs_verl
def test_the_cleaner_agent_loop_inside_verl(random_policy):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    from cleaner.integrations.verl.agent_loop import CleanerAgentLoop

    assert _agent_loop_registry["cleaner_agent"]["_target_"].endswith("CleanerAgentLoop")
    tokenizer = AutoTokenizer.from_pretrained(random_policy)
    model = AutoModelForCausalLM.from_pretrained(random_policy)
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"response_length": 64, "prompt_length": 512}}}
    )

    async def main():
        loop = CleanerAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=ServerManager(HFEngine(model, tokenizer)),
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(OmegaConf.create({})),
            overrides=["sandbox.workers=1"],
        )
        problems = load_benchmark("gym:gcd", size=1, seed=1)
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        rows = to_verl_rows(problems, "train") + to_verl_rows(problems, "test")
        try:  # concurrently, as verl runs them: one shared sandbox is started, not two
            return await asyncio.gather(
                *(loop.run(sampling, raw_prompt=row["prompt"], **row) for row in rows)
            )
        finally:
            sandbox, _ = await CleanerAgentLoop.shared
            await sandbox.close()
            CleanerAgentLoop.shared = None

    train, test = asyncio.run(main())
    for output in (train, test):
        assert output.reward_score in (-1.0, 1.0)
        assert 0 < len(output.response_ids) <= 64
        assert len(output.response_mask) == len(output.response_logprobs)
        assert len(output.response_mask) == len(output.response_ids)
        assert {"tool_calls", "saar_recovered", "finish"} <= output.extra_fields.keys()
    # validation rows measure the policy alone: no SAAR
    assert train.extra_fields["saar_active"] and not test.extra_fields["saar_active"]


def test_verls_reward_function_grades_as_cleaner_does():
    from cleaner.integrations.verl.reward import compute_score

    (gcd,) = to_verl_rows(load_benchmark("gym:gcd", size=1, seed=1))
    answer = gcd["reward_model"]["ground_truth"]
    right = compute_score("gym/gcd", f"So \\boxed{{{answer}}}.", answer, gcd["extra_info"])
    wrong = compute_score("gym/gcd", "So \\boxed{-5}.", answer, gcd["extra_info"])
    assert (right["score"], right["acc"]) == (1.0, 1.0) and (wrong["score"], wrong["acc"]) == (
        -1.0,
        0.0,
    )
    assert compute_score("openai/gsm8k", "it is \\boxed{\\frac{1}{2}}", "0.5")["score"] == 1.0
    problem = load_benchmark("humaneval")[0]
    (row,) = to_verl_rows([problem])
    solution = problem.metadata["code_prompt"] + problem.metadata["canonical_solution"]
    passed = compute_score("humaneval", f"```python\n{solution}\n```", "", row["extra_info"])
    failed = compute_score(
        "humaneval", "```python\ndef nothing(): pass\n```", "", row["extra_info"]
    )
    # the code reward is the fraction of tests passed (-1 without a code block)
    assert (passed["score"], passed["acc"]) == (1.0, 1.0) and failed["acc"] == 0.0
    assert failed["score"] < 1.0


@needs_verl
def test_verl_loads_the_reward_function_by_path():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import cleaner.integrations.verl.reward as module

    function = {"path": module.__file__, "name": "compute_score", "reward_kwargs": {}}
    config = OmegaConf.create({"reward": {"custom_reward_function": function}})
    compute_score = get_custom_reward_fn(config)
    assert compute_score(data_source="x", solution_str="\\boxed{4}", ground_truth="4")["score"] == 1
