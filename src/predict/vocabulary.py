"""The study's closed vocabularies, written once, below every module that speaks them: the six verified outcome
classes (the sandbox, the environment, the traces and the analysis), the two protocols and the variants (the config
models' ``arms.*.protocol`` and ``extensions.*.variant``, the environment's `predict.env.protocol`, the SFT traces of
`predict.traces.render` and the run matrix of `predict.runs`).

Standard library only: the sandbox's child and the agent program import it without the config stack (pydantic)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Outcome(StrEnum):
    """What running a candidate solution against a task's tests verifiably produced."""

    PASS = "PASS"
    ASSERTION_FAILURE = "ASSERTION_FAILURE"  # a *test* assert failed
    RUNTIME_ERROR = "RUNTIME_ERROR"  # the solution raised (also AssertionError raised in its own code)
    SYNTAX_ERROR = "SYNTAX_ERROR"  # solution.py does not compile
    TIMEOUT = "TIMEOUT"  # wall or CPU limit hit
    OTHER = "OTHER"  # no verdict: the child died silently, was killed, or broke the protocol


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)

Protocol = Literal["reactive", "predictive"]
Variant = Literal["none", "forced_keep", "budget_neutral", "edit_on_revise", "irreversible", "blind"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
PREDICTIVE_VARIANTS: tuple[str, ...] = ("forced_keep", "budget_neutral", "edit_on_revise")
"""Variants of the prediction step: the predictive protocol only."""
ENVIRONMENT_VARIANTS: tuple[str, ...] = ("irreversible", "blind")
"""Variants of what acting first costs, for both protocols; they change the actions an SFT trace takes
(`predict.traces.render`), so a run of one trains from its own SFT (`predict.runs`)."""
VARIANTS: tuple[str, ...] = get_args(Variant)  # none, then PREDICTIVE_VARIANTS, then ENVIRONMENT_VARIANTS
TRACE_VARIANTS: tuple[str, ...] = ("none", *ENVIRONMENT_VARIANTS)
"""The variants whose SFT traces `predict.traces.render` renders; a run of any other trains from its base arm's
SFT (`predict.runs`: ``sft: own`` needs one of these)."""
