"""The code reward: the response's last fenced python block, run in the sandbox against the tests.

    async with Sandbox() as sb:
        s = await score_code(response, problem.tests, sb)     # Score(correct, reward, score, ...)
    score_code_sync(response, tests)                          # blocking, on a shared SyncSandbox

Reward (SPEC section 6): the fraction of tests passed in [0, 1]; -1 when the response has no
complete python block (the last ```python / ```py / ```python3 fence that is closed). `correct` is
True when every test passed.

Test shapes (`cleaner.data.problem.TEST_TYPES`):

- `{"type": "stdio", "cases": [{"input", "output"}, ...]}`: each case runs the program in a fresh
  process with the case input on stdin (the sandbox gives no stdin, so a small harness puts the input
  in a memfd and makes it fd 0 before running the program as `__main__`: `input()`, `sys.stdin`,
  `sys.stdin.buffer` and `open(0)` all read it). The case passes when the process ended normally (an
  ok status, exit code none or 0) and its stdout matches the expected output line by line, each
  line whitespace-trimmed, trailing blank lines ignored, and tokens that are both numbers equal within
  1e-6 (relative or absolute). One case is one test.
- the same with `fn_name` (LeetCode-style rows): each case's input is one JSON value a line (the
  arguments); the harness calls `Solution().<fn_name>(*args)` (or a top-level `<fn_name>`) and
  prints the result as data; the host compares it with the JSON output (tuples as lists, numbers
  within the same tolerance). One case is one test.
- `{"type": "functional", "entry_point", "test", "import_prefix"?}` (HumanEval; the 30K set's
  LeetCode rows, whose entry point may be an expression such as `Solution().twoSum`): `check(candidate)`
  of the test must complete. The whole check counts as ONE test (pass or fail): HumanEval's checks
  are a run of asserts, sometimes in loops and on shared state, and splitting them would grade
  something other than what the benchmark grades.

Who decides the verdict, and the threat model. Model code is hostile: it may exit early
(`sys.exit(0)`, `os._exit(0)`, raising SystemExit inside `check`), patch `print`, builtins or the
harness, replace `check`, return objects whose `__eq__` is always true, trace and rewrite the
running test, read anything in its own process (nonces, the harness's source, the test), and write
anything to stdout. Nothing that the process running model code says is taken as a pass:

- stdio and fn_name: the expected outputs never enter the sandbox. The host compares stdout (data)
  with them, so the only way to pass is to print the right answer; exiting early prints nothing.
- functional, in two runs. Run 1 ("record", untrusted) executes the prefix, the program and the
  test SEALED on the host (`seal_test`): each assert of `check` is reduced to the program calls it
  makes (`assert abs(candidate(x) - 0.5) < 1e-6` becomes `candidate(x)`), so the values asserts
  compare with never enter this process; an assert that cannot be split honestly (the candidate
  passed as a value, calls inside a comprehension) is kept whole. The candidate and every program
  function the test calls are wrapped so that each top-level call's arguments (before and after the
  call) and result are written out as plain data (None, bool, int, float, str, bytes, complex, list,
  tuple, set, dict, and instances of user classes by class name and attributes; anything else is
  "unencodable"). Run 2 ("replay", trusted: no model code in it) executes the prefix and the
  original test in a fresh process where the candidate and those functions are stubs that look each
  call up among the recorded ones (by name and encoded arguments, in recorded order among equal
  calls) and return the recorded result, rebuilt from data: an always-equal object comes back as
  an instance of a class run 2 does not know (the call raises), an `int` subclass is not an `int`,
  and user-class instances are rebuilt as the prefix's or test's own class (its `__eq__`, not the
  model's). The verdict is run 2's: its check
  completed (status ok, no exit code, no error). Run 2 keeps the real builtins and the prefix's
  definitions even when the program rebinds those names, and imports only standard-library modules
  named by run 1. Run 1 must also have completed normally, or run 2 is skipped (a failure).
  Early exits leave no or partial records (a failure); tampering with run 1's harness or test can
  only change the recorded data, which run 2 then checks with an untampered test.

Limits, stated plainly:

- What `check` computes outside its asserts, and asserts kept whole, run in run 1's process (they
  produce the calls): an expected value held there (`expected = ...`, HumanEval/38's loop variable)
  can be read by a program from its caller's frame and returned, and that passes. Values written
  in the asserts themselves cannot be read this way. Stdio and fn_name tests have no such limit.
- Stdio cases shown in the prompt as examples (LiveCodeBench's public cases) can be passed by a
  program that prints them by input, as in LiveCodeBench itself; the hidden cases cannot.
- Program functions the test calls (HumanEval's `poly`, `encode_cyclic`, given in the prompt and
  re-submitted by the model) are trusted for their results exactly as in the original harness.
- Replay is by encoded arguments: a test whose calls depend on unseeded randomness is seeded
  (`random.seed(0)` before the test, in both runs; the global random state is saved and restored
  around each recorded call so the model's own use of `random` does not shift it); randomness
  drawn inside an assert's expected side would still diverge. Tests that inspect identity, or
  objects that cannot be encoded, fail even for a correct program.
- A program the test references only as a class (`Solution` used directly) cannot be replayed and
  fails; entry points such as `Solution().twoSum` work.
- Time: each run is bounded by the timeout (default 6 s; the sandbox kills past it). A functional
  test costs at most two runs (a hanging program: one timeout). Stdio cases run as many at a time
  as the embedded sandbox has workers; once one case times out, the cases not yet started are
  counted as failed without running (`stop_after_timeout`, on by default), so a program that hangs
  costs about one timeout of wall time, not one per case. The price: a program that is only too
  slow on one case loses the cases after it too.

A failing score's `note` says how many tests passed and why the first failure failed; for a
functional test it names the deciding run (`program run: ...` or `replayed check: ...`).
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import builtins
import json
import math
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import CodeType
from typing import Any

from cleaner.rewards.answer import Score
from cleaner.sandbox import ExecResult, RemoteSandbox, Sandbox, SyncSandbox

DEFAULT_TIMEOUT_S = 6.0
"""Per run (a stdio case, or one of the two functional runs); LiveCodeBench's own limit is 6 s."""
MAX_OUTPUT_BYTES = 16 << 20
"""Stdout cap per run on an embedded sandbox (large LiveCodeBench outputs, functional records)."""
FLOAT_TOLERANCE = 1e-6

