"""The code reward against the real sandbox: HumanEval's canonical solutions, stdio and fn_name cases,
timeouts, and programs that try to fake a pass."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from cleaner.data import Problem, load_humaneval
from cleaner.jsonl import RecordError
from cleaner.rewards import (
    last_python_block,
    score_code,
    score_code_sync,
    score_file,
    score_problem,
    score_problem_async,
)
from cleaner.rewards.code import outputs_match, seal_test, values_match
from cleaner.sandbox import Sandbox, SyncSandbox


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n"


@pytest.fixture(scope="module")
def sb():
    with SyncSandbox(workers=2) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


def canonical(problem: Problem) -> str:
    return problem.metadata["code_prompt"] + problem.metadata["canonical_solution"]


# A small functional problem for the attacks: the right answer is 2 * x.
DOUBLE = {
    "type": "functional",
    "entry_point": "double",
    "test": "def check(candidate):\n"
    "    assert candidate(2) == 4\n"
    "    assert candidate(-3) == -6\n"
    "    assert abs(candidate(0.5) - 1.0) < 1e-9\n",
}
WRONG_DOUBLE = "def double(x):\n    return x + 1\n"


# ------------------------------------------------------------------ the program


def test_last_python_block():
    assert last_python_block("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert last_python_block("```Python3\nc = 3\n```") == "c = 3\n"
    assert last_python_block("```text\nnot code\n```\n```\nbare\n```") is None
    assert last_python_block("no code at all") is None
    # The final block is cut off: the response has no answer, whatever it wrote before.
    assert last_python_block("```python\na = 1\n```\n```python\nb = 2") is None
    # Fences inside the code do not end it early unless they stand alone on a line.
    assert last_python_block('```python\ns = "```x"\n```') == 's = "```x"\n'


def test_no_code_block_is_minus_one(sb):
    score = score_code_sync("The answer is to double it.", DOUBLE, sb)
    assert (score.correct, score.reward, score.score, score.predicted) == (False, -1.0, 0.0, None)
    assert score.note == "no python code block"


# ------------------------------------------------------------------ HumanEval


async def test_humaneval_canonical_solutions_all_pass_and_broken_ones_do_not(humaneval):
    assert len(humaneval) == 164
    async with Sandbox(workers=2) as sandbox:
        start = time.monotonic()
        scores = await asyncio.gather(
            *(score_code(fenced(canonical(p)), p.tests, sandbox) for p in humaneval)
        )
        elapsed = time.monotonic() - start
        failed = {p.id: s.note for p, s in zip(humaneval, scores, strict=True) if s.score != 1.0}
        assert failed == {}
        assert all(s.correct and s.reward == 1.0 for s in scores)
        assert elapsed < 45, f"164 canonical solutions took {elapsed:.1f} s"

        # Every return replaced by `return None`: no problem passes.
        no_return = [
            fenced(re.sub(r"\breturn\b.*", "return None", canonical(p))) for p in humaneval
        ]
        scores = await asyncio.gather(
            *(
                score_code(r, p.tests, sandbox, timeout=3)
                for r, p in zip(no_return, humaneval, strict=True)
            )
        )
        assert [p.id for p, s in zip(humaneval, scores, strict=True) if s.score == 1.0] == []
        assert all(s.reward == 0.0 and not s.correct for s in scores)

        # Truncated halfway through the solution, on a sample: fails too.
        sample = humaneval[::8]
        truncated = []
        for p in sample:
            lines = p.metadata["canonical_solution"].rstrip().splitlines()
            truncated.append(
                fenced(p.metadata["code_prompt"] + "\n".join(lines[: len(lines) // 2]))
            )
        scores = await asyncio.gather(
            *(
                score_code(r, p.tests, sandbox, timeout=2)
                for r, p in zip(truncated, sample, strict=True)
            )
        )
        assert [p.id for p, s in zip(sample, scores, strict=True) if s.score == 1.0] == []


def test_humaneval_helpers_given_in_the_prompt_are_used(sb, humaneval):
    # HumanEval/38 tests decode_cyclic with the program's own encode_cyclic.
    cyclic = humaneval[38]
    assert score_code_sync(fenced(canonical(cyclic)), cyclic.tests, sb).correct
    only_decoder = canonical(cyclic).split("def decode_cyclic")[1]
    assert not score_code_sync(fenced("def decode_cyclic" + only_decoder), cyclic.tests, sb).correct


# ------------------------------------------------------------------ stdio


def stdio(*cases: tuple[str, str]) -> dict:
    return {"type": "stdio", "cases": [{"input": i, "output": o} for i, o in cases]}


def test_stdio_cases_read_stdin_every_way(sb):
    tests = stdio(("3 4\n", "7\n"), ("10 -2\n", "8"), ("1 1\n", "2\n\n\n"))
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)",
        "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
        "import sys\na, b = map(int, sys.stdin.buffer.readline().split())\nprint(a + b)",
        "a, b = map(int, open(0).read().split())\nprint(a + b)",
        "import sys\ndef main():\n    print(sum(map(int, sys.stdin.readline().split())))\n"
        "if __name__ == '__main__':\n    main()",
    ]
    for program in programs:
        score = score_code_sync(fenced(program), tests, sb)
        assert (score.correct, score.score, score.reward) == (True, 1.0, 1.0), program


def test_stdio_fraction_and_failures(sb):
    tests = stdio(("1\n", "1\n"), ("2\n", "4\n"), ("3\n", "9\n"))
    square_but_wrong_for_3 = "n = int(input())\nprint(n * n if n < 3 else 0)"
    score = score_code_sync(fenced(square_but_wrong_for_3), tests, sb)
    assert (score.correct, score.score, score.reward) == (False, 2 / 3, 2 / 3)
    assert score.note == "2/3 tests passed; test 2: wrong answer"
    crash = "n = int(input())\nprint(n * n)\nraise ValueError('after printing')"
    score = score_code_sync(fenced(crash), tests, sb)
    assert score.score == 0.0 and "ValueError" in score.note


def test_stdio_comparison_is_line_wise_trimmed_and_numeric_tolerant(sb):
    assert outputs_match("  1 2 \n3\n\n", "1 2\n3")
    assert outputs_match("0.333333333\n", "0.3333333333333333")
    assert outputs_match("1e6 2.0000000001\n", "1000000 2")
    assert outputs_match("1000000000.5", "1000000000.0")  # 5e-10 relative
    assert not outputs_match("0.334\n", "0.333")
    assert not outputs_match("1 2", "1\n2")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("Yes", "YES")
    assert not outputs_match("", "0")
    tests = stdio(("3\n", "0.3333333\n"), ("8\n", "0.125\n"))
    assert score_code_sync(fenced("print(1 / int(input()))"), tests, sb).correct
    assert score_code_sync(fenced("print(f'{1 / int(input()):.9f}')"), tests, sb).correct
    score = score_code_sync(fenced("print(f'{1 / int(input()):.2f}')"), tests, sb)
    assert score.score == 0.0


def test_large_input_and_output(sb):
    numbers = list(range(200_000))
    tests = stdio(
        (f"{len(numbers)}\n" + " ".join(map(str, numbers)) + "\n", "\n".join(map(str, numbers)))
    )
    program = "import sys\ndata = sys.stdin.buffer.read().split()\nprint('\\n'.join(x.decode() for x in data[1:]))"
    assert score_code_sync(fenced(program), tests, sb).correct


# ------------------------------------------------------------------ fn_name (LeetCode-style cases)


def test_fn_name_cases_call_the_method(sb):
    tests = {
        "type": "stdio",
        "fn_name": "twoSum",
        "cases": [
            {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]"},
            {"input": "[3, 2, 4]\n6", "output": "[1, 2]"},
            {"input": "[3, 3]\n6", "output": "[0, 1]"},
        ],
    }
    solution = (
        "from typing import List\n"
        "class Solution:\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n"
        "        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n"
        "                return (seen[target - x], i)\n"  # a tuple matches a JSON list
        "            seen[x] = i\n"
    )
    assert score_code_sync(fenced(solution), tests, sb).correct
    first_only = solution.replace("return (seen[target - x], i)", "return [0, 1]")
    assert score_code_sync(fenced(first_only), tests, sb).score == pytest.approx(2 / 3)
    top_level = "def twoSum(nums, target):\n    return [0, 1]\n"
    assert score_code_sync(fenced(top_level), tests, sb).score == pytest.approx(2 / 3)


def test_values_match():
    assert values_match((1, 2), [1, 2])
    assert values_match(0.1 + 0.2, 0.3)
    assert values_match({"a": [1.0]}, {"a": [1]})
    assert not values_match(True, 1)
    assert not values_match(1, True)
    assert not values_match([1, 2], [2, 1])
    assert not values_match("1", 1)


# ------------------------------------------------------------------ functional with a prefix

LINKED_LIST_PREFIX = """from typing import *

