"""Math and science reward: the last `\\boxed{}` of a response, compared with the reference by math-verify.

Strict, as the reference recipes are: no box, no credit. Equivalence is math-verify's, so `042`
matches `42` (AIME answers), `0.5` matches `\\frac{1}{2}`, `\\sqrt{12}` matches `2\\sqrt{3}` and
`\\{2,1\\}` matches `\\{1,2\\}`.

Why a worker process. math-verify bounds its own run time with SIGALRM, which only works in the main
thread; rollouts score from worker threads and from asyncio. With its timeouts off, a pathological
answer (sympy simplifying a huge expression) can run for minutes, and a thread cannot be stopped.
So comparisons run in a small pool of long-lived child processes (`python -m
cleaner.rewards._math_worker`): the caller waits on the pipe with a deadline and, past it, kills the
child and starts a new one. A comparison costs a few milliseconds plus ~0.1 ms of pipe traffic; a
worker costs ~1 s to start (sympy import), once. Plain `subprocess` rather than `multiprocessing`:
no fork of a threaded parent, no re-import of the user's `__main__`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from cleaner.rewards.answer import MAX_ANSWER_CHARS, Score, clean_answer, last_boxed, verdict

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_WORKERS = 2
DEFAULT_MEMORY_MB = 2048


class _Worker:
    """One child process and the read buffer of its reply pipe."""

    def __init__(self, memory_mb: int, startup_timeout: float):
        # The child must import this very package, even when the parent found it through sys.path edits.
        package_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        env = {
            **os.environ,
            "PYTHONPATH": python_path,
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cleaner.rewards._math_worker", str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            env=env,
        )
        self.buffer = b""
        try:
            ready = self.read_line(time.monotonic() + startup_timeout)
        except (TimeoutError, EOFError) as e:
            self.kill()
            raise RuntimeError(
                f"the math-verify worker did not start ({type(e).__name__}); "
                "is math-verify installed?"
            ) from None
        if json.loads(ready) != {"ready": True}:
            self.kill()
            raise RuntimeError(f"the math-verify worker said {ready!r} instead of ready")

    def ask(self, request: dict, deadline: float) -> dict:
        """Send one request, wait for its reply until `deadline` (TimeoutError, EOFError, OSError)."""
        data = (json.dumps(request) + "\n").encode()
        while data:  # an unbuffered pipe may take a long request in parts
            data = data[self.proc.stdin.write(data) :]
        return json.loads(self.read_line(deadline))

    def read_line(self, deadline: float) -> str:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


class MathVerifier:
    """A pool of math-verify worker processes; `equivalent` is safe from any thread.

    At most `workers` comparisons run at once; more callers wait their turn. Each comparison is
    bounded by `timeout` seconds (a worker's start-up, once, by `startup_timeout`).
    """

    def __init__(
        self,
        *,
        workers: int = DEFAULT_WORKERS,
        timeout: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        startup_timeout: float = 120.0,
    ):
        if workers < 1 or timeout <= 0:
            raise ValueError("workers must be >= 1 and timeout > 0")
        self.workers, self.timeout = workers, timeout
        self.memory_mb, self.startup_timeout = memory_mb, startup_timeout
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.workers)
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()

    def equivalent(self, gold: str, predicted: str) -> tuple[bool, str]:
        """(equal, note): note is "" on an answer, else why there is none (timeout, worker error)."""
        if self._closed:
            raise RuntimeError("this MathVerifier is closed")
        if os.getpid() != self._pid:
            self._reset()  # a forked child: the workers' pipes belong to the parent
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker(self.memory_mb, self.startup_timeout)
            try:
                reply = worker.ask(
                    {"gold": gold, "predicted": predicted}, time.monotonic() + self.timeout
                )
            except TimeoutError:
                worker.kill()
                return False, f"math-verify timed out after {self.timeout:g} s"
            except (EOFError, OSError, ValueError):
                worker.kill()
                return False, "math-verify worker died"
            except BaseException:  # interrupted mid-request: its reply would answer the next caller
                worker.kill()
                raise
            if self._closed:
                worker.kill()
            else:
                self._idle.put(worker)
        if "error" in reply:
            return False, f"math-verify failed: {reply['error']}"
        return bool(reply["equal"]), ""

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: MathVerifier | None = None
_shared_lock = threading.Lock()


def shared_verifier() -> MathVerifier:
    """The process-wide pool `score_math` uses unless given one; started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifier()
            atexit.register(_shared.close)
        return _shared


def close_shared_verifier() -> None:
    """Stop the shared pool's workers now (the next `score_math` starts a fresh pool)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


def _canonical(answer: str) -> str:
    """Spelling-only normalisation for the fast path: equal here means equal, nothing more."""
    answer = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", answer)
    answer = re.sub(r"\\(?:left|right)(?![A-Za-z])|\\[!,;]", "", answer)
    # Spaces between digits are kept: "4 2" is not obviously 42.
    return "".join(re.sub(r"(?<=\d)\s+(?=\d)", "_", answer).split())


def reference_answer(answer: str) -> str:
    """The gold answer as a bare expression: datasets sometimes store it boxed."""
    boxed = last_boxed(answer)
    return clean_answer(boxed if boxed is not None else answer)


def score_math(response: str, answer: str, *, verifier: MathVerifier | None = None) -> Score:
    """Score `response` against the reference `answer`: +1 if its last boxed answer is equivalent.

    Bounded in time (the verifier's timeout, default 5 s; a timeout scores as wrong). Safe to call
    from any thread; from asyncio use `score_math_async`.
    """
    boxed = last_boxed(response)
    if boxed is None:
        return verdict(False, None, "no boxed answer")
    predicted = clean_answer(boxed)
    if not predicted:
        return verdict(False, predicted, "empty boxed answer")
    if len(predicted) > MAX_ANSWER_CHARS:
        return verdict(
            False, predicted[:100], f"boxed answer longer than {MAX_ANSWER_CHARS} characters"
        )
    gold = reference_answer(str(answer))
    if not gold:
        raise ValueError("the reference answer is empty")
    if _canonical(predicted) == _canonical(gold):
        return verdict(True, predicted)
    equal, note = (verifier or shared_verifier()).equivalent(gold, predicted)
    return verdict(equal, predicted, note or "not equivalent to the reference")


async def score_math_async(
    response: str, answer: str, *, verifier: MathVerifier | None = None
) -> Score:
    """`score_math` for an event loop: the wait happens in a thread, never on the loop."""
    return await asyncio.to_thread(score_math, response, answer, verifier=verifier)