# ------------------------------------------------------------------ the program


_FENCE_OPEN = re.compile(r"^\s*```\s*(?:python3?|py)\s*$", re.IGNORECASE)
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")


def last_python_block(response: str) -> str | None:
    """The last closed ```python (or ```py, ```python3) block of `response`, None if there is none.

    A response whose final block is cut off (no closing fence) has none: a truncated answer has not
    answered, whatever it wrote earlier (as with a cut-off final `\\boxed{}`).
    """
    found = None
    lines = response.splitlines()
    i = 0
    while i < len(lines):
        if _FENCE_OPEN.match(lines[i]):
            for j in range(i + 1, len(lines)):
                if _FENCE_CLOSE.match(lines[j]):
                    found = "\n".join(lines[i + 1 : j]) + "\n"
                    i = j
                    break
            else:
                return None  # the final block is cut off: whatever came before was not the answer
        i += 1
    return found


# ------------------------------------------------------------------ data encoding (both sides)

# Runs inside the sandbox (record and replay runs) and, exec'd once here, on the host (fn_name
# results). One text so that both sides encode identically: replay matches calls by encoded arguments.
_CODEC_SOURCE = r'''
def _encode(value):
    """Plain data for a value, as JSON-ready lists and dicts; raises TypeError for anything else."""
    memo = {}

    def enc(x):
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return x if -(1 << 62) < x < (1 << 62) else {"i": str(x)}
        if t is float:
            return {"f": repr(x)}
        if t is complex:
            return {"c": [repr(x.real), repr(x.imag)]}
        if t is bytes:
            return {"b": x.hex()}
        if t is list:
            return [enc(v) for v in x]
        if t is tuple:
            return {"t": [enc(v) for v in x]}
        if t is set or t is frozenset:
            items = sorted((enc(v) for v in x), key=lambda e: __import__("json").dumps(e, sort_keys=True))
            return {"s" if t is set else "fs": items}
        if t is dict:
            return {"d": [[enc(k), enc(v)] for k, v in x.items()]}
        if id(x) in memo:
            return {"ref": memo[id(x)]}
        attrs = getattr(x, "__dict__", None)
        if t.__module__ == "builtins" or type(attrs) is not dict:
            raise TypeError(f"cannot encode a {t.__name__}")
        memo[id(x)] = len(memo)
        return {
            "o": t.__name__,
            "id": memo[id(x)],
            "a": [[k, enc(v)] for k, v in attrs.items() if type(k) is str],
        }

    return enc(value)


def _decode(data, classes):
    """The value `_encode` wrote; user-class instances are rebuilt from `classes` (name -> class)."""
    memo = {}

    def dec(x):
        if type(x) is list:
            return [dec(v) for v in x]
        if type(x) is not dict:
            return x
        if "i" in x:
            return int(x["i"])
        if "f" in x:
            return float(x["f"])
        if "c" in x:
            return complex(float(x["c"][0]), float(x["c"][1]))
        if "b" in x:
            return bytes.fromhex(x["b"])
        if "t" in x:
            return tuple(dec(v) for v in x["t"])
        if "s" in x:
            return set(dec(v) for v in x["s"])
        if "fs" in x:
            return frozenset(dec(v) for v in x["fs"])
        if "d" in x:
            return {dec(k): dec(v) for k, v in x["d"]}
        if "ref" in x:
            return memo[x["ref"]]
        cls = classes.get(x["o"])
        if not isinstance(cls, type):
            raise TypeError(f"no class {x['o']!r} to rebuild a result with")
        obj = cls.__new__(cls)
        memo[x["id"]] = obj
        for k, v in x["a"]:
            obj.__dict__[k] = dec(v)
        return obj

    return dec(data)
'''

