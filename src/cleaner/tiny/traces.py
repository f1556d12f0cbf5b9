"""Synthetic multi-turn tool-use traces over reasoning-gym tasks, for bootstrapping the tiny model.

Each trace answers one reasoning-gym problem with the reference prompt: reasoning, a hermes tool
call whose code is templated from the problem's metadata, the REAL output of running that code in
the sandbox, and a final `The answer is \\boxed{...}` taken from that output. At `failure_rate` the
first attempt is a mistake a model would really make (a missing import, a misspelt name, a wrong
argument type, an unclosed parenthesis), its real error comes back, and a correction follows whose
reasoning names the problem: a small edit (a shallow SAAR graft) or a rewrite with another approach
(a deep graft); sometimes the first fix has a slip of its own. Only traces whose final answer the
task's own scorer accepts are kept, and every failure must raise the error type it was written for.

The traces are `cleaner.trajectory/1` records, so `cleaner purify` reads them as they are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cleaner.data.gym import load_gym
from cleaner.data.problem import Problem
from cleaner.formats import TOOL_SCHEMA
from cleaner.rewards.gym import score_gym
from cleaner.trajectory import Trajectory, Turn

CODE_INTERPRETER_TOOL = TOOL_SCHEMA
TOOLS = [CODE_INTERPRETER_TOOL]

TRACE_TASKS = (
    "basic_arithmetic",
    "gcd",
    "lcm",
    "prime_factorization",
    "count_primes",
    "base_conversion",
    "fraction_simplification",
)
"""reasoning-gym tasks whose solution code can be templated from the entry's metadata."""

TASK_CONFIG: dict[str, dict[str, Any]] = {
    # Up to 4 terms of up to 3 digits: results stay exact integers a small model can copy.
    "basic_arithmetic": {"max_terms": 4, "max_digits": 3},
}
"""Generator settings for the trace tasks (and for held-out checks); other tasks use the defaults."""

FAILURE_KINDS = ("missing_import", "misspelt_name", "wrong_type", "syntax_slip")
EXPECTED_ERROR = {
    "missing_import": ("NameError",),
    "misspelt_name": ("AttributeError", "ImportError"),
    "wrong_type": ("TypeError",),
    "syntax_slip": ("SyntaxError",),
}


@dataclass
class Solution:
    """How one task's problem is solved in code, and how that code typically goes wrong."""

    reasoning: list[str]
    """Phrasings of the plan; one is drawn per trace."""
    code: str
    alternative: tuple[str, str] | None = None
    """(reasoning, code) of a different approach: what a rewrite (deep correction) switches to."""
    import_name: str | None = None
    """The name a missing import leaves undefined."""
    misspelling: tuple[str, str, str] | None = None
    """(correct text, misspelt text, why): the misspelt-name mistake and its explanation."""
    wrong_type: tuple[str, str] | None = None
    """(code with a wrong argument type, why it fails)."""

    def failure_kinds(self) -> list[str]:
        kinds = ["syntax_slip"]
        if self.import_name:
            kinds.append("missing_import")
        if self.misspelling:
            kinds.append("misspelt_name")
        if self.wrong_type:
            kinds.append("wrong_type")
        return sorted(kinds)

    def broken(self, kind: str) -> str:
        """The code with mistake `kind`."""
        if kind == "missing_import":
            lines = self.code.split("\n")
            return "\n".join(line for line in lines if not line.startswith(("import ", "from ")))
        if kind == "misspelt_name":
            right, wrong, _ = self.misspelling
            return self.code.replace(right, wrong, 1)
        if kind == "wrong_type":
            return self.wrong_type[0]
        if kind == "syntax_slip":  # the last closing parenthesis goes missing
            at = self.code.rindex(")")
            return self.code[:at] + self.code[at + 1 :]
        raise ValueError(f"unknown failure kind {kind!r}")

    def diagnosis(self, kind: str, rewrite: bool = False) -> str:
        """Reasoning of a correction: names what went wrong, then the fix (or the new approach)."""
        if kind == "missing_import":
            problem = (
                f"The error says name '{self.import_name}' is not defined: I forgot the import."
            )
            fix = "I will add it and run the code again."
        elif kind == "misspelt_name":
            right, wrong, why = self.misspelling
            problem, fix = f"{why} I wrote {wrong} instead of {right}.", "Fixing the name."
        elif kind == "wrong_type":
            problem, fix = self.wrong_type[1], ""  # the explanation already says what the fix is
        elif kind == "syntax_slip":
            problem, fix = "SyntaxError: I left a parenthesis unclosed.", "Closing it."
        else:
            raise ValueError(f"unknown failure kind {kind!r}")
        if rewrite:
            approach = self.alternative[0]
            fix = "Rather than patch it, " + approach[0].lower() + approach[1:]
        return f"{problem} {fix}".rstrip()