class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

def list_node(values):
    head = ListNode()
    tail = head
    for v in values:
        tail.next = ListNode(v)
        tail = tail.next
    return head.next

def is_same_list(a, b):
    while a and b:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None
"""

REVERSE_LIST = {
    "type": "functional",
    "entry_point": "Solution().reverseList",
    "import_prefix": LINKED_LIST_PREFIX,
    "test": "def check(candidate):\n"
    "    assert is_same_list(candidate(head=list_node([1, 2, 3])), list_node([3, 2, 1]))\n"
    "    assert candidate(head=None) is None\n",
}

REVERSE_SOLUTION = """class Solution:
    def reverseList(self, head):
        previous = None
        while head:
            head.next, previous, head = previous, head, head.next
        return previous
"""


def test_leetcode_style_functional_with_prefix_objects(sb):
    assert score_code_sync(fenced(REVERSE_SOLUTION), REVERSE_LIST, sb).correct
    # The model may re-declare the prefix's class (it is commented in LeetCode prompts).
    redeclared = "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n\n"
    assert score_code_sync(fenced(redeclared + REVERSE_SOLUTION), REVERSE_LIST, sb).correct
    identity = "class Solution:\n    def reverseList(self, head):\n        return head\n"
    assert not score_code_sync(fenced(identity), REVERSE_LIST, sb).correct


def test_in_place_changes_to_arguments_are_replayed(sb):
    tests = {
        "type": "functional",
        "entry_point": "sort_in_place",
        "test": "def check(candidate):\n"
        "    nums = [3, 1, 2]\n"
        "    assert candidate(nums) is None\n"
        "    assert nums == [1, 2, 3]\n",
    }
    assert score_code_sync(fenced("def sort_in_place(a):\n    a.sort()"), tests, sb).correct
    sorted_copy = "def sort_in_place(a):\n    a = sorted(a)"
    assert not score_code_sync(fenced(sorted_copy), tests, sb).correct


# ------------------------------------------------------------------ time


def test_a_hanging_program_costs_at_most_its_timeout(sb):
    start = time.monotonic()
    score = score_code_sync(
        fenced("def double(x):\n    while True:\n        pass"), DOUBLE, sb, timeout=1
    )
    assert (score.score, score.reward) == (0.0, 0.0) and "timeout" in score.note
    assert time.monotonic() - start < 4

    # Eight stdio cases on two workers: two time out together, the rest are not started.
    tests = stdio(*[(f"{i}\n", f"{i}\n") for i in range(8)])
    start = time.monotonic()
    score = score_code_sync(fenced("while True:\n    pass"), tests, sb, timeout=1)
    assert score.score == 0.0 and "timeout" in score.note
    assert time.monotonic() - start < 4


# ------------------------------------------------------------------ attacks: none may pass

FUNCTIONAL_ATTACKS = {
    "sys.exit(0) before the test": "import sys\nsys.exit(0)\n" + WRONG_DOUBLE,
    "os._exit(0) before the test": "import os\nos._exit(0)\n" + WRONG_DOUBLE,
    "SystemExit(0) raised inside check": "def double(x):\n    raise SystemExit(0)\n",
    "os._exit(0) inside check": "def double(x):\n    import os\n    os._exit(0)\n",
    "print patched to nothing": "import builtins\nbuiltins.print = lambda *a, **k: None\n"
    + WRONG_DOUBLE,
    "builtins the test uses patched": "import builtins\nbuiltins.abs = lambda x: 0\n"
    "def double(x):\n    return 2 * x if isinstance(x, int) else 0\n",
    "an always-equal result": "class Anything:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __sub__(self, other):\n        return 0\n"
    "def double(x):\n    return Anything()\n",
    "an int subclass equal to everything": "class Liar(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __sub__(self, other):\n        return 0\n"
    "    __hash__ = int.__hash__\n"
    "def double(x):\n    return Liar(0)\n",
    "a fake PASS marker printed": "print('PASS')\nprint('all tests passed')\n" + WRONG_DOUBLE,
    "a forged record of the calls, then exit": "import sys, os, json\n"
    "marker = sys._getframe(1).f_locals['_marker']\n"
    "print(marker + json.dumps({'records': [], 'provided': {}}))\n"
    "sys.stdout.flush()\nos._exit(0)\n",
    "check replaced through the caller's namespace": "import sys\n"
    "namespace = sys._getframe(0).f_globals\n"
    "class Check(dict):\n    pass\n"
    "import builtins\n"
    "real_exec = builtins.exec\n"
    "def exec_without_asserts(code, *args):\n"
    "    real_exec(code, *args)\n"
    "    if 'check' in namespace:\n"
    "        namespace['check'] = lambda candidate: None\n"
    "builtins.exec = exec_without_asserts\n" + WRONG_DOUBLE,
    "a trace hook that skips check's asserts": "import sys\n"
    "def double(x):\n    return 2 * x if isinstance(x, float) else x + 1\n"
    "def tracer(frame, event, arg):\n"
    "    if frame.f_code.co_name != 'check':\n        return None\n"
    "    def lines(frame, event, arg):\n"
    "        if event == 'line' and frame.f_lineno == 2:\n"
    "            frame.f_lineno = 4  # jump to the one assert this answer passes\n"
    "        return lines\n"
    "    return lines\n"
    "sys.settrace(tracer)\n",
}


# Early exits are caught in the program run (it did not complete); everything else completes it,
# and only the replayed check, with no model code in its process, catches it.
EXITS = {name for name in FUNCTIONAL_ATTACKS if "exit" in name.lower()}


@pytest.mark.parametrize("attack", list(FUNCTIONAL_ATTACKS))
def test_functional_attacks_do_not_pass(sb, attack):
    score = score_code_sync(fenced(FUNCTIONAL_ATTACKS[attack]), DOUBLE, sb, timeout=3)
    assert not score.correct and score.score == 0.0, (attack, score.note)
    stage = "program run" if attack in EXITS else "replayed check"
    assert f"test 0: {stage}: " in score.note, (attack, score.note)


def test_functional_attacks_are_real_tricks(sb):
    """The same tricks do fool a naive in-process harness (program, test, check, then 'PASS')."""
    naive = "{program}\n{test}\ncheck({entry_point})\nprint('PASS')\n"
    fooled = 0
    for name in ("an always-equal result", "builtins the test uses patched"):
        code = naive.format(program=FUNCTIONAL_ATTACKS[name], **DOUBLE)
        result = sb.run(code)
        fooled += result.ok and result.stdout.strip().endswith("PASS")
    code = naive.format(program=FUNCTIONAL_ATTACKS["sys.exit(0) before the test"], **DOUBLE)
    result = sb.run(code)
    fooled += result.ok  # the sandbox's status alone would call it a success
    assert fooled == 3


def test_prefix_helpers_redefined_by_the_program_are_not_trusted(sb):
    cheat = "def is_same_list(a, b):\n    return True\n\n" + (
        "class Solution:\n    def reverseList(self, head):\n        return head\n"
    )
    assert not score_code_sync(fenced(cheat), REVERSE_LIST, sb).correct
    eq_cheat = (
        "class ListNode:\n"
        "    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "class Solution:\n    def reverseList(self, head):\n        return head\n"
    )
    assert not score_code_sync(fenced(eq_cheat), REVERSE_LIST, sb).correct


STDIO_ATTACKS = {
    "sys.exit(0) without output": "import sys\nsys.exit(0)",
    "os._exit(0) without output": "import os\nos._exit(0)",
    "a PASS marker": "print('PASS')",
    "print patched, then nothing": "import builtins\nbuiltins.print = lambda *a, **k: None\nprint(7)",
    "the input echoed": "import sys\nprint(sys.stdin.read())",
}


@pytest.mark.parametrize("attack", list(STDIO_ATTACKS))
def test_stdio_attacks_do_not_pass(sb, attack):
    tests = stdio(("3 4\n", "7\n"), ("1 2\n", "3\n"))
    score = score_code_sync(fenced(STDIO_ATTACKS[attack]), tests, sb)
    assert score.score == 0.0, (attack, score.note)


def test_fn_name_attacks_do_not_pass(sb):
    tests = {
        "type": "stdio",
        "fn_name": "add",
        "cases": [{"input": "3\n4", "output": "7"}, {"input": "1\n2", "output": "3"}],
    }
    forged = (
        "import sys, os\n"
        "marker = sys._getframe(1).f_locals['_marker']\n"
        "def add(a, b):\n"
        "    print(marker + '\"PASS\"')\n"
        "    os._exit(0)\n"
    )
    always_equal = "class Anything:\n    def __eq__(self, o):\n        return True\n" + (
        "def add(a, b):\n    return Anything()\n"
    )
    for program in (forged, always_equal, "import sys\nsys.exit(0)"):
        assert score_code_sync(fenced(program), tests, sb).score == 0.0
    assert score_code_sync(fenced("def add(a, b):\n    return a + b"), tests, sb).correct


CONSTANT_READER = (
    "import sys, dis\n"
    "def double(x):\n"
    "    caller = sys._getframe(1)\n"
    "    while caller.f_code.co_name != 'check':\n"
    "        caller = caller.f_back\n"
    "    ops = list(dis.get_instructions(caller.f_code))\n"
    "    here = next(i for i, op in enumerate(ops) if op.offset >= caller.f_lasti)\n"
    "    for op in ops[here:]:\n"
    "        if op.opname == 'LOAD_CONST' and isinstance(op.argval, (int, float)):\n"
    "            return op.argval\n"
)


def test_expected_values_of_asserts_never_enter_the_program_run(sb):
    """`check`'s asserts are sealed: the program run gets only their calls, so a program that reads
    the expected value out of `check`'s code finds nothing to return."""
    tests = {
        "type": "functional",
        "entry_point": "double",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n",
    }
    assert not score_code_sync(fenced(CONSTANT_READER), tests, sb).correct