_codec: dict[str, Any] = {}
exec(compile(_CODEC_SOURCE, "<cleaner.rewards.code codec>", "exec"), _codec)  # noqa: S102 - our text


def _decode_plain(data: Any) -> Any:
    """Host side: plain data only (no user classes)."""
    return _codec["_decode"](data, {})


# ------------------------------------------------------------------ harnesses (sandbox side)

_STDIO_HARNESS = r"""
import os as _os, sys as _sys
def _cleaner_stdio(_input, _program):
    fd = _os.memfd_create("stdin")
    view = memoryview(_input)
    while view:
        view = view[_os.write(fd, view):]
    _os.lseek(fd, 0, 0)
    _os.dup2(fd, 0)
    _os.close(fd)
    _sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    exec(compile(_program, "<solution>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""

_CALL_HARNESS = (
    _CODEC_SOURCE
    + r"""
import os as _os, sys as _sys, json as _json
def _cleaner_call(_program, _fn_name, _arguments, _marker):
    write, dumps, encode = _os.write, _json.dumps, _encode  # taken before model code runs
    args = _json.loads(_arguments)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(_program, "<solution>", "exec"), ns)
    target = getattr(ns["Solution"](), _fn_name) if "Solution" in ns else ns[_fn_name]
    result = encode(target(*args))
    line = ("\n" + _marker + dumps(result) + "\n").encode()
    while line:
        line = line[write(1, line):]
_sys.setrecursionlimit(100000)
"""
)

_RECORD_HARNESS = (
    _CODEC_SOURCE
    + r"""