def _basic_arithmetic(entry: dict[str, Any], rng: random.Random) -> Solution:
    # reasoning-gym's divisions are exact; floor division keeps the printed result an integer.
    expression = entry["metadata"]["expression"].replace("/", "//")
    code = f"print({expression})"
    return Solution(
        reasoning=[
            "I will evaluate the expression exactly with Python.",
            "Let me compute the expression with Python to avoid arithmetic slips.",
            f"The expression is {expression}. I will let Python evaluate it.",
        ],
        code=code,
        wrong_type=(
            f'print("Result: " + {expression})',
            "TypeError: a string cannot be concatenated with an integer. I will print the value alone.",
        ),
    )


def _gcd(entry: dict[str, Any], rng: random.Random) -> Solution:
    a, b = entry["metadata"]["numbers"]
    return Solution(
        reasoning=[
            f"I need the greatest common divisor of {a} and {b}. Python's math.gcd computes it exactly.",
            f"The GCD of {a} and {b} can be computed with math.gcd.",
            "I will compute the GCD with math.gcd.",
        ],
        code=f"import math\nprint(math.gcd({a}, {b}))",
        alternative=(
            "Let me write Euclid's algorithm directly instead.",
            f"a, b = {a}, {b}\nwhile b:\n    a, b = b, a % b\nprint(a)",
        ),
        import_name="math",
        misspelling=("math.gcd", "math.gdc", "AttributeError: math has no attribute gdc."),
        wrong_type=(
            f"import math\nprint(math.gcd([{a}, {b}]))",
            "TypeError: math.gcd takes the numbers as separate arguments, not a list.",
        ),
    )


def _lcm(entry: dict[str, Any], rng: random.Random) -> Solution:
    a, b = entry["metadata"]["numbers"]
    return Solution(
        reasoning=[
            f"I need the least common multiple of {a} and {b}. Python's math.lcm computes it exactly.",
            f"The LCM of {a} and {b} can be computed with math.lcm.",
            "I will compute the LCM with math.lcm.",
        ],
        code=f"import math\nprint(math.lcm({a}, {b}))",
        alternative=(
            "Let me use lcm(a, b) = a * b // gcd(a, b), with Euclid's algorithm for the gcd.",
            f"a, b = {a}, {b}\nx, y = a, b\nwhile y:\n    x, y = y, x % y\nprint(a * b // x)",
        ),
        import_name="math",
        misspelling=("math.lcm", "math.lcd", "AttributeError: math has no attribute lcd."),
        wrong_type=(
            f"import math\nprint(math.lcm([{a}, {b}]))",
            "TypeError: math.lcm takes the numbers as separate arguments, not a list.",
        ),
    )


def _prime_factorization(entry: dict[str, Any], rng: random.Random) -> Solution:
    n = entry["metadata"]["number"]
    return Solution(
        reasoning=[
            f"I will factor {n} with sympy and join the prime factors with ×.",
            "sympy.factorint with multiple=True lists the prime factors in order; I will join them with ×.",
            f"Let me factor {n} with sympy.",
        ],
        code=f"import sympy\nfactors = sympy.factorint({n}, multiple=True)\nprint(' × '.join(map(str, factors)))",
        alternative=(
            "Let me do trial division by hand instead.",
            f"n = {n}\nfactors = []\nd = 2\nwhile d * d <= n:\n    while n % d == 0:\n"
            "        factors.append(d)\n        n //= d\n    d += 1\nif n > 1:\n    factors.append(n)\n"
            "print(' × '.join(str(f) for f in factors))",
        ),
        import_name="sympy",
        misspelling=(
            "sympy.factorint",
            "sympy.factor_int",
            "AttributeError: sympy has no attribute factor_int.",
        ),
        wrong_type=(
            f"import sympy\nfactors = sympy.factorint({n}, multiple=True)\nprint(' × '.join(factors))",
            "TypeError: join needs strings, but the factors are integers. I will convert them with str.",
        ),
    )


def _count_primes(entry: dict[str, Any], rng: random.Random) -> Solution:
    start, end = entry["metadata"]["start"], entry["metadata"]["end"]
    return Solution(
        reasoning=[
            f"I will count the primes from {start} to {end} with sympy.primerange; the end is inclusive, so the range stops at {end} + 1.",
            "sympy.primerange lists the primes in a range; I will count them.",
            f"Let me count the primes between {start} and {end} with sympy.",
        ],
        code=f"import sympy\nprint(len(list(sympy.primerange({start}, {end} + 1))))",
        alternative=(
            "Let me use the prime counting function instead: primepi(end) - primepi(start - 1).",
            f"from sympy import primepi\nprint(primepi({end}) - primepi({start} - 1))",
        ),
        import_name="sympy",
        misspelling=(
            "sympy.primerange",
            "sympy.prime_range",
            "AttributeError: sympy has no attribute prime_range.",
        ),
        wrong_type=(
            f"import sympy\nprint(len(sympy.primerange({start}, {end} + 1)))",
            "TypeError: primerange returns a generator, which has no len(). I need to wrap it in list().",
        ),
    )


