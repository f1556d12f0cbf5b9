from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chatml_tokenizer():
    """A real byte-level BPE tokenizer with the embedded ChatML tool template, built locally."""
    from cleaner.tiny.tokenizer import build_tokenizer

    corpus = [
        "Let me compute it with Python. print(x) def f(n): return n * 2 import math sympy numpy",
        'The answer is \\boxed{3}. {"name": "code_interpreter", "arguments": {"code": "print(1)"}}',
        "NameError: name 'x' is not defined Traceback line 1 ZeroDivisionError: division by zero",
    ] * 20
    return build_tokenizer(corpus, vocab_size=512)
