"""The rollout loop and online SAAR, driven by a scripted policy: a deterministic function from the
context to the next assistant message, so each SAAR branch can be forced. The tokenizer, chat template,
sandbox and splicing are real; the policy's text is tokenized as if it had been sampled."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import pytest

from cleaner.agent import GIVE_UP_HINT, Rollout
from cleaner.config import RolloutConfig, SaarConfig
from cleaner.engines.base import Generation, SamplingParams
from cleaner.formats import TOOL_SCHEMA
from cleaner.sandbox import Sandbox

PROMPT = [{"role": "user", "content": "What is 45 squared?"}]


def call(reasoning: str, code: str) -> str:
    body = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
    return f"{reasoning}\n<tool_call>\n{body}\n</tool_call>"


class ScriptedEngine:
    """Answers each request with `policy(context_text)`, tokenized; records every request."""

    def __init__(self, tokenizer, policy: Callable[[str], str]):
        self.tokenizer, self.policy = tokenizer, policy
        self.requests: list[str] = []
        self.closed: list[str] = []

    async def generate(self, session, context_ids, params: SamplingParams, detector_factory=None):
        context = self.tokenizer.decode(context_ids)
        self.requests.append(context)
        text = self.policy(context)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        finish = "call" if "</tool_call>" in text else "eos"
        if finish == "eos":
            ids = ids + [self.tokenizer.eos_token_id]
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
            text = self.tokenizer.decode(ids)
        return Generation(ids, [-0.5] * len(ids), text, finish)

    async def close(self, session):
        self.closed.append(session)


def responses(context: str) -> list[str]:
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S)


@pytest.fixture
def sandbox():
    """A one-worker sandbox factory; each rollout runs in its own event loop with its own sandbox."""
    return lambda: Sandbox(workers=1, preload=())


def run(tokenizer, sandbox, policy, saar=SaarConfig(), **rollout):
    engine = ScriptedEngine(tokenizer, policy)
    cfg = RolloutConfig(**{"max_response_tokens": 4000, **rollout})

    async def main():
        async with sandbox() as sb:
            return await Rollout(engine, sb, tokenizer, cfg, saar).run("traj-0", PROMPT, seed=1)

    return asyncio.run(main()), engine


def rendered(tokenizer, messages):
    """The chat template's rendering of a conversation: what the spliced ids must decode to."""
    return tokenizer.apply_chat_template(PROMPT + messages, tools=[TOOL_SCHEMA], tokenize=False)


def assistant_call(reasoning, code):
    return {
        "role": "assistant",
        "content": reasoning,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": {"code": code}},
            }
        ],
    }


def test_a_clean_trajectory_is_spliced_exactly_as_the_template_renders_it(
    chatml_tokenizer, sandbox
):
    def policy(context):
        if not responses(context):
            return call("Let me compute it.", "print(45 ** 2)")
        return "The answer is \\boxed{2025}."

    out, engine = run(chatml_tokenizer, sandbox, policy, saar=SaarConfig(enabled=False))
    t = out.trajectory
    assert [turn.code for turn in t.turns] == ["print(45 ** 2)", None]
    assert t.turns[0].observation.stdout == "2025\n"
    assert t.extra["rollout"]["finish"] == "eos" and t.extra["rollout"]["tool_calls"] == 1
    expected = rendered(
        chatml_tokenizer,
        [
            assistant_call("Let me compute it.", "print(45 ** 2)"),
            {"role": "tool", "content": "2025\n"},
            {"role": "assistant", "content": "The answer is \\boxed{2025}."},
        ],
    )
    assert chatml_tokenizer.decode(out.token_ids) + "\n" == expected
    trained = [tok for tok, m in zip(out.token_ids, out.loss_mask, strict=True) if m]
    assert chatml_tokenizer.decode(trained) == (
        call("Let me compute it.", "print(45 ** 2)") + "The answer is \\boxed{2025}.<|im_end|>"
    )
    assert engine.closed == ["traj-0"]