def _base_conversion(entry: dict[str, Any], rng: random.Random) -> Solution:
    meta = entry["metadata"]
    digits, source, target = meta["source_repr"], meta["source_base"], meta["target_base"]
    # np.base_repr writes digits above 9 in upper case; the task wants lower case.
    return Solution(
        reasoning=[
            f"I will parse {digits} in base {source} with int and write it in base {target} with numpy.base_repr.",
            f"Convert the base-{source} number to an integer, then to base {target}.",
            "int(text, base) reads the number and numpy.base_repr writes it in the new base.",
        ],
        code=f"import numpy as np\nprint(np.base_repr(int('{digits}', {source}), {target}).lower())",
        alternative=(
            "Let me write the digits out by repeated division instead.",
            f"n = int('{digits}', {source})\nsymbols = '0123456789abcdefghijklmnopqrstuvwxyz'\nout = ''\n"
            f"while n:\n    out = symbols[n % {target}] + out\n    n //= {target}\nprint(out or '0')",
        ),
        import_name="np",
        misspelling=(
            "np.base_repr",
            "np.baserepr",
            "AttributeError: numpy has no attribute baserepr.",
        ),
        # int(115, 11) is only a TypeError when the digits form a valid Python integer literal.
        wrong_type=(
            f"import numpy as np\nprint(np.base_repr(int({digits}, {source}), {target}).lower())",
            "TypeError: int only takes a base when the number is a string, so the digits need quotes.",
        )
        if digits.isdigit() and (digits == "0" or not digits.startswith("0"))
        else None,
    )


def _fraction_simplification(entry: dict[str, Any], rng: random.Random) -> Solution:
    meta = entry["metadata"]
    num, den = meta["numerator"], meta["denominator"]
    return Solution(
        reasoning=[
            f"Fraction({num}, {den}) reduces the fraction to lowest terms.",
            "Python's fractions.Fraction reduces a fraction automatically.",
            f"I will reduce {num}/{den} with fractions.Fraction.",
        ],
        code=f"from fractions import Fraction\nprint(Fraction({num}, {den}))",
        alternative=(
            "Let me divide both parts by their greatest common divisor instead.",
            f"import math\ng = math.gcd({num}, {den})\nprint(f'{{{num} // g}}/{{{den} // g}}')",
        ),
        import_name="Fraction",
        misspelling=(
            "import Fraction",
            "import Fractions",
            "ImportError: the fractions module has no name Fractions.",
        ),
        wrong_type=(
            f"from fractions import Fraction\nprint(Fraction('{num}', {den}))",
            "TypeError: Fraction needs two integers, not a string and an integer.",
        ),
    )


SOLVERS: dict[str, Callable[[dict[str, Any], random.Random], Solution]] = {
    "basic_arithmetic": _basic_arithmetic,
    "gcd": _gcd,
    "lcm": _lcm,
    "prime_factorization": _prime_factorization,
    "count_primes": _count_primes,
    "base_conversion": _base_conversion,
    "fraction_simplification": _fraction_simplification,
}


@dataclass(frozen=True)
class TraceMix:
    """The rates that shape a trace set."""

    failure_rate: float = 0.3
    """Fraction of traces whose first tool call fails."""
    double_failure_rate: float = 0.2
    """Of the failing traces, the fraction whose first fix fails too (two failures before the fix)."""
    rewrite_rate: float = 0.3
    """Of the corrections, the fraction that rewrite with another approach (deep) where the task has one."""
    alternative_rate: float = 0.15
    """Of the clean traces, the fraction that solve with the alternative approach from the start."""

    def __post_init__(self):
        for name in ("failure_rate", "double_failure_rate", "rewrite_rate", "alternative_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass
class Attempt:
    reasoning: str
    code: str
    expected_error: tuple[str, ...] | None  # None: must succeed
    kind: str  # "solve", "alternative", a failure kind, "fix" or "rewrite"


@dataclass
class TraceStats:
    """What a generation produced: how many traces, which failures, and what was dropped and why."""

    traces: int = 0
    failing_traces: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    corrections: dict[str, int] = field(default_factory=dict)
    per_task: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "failing_traces": self.failing_traces,
            "failures": dict(sorted(self.failures.items())),
            "corrections": dict(sorted(self.corrections.items())),
            "per_task": dict(sorted(self.per_task.items())),
            "dropped": dict(sorted(self.dropped.items())),
        }


