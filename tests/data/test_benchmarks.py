"""The benchmark loaders on small files written in the layouts of the public releases."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cleaner.data import (
    load_aime2024,
    load_aime2025,
    load_benchmark,
    load_gpqa_diamond,
    load_livecodebench_v6,
    load_open_agentrl_30k,
)
from cleaner.jsonl import RecordError

# The reference wording, spelled out here independently of cleaner.data.prompts so that an edit
# there is caught (source: recipe/cleaner/reward.py in Tianshi-Xu/Open-CLEANER).
AIME_PROMPT = (
    "Analyze and solve the following math problem step by step. \n\n"
    "Find $x$ if $x+1=43$."
    "\n\nThe tool could be used for more precise and efficient calculation and could help you to verify your "
    "result before you reach the final answer."
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, then utilize "
    "the tools to help you solve the problem.**"
    "\nRemember once you make sure the current answer is your final answer, do not call the tools again and "
    "directly output the final answer in the following text format, the answer format must be: "
    "\\boxed{'The final answer goes here.'}."
)


def write_parquet(path, columns, schema=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=schema), path)
    return path


@pytest.fixture
def eval_root(tmp_path):
    root = tmp_path / "Open-AgentRL-Eval"
    write_parquet(
        root / "aime2024/aime_2024_problems.parquet",
        {
            "ID": ["2024-I-1", "2024-I-2"],
            "Problem": ["Find $x$ if $x+1=43$.", "Compute $2^3$."],
            "Solution": ["...", "..."],
            "Answer": [42, 8],
            "data_source": ["AIME2024", "AIME2024"],
        },
    )
    write_parquet(
        root / "aime2025/aime_2025_problems.parquet",
        {
            "problem": ["Find $x$ if $x+1=43$."],
            "answer": ["042"],
            "data_source": ["AIME2025"],
        },
    )
    write_parquet(
        root / "gpqa-diamond/gpqa_diamond.parquet",
        {
            "problem": [
                "Which is a noble gas?\nA) N\nB) Ne\nC) Na\nD) Ni",
                "Which is a lepton?\nA) proton\nB) neutron\nC) electron\nD) pion",
            ],
            "solution": ["B", "C"],
            "domain": ["Chemistry", "Physics"],
            "data_source": ["gpqa_diamond", "gpqa_diamond"],
        },
    )
    reward_model = {
        "ground_truth": {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]},
        "style": "rule",
    }
    write_parquet(
        root / "livecodebench-v6/lcb_v6_2502_2505.parquet",
        {
            "problem": ["Read two integers and print their sum."],
            "reward_model": [json.dumps(reward_model)],
            "extra_info": [json.dumps({"question_id": "abc123", "difficulty": "easy"})],
            "ability": ["code"],
            "data_source": ["LiveCodeBench_v6"],
        },
    )
    return root


def test_aime2024(eval_root):
    problems = load_aime2024(eval_root)
    assert [p.id for p in problems] == ["aime2024/2024-I-1", "aime2024/2024-I-2"]
    assert [p.answer for p in problems] == ["42", "8"]
    assert problems[0].kind == "math" and problems[0].source == "aime2024"
    assert problems[0].prompt == [{"role": "user", "content": AIME_PROMPT}]


def test_aime2025_keeps_the_answer_text_and_numbers_rows_without_ids(eval_root):
    (problem,) = load_aime2025(eval_root)
    assert problem.id == "aime2025/0" and problem.answer == "042"
    assert problem.prompt[0]["content"] == AIME_PROMPT


def test_eval_loader_accepts_the_file_itself(eval_root):
    assert len(load_aime2024(eval_root / "aime2024/aime_2024_problems.parquet")) == 2


def test_gpqa_diamond(eval_root):
    problems = load_gpqa_diamond(eval_root)
    assert [p.answer for p in problems] == ["B", "C"]
    assert all(p.kind == "mcq" for p in problems)
    content = problems[1].prompt[0]["content"]
    assert content.startswith(
        "Analyze and solve the following Physics problem step by step. \n\nWhich is a lepton?"
    )
    assert content.endswith(
        "\\boxed{'The final answer goes here.'}.\n Here you need to put the final uppercase letter option of this "
        "problem into \\boxed{}"
    )
    assert problems[0].metadata["domain"] == "Chemistry"


def test_livecodebench_v6(eval_root):
    (problem,) = load_livecodebench_v6(eval_root)
    assert problem.id == "livecodebench-v6/abc123" and problem.kind == "code"
    assert problem.tests == {
        "type": "stdio",
        "cases": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"}],
    }
    content = problem.prompt[0]["content"]
    assert content.startswith(
        "You will be given a question (problem specification) and will generate a correct "
        "Python program that matches the specification and passes all tests.\n\nRead two"
    )
    # the examples are Python's str() of the lists, as in the reference
    assert (
        "\nHere are some input and output examples of the expected code:\nInput:['1 2\\n', '5 7\\n']\nOutput:\n"
        "['3\\n', '12\\n']" in content
    )
    assert '```python\n# YOUR CODE HERE\n"\nBefore sumbit your code' in content
    assert problem.metadata["extra_info"]["difficulty"] == "easy"


def test_missing_column_names_file_row_and_field(eval_root):
    path = write_parquet(
        eval_root / "aime2024/aime_2024_problems.parquet",
        {"Problem": ["ok", "also ok"], "Answer": [1, None]},
    )
    with pytest.raises(RecordError) as info:
        load_aime2024(eval_root)
    assert (info.value.line, info.value.field) == (2, "Answer")
    assert str(path) in str(info.value)


def test_bad_gpqa_letter(eval_root):
    write_parquet(
        eval_root / "gpqa-diamond/gpqa_diamond.parquet",
        {"problem": ["q"], "solution": ["Neon"], "domain": ["Chemistry"]},
    )
    with pytest.raises(RecordError) as info:
        load_gpqa_diamond(eval_root)
    assert (info.value.line, info.value.field) == (1, "solution")


@pytest.mark.parametrize(
    "reward_model, field",
    [
        ("{not json", "reward_model"),
        (json.dumps({"style": "rule"}), "reward_model.ground_truth"),
        (
            json.dumps({"ground_truth": {"inputs": ["1"], "outputs": []}}),
            "reward_model.ground_truth",
        ),
    ],
)
def test_bad_livecodebench_tests(eval_root, reward_model, field):
    write_parquet(
        eval_root / "livecodebench-v6/lcb_v6_2502_2505.parquet",
        {"problem": ["p"], "reward_model": [reward_model]},
    )
    with pytest.raises(RecordError) as info:
        load_livecodebench_v6(eval_root)
    assert (info.value.line, info.value.field) == (1, field)


def test_missing_benchmark_file_says_which_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="aime2025/aime_2025_problems.parquet"):
        load_aime2025(tmp_path)


TRAIN_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ]
)


def train_rows():
    def row(source, content, truth, index, ability="MATH"):
        return {
            "data_source": source,
            "prompt": [{"role": "user", "content": content}],
            "ability": ability,
            "reward_model": {"ground_truth": truth, "style": "rule"},
            "extra_info": {"index": index, "split": "train"},
        }

    stdio = json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})
    functional = json.dumps(
        {
            "import_prefix": "from typing import *\n",
            "entry_point": "Solution().double",
            "test_code": "def check(candidate):\n    assert candidate(2) == 4\n",
        }
    )
    return [
        row("math_dapo", "DAPO problem text", "34", 0),
        row("train-math-deepscaler", "What is 6*7?", "42", 1),
        row("train-code-taco-easy", "Double a number read from stdin.", stdio, 2, "code"),
        row("train-code-leetcode-Hard", "Implement double.", functional, 3, "code"),
        row("mega-science", "A science question", "9.8", 4),
    ]


def test_open_agentrl_30k(tmp_path):
    rows = train_rows()
    write_parquet(
        tmp_path / "Open-AgentRL-30K/Open-AgentRL-30K.parquet",
        {name: [r[name] for r in rows] for name in TRAIN_SCHEMA.names},
        schema=TRAIN_SCHEMA,
    )
    problems = load_open_agentrl_30k(tmp_path / "Open-AgentRL-30K")
    assert [p.id for p in problems] == [f"open-agentrl-30k/{i}" for i in range(5)]
    assert [p.kind for p in problems] == ["math", "math", "code", "code", "math"]
    assert [p.source for p in problems] == [r["data_source"] for r in rows]
    units = (
        "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the "
        "numerical value of the final answer only, without any units."
    )
    assert problems[0].prompt[0]["content"] == "DAPO problem text" + units
    assert problems[4].prompt[0]["content"] == "A science question" + units
    bare = problems[1].prompt[0]["content"]
    assert bare.startswith(
        "Analyze and solve the following math problem step by step. \n\nWhat is 6*7?\n\nThe tool"
    )
    assert bare.endswith(
        "should be the final numerical value of the final answer only, without any units."
    )
    code = problems[2].prompt[0]["content"]
    assert code.startswith(
        "Double a number read from stdin.\n\n**Note: You should first analyze the problem"
    )
    assert code.endswith("submit your code within ```python\n# YOUR CODE HERE\n```.")
    assert problems[0].answer == "34" and problems[1].answer == "42"
    assert problems[2].tests == {"type": "stdio", "cases": [{"input": "2\n", "output": "4\n"}]}
    assert problems[3].tests["type"] == "functional"
    assert problems[3].tests["entry_point"] == "Solution().double"
    assert problems[3].tests["test"].startswith("def check(candidate):")


def test_open_agentrl_30k_prompt_is_idempotent_on_prewrapped_rows(tmp_path):
    wrapped = load_open_agentrl_30k(write_30k(tmp_path / "a.parquet", [train_rows()[1]]))[0].prompt[
        0
    ]["content"]
    again = train_rows()[1]
    again["prompt"] = [{"role": "user", "content": wrapped}]
    assert (
        load_open_agentrl_30k(write_30k(tmp_path / "b.parquet", [again]))[0].prompt[0]["content"]
        == wrapped
    )


def write_30k(path, rows):
    return write_parquet(
        path, {name: [r[name] for r in rows] for name in TRAIN_SCHEMA.names}, schema=TRAIN_SCHEMA
    )


def test_open_agentrl_30k_bad_row(tmp_path):
    rows = train_rows()
    rows[2]["reward_model"] = {"ground_truth": json.dumps({"inputs": "2"}), "style": "rule"}
    path = write_30k(tmp_path / "train.parquet", rows)
    with pytest.raises(RecordError) as info:
        load_open_agentrl_30k(path)
    assert (info.value.line, info.value.field) == (3, "reward_model.ground_truth")


def test_load_benchmark_by_name(eval_root):
    assert len(load_benchmark("aime2024", root=eval_root)) == 2
    assert len(load_benchmark("gym:gcd,lcm", size=3, seed=1)) == 6
    with pytest.raises(ValueError, match="root"):
        load_benchmark("gpqa-diamond")
    with pytest.raises(ValueError, match="unknown data"):
        load_benchmark("mmlu")
