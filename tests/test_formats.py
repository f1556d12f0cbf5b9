import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.formats import get_format, observation_text, truncate_middle
from cleaner.trajectory import Observation

FORMATS = ["hermes", "markdown"]
code_texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40
).filter(lambda c: "</tool_call>" not in c and "```" not in c and "<tool_call>" not in c)


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=150, deadline=None)
@given(
    reasoning=st.text(alphabet="ab c\n.", max_size=20).map(str.rstrip),
    code=code_texts,
    cuts=st.lists(st.integers(0, 400), max_size=12),
    tail=st.text(alphabet="xyz", max_size=10),
)
def test_call_end_is_found_however_the_text_is_chunked(name, reasoning, code, cuts, tail):
    fmt = get_format(name)
    call = fmt.render(reasoning, code)
    text = call + tail
    detector = fmt.detector()
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    ends = [detector.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert detector.end == len(call)
    assert ends[-1] == len(call)
    first = next(i for i, e in enumerate(ends) if e is not None)
    assert (
        bounds[first + 1] >= len(call) > bounds[first]
    )  # reported as soon as the call was complete
    parsed = fmt.parse(text[: detector.end])
    assert (parsed.reasoning, parsed.code, parsed.invalid) == (reasoning, code, None)


@pytest.mark.parametrize("name", FORMATS)
def test_no_call_is_a_final_answer(name):
    fmt = get_format(name)
    detector = fmt.detector()
    assert detector.feed("The answer is \\boxed{7}.") is None and not detector.call_open
    parsed = fmt.parse("The answer is \\boxed{7}.")
    assert (
        parsed.code is None
        and parsed.invalid is None
        and parsed.reasoning == "The answer is \\boxed{7}."
    )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"name": "code_interpreter", "arguments": {"code": "print(1)"', "not valid JSON"),
        ('["print(1)"]', "JSON object"),
        ('{"name": "browser", "arguments": {"code": "print(1)"}}', "unknown tool 'browser'"),
        ('{"name": "code_interpreter", "arguments": {"source": "print(1)"}}', "string 'code'"),
        ('{"name": "code_interpreter", "arguments": {"code": 3}}', "string 'code'"),
        ('{"name": "code_interpreter", "arguments": "{not json"}', "string that is not valid JSON"),
    ],
)
def test_malformed_hermes_calls_are_invalid_not_exceptions(body, why):
    parsed = get_format("hermes").parse(f"Let me try.\n<tool_call>\n{body}\n</tool_call>")
    assert parsed.invalid is not None and why in parsed.invalid
    assert parsed.code == body and parsed.reasoning == "Let me try."


def test_hermes_accepts_stringified_arguments():
    args = json.dumps({"code": "print(2)"})
    parsed = get_format("hermes").parse(
        '<tool_call>\n{"name": "code_interpreter", "arguments": '
        + json.dumps(args)
        + "}\n</tool_call>"
    )
    assert parsed.code == "print(2)" and parsed.invalid is None


@pytest.mark.parametrize(
    ("name", "text"),
    [("hermes", 'x\n<tool_call>\n{"name": "code_in'), ("markdown", "x\n```python\nprint(1)")],
)
def test_an_unterminated_call_is_invalid(name, text):
    fmt = get_format(name)
    detector = fmt.detector()
    assert detector.feed(text) is None and detector.call_open
    parsed = fmt.parse(text)
    assert parsed.invalid and "unterminated" in parsed.invalid and parsed.code is not None


def test_markdown_block_must_start_on_a_new_line():
    parsed = get_format("markdown").parse("```python print(1)\n```")
    assert parsed.invalid and parsed.code == "print(1)"
    assert get_format("markdown").parse("```python3\nprint(1)\n```").code == "print(1)"


def test_truncation_keeps_head_and_tail():
    text = "".join(str(i % 10) for i in range(1000))
    out = truncate_middle(text, 256)
    assert (
        out.startswith(text[:128]) and out.endswith(text[-128:]) and "744 characters omitted" in out
    )
    assert truncate_middle("short", 256) == "short"


def test_observation_text_shows_errors_and_says_when_nothing_printed():
    assert observation_text(Observation("ok", stdout="42\n")) == "42\n"
    assert "no output" in observation_text(Observation("ok"))
    assert (
        observation_text(
            Observation(
                "error", stderr="NameError: name 'x' is not defined", error_type="NameError"
            )
        )
        == "NameError: name 'x' is not defined"
    )
    assert "TimeoutError" in observation_text(Observation("timeout"))
    assert "memory" in observation_text(Observation("killed", reason="memory"))
    assert len(observation_text(Observation("ok", stdout="x" * 5000), max_chars=100)) < 160


# --- splicing tool results onto token ids through a real chat template ---------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run Python code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


def test_spliced_ids_equal_the_template_rendering_of_the_whole_conversation(chatml_tokenizer):
    tok, fmt = chatml_tokenizer, get_format("hermes")
    messages = [
        {"role": "system", "content": "Solve with Python."},
        {"role": "user", "content": "What is 1+2?"},
    ]
    ids = tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    turns = [
        ("Let me compute it.", "print(1 + 2)", "3\n"),
        ("Check again.", "x = 1\nprint(x + 2)", "3\n"),
    ]
    for reasoning, code, output in turns:
        ids = ids + tok.encode(fmt.render(reasoning, code), add_special_tokens=False)  # as sampled
        ids = ids + fmt.observation_ids(tok, output)  # spliced, history untouched
    ids = ids + tok.encode("The answer is \\boxed{3}.<|im_end|>\n", add_special_tokens=False)

    conversation = list(messages)
    for reasoning, code, output in turns:
        conversation.append(
            {
                "role": "assistant",
                "content": reasoning,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "code_interpreter", "arguments": {"code": code}},
                    }
                ],
            }
        )
        conversation.append({"role": "tool", "content": output})
    conversation.append({"role": "assistant", "content": "The answer is \\boxed{3}."})
    expected = tok.apply_chat_template(conversation, tools=TOOLS, tokenize=True, return_dict=False)
    assert tok.decode(ids) == tok.decode(expected)
    assert ids == expected


def test_splicing_after_an_end_of_turn_token_does_not_repeat_it(chatml_tokenizer):
    fmt = get_format("hermes")
    with_end = fmt.observation_ids(chatml_tokenizer, "3")
    without = fmt.observation_ids(chatml_tokenizer, "3", turn_ended=True)
    assert with_end == chatml_tokenizer.encode("<|im_end|>", add_special_tokens=False) + without
    assert chatml_tokenizer.decode(without).startswith("\n<|im_start|>user\n<tool_response>\n3\n")


def test_markdown_observation_is_an_output_block(chatml_tokenizer):
    ids = get_format("markdown").observation_ids(chatml_tokenizer, "3")
    assert chatml_tokenizer.decode(ids) == "\n```output\n3\n```\n"