import builtins as _builtins, os as _os, sys as _sys, json as _json, random as _random, types as _types
def _cleaner_record(_prefix, _program, _test, _test_names, _entry_point, _marker):
    # Taken before model code runs (it may patch them later; that only spoils the record).
    write, dumps, encode = _os.write, _json.dumps, _encode
    get_random, set_random = _random.getstate, _random.setstate
    records, depth = [], [0]

    def recorder(name, function):
        def call(*args, **kwargs):
            if depth[0]:  # a call made by recorded code: replay returns its caller's result
                return function(*args, **kwargs)
            entry = {"name": name}
            records.append(entry)
            try:
                entry["args"] = encode([list(args), kwargs])
            except Exception:
                entry["args"] = None
            depth[0] += 1
            state = get_random()
            try:
                result = function(*args, **kwargs)
            except BaseException as e:
                entry["raised"] = [type(e).__name__, str(e)[:1000]]
                raise
            finally:
                depth[0] -= 1
                set_random(state)
            try:
                entry["after"] = encode([list(args), kwargs])
                entry["result"] = encode(result)
            except Exception as e:
                entry["unencodable"] = str(e)[:1000]
            return result
        return call

    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(_prefix, "<prefix>", "exec"), ns)
    prefix_names = set(ns)
    exec(compile(_program, "<solution>", "exec"), ns)
    test_code = compile(_test, "<test>", "exec")
    provided = {}
    for name in _test_names:
        if name not in ns or name in prefix_names or hasattr(_builtins, name):
            continue
        value = ns[name]
        if isinstance(value, type):
            continue  # classes are not replayed: run 2 rebuilds instances with its own classes
        if isinstance(value, _types.ModuleType):
            provided[name] = {"module": value.__name__}
        elif callable(value):
            ns[name] = recorder(name, value)
            provided[name] = "call"
        else:
            try:
                provided[name] = {"value": encode(value)}
            except Exception:
                pass
    candidate = recorder("<candidate>", eval(compile(_entry_point, "<entry_point>", "eval"), ns))
    _random.seed(0)
    exec(test_code, ns)
    ns["check"](candidate)
    line = ("\n" + _marker + dumps({"records": records, "provided": provided}) + "\n").encode()
    while line:
        line = line[write(1, line):]
_sys.setrecursionlimit(100000)
"""
)

_REPLAY_HARNESS = (
    _CODEC_SOURCE
    + r"""
import builtins as _builtins, importlib as _importlib, json as _json, random as _random, sys as _sys
def _cleaner_replay(_prefix, _test, _payload):
    data = _json.loads(_payload)
    # Calls are matched by name and encoded arguments, in recorded order among equal ones: the
    # program run made the calls of a sealed test, which may differ in order and short-circuits.
    pending = {}
    for entry in data["records"]:
        key = _json.dumps([entry.get("name"), entry.get("args")])
        pending.setdefault(key, []).append(entry)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(_prefix, "<prefix>", "exec"), ns)
    prefix_names = set(ns)

    def classes():
        return {k: v for k, v in ns.items() if isinstance(v, type)}

    def mutate(target, after):
        # The recorded state of an argument after the call, for tests that check in-place changes.
        if type(target) is list and type(after) is list:
            target[:] = after
        elif type(target) in (dict, set) and type(after) is type(target):
            target.clear()
            target.update(after)
        elif type(target) is type(after) and hasattr(target, "__dict__") and type(target).__module__ != "builtins":
            target.__dict__.clear()
            target.__dict__.update(after.__dict__)

    def replayer(name):
        def call(*args, **kwargs):
            same = pending.get(_json.dumps([name, _encode([list(args), kwargs])]))
            if not same:
                raise AssertionError(f"replay: the program run made no such call of {name}")
            entry = same.pop(0)
            if "raised" in entry:
                kind = getattr(_builtins, str(entry["raised"][0]), None)
                if not (isinstance(kind, type) and issubclass(kind, Exception)):
                    kind = RuntimeError
                raise kind(str(entry["raised"][1]))
            if "unencodable" in entry or "result" not in entry:
                raise TypeError(f"replay: {name} returned {entry.get('unencodable', 'nothing')}")
            after_args, after_kwargs = _decode(entry["after"], classes())
            for target, after in zip(args, after_args):
                mutate(target, after)
            for key, after in after_kwargs.items():
                if key in kwargs:
                    mutate(kwargs[key], after)
            return _decode(entry["result"], classes())
        return call

    for name, how in data["provided"].items():
        if not name.isidentifier() or name in prefix_names or hasattr(_builtins, name):
            continue
        if how == "call":
            ns[name] = replayer(name)
        elif "module" in how:
            module = str(how["module"])
            if module.split(".")[0] in _sys.stdlib_module_names:
                ns[name] = _importlib.import_module(module)
        elif "value" in how:
            ns[name] = _decode(how["value"], classes())
    _random.seed(0)
    exec(compile(_test, "<test>", "exec"), ns)
    ns["check"](replayer("<candidate>"))
