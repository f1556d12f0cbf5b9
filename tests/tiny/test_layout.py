import pytest

from cleaner.formats import HermesFormat, observation_text
from cleaner.tiny.bootstrap import render_conversation, trace_tokens
from cleaner.tiny.tokenizer import SPECIAL_TOKENS, build_tokenizer
from cleaner.tiny.traces import TOOLS
from cleaner.tokens import TokenTrajectory


@pytest.fixture(scope="module")
def tokenizer(traces):
    traces, _ = traces
    probe = build_tokenizer(["x"], vocab_size=300)
    corpus = [
        probe.apply_chat_template(render_conversation(t), tools=TOOLS, tokenize=False)
        for t in traces
    ]
    return build_tokenizer(corpus, vocab_size=1024)


def test_tokenizer_keeps_special_tokens_and_splits_digits(tokenizer):
    for token in SPECIAL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    ids = tokenizer.encode("math.gcd(780, 461)", add_special_tokens=False)
    digits = [tokenizer.decode([i]) for i in ids if tokenizer.decode([i]).strip().isdigit()]
    assert digits == list("780461")


def test_ids_are_the_chat_template_rendering_of_the_conversation(traces, tokenizer):
    traces, _ = traces
    for trace in traces:
        tokens = trace_tokens(tokenizer, trace)
        messages = render_conversation(trace)
        expected = tokenizer.apply_chat_template(
            messages, tools=TOOLS, tokenize=True, return_dict=False
        )
        assert tokens.token_ids == expected
        assert tokenizer.decode(tokens.token_ids) == tokenizer.apply_chat_template(
            messages, tools=TOOLS, tokenize=False
        )


def test_loss_mask_covers_exactly_the_assistant_sampled_tokens(traces, tokenizer):
    traces, _ = traces
    fmt = HermesFormat()
    for trace in traces[:40]:
        tokens = trace_tokens(tokenizer, trace)
        trained = [s for s in tokens.segments if s.trained]
        assert [s.turn for s in trained] == list(range(len(trace.turns)))
        for segment, turn in zip(trained, trace.turns, strict=True):
            text = fmt.render(turn.reasoning, turn.code)
            # a tool call stops at </tool_call> (where the rollout stops); an answer ends its turn
            if turn.code is None:
                text += "<|im_end|>"
            assert tokenizer.decode(segment.token_ids) == text
        mask = tokens.loss_mask
        assert sum(mask) == sum(len(s.token_ids) for s in trained)
        untrained = tokenizer.decode(
            [t for t, m in zip(tokens.token_ids, mask, strict=True) if not m]
        )
        for turn in trace.turns:
            if turn.observation is not None:
                assert observation_text(turn.observation) in untrained
        # prompt first, untrained; it ends with the assistant header the model continues from
        assert tokens.segments[0].origin == "prompt"
        assert tokenizer.decode(tokens.segments[0].token_ids).endswith("<|im_start|>assistant\n")
        # lossless as a record
        assert TokenTrajectory.from_dict(tokens.to_dict()).token_ids == tokens.token_ids


def test_tool_results_are_spliced_with_the_formats_observation_ids(traces, tokenizer):
    traces, _ = traces
    fmt = HermesFormat()
    trace = next(t for t in traces if t.failed_calls)
    tool_segments = [s for s in trace_tokens(tokenizer, trace).segments if s.origin == "tool"]
    for segment, turn in zip(tool_segments, trace.turns, strict=False):
        assert segment.token_ids == fmt.observation_ids(
            tokenizer, observation_text(turn.observation)
        )
