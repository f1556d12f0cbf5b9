"""Token ids to text as they are sampled, for the call detector (no torch: adapters use it too)."""

from __future__ import annotations


class TextStream:
    """Text deltas of a growing token sequence, decoding only a short window of ids per token.

    A byte-level token can end inside a multi-byte character; the window's text then ends in U+FFFD
    and nothing is emitted until the following tokens complete the character.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._start = 0  # the window is ids[_start:]: it begins where all characters were complete
        self._emitted = 0  # the text of ids[:_emitted] has been emitted

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        emitted = self._decode(self._start, self._emitted)
        text = self._decode(self._start, len(self._ids))
        if len(text) <= len(emitted) or text.endswith("\ufffd"):
            return ""
        self._start, self._emitted = self._emitted, len(self._ids)
        return text[len(emitted) :]

    def flush(self) -> str:
        """Whatever is held back, incomplete characters included (as U+FFFD)."""
        emitted = self._decode(self._start, self._emitted)
        text = self._decode(self._start, len(self._ids))
        self._start = self._emitted = len(self._ids)
        return text[len(emitted) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(
            self._ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