_sys.setrecursionlimit(100000)
"""
)


def _harness(template: str, function: str, *arguments: Any) -> str:
    """The harness source, then a call of its `function` with Python literals (repr: no injection)."""
    return f"{template}\n{function}({', '.join(map(repr, arguments))})\n"


# ------------------------------------------------------------------ sealing the test (host side)


def test_names(test: str) -> list[str]:
    """Every global name the test's code uses (its functions' too): what run 1 records or provides."""

    def names_in(code: CodeType) -> set[str]:
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                names |= names_in(const)
        return names

    return sorted(names_in(compile(test, "<test>", "exec")))


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


_SCOPES = (ast.Lambda, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.NamedExpr)


class _Sealer(ast.NodeTransformer):
    """Rewrites `check`'s asserts into the calls they make to the program, dropping what they
    compare with. An assert that cannot be split honestly (the candidate passed as a value, calls
    inside a lambda or comprehension) is kept whole."""

    def __init__(self, known: set[str], params: set[str]):
        self.known = (
            known  # builtins, the test's and the prefix's names: trusted, not program calls
        )
        self.params = params

    def program_calls(self, expr: ast.AST, calls: list[ast.expr]) -> bool:
        """Append the program calls of `expr` in evaluation order; False if it cannot be split."""
        if isinstance(expr, ast.Call):
            if isinstance(expr.func, ast.Name) and expr.func.id not in self.known:
                calls.append(expr)
                return True
            parts = [expr.func, *expr.args, *(k.value for k in expr.keywords)]
            return all(self.program_calls(part, calls) for part in parts)
        if isinstance(expr, _SCOPES):
            return not any(
                isinstance(n, ast.Call) or (isinstance(n, ast.Name) and n.id in self.params)
                for n in ast.walk(expr)
            )
        if isinstance(expr, ast.Name):
            return expr.id not in self.params
        return all(self.program_calls(child, calls) for child in ast.iter_child_nodes(expr))

    def visit_Assert(self, node: ast.Assert) -> ast.AST | list[ast.stmt]:
        calls: list[ast.expr] = []
        if not self.program_calls(node.test, calls):
            return node
        return [ast.Expr(call) for call in calls] or [ast.Pass()]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # a nested function is called from elsewhere: left as it is

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef


def seal_test(test: str, prefix: str = "") -> str:
    """The test that run 1 gets: `check`'s asserts reduced to their calls, so that the values they
    compare with never enter the process running model code. The original test when it cannot be
    parsed or has no `check`."""
    try:
        tree = ast.parse(test)
        known = _top_level_names(tree) | _top_level_names(ast.parse(prefix)) | set(dir(builtins))
    except SyntaxError:
        return test
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            arguments = node.args
            params = {
                a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            }
            sealer = _Sealer(known, params)
            node.body = [sealer.visit(statement) for statement in node.body]
            node.body = [
                s
                for statement in node.body
                for s in (statement if isinstance(statement, list) else [statement])
            ]
            return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return test


# ------------------------------------------------------------------ comparison (host side)

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.IGNORECASE)


def _numbers_close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)


def _tokens_match(got: str, want: str) -> bool:
    if got == want:
        return True
    if _NUMBER.fullmatch(got) and _NUMBER.fullmatch(want):
        return _numbers_close(float(got), float(want))
    return False


def outputs_match(got: str, want: str) -> bool:
    """Line-wise, each line trimmed, trailing blank lines ignored; numbers equal within 1e-6."""
    got_lines = [line.strip() for line in got.strip().splitlines()]
    want_lines = [line.strip() for line in want.strip().splitlines()]
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines, strict=True):
        if g == w:
            continue
        g_tokens, w_tokens = g.split(), w.split()
        if len(g_tokens) != len(w_tokens) or not all(
            _tokens_match(a, b) for a, b in zip(g_tokens, w_tokens, strict=True)
        ):
            return False
    return True


def values_match(got: Any, want: Any) -> bool:
    """fn_name results: JSON-equal, tuples as lists, numbers within the tolerance, bool not a number."""
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return _numbers_close(float(got), float(want))
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(
            values_match(a, b) for a, b in zip(got, want, strict=True)
        )
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(values_match(got[k], want[k]) for k in got)
    return type(got) is type(want) and got == want


# ------------------------------------------------------------------ running


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest class

    passed: bool
    status: str
    """The sandbox status of the deciding run (`ok`, `error`, `timeout`, `killed`), or `skipped`."""
    detail: str = ""
    """Why it failed: `wrong answer`, an error type, `timeout`, ..."""


AnySandbox = Sandbox | RemoteSandbox


def _ended_normally(result: ExecResult) -> bool:
    """The process finished its code: not killed, no exception; sys.exit(0) allowed (stdio only)."""
    return result.status == "ok" and result.exit_code in (None, 0)


def _failure(result: ExecResult) -> str:
    if result.status == "timeout":
        return "timeout"
    if result.status == "ok":
        return f"exited with code {result.exit_code}" if result.exit_code is not None else ""
    return result.error_type or result.reason or result.status


async def _run(sandbox: AnySandbox, code: str, timeout: float) -> ExecResult:
    if isinstance(sandbox, Sandbox):
        limits = replace(
            sandbox.limits,
            timeout=timeout,
            max_output_bytes=max(sandbox.limits.max_output_bytes, MAX_OUTPUT_BYTES),
        )
        return await sandbox.run(code, limits=limits, print_last_expr=False)
    return await sandbox.run(code, timeout=timeout, print_last_expr=False)


def _marked_line(stdout: str, marker: str) -> str | None:
    """The last stdout line the harness marked (model code may print anything around it)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            return line[len(marker) :]
    return None


