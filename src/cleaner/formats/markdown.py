"""The `markdown` tool-call format (ToRL / SimpleTIR style).

The assistant writes a fenced python block; it is executed and its result is appended to the same
assistant message as a fenced `output` block, after which generation continues.
"""

from __future__ import annotations

from cleaner.formats.base import CallDetector, ParsedTurn, split_call

OPEN, CLOSE = "```python", "\n```"


class MarkdownFormat:
    name = "markdown"
    opener, closer = OPEN, CLOSE

    def detector(self) -> CallDetector:
        return CallDetector(OPEN, CLOSE)

    def parse(self, text: str) -> ParsedTurn:
        reasoning, body, closed = split_call(text, OPEN, CLOSE)
        if body is None:
            return ParsedTurn(reasoning=text, code=None)
        if not closed:
            return ParsedTurn(
                reasoning, code=body.strip("\n"), invalid="unterminated code block: no closing ```"
            )
        info, newline, code = body.partition("\n")
        if info.strip() not in ("", "3"):  # ```python3 is fine, ```python print(1) is not
            return ParsedTurn(
                reasoning,
                code=(info + newline + code).strip(),
                invalid="the code block must start on the line after ```python",
            )
        return ParsedTurn(reasoning, code=code)

    def render(self, reasoning: str, code: str | None) -> str:
        if code is None:
            return reasoning
        sep = "\n" if reasoning else ""
        return f"{reasoning}{sep}{OPEN}\n{code}{CLOSE}"

    def observation_ids(self, tokenizer, text: str, *, turn_ended: bool = False) -> list[int]:
        """The result as a fenced output block inside the same assistant message."""
        if turn_ended:
            raise ValueError(
                "the markdown format continues the assistant turn; it cannot follow its end"
            )
        return tokenizer.encode(f"\n```output\n{text}\n```\n", add_special_tokens=False)
