"""The reference prompts, word for word.

Source: `recipe/cleaner/reward.py` (`CustomRLHFDataset`) in Tianshi-Xu/Open-CLEANER, itself
`recipe/demystify/reward.py` of Gen-Verse/Open-AgentRL (DemyAgent), whose prompts CLEANER reuses.
Spelling and spacing are theirs and deliberate here ("sumbit", the stray `"` after the LiveCodeBench
code fence, "\\n Here you need"): the SFT checkpoints were trained on exactly these strings. There is
no system message; the code_interpreter tool reaches the model through the chat template.

HumanEval and reasoning-gym are not in the reference recipes; their prompts below are ours, built
from the same pieces (marked as such).
"""

from __future__ import annotations

from typing import Any

MATH_INTRO = "Analyze and solve the following math problem step by step. \n\n"
TOOL_HINT = (
    "\n\nThe tool could be used for more precise and efficient calculation and could help you to verify "
    "your result before you reach the final answer."
)
AGENT_NOTE = (
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, then "
    "utilize the tools to help you solve the problem.**"
)
ANSWER_FORMAT = (
    "\nRemember once you make sure the current answer is your final answer, do not call the tools again "
    "and directly output the final answer in the following text format, the answer format must be: "
    "\\boxed{'The final answer goes here.'}."
)
MCQ_LETTER_NOTE = (
    "\n Here you need to put the final uppercase letter option of this problem into \\boxed{}"
)
UNITS_NOTE = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the "
    "numerical value of the final answer only, without any units."
)
UNITS_NOTE_SKYWORK = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the "
    "final numerical value of the final answer only, without any units."
)
CODE_SUBMIT_NOTE = (
    "\nBefore sumbit your code, you can utilize tools to check the correctness of your code, once you "
    "make sure the current code is correct, do not call the tools again and submit your code within "
    "```python\n# YOUR CODE HERE\n```."
)
LCB_INTRO = (
    "You will be given a question (problem specification) and will generate a correct Python program "
    "that matches the specification and passes all tests.\n\n"
)
LCB_STDIO_NOTE = (
    "\n\nRead the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
    "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python "
    'program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n"'
)


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def math_prompt(problem: str) -> str:
    """AIME 2024/2025 (`map_fn`)."""
    return MATH_INTRO + problem + TOOL_HINT + AGENT_NOTE + ANSWER_FORMAT


def mcq_prompt(problem: str, domain: str) -> str:
    """GPQA-Diamond (`map_fn_gpqa`); `problem` already lists the options, `domain` is e.g. Physics."""
    intro = f"Analyze and solve the following {domain} problem step by step. \n\n"
    return intro + problem + TOOL_HINT + AGENT_NOTE + ANSWER_FORMAT + MCQ_LETTER_NOTE


def livecodebench_prompt(problem: str, inputs: list[Any], outputs: list[Any]) -> str:
    """LiveCodeBench v6 (`map_lcb`); the examples are Python's `str()` of the two lists, as theirs are."""
    examples = (
        "\nHere are some input and output examples of the expected code:\nInput:"
        + str(inputs)
        + "\nOutput:\n"
        + str(outputs)
    )
    return LCB_INTRO + problem + examples + AGENT_NOTE + LCB_STDIO_NOTE + CODE_SUBMIT_NOTE


def training_prompt(content: str, data_source: str) -> str:
    """Open-AgentRL-30K rows (`map_fn2` for math_dapo / mega-science, `map_fn_skywork` otherwise).

    One deviation, to make it idempotent: a non-code row whose text already carries the math
    scaffold only gets the units note (what `map_fn2` does), and a code row that already asks for
    the code fence is left alone. The reference code picks one map function per file from its first
    row, so it can apply `map_fn2` to every row of the 30K file; this gives the same text on rows
    that are pre-wrapped and the `map_fn_skywork` text on bare ones.
    """
    if data_source in ("math_dapo", "mega-science"):
        return content + UNITS_NOTE
    if "code" in data_source:
        if "submit your code within" in content:
            return content
        return content + AGENT_NOTE + CODE_SUBMIT_NOTE
    if content.startswith(MATH_INTRO.strip()) or "the answer format must be" in content:
        return content if content.endswith("without any units.") else content + UNITS_NOTE
    return MATH_INTRO + content + TOOL_HINT + AGENT_NOTE + ANSWER_FORMAT + UNITS_NOTE_SKYWORK


def humaneval_prompt(code_prompt: str) -> str:
    """Ours: HumanEval's signature and docstring, then the reference code-submission notes."""
    return (
        "Complete the following Python function. Submit the complete function, with its signature and "
        "any imports it needs.\n\n```python\n"
        + code_prompt.rstrip()
        + "\n```"
        + AGENT_NOTE
        + CODE_SUBMIT_NOTE
    )


def gym_prompt(question: str) -> str:
    """Ours: a reasoning-gym question in the reference math prompt (boxed final answer)."""
    return math_prompt(question)
