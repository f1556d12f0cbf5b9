"""The `hermes` tool-call format (Qwen and the reference recipes).

The assistant writes its reasoning, then
    <tool_call>
    {"name": "code_interpreter", "arguments": {"code": "..."}}
    </tool_call>
and the result comes back as a `tool` message rendered by the model's chat template (Qwen: a user
turn wrapped in <tool_response>).
"""

from __future__ import annotations

import json
from typing import Any

from cleaner.formats.base import TOOL_NAME, CallDetector, ParsedTurn, split_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SENTINEL = "\u2063CLEANER-SPLICE\u2063"  # invisible separator: never in real assistant text


def render_call(code: str) -> str:
    """The JSON body of a tool call for `code`."""
    return json.dumps({"name": TOOL_NAME, "arguments": {"code": code}}, ensure_ascii=False)


def _code_from_call(body: str) -> tuple[str | None, str | None]:
    """(code, None) for a well-formed call body, (None, why) otherwise."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
    if not isinstance(call, dict):
        return None, "tool call must be a JSON object with 'name' and 'arguments'"
    if call.get("name") != TOOL_NAME:
        return None, f"unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME!r}"
    arguments: Any = call.get("arguments")
    if isinstance(arguments, str):  # OpenAI-style stringified arguments
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "tool call 'arguments' is a string that is not valid JSON"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("code"), str):
        return None, "tool call 'arguments' must be an object with a string 'code'"
    return arguments["code"], None


class HermesFormat:
    name = "hermes"
    opener, closer = OPEN, CLOSE

    def detector(self) -> CallDetector:
        return CallDetector(OPEN, CLOSE)

    def parse(self, text: str) -> ParsedTurn:
        """Split one assistant message into reasoning and the first tool call (if any)."""
        reasoning, body, closed = split_call(text, OPEN, CLOSE)
        if body is None:
            return ParsedTurn(reasoning=text, code=None)
        if not closed:
            return ParsedTurn(
                reasoning, code=body.strip(), invalid=f"unterminated tool call: no {CLOSE}"
            )
        body = body.strip()
        code, why = _code_from_call(body)
        if why is not None:
            return ParsedTurn(reasoning, code=body, invalid=why)
        return ParsedTurn(reasoning, code=code)

    def render(self, reasoning: str, code: str | None) -> str:
        """Assistant text for a turn; `parse(render(r, c))` gives back (r, c) for stripped r."""
        if code is None:
            return reasoning
        sep = "\n" if reasoning else ""
        return f"{reasoning}{sep}{OPEN}\n{render_call(code)}\n{CLOSE}"

    def observation_ids(self, tokenizer, text: str, *, turn_ended: bool = False) -> list[int]:
        """Token ids to splice after a tool call: the end of the assistant turn, the tool message and
        the next assistant header, exactly as the chat template renders them.

        The template is rendered around a sentinel assistant message and only what follows the
        sentinel is tokenized, so the history's ids are never rebuilt from text. `turn_ended` says the
        sampled ids already end with the end-of-turn token (then it is not added twice).
        """
        messages = [
            {"role": "user", "content": "."},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "tool", "content": text},
        ]
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        if rendered.count(_SENTINEL) != 1:
            raise ValueError("the chat template does not render assistant content verbatim")
        delta = rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]
        if turn_ended:
            end_of_turn = tokenizer.eos_token or ""
            if not delta.startswith(end_of_turn):
                raise ValueError(
                    f"the chat template's assistant turn does not end with {end_of_turn!r}"
                )
            delta = delta[len(end_of_turn) :]
        return tokenizer.encode(delta, add_special_tokens=False)
