"""The six verified outcome classes shared by the sandbox, the environment and the analysis."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """What running a candidate solution against a task's tests verifiably produced."""

    PASS = "PASS"
    ASSERTION_FAILURE = "ASSERTION_FAILURE"  # a *test* assert failed
    RUNTIME_ERROR = "RUNTIME_ERROR"  # the solution raised (also AssertionError raised in its own code)
    SYNTAX_ERROR = "SYNTAX_ERROR"  # solution.py does not compile
    TIMEOUT = "TIMEOUT"  # wall or CPU limit hit
    OTHER = "OTHER"  # no verdict: the child died silently, was killed, or broke the protocol


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