async def _stdio_case(
    sandbox: AnySandbox, program: str, case: dict[str, Any], timeout: float
) -> TestOutcome:
    code = _harness(_STDIO_HARNESS, "_cleaner_stdio", str(case["input"]).encode("utf-8"), program)
    result = await _run(sandbox, code, timeout)
    if not _ended_normally(result):
        return TestOutcome(False, result.status, _failure(result))
    if result.stdout_truncated or not outputs_match(result.stdout, str(case["output"])):
        return TestOutcome(False, result.status, "wrong answer")
    return TestOutcome(True, result.status)


async def _call_case(
    sandbox: AnySandbox, program: str, fn_name: str, case: dict[str, Any], timeout: float
) -> TestOutcome:
    try:
        arguments = [json.loads(line) for line in str(case["input"]).splitlines() if line.strip()]
        expected = json.loads(str(case["output"]))
    except json.JSONDecodeError as e:
        return TestOutcome(False, "invalid", f"test case is not JSON: {e}")
    marker = "#cleaner-result:" + os.urandom(8).hex() + ":"
    code = _harness(_CALL_HARNESS, "_cleaner_call", program, fn_name, json.dumps(arguments), marker)
    result = await _run(sandbox, code, timeout)
    if result.status != "ok" or result.exit_code is not None:
        return TestOutcome(False, result.status, _failure(result) or "did not return")
    line = _marked_line(result.stdout, marker)
    try:
        got = _decode_plain(json.loads(line)) if line is not None else None
    except Exception:  # noqa: BLE001 - whatever model code printed is just a wrong answer
        line = None
    if line is None or not values_match(got, expected):
        return TestOutcome(False, result.status, "wrong answer")
    return TestOutcome(True, result.status)


async def _functional(
    sandbox: AnySandbox, program: str, tests: dict[str, Any], timeout: float
) -> TestOutcome:
    prefix = str(tests.get("import_prefix") or "")
    test = str(tests["test"])
    try:
        names = test_names(test)
    except (SyntaxError, ValueError) as e:
        return TestOutcome(False, "invalid", f"the test does not compile: {e}")
    sealed = seal_test(test, prefix)
    marker = "#cleaner-record:" + os.urandom(8).hex() + ":"
    record = await _run(
        sandbox,
        _harness(
            _RECORD_HARNESS,
            "_cleaner_record",
            prefix,
            program,
            sealed,
            names,
            str(tests["entry_point"]),
            marker,
        ),
        timeout,
    )
    # Run 1 is untrusted in the pass direction only: anything but a normal end is a failure.
    if record.status != "ok" or record.exit_code is not None:
        return TestOutcome(False, record.status, "program run: " + _failure(record))
    payload = _marked_line(record.stdout, marker)
    if payload is None or record.stdout_truncated:
        return TestOutcome(False, record.status, "program run: no record of the calls")
    replay = await _run(
        sandbox,
        _harness(_REPLAY_HARNESS, "_cleaner_replay", prefix, str(tests["test"]), payload),
        timeout,
    )
    # Run 2 ran no model code: its own completion is the verdict.
    if replay.status == "ok" and replay.exit_code is None and replay.error_type is None:
        return TestOutcome(True, "ok")
    return TestOutcome(False, replay.status, "replayed check: " + (_failure(replay) or "failed"))