def test_shallow_graft_purifies_the_context(chatml_tokenizer, sandbox):
    def policy(context):
        seen = responses(context)
        if not seen:
            return call("Sum the first ten integers.", "print(sum(range(10))")
        if "SyntaxError" in seen[-1]:
            return call("I missed a parenthesis.", "print(sum(range(10)))")
        return "The answer is \\boxed{45}."

    out, engine = run(chatml_tokenizer, sandbox, policy)
    t = out.trajectory
    assert [turn.code for turn in t.turns] == ["print(sum(range(10)))", None]
    assert t.turns[0].reasoning == "Sum the first ten integers." and t.turns[0].origin == "shallow"
    assert t.turns[0].observation.stdout == "45\n"
    (g,) = t.saar.grafts
    assert (g.turn, g.kind, g.attempt, g.extra["error_type"]) == (0, "shallow", 1, "SyntaxError")
    assert not t.saar.gave_up and t.extra["rollout"]["first_attempt_failures"] == 1
    # the correction was sampled with the error in view; the final context has no trace of it
    assert "SyntaxError" in engine.requests[1] and "SyntaxError" not in engine.requests[2]
    assert "SyntaxError" not in chatml_tokenizer.decode(out.token_ids)
    expected = rendered(
        chatml_tokenizer,
        [
            assistant_call("Sum the first ten integers.", "print(sum(range(10)))"),
            {"role": "tool", "content": "45\n"},
            {"role": "assistant", "content": "The answer is \\boxed{45}."},
        ],
    )
    assert chatml_tokenizer.decode(out.token_ids) + "\n" == expected
    # kept reasoning is on-policy, the grafted call is not; both are trained
    origins = [s.origin for s in out.segments]
    assert origins == ["prompt", "sampled", "shallow", "tool", "sampled"]
    assert chatml_tokenizer.decode(out.segments[2].token_ids).startswith("<tool_call>")


def test_deep_graft_takes_the_corrections_reasoning(chatml_tokenizer, sandbox):
    def policy(context):
        seen = responses(context)
        if not seen:
            return call("Use a loop.", "for i in rang(10): total += i")
        if "NameError" in seen[-1]:
            return call("Use the closed form instead.", "n = 9\nprint(n * (n + 1) // 2)")
        return "The answer is \\boxed{45}."

    out, _ = run(chatml_tokenizer, sandbox, policy)
    t = out.trajectory
    assert t.turns[0].reasoning == "Use the closed form instead." and t.turns[0].origin == "deep"
    assert [s.origin for s in out.segments] == ["prompt", "deep", "tool", "sampled"]
    assert t.saar.grafts[0].kind == "deep" and t.saar.grafts[0].similarity < 0.5


def test_gives_up_after_max_retries_with_a_hint_and_stays_raw_after(chatml_tokenizer, sandbox):
    def policy(context):
        seen = responses(context)
        if len(seen) >= 1 and "ZeroDivisionError" in seen[-1] and "Try a different" in seen[-1]:
            return call("Another one.", "print(1/0)")
        if seen and "Error" in seen[-1]:
            return call("Try again.", f"print(1/{0})")
        if not seen:
            return call("Divide.", "print(1/0)")
        return "The answer is \\boxed{0}."

    out, engine = run(
        chatml_tokenizer, sandbox, policy, saar=SaarConfig(max_retries=2), max_turns=2
    )
    t = out.trajectory
    assert t.saar.gave_up and [g.attempt for g in t.saar.grafts] == [1, 2]
    assert t.turns[0].failed  # the last grafted turn keeps its error...
    context = chatml_tokenizer.decode(out.token_ids)
    assert GIVE_UP_HINT.strip() in context  # ...with the hint
    # SAAR is off afterwards: the next failure is not corrected
    assert len(t.turns) == 2 and t.turns[1].failed and len(t.saar.grafts) == 2
    assert t.extra["rollout"]["finish"] == "max_turns"


