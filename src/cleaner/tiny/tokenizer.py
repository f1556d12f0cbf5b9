"""The embedded model's tokenizer: a byte-level BPE trained locally, with a ChatML chat template
that renders tool calls and results the way Qwen's does, so one code path serves the tiny model and
Qwen3-4B alike."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def chat_template() -> str:
    return (
        resources.files("cleaner.tiny").joinpath("chat_template.jinja").read_text(encoding="utf-8")
    )


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus`; every byte is in the alphabet, so any text encodes."""
    bpe = Tokenizer(models.BPE())
    # One token per digit, as Qwen's tokenizer does: a small model copies numbers digit by digit
    # instead of having to learn thousands of rare multi-digit tokens.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
    )
