"""A child process that answers math-verify comparisons, one JSON line in, one JSON line out.

Run by `cleaner.rewards.math`; not an entry point for people. It runs math-verify in its own main
thread with math-verify's timeouts off: the parent bounds the time by killing this process.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys


def main() -> None:
    # Keep the protocol channel for ourselves; anything a library prints goes to stderr instead.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    limit_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if limit_mb > 0:
        # A pathological expression (a tower of powers) must fail with MemoryError, not eat the host.
        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # With the timeouts off, math-verify warns on every call that the caller must bound the time.
    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    channel.write('{"ready": true}\n')
    channel.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            gold = parse("\\boxed{" + request["gold"] + "}", parsing_timeout=None)
            predicted = parse("\\boxed{" + request["predicted"] + "}", parsing_timeout=None)
            equal = bool(gold) and bool(predicted) and verify(gold, predicted, timeout_seconds=None)
            reply = {"equal": bool(equal)}
        except (Exception, MemoryError, RecursionError) as e:
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