def test_a_correction_without_code_keeps_error_and_answer(chatml_tokenizer, sandbox):
    def policy(context):
        if not responses(context):
            return call("Compute.", "print(undefined_name)")
        return "I cannot fix it. \\boxed{0}"

    out, _ = run(chatml_tokenizer, sandbox, policy)
    t = out.trajectory
    assert [turn.code for turn in t.turns] == ["print(undefined_name)", None]
    assert t.turns[0].failed and t.saar.gave_up and t.saar.grafts == []
    assert "NameError" in chatml_tokenizer.decode(out.token_ids)


def test_stateful_rollback_restores_the_interpreter_state(chatml_tokenizer, sandbox):
    def policy(context):
        seen = responses(context)
        if not seen:
            return call("Set x.", "x = 1\nprint(x)")
        if len(seen) == 1:
            return call("Change x, then print y.", "x = 100\nprint(y)")
        if "NameError" in seen[-1]:
            return call("Print x instead.", "print(x)")
        return "The answer is \\boxed{1}."

    out, _ = run(chatml_tokenizer, sandbox, policy, stateful=True)
    t = out.trajectory
    assert [turn.code for turn in t.turns] == ["x = 1\nprint(x)", "print(x)", None]
    assert t.turns[1].observation.stdout == "1\n"  # x = 100 ran before the error and was undone


def test_without_rollback_errors_stay(chatml_tokenizer, sandbox):
    def policy(context):
        seen = responses(context)
        if not seen:
            return call("Compute.", "print(y)")
        if len(seen) == 1:
            return call("Define y.", "y = 2\nprint(y)")
        return "\\boxed{2}"

    out, engine = run(chatml_tokenizer, sandbox, policy, saar=SaarConfig(rollback_probability=0.0))
    t = out.trajectory
    assert [turn.failed for turn in t.turns] == [True, False, False]
    assert not t.saar.active and t.saar.grafts == []


def test_turn_and_tool_call_budgets(chatml_tokenizer, sandbox):
    def always_call(context):
        return call("Again.", "print(1)")

    out, _ = run(chatml_tokenizer, sandbox, always_call, max_turns=3)
    assert (
        len(out.trajectory.turns) == 3 and out.trajectory.extra["rollout"]["finish"] == "max_turns"
    )
    out, _ = run(chatml_tokenizer, sandbox, always_call, max_tool_calls=2)
    r = out.trajectory.extra["rollout"]
    assert (
        r["executions"] == 2 and r["finish"] == "max_tool_calls" and len(out.trajectory.turns) == 3
    )


def test_response_token_budget(chatml_tokenizer, sandbox):
    out, _ = run(chatml_tokenizer, sandbox, lambda c: "word " * 500, max_response_tokens=50)
    sampled = sum(len(s.token_ids) for s in out.segments if s.origin == "sampled")
    assert sampled == 50 and out.trajectory.extra["rollout"]["finish"] == "length"


def test_malformed_call_is_an_invalid_observation_not_executed(chatml_tokenizer, sandbox):
    def policy(context):
        if not responses(context):
            return 'Let me try.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": 1/0}}\n</tool_call>'
        return "\\boxed{1}"

    out, _ = run(chatml_tokenizer, sandbox, policy, saar=SaarConfig(enabled=False))
    t = out.trajectory
    assert t.turns[0].observation.status == "invalid" and t.extra["rollout"]["executions"] == 0
    assert "InvalidToolCall" in chatml_tokenizer.decode(out.token_ids)


def test_long_output_is_truncated_head_and_tail(chatml_tokenizer, sandbox):
    def policy(context):
        if not responses(context):
            return call("Print a lot.", "print('a' * 1000 + 'END')")
        return "\\boxed{1}"

    out, _ = run(chatml_tokenizer, sandbox, policy, observation_chars=100)
    shown = responses(chatml_tokenizer.decode(out.token_ids))[0]
    assert shown.startswith("a" * 50) and shown.endswith("END\n") and "characters omitted" in shown
    assert (
        len(out.trajectory.turns[0].observation.stdout) == 1004
    )  # the record keeps the full output