async def run_tests(
    program: str,
    tests: dict[str, Any],
    sandbox: AnySandbox,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    concurrency: int | None = None,
    stop_after_timeout: bool = True,
) -> list[TestOutcome]:
    """One outcome per test of `tests` (a functional test is one test).

    Stdio cases run `concurrency` at a time (default: the embedded sandbox's worker count, else 4),
    so that a timeout is seen before more cases start when `stop_after_timeout` skips them.
    """
    if concurrency is None:
        concurrency = len(sandbox.workers) if isinstance(sandbox, Sandbox) else 4
    kind = tests.get("type")
    if kind == "functional":
        return [await _functional(sandbox, program, tests, timeout)]
    if kind != "stdio":
        raise ValueError(f"unknown test type {kind!r}")
    cases: Sequence[dict[str, Any]] = tests["cases"]
    fn_name = tests.get("fn_name")
    gate = asyncio.Semaphore(max(1, concurrency))
    timed_out = False

    async def one(case: dict[str, Any]) -> TestOutcome:
        nonlocal timed_out
        async with gate:
            if timed_out and stop_after_timeout:
                return TestOutcome(False, "skipped", "not run after a timeout")
            if fn_name:
                outcome = await _call_case(sandbox, program, fn_name, case, timeout)
            else:
                outcome = await _stdio_case(sandbox, program, case, timeout)
            timed_out = timed_out or outcome.status == "timeout"
            return outcome

    return list(await asyncio.gather(*(one(case) for case in cases)))


def _score(program: str | None, outcomes: list[TestOutcome]) -> Score:
    passed = sum(o.passed for o in outcomes)
    fraction = passed / len(outcomes) if outcomes else 0.0
    correct = bool(outcomes) and passed == len(outcomes)
    note = ""
    if not correct:
        first = next((i for i, o in enumerate(outcomes) if not o.passed), None)
        note = f"{passed}/{len(outcomes)} tests passed"
        if first is not None:
            note += f"; test {first}: {outcomes[first].detail or outcomes[first].status}"
    return Score(correct=correct, reward=fraction, score=fraction, predicted=program, note=note)


NO_CODE = Score(correct=False, reward=-1.0, score=0.0, predicted=None, note="no python code block")


async def score_code(
    response: str,
    tests: dict[str, Any],
    sandbox: AnySandbox,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    stop_after_timeout: bool = True,
) -> Score:
    """The code reward of `response`: fraction of `tests` passed, -1 without a python block.

    `predicted` is the extracted program; `note` says how many passed and why the first failure failed.
    """
    program = last_python_block(response)
    if program is None:
        return NO_CODE
    outcomes = await run_tests(
        program, tests, sandbox, timeout=timeout, stop_after_timeout=stop_after_timeout
    )
    return _score(program, outcomes)


# ------------------------------------------------------------------ blocking use

_shared: SyncSandbox | None = None
_shared_lock = threading.Lock()


def shared_sandbox() -> SyncSandbox:
    """One embedded sandbox (a worker per core) for blocking callers; started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SyncSandbox()
            atexit.register(close_shared_sandbox)
        return _shared


def close_shared_sandbox() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


def score_code_sync(
    response: str,
    tests: dict[str, Any],
    sandbox: SyncSandbox | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    stop_after_timeout: bool = True,
) -> Score:
    """`score_code` for code without an event loop, on `sandbox` or the shared one. Thread-safe."""
    sync = sandbox or shared_sandbox()
    coroutine = score_code(
        response, tests, sync.sandbox, timeout=timeout, stop_after_timeout=stop_after_timeout
    )
    # SyncSandbox's loop owns its sandbox's asyncio objects: run the whole scoring there.
    return asyncio.run_coroutine_threadsafe(coroutine, sync._loop).result()