def plan_attempts(solution: Solution, mix: TraceMix, rng: random.Random) -> list[Attempt]:
    """The tool calls of one trace: a clean solve, or one or two failures and a correction."""
    plan = rng.choice(solution.reasoning)
    if rng.random() >= mix.failure_rate:
        if solution.alternative and rng.random() < mix.alternative_rate:
            return [Attempt(*solution.alternative, None, "alternative")]
        return [Attempt(plan, solution.code, None, "solve")]
    kinds = solution.failure_kinds()
    first = rng.choice(kinds)
    attempts = [Attempt(plan, solution.broken(first), EXPECTED_ERROR[first], first)]
    last = first
    others = [k for k in kinds if k != first]
    if others and rng.random() < mix.double_failure_rate:
        second = rng.choice(others)
        attempts.append(
            Attempt(
                solution.diagnosis(first), solution.broken(second), EXPECTED_ERROR[second], second
            )
        )
        last = second
    if solution.alternative and rng.random() < mix.rewrite_rate:
        code = solution.alternative[1]
        attempts.append(Attempt(solution.diagnosis(last, rewrite=True), code, None, "rewrite"))
    else:
        attempts.append(Attempt(solution.diagnosis(last), solution.code, None, "fix"))
    return attempts


def final_answer(stdout: str) -> str:
    """The final turn: the last printed line, boxed."""
    value = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
    return f"The code printed {value}.\n\nThe answer is \\boxed{{{value}}}."


def make_trace(problem: Problem, sandbox, mix: TraceMix, rng: random.Random) -> Trajectory | str:
    """One trace for `problem`, run for real in `sandbox`; or why it was dropped."""
    task, entry = problem.metadata["task"], problem.metadata["entry"]
    solution = SOLVERS[task](entry, rng)
    attempts = plan_attempts(solution, mix, rng)
    turns: list[Turn] = []
    for attempt in attempts:
        result = sandbox.run(attempt.code)
        observation = result.to_observation()
        if attempt.expected_error is None:
            if not result.ok:
                return f"solution failed: {result.error_type or result.status}"
        elif result.status != "error" or result.error_type not in attempt.expected_error:
            return f"{attempt.kind} gave {result.error_type or result.status}"
        observation.extra = {}  # timings and isolation details vary from run to run
        turns.append(Turn(attempt.reasoning, attempt.code, observation))
    final = final_answer(turns[-1].observation.stdout)
    turns.append(Turn(final))
    if not score_gym(final, task, entry).correct:
        return "answer rejected by the scorer"
    return Trajectory(
        id=problem.id,
        prompt=problem.prompt,
        turns=turns,
        answer=problem.answer,
        reward=1.0,
        extra={"task": task, "attempts": [a.kind for a in attempts]},
    )


def trace_problems(
    n_traces: int, *, seed: int = 0, tasks: tuple[str, ...] = TRACE_TASKS
) -> list[Problem]:
    """The problems `generate_traces` draws from: an even mix of `tasks`, with a little spare."""
    per_task = -(-n_traces // len(tasks)) + 2
    return load_gym(list(tasks), size=per_task, seed=seed, config=TASK_CONFIG)


def generate_traces(
    n_traces: int,
    *,
    seed: int = 0,
    mix: TraceMix | None = None,
    tasks: tuple[str, ...] = TRACE_TASKS,
    sandbox=None,
) -> tuple[list[Trajectory], TraceStats]:
    """`n_traces` traces (fewer only if many are dropped), an even mix of `tasks`, in a seeded order.

    `sandbox` is a `SyncSandbox` (one is started and closed here if none is given).
    """
    from cleaner.sandbox.sync import SyncSandbox

    mix = mix or TraceMix()
    rng = random.Random(seed)
    problems = trace_problems(n_traces, seed=seed, tasks=tasks)
    rng.shuffle(problems)
    own = sandbox is None
    sandbox = sandbox or SyncSandbox(workers=1)
    stats, traces = TraceStats(), []
    try:
        for problem in problems:
            if len(traces) == n_traces:
                break
            trace = make_trace(problem, sandbox, mix, rng)
            if isinstance(trace, str):
                reason = re.sub(r"\d+", "N", trace)
                stats.dropped[reason] = stats.dropped.get(reason, 0) + 1
                continue
            traces.append(trace)
            stats.traces += 1
            task = trace.extra["task"]
            stats.per_task[task] = stats.per_task.get(task, 0) + 1
            kinds = trace.extra["attempts"]
            if kinds[0] in FAILURE_KINDS:
                stats.failing_traces += 1
                stats.corrections[kinds[-1]] = stats.corrections.get(kinds[-1], 0) + 1
            for kind in kinds:
                if kind in FAILURE_KINDS:
                    stats.failures[kind] = stats.failures.get(kind, 0) + 1
    finally:
        if own:
            sandbox.close()
    return traces, stats