def test_seal_test():
    test = (
        "def helper(f):\n    return f(1) == 2\n"
        "def check(candidate):\n"
        "    assert candidate(2) == 4, 'message'\n"
        "    for x in range(3):\n"
        "        assert abs(candidate(x) - 2 * x) < 1e-9\n"
        "    assert is_same(candidate(head=make([1])), make([9]))\n"
        "    assert poly([1, 2], candidate(1)) == 0\n"
        "    assert helper(candidate)\n"
        "    assert all(candidate(x) == 2 * x for x in range(3))\n"
    )
    sealed = seal_test(test, prefix="def make(v): ...\ndef is_same(a, b): ...\n")
    assert sealed.splitlines()[3:] == [
        "def check(candidate):",
        "    candidate(2)",
        "    for x in range(3):",
        "        candidate(x)",
        "    candidate(head=make([1]))",
        "    poly([1, 2], candidate(1))",  # a program function (not the test's, prefix's or builtin)
        "    assert helper(candidate)",  # the candidate passed as a value: kept whole
        "    assert all((candidate(x) == 2 * x for x in range(3)))",  # calls in a comprehension
    ]
    assert seal_test("not python (") == "not python ("


def test_replay_matches_calls_made_in_another_order(sb):
    # The program run calls both sides of `or`; the check stops at the first.
    tests = {
        "type": "functional",
        "entry_point": "double",
        "test": "def check(candidate):\n"
        "    assert candidate(1) == 2 or candidate(5) == 0\n"
        "    assert candidate(3) + candidate(3) == 12\n",
    }
    assert score_code_sync(fenced("def double(x):\n    return 2 * x"), tests, sb).correct


def test_known_limit_expected_values_held_outside_asserts_can_be_read(sb):
    """Documented limit (module docstring): what `check` computes outside its asserts runs in the
    program's process, so a program can read an expected value held in a variable. Stdio and
    fn_name tests do not have this limit: their expected outputs never enter the sandbox."""
    reader = (
        "import sys\n"
        "def double(x):\n"
        "    return sys._getframe(1).f_back.f_locals['expected']\n"  # recorder, then check
    )
    tests = {
        "type": "functional",
        "entry_point": "double",
        "test": "def check(candidate):\n    expected = 4\n    assert candidate(2) == expected\n",
    }
    assert score_code_sync(fenced(reader), tests, sb).correct


# ------------------------------------------------------------------ wiring


async def test_score_code_through_the_service(humaneval):
    from aiohttp.test_utils import TestServer

    from cleaner.sandbox import RemoteSandbox, make_app

    server = TestServer(make_app(Sandbox(workers=1), max_in_flight=8))
    await server.start_server()
    try:
        async with RemoteSandbox(str(server.make_url("/"))) as remote:
            problem = humaneval[2]
            assert (await score_code(fenced(canonical(problem)), problem.tests, remote)).correct
            tests = stdio(("3 4\n", "7\n"), ("1 2\n", "4\n"))
            score = await score_code(fenced("print(sum(map(int, input().split())))"), tests, remote)
            assert score.score == 0.5
            attack = FUNCTIONAL_ATTACKS["an always-equal result"]
            assert not (await score_code(fenced(attack), DOUBLE, remote)).correct
    finally:
        await server.close()


def test_score_problem_for_code(sb, humaneval):
    problem = humaneval[0]
    assert score_problem(problem, fenced(canonical(problem)), sandbox=sb).correct
    assert score_problem(problem, "no code", sandbox=sb).reward == -1.0
    with pytest.raises(ValueError, match="sandbox"):
        score_problem(problem, fenced(canonical(problem)))


async def test_score_problem_async(humaneval):
    problem = humaneval[1]
    async with Sandbox(workers=1) as sandbox:
        score = await score_problem_async(problem, fenced(canonical(problem)), sandbox=sandbox)
    assert score.correct
    math = Problem(id="m", kind="math", prompt=[{"role": "user", "content": "q"}], answer="4")
    assert (await score_problem_async(math, "\\boxed{4}")).correct


def test_score_file_code(tmp_path, humaneval):
    records = [
        {"id": "he0", "response": fenced(canonical(humaneval[0])), "tests": humaneval[0].tests},
        {
            "id": "sum",
            "response": fenced("print(sum(map(int, input().split())))"),
            "tests": stdio(("1 2\n", "3\n"), ("2 2\n", "5\n")),
        },
        {"id": "none", "response": "I cannot solve it.", "tests": stdio(("1\n", "1\n"))},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "code")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == ["he0", "sum", "none"]
    assert [r["correct"] for r in out] == [True, False, False]
    assert [r["score"] for r in out] == [1.0, 0.5, 0.0]
    assert [r["reward"] for r in out] == [1.0, 0.5, -1.0]
    assert out[0]["tests"] == humaneval[0].tests
    assert summary["count"] == 3 and summary["correct"] == 1 and summary["no_answer"] == 1
    assert summary["mean_score"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "tests",
    [None, {"type": "essay"}, {"type": "stdio", "cases": []}, {"type": "functional", "test": ""}],
)
def test_score_file_code_rejects_malformed_tests(tmp_path, tests):
    line = {"id": "x", "response": "```python\npass\n```", "tests": tests}
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(RecordError) as info:
        score_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "code")
    assert (info.value.line, info.value.field) == (1, "tests")
    assert not (tmp_path / "out.jsonl").exists()
