"""The study's rollout protocol (the published mbpp_127 format) as pure logic.

Everything the model sees or sends is defined here, in one place: the system prompts, the task prompt, the action
grammar, the prediction line and every tool-result string. `Episode` is the state machine of one rollout: it
takes one assistant reply at a time and returns the next user message. It does no I/O; the only effect it has is
calling the injected `run_tests(solution) -> Outcome` (the sandbox in production, a stub in unit tests).

Rules (the environment's, documented here and in the system prompts):

* One action per reply: the first line (outside a closed ``<think>...</think>`` block) that is
  ``CALL <tool> {json}`` or ``FINAL: <summary>``. JSON arguments are one object on that line.
* Tools: ``read_file {"file_path"}``, ``apply_patch {"find", "replace"}`` (optional ``file_path``, default
  solution.py), ``python_test {"project_path"}``. Paths are relative to the workdir; the workdir holds one file,
  solution.py. Every reply that is not FINAL and not an awaited prediction is a tool call and costs one call of
  the budget, including replies that produce a ``status: error`` result (no action line, malformed JSON, missing
  arguments, unknown tool, path outside the workdir, missing/ambiguous find text), except that a python_test that
  runs costs ``test_cost`` calls (below).
* Expensive tests (``test_cost: k``, both protocols, any variant; default 1 = the study's protocol): a python_test
  that runs spends k budget calls. When fewer than k calls are left it is refused: nothing runs, the answer is
  ``status: error`` (`ERRORS["test_unaffordable"]`), and the reply costs one call like any other invalid action (so
  a model that keeps asking still runs out of budget). A python_test with a bad path is an invalid action and costs
  one call. The budget scales with k so that a direct solve (read_file, apply_patch, python_test, FINAL: 2 + k
  calls) keeps the spare calls it has at k = 1: the effective budget is ``budget + (k - 1)`` (`scaled_budget`;
  applied by `ProtocolConfig.resolve` after the variant, so the study's 8 becomes 10 at k = 3). The system prompt
  states the cost and the refusal exactly (only when k > 1; at k = 1 it is the study's prompt, byte for byte).
* Budget: after the call that spends the last unit the episode ends (``budget_exhausted``) without another model
  call, except that a successful patch still gets its pending prediction in the predictive protocol (the
  prediction can refund the call under ``revise_costs_call=False``, and then the episode goes on).
* Context: a conversation that outgrows the server's context (``serving.max_model_len``: the server refuses the
  prompt as longer than its maximum context) ends the episode with ``stop_reason`` ``context``, graded on its
  solution state as a spent budget is. Its length is the policy's own doing (its replies and the results its calls
  asked for), so it is no infrastructure failure: left out of the figures, a task the policy talks past the context
  would drop out of every comparison, and a greedy rerun would drop it again.
* Predictive protocol: the reply after a successful ``apply_patch`` result must be
  ``<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>``. It is not a tool call. A non-PASS prediction
  forces REVISE. REVISE reverts the patch and answers with `RESULT_PATCH_REVERTED`, which says nothing about the
  patch's outcome; KEEP answers `RESULT_PATCH_KEPT`. A malformed prediction line is recorded as
  ``prediction="MALFORMED"`` (the raw reply is kept on the step), counts as a non-PASS prediction (so REVISE,
  unless the variant is forced_keep) and is answered with a ``status: error`` message naming the expected format
  and what happened to the patch.
* Variants (one at a time: ``variant`` is one value). The predictive ones (`PREDICTIVE_VARIANTS`, the
  predictive protocol only): ``forced_keep`` makes every effective decision KEEP (predictions are still asked for
  and recorded); ``budget_neutral`` makes REVISE free (``revise_costs_call=False``) or, when a budget is given for
  it, raises the budget to that value (see `ProtocolConfig.resolve`); ``edit_on_revise`` (below). Any action line in
  a prediction reply is ignored (never executed), except edit_on_revise's replacement. The environment ones
  (`ENVIRONMENT_VARIANTS`, both protocols: what acting first costs): ``irreversible`` and ``blind`` (below). No
  variant combines with another (an irreversible or blind edit_on_revise is not a setting); each combines with
  ``test_cost``.
* Irreversible (``variant: irreversible``): the first python_test that runs is final. The episode ends on it
  (``stop_reason`` ``final_test``, no further model call) and is graded on the solution state it tested (nothing
  changes the state after it, so solution.py as the episode leaves it is that state). Its result never reaches the
  model (``result_sent=False``): the test and the patch it tested record ``outcome_seen=False``, as for a
  budget-ending test. A python_test that does not run (a bad path; refused under ``test_cost``) is an invalid
  action as always and ends nothing. Before it, the episode is the study's: Arm B's KEEP/REVISE is the last chance
  to act on a prediction. Without a test the episode ends at FINAL or the budget, graded then. The system prompt's
  python_test line says the test ends the episode and shows no result (`_TEST_TOOL_IRREVERSIBLE`).
* Blind (``variant: blind``): no test tool. The system prompt offers read_file and apply_patch only and says that no
  tool runs the tests and no result is ever shown (`_BLIND_RULE`); a python_test call is an invalid action
  (``action="invalid"``, ``tool="python_test"``, `ERRORS["test_unavailable"]`, one call), and the tool lists in
  error messages leave it out (`ProtocolConfig.tools`). The episode ends at FINAL or the budget and is graded then.
  Every patch's outcome is a hidden shadow execution (``outcome_seen=False``): no user message carries an outcome
  class or test output. At ``test_cost`` k the budget is scaled as for every variant (the calls the other runs at
  k have), and the prompt has no cost note (there is no test to pay for).
* Edit on REVISE (``variant: edit_on_revise``, cap ``max_chained_revisions``, default 2): an effective REVISE
  (sampled, forced by a non-PASS prediction, or by a malformed line) must be followed in the same reply by a
  replacement patch: the first action line after the prediction line (anywhere in the reply when no prediction
  line parsed), ``CALL apply_patch {"find", "replace"}``. The REVISEd patch is shadowed and reverted as always,
  then the replacement is applied to the reverted solution at no call (the REVISEd patch's call stays spent;
  REVISE is never refunded here: ``revise_costs_call=False`` is refused), answered with ``patch reverted`` and
  `REPLACEMENT_APPLIED` (its place in the chain, e.g. ``chained revision 1 of 2``), and the next reply must be the
  replacement's own prediction, under the same rules. A REVISE of the ``max_chained_revisions``-th replacement in
  a row only reverts it: a replacement in that reply is not applied (`ERRORS["revision_cap"]`; without one the
  answer is the plain `RESULT_PATCH_REVERTED`). Below the cap, a REVISE reply without a usable replacement (none,
  another action, or one that fails like a tool call's patch would: malformed JSON, missing arguments, bad path,
  missing/ambiguous find text) reverts the patch, applies nothing and is answered ``status: error`` naming why
  (`ERRORS["replacement_missing"]`, ``["replacement_not_patch"]``, ``["replacement_failed"]``); it costs no call
  either (a prediction reply never does). Nothing is discarded silently: every REVISE reply's answer says what was
  applied: ``status: success`` (``status: error`` when the prediction was malformed or a replacement was missing,
  failed or refused), then ``patch reverted`` (the malformed-prediction message instead, when malformed), then the
  replacement's line, if any. The REVISEd patch's hidden outcome is recorded before the revert; the replacement is
  a patch like any other (tested in view or shadowed; its prediction is asked for even after the budget-ending
  call). Records: the step of a REVISE reply that applied a replacement is the replacement's patch step too
  (``edited_from`` = the REVISEd patch's step, ``revision_depth`` = its place in the chain; its prediction fields
  are the replacement's, its own prediction is on ``steps[patch_step]``). ``edit_error`` holds why a replacement
  was not applied.
* Shadow execution: every successful patch gets a verified outcome, in every variant. A patch is "tested in view"
  when a python_test runs on exactly its solution state before anything changes that state (read_file and failed
  patches change nothing) and its result reaches the model (not the budget-ending call); then the test's outcome
  is the patch's, with ``outcome_seen=True``. Otherwise (a later patch, a REVISE, or the end of the episode comes
  first) the patched code is run hidden, before any revert, and its outcome is recorded with ``outcome_seen=False``.
* Test results are memoised per solution text within an episode, so re-testing unchanged code is consistent and
  free.
* If the episode is cut off (model error, model-call cap) while a prediction is pending, the patch stays applied
  and its prediction and decision stay null.
* Records: a *patch step* is a step with ``applied`` (``action == "apply_patch"``, or under edit_on_revise a
  prediction step that carries a replacement); its prediction fields (prediction, decision_sampled, decision,
  forced, reverted, prediction_step) are those of its patch. A prediction step's ``patch_step`` is the patch it
  predicts. ``cost`` is the budget calls a step spent (after a budget_neutral refund), ``calls_used`` the running
  total.
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from predict.vocabulary import OUTCOMES, PREDICTIVE_VARIANTS, PROTOCOLS, VARIANTS, Outcome, Protocol, Variant

SOLUTION_FILE = "solution.py"
STUB = "# Write your function here.\n"
TOOLS: tuple[str, ...] = ("read_file", "apply_patch", "python_test")
DECISIONS: tuple[str, ...] = ("KEEP", "REVISE")
PREDICTION_CLASSES: tuple[str, ...] = OUTCOMES
MALFORMED = "MALFORMED"
STOP_REASONS: tuple[str, ...] = ("final", "budget", "error", "max_turns", "final_test", "context")
"""``final_test``: the irreversible variant's python_test ended the episode; ``context``: the conversation outgrew
the server's context (module doc)."""

RunTests = Callable[[str], Any]
"""solution text -> an Outcome (or anything with `.outcome` and optionally `.detail`, like a sandbox Verdict)."""

# Runtime layout: the files the task, harness and program share inside the rollout's workdir.
TASK_FILE = ".predict/task.json"  # {"task_id", "test_list", "test_setup_code"}: written by the task's setup
RESULT_FILE = ".predict/result.json"  # the program's episode result, copied into trace.info
RESULT_MAX_BYTES = 64 << 20  # the most of RESULT_FILE the harness and the task read back
DETAIL_CHARS = 500  # sandbox detail kept per verified outcome

# ---------------------------------------------------------------------------------------------------------------
# Tool-result strings: exactly what the model gets back as the next user message.
# ---------------------------------------------------------------------------------------------------------------
RESULT_PATCH_APPLIED = "status: success\npatch applied"
RESULT_TESTS_PASSED = "status: success\ntests passed"
RESULT_TESTS_FAILED = "status: failed\ntests failed (actual: {outcome})"
# The neutral answers to a prediction message: they reveal nothing about the patch's outcome.
PATCH_KEPT = "patch kept"
PATCH_REVERTED = "patch reverted"
RESULT_PATCH_KEPT = "status: success\n" + PATCH_KEPT
RESULT_PATCH_REVERTED = "status: success\n" + PATCH_REVERTED

# edit_on_revise: the line after "patch reverted" when a replacement patch went in (depth: its place in the chain)
REPLACEMENT_APPLIED = "replacement patch applied (chained revision {depth} of {cap})"

PREDICTION_FORMAT = "<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>"


def read_result(text: str) -> str:
    return f"status: success\n{text}"


def error_result(message: str) -> str:
    return f"status: error\n{message}"


# Error messages say what was wrong and how to fix it; the `kind` keys are what the step records.
ERRORS: dict[str, str] = {
    "no_action": (
        "no action line found. Reply with exactly one action line: "
        'CALL <tool> {{"arg": "value"}} (tools: {tools}) or FINAL: <summary>.'
    ),
    "malformed_json": (
        "malformed JSON arguments for {tool}: {detail}. Put the arguments on the same line as one JSON object, "
        'e.g. CALL apply_patch {{"find": "old text", "replace": "new text"}} (use \\n for newlines).'
    ),
    "missing_args": "{tool} needs the string argument(s) {args}, e.g. {example}.",
    "unknown_tool": "unknown tool {tool!r}. Available tools: {tools}.",
    "path_outside_workdir": (
        "path {path!r} is outside the workdir. Use a path relative to the workdir, e.g. " + SOLUTION_FILE + "."
    ),
    "no_such_file": "no such file {path!r}. The workdir contains only " + SOLUTION_FILE + ".",
    "find_empty": "the find text is empty. Give an exact, non-empty snippet of the current " + SOLUTION_FILE + ".",
    "find_not_found": (
        "the find text was not found in {path}; nothing was changed. Copy it exactly from the current file "
        "(read_file shows it)."
    ),
    "find_ambiguous": (
        "the find text occurs {count} times in {path}; it must occur exactly once, nothing was changed. "
        "Include more surrounding text to make it unique."
    ),
    "malformed_prediction": (
        "malformed prediction. After a patch, reply with exactly "
        + PREDICTION_FORMAT
        + ", CLASS one of "
        + ", ".join(PREDICTION_CLASSES)
        + ". It counts as a non-PASS prediction: the patch was {fate}."
    ),
    # test_cost > 1
    "test_unaffordable": (
        "python_test costs {cost} tool calls, calls left: {left}. Nothing was run (this reply used one call). "
        "Use the remaining calls for other tools, or end with FINAL: <summary>."
    ),
    # blind: the tool is not offered
    "test_unavailable": (
        "there is no python_test tool here: the tests run only when the episode ends, and their result is never "
        "shown. Available tools: {tools}."
    ),
    # edit_on_revise: the line after "patch reverted" when no replacement went in
    "replacement_missing": (
        "no replacement patch. After REVISE, put the replacement on a later line of the same reply: "
        'CALL apply_patch {{"find": "<exact text>", "replace": "<new text>"}}, written against solution.py '
        "without the reverted patch. Nothing was applied."
    ),
    "replacement_not_patch": (
        "the action after REVISE must be apply_patch, not {tool}; it was not run. Nothing was applied."
    ),
    "replacement_failed": "the replacement patch was not applied: {detail}",
    "revision_cap": (
        "chained revision limit reached ({cap} replacement patches in a row), so the replacement patch was not "
        "applied. Continue with a tool call."
    ),
}

TOOL_EXAMPLES: dict[str, str] = {
    "read_file": 'CALL read_file {"file_path": "solution.py"}',
    "apply_patch": 'CALL apply_patch {"find": "...", "replace": "..."}',
    "python_test": 'CALL python_test {"project_path": "solution.py"}',
}
REQUIRED_ARGS: dict[str, tuple[str, ...]] = {
    "read_file": ("file_path",),
    "apply_patch": ("find", "replace"),
    "python_test": ("project_path",),
}

# ---------------------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------------------
_SYSTEM_COMMON = """\
You are a coding agent. Your workdir contains one file, solution.py, which starts as the stub \
"# Write your function here.". Write the requested Python function in solution.py so that it passes the tests.

Act with tools. Reply with exactly one action line per message (it may follow your reasoning):
CALL read_file {{"file_path": "solution.py"}}
  shows the current file.
CALL apply_patch {{"find": "<exact text>", "replace": "<new text>"}}
  replaces the one occurrence of the find text in solution.py (use \\n for newlines inside JSON strings).
{test_tool}FINAL: <one-line summary>
  ends the episode; solution.py as it is then is graded.
{rule}
The JSON arguments go on the same line as CALL. You have a budget of {budget} tool calls; a reply that is not a \
valid action also uses one. When the budget is spent the episode ends and solution.py is graded as it is."""

# The python_test entry of the tool list ({test_cost_note}: `_SYSTEM_TEST_COST` or nothing); blind has none.
_TEST_TOOL = """\
CALL python_test {{"project_path": "solution.py"}}
  runs the task's tests on solution.py and reports the outcome class: PASS, ASSERTION_FAILURE, RUNTIME_ERROR, \
SYNTAX_ERROR, TIMEOUT or OTHER.{test_cost_note}
"""
_TEST_TOOL_IRREVERSIBLE = """\
CALL python_test {{"project_path": "solution.py"}}
  runs the task's tests on solution.py and ends the episode: solution.py as tested is graded, and you get no \
result. Only one test can run, so test only when solution.py is done.{test_cost_note}
"""
# blind: the paragraph after the tool list (the other variants have none there)
_BLIND_RULE = """
No tool runs the tests: they run only when the episode ends and solution.py is graded, and you never see their \
result.
"""

# test_cost > 1 only (appended to the python_test line; at test_cost 1 the prompt is the study's)
_SYSTEM_TEST_COST = """
  It costs {test_cost} tool calls of the budget (every other tool call costs one). With fewer than {test_cost} \
calls left it is refused with status: error, and that reply uses one call."""

_SYSTEM_PREDICTIVE = """

After every successful apply_patch, before anything else, predict the outcome of running the tests on the patched \
solution.py and decide whether to keep the patch. Reply with exactly this line:
<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>
where CLASS is one of PASS, ASSERTION_FAILURE, RUNTIME_ERROR, SYNTAX_ERROR, TIMEOUT, OTHER. KEEP keeps the patch; \
REVISE reverts it (the tool call stays spent{revise_cost}). Any prediction other than PASS means REVISE. The \
prediction line is not a tool call."""

_SYSTEM_PREDICTIVE_FORCED_KEEP = """

After every successful apply_patch, before anything else, predict the outcome of running the tests on the patched \
solution.py and state a decision. Reply with exactly this line:
<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>
where CLASS is one of PASS, ASSERTION_FAILURE, RUNTIME_ERROR, SYNTAX_ERROR, TIMEOUT, OTHER. The patch is kept \
whatever you decide. The prediction line is not a tool call."""


_SYSTEM_PREDICTIVE_EDIT = """

After every successful apply_patch, before anything else, predict the outcome of running the tests on the patched \
solution.py and decide whether to keep the patch. Reply with exactly this line:
<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>
where CLASS is one of PASS, ASSERTION_FAILURE, RUNTIME_ERROR, SYNTAX_ERROR, TIMEOUT, OTHER. KEEP keeps the patch. \
Any prediction other than PASS means REVISE. REVISE reverts the patch (the tool call stays spent) and must be \
followed, on a later line of the same reply, by a replacement patch written against solution.py as it was before \
the reverted patch:
CALL apply_patch {{"find": "<exact text>", "replace": "<new text>"}}
The replacement costs no tool call; it is applied and then needs its own prediction line. At most \
{max_chained_revisions} replacements can follow one another; a REVISE of the last one only reverts it. The \
prediction line is not a tool call."""


def call_line(tool: str, args: dict[str, str]) -> str:
    """A well-formed action line, as a model that follows the system prompt writes it (used by the SFT traces)."""
    return f"CALL {tool} {json.dumps(args, ensure_ascii=False)}"


def final_line(summary: str) -> str:
    return f"FINAL: {summary}"


def prediction_line(prediction: str, decision: str) -> str:
    """The prediction reply in `PREDICTION_FORMAT`."""
    return f"<PREDICTION>{prediction}</PREDICTION> <DECISION>{decision}</DECISION>"


def edit_reply(prediction: str, find: str, replace: str) -> str:
    """An edit_on_revise REVISE reply: the prediction line, then the replacement patch on the next line."""
    return prediction_line(prediction, "REVISE") + "\n" + call_line("apply_patch", {"find": find, "replace": replace})


def scaled_budget(budget: int, test_cost: int) -> int:
    """The budget at `test_cost`: a direct solve (2 + test_cost calls) keeps the spare calls it has at cost 1."""
    return budget + test_cost - 1


def task_prompt(text: str, test_list: list[str] | tuple[str, ...]) -> str:
    """The MBPP task prompt: the task text plus its asserts, as in the study's rollouts."""
    return f"{text}\nYour code should pass these tests:\n\n" + "\n".join(test_list)


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProtocolConfig:
    """What the program enforces in one episode (already resolved: see `resolve`)."""

    # The agent program imports this module in its sandbox without the config stack (pydantic), so the
    # env defaults below are copies: each line says so and tests/test_config_defaults.py holds them equal to the model.
    protocol: Protocol = "reactive"
    variant: Variant = "none"  # mirrors the config default (ExtensionSettings.variant)
    budget: int = 8
    revise_costs_call: bool = True  # mirrors the config default (EnvSettings.revise_costs_call)
    max_model_calls: int | None = None
    """Hard cap on model replies; None = the most the budget can use (see `model_call_cap`)."""
    test_cost: int = 1  # mirrors the config default (EnvSettings.test_cost)
    """Budget calls a python_test that runs spends (`budget` is already scaled for it: see `resolve`)."""
    max_chained_revisions: int = 2  # mirrors the config default (EnvSettings.max_chained_revisions)
    """edit_on_revise: most replacement patches in a row (ignored by the other variants)."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant in PREDICTIVE_VARIANTS and self.protocol != "predictive":
            raise ValueError(f"variant {self.variant!r} needs the predictive protocol")
        if self.max_model_calls is not None and self.max_model_calls < 1:
            raise ValueError(f"max_model_calls must be >= 1, got {self.max_model_calls}")
        for name in ("budget", "test_cost", "max_chained_revisions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.variant == "edit_on_revise" and not self.revise_costs_call:
            raise ValueError(
                "variant 'edit_on_revise' needs revise_costs_call=True (a refunded REVISE plus a free "
                "replacement would make patches free)"
            )

    # Each default below is the field's of the same name above (class-body names, evaluated here): written once.
    @classmethod
    def resolve(
        cls,
        protocol: str = protocol,
        variant: str = variant,
        budget: int = budget,
        revise_costs_call: bool = revise_costs_call,
        budget_neutral_budget: int | None = None,
        max_model_calls: int | None = max_model_calls,
        test_cost: int = test_cost,
        max_chained_revisions: int = max_chained_revisions,
    ) -> ProtocolConfig:
        """Apply the variant (budget_neutral = the raised budget when one is given, else a free REVISE), then scale
        the budget for the test cost (`scaled_budget`)."""
        if variant == "budget_neutral":
            if budget_neutral_budget is not None:
                budget = budget_neutral_budget
            else:
                revise_costs_call = False
        return cls(
            protocol,  # type: ignore[arg-type]
            variant,  # type: ignore[arg-type]
            scaled_budget(budget, test_cost),
            revise_costs_call,
            max_model_calls,
            test_cost,
            max_chained_revisions,
        )

    @classmethod
    def from_env(cls, env: Any, protocol: str, **overrides: Any) -> ProtocolConfig:
        """`resolve` with the study config's typed ``env`` section (`predict.config.models.EnvSettings`: its keys are
        `resolve`'s argument names; a key the config left out is left to `resolve`), the arm's protocol and
        `overrides` (e.g. a run's variant) on top: the one place the knobs' defaults live."""
        knobs = {k: getattr(env, k) for k in PROTOCOL_KNOBS if k in env.model_fields_set and k != "protocol"}
        return cls.resolve(**{**knobs, "protocol": protocol, **overrides})

    @property
    def predictive(self) -> bool:
        return self.protocol == "predictive"

    @property
    def model_call_cap(self) -> int:
        """Replies the program asks for at most. Every tool call can be followed by one prediction, plus FINAL:
        2*budget+1 never binds while REVISE costs a call; a free REVISE can loop, so then the cap is 4*budget+1
        (hitting it ends the episode with stop_reason max_turns). Under edit_on_revise a patch call can be followed
        by 1 + max_chained_revisions predictions: (max_chained_revisions+2)*budget+1, which never binds either."""
        if self.max_model_calls is not None:
            return self.max_model_calls
        if self.variant == "edit_on_revise":
            return (self.max_chained_revisions + 2) * self.budget + 1
        return 2 * self.budget + 1 if self.revise_costs_call or not self.predictive else 4 * self.budget + 1

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools this episode offers: every one of `TOOLS`, but python_test under blind."""
        return tuple(t for t in TOOLS if not (t == "python_test" and self.variant == "blind"))

    def system_prompt(self) -> str:
        note = _SYSTEM_TEST_COST.format(test_cost=self.test_cost) if self.test_cost != 1 else ""
        test_tool = {"blind": "", "irreversible": _TEST_TOOL_IRREVERSIBLE}.get(self.variant, _TEST_TOOL)
        text = _SYSTEM_COMMON.format(
            budget=self.budget,
            test_tool=test_tool.format(test_cost_note=note),
            rule=_BLIND_RULE if self.variant == "blind" else "",
        )
        if not self.predictive:
            return text
        if self.variant == "forced_keep":
            return text + _SYSTEM_PREDICTIVE_FORCED_KEEP
        if self.variant == "edit_on_revise":
            return text + _SYSTEM_PREDICTIVE_EDIT.format(max_chained_revisions=self.max_chained_revisions)
        return text + _SYSTEM_PREDICTIVE.format(revise_cost="" if self.revise_costs_call else ", refunded")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The protocol knobs as the study config and callers name them (`ProtocolConfig.resolve`'s arguments).
PROTOCOL_KNOBS: tuple[str, ...] = tuple(p for p in inspect.signature(ProtocolConfig.resolve).parameters if p != "cls")


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_CALL = re.compile(r"^\s*CALL\s+(\S+)(.*)$")
_FINAL = re.compile(r"^\s*FINAL:(.*)$")
# Groups: 1 = from the PREDICTION tag's ">" to the end of the class, 2 = the class, 3 and 4 the same for DECISION.
_PREDICTION = re.compile(
    r"<PREDICTION(>\s*([^<\n]*?))\s*</PREDICTION>\s*<DECISION(>\s*([^<\n]*?))\s*</DECISION>", re.IGNORECASE
)


def strip_thinking(reply: str) -> str:
    """Drop closed <think>...</think> blocks: an action mentioned while reasoning is not the action."""
    return _THINK.sub("", reply)


@dataclass(frozen=True)
class Action:
    """One parsed reply. kind: call | final | none (no action line)."""

    kind: Literal["call", "final", "none"]
    line: str | None = None
    tool: str | None = None
    args_text: str | None = None
    summary: str | None = None


def parse_action(reply: str) -> Action:
    """The first action line of the reply (outside closed think blocks)."""
    for line in strip_thinking(reply).splitlines():
        if m := _CALL.match(line):
            return Action("call", line=line.strip(), tool=m.group(1), args_text=m.group(2).strip())
        if m := _FINAL.match(line):
            return Action("final", line=line.strip(), summary=m.group(1).strip())
    return Action("none")


def parse_args(text: str) -> dict[str, Any]:
    """One JSON object from the start of `text` (trailing text after the object is ignored)."""
    if not text:
        raise ValueError("no JSON arguments after the tool name")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as e:
        raise ValueError(e.msg + f" at column {e.colno}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Prediction:
    prediction: str  # a PREDICTION_CLASSES value or MALFORMED
    decision: str | None  # the sampled decision when it parsed, else None
    valid: bool


@dataclass(frozen=True)
class PredictionLine:
    """The prediction line the protocol acts on, located in the reply as written (character offsets into it)."""

    prediction: str
    """The class as sampled (blanks stripped, case kept)."""
    decision: str
    prediction_span: tuple[int, int]
    """[start, end) from the PREDICTION tag's ">" to the end of the class (the label's characters)."""
    decision_span: tuple[int, int]
    """The same for the DECISION value."""


def find_prediction_line(reply: str) -> PredictionLine | None:
    """The first ``<PREDICTION>..</PREDICTION> <DECISION>..</DECISION>`` pair outside closed think blocks: the one
    `parse_prediction` acts on (a lone PREDICTION pair before it is not it), or None. The label locator of training
    (`predict.train.labels`) reads its spans, so the label it trains is the prediction the program acted on."""
    kept: list[int] = []  # reply offset of each character of strip_thinking(reply)
    pos = 0
    for t in _THINK.finditer(reply):
        kept.extend(range(pos, t.start()))
        pos = t.end()
    kept.extend(range(pos, len(reply)))
    m = _PREDICTION.search(strip_thinking(reply))
    if m is None:
        return None

    def span(group: int) -> tuple[int, int]:  # never empty: the group starts with the tag's ">"
        a, b = m.span(group)
        return kept[a], kept[b - 1] + 1

    return PredictionLine(m.group(2), m.group(4), span(1), span(3))


def parse_prediction(reply: str) -> Prediction:
    """The prediction line (`find_prediction_line`). Tags are matched case-insensitively and values are
    upper-cased; anything else (missing tags, unknown class, unknown decision) makes the whole line MALFORMED (a
    parsable decision is still kept)."""
    line = find_prediction_line(reply)
    if line is None:
        return Prediction(MALFORMED, None, False)
    cls_, decision = line.prediction.strip().upper(), line.decision.strip().upper()
    decision_ok = decision in DECISIONS
    if cls_ not in PREDICTION_CLASSES or not decision_ok:
        return Prediction(MALFORMED, decision if decision_ok else None, False)
    return Prediction(cls_, decision, True)


def replacement_action(reply: str) -> Action:
    """edit_on_revise: the first action line after the prediction line (outside closed think blocks), or the reply's
    first action line when no prediction line parsed."""
    text = strip_thinking(reply)
    m = _PREDICTION.search(text)
    return parse_action(text[m.end() :] if m else text)


def resolve_path(path: Any) -> str | None:
    """Normalise a workdir-relative path; None when it is absolute or escapes the workdir."""
    if not isinstance(path, str) or not path or path.startswith(("/", "~")) or "\\" in path:
        return None
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


# ---------------------------------------------------------------------------------------------------------------
# The episode
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Step:
    """One assistant reply and what the environment did with it."""

    index: int
    action: str  # read_file | apply_patch | python_test | final | prediction | invalid
    reply: str
    status: str  # success | failed | error | final
    result: str | None = None  # the environment's answer (None for FINAL)
    result_sent: bool = True  # False when the episode ended on this step, so the answer never reached the model
    tool: str | None = None  # the tool name as written (also for unknown tools)
    action_line: str | None = None
    args: str | None = None  # JSON of the parsed arguments
    error: str | None = None  # error kind, a key of ERRORS
    counted: bool = False  # whether this step spent a budget call (False after a refund)
    cost: int = 0  # budget calls this step spent (test_cost for a python_test that ran; 0 after a refund)
    calls_used: int = 0  # budget calls used after this step
    # apply_patch
    find: str | None = None
    replace: str | None = None
    applied: bool = False
    patched_code: str | None = None
    # edit_on_revise, on a REVISE reply's step: the replacement patch it carries (then also a patch step)
    edited_from: int | None = None  # the REVISEd patch's step, when the replacement was applied
    revision_depth: int = 0  # on a patch step: 0 for a tool call's patch, k for the k-th replacement in a row
    edit_error: str | None = None  # why no replacement was applied (a key of ERRORS)
    # prediction (on the prediction step and copied onto its patch step)
    prediction: str | None = None
    decision_sampled: str | None = None
    decision: str | None = None
    forced: bool | None = None
    reverted: bool = False
    prediction_step: int | None = None  # on a patch step: its prediction step
    patch_step: int | None = None  # on a prediction step: its patch step
    # verified outcome (patch steps: of the patched code; python_test steps: of the tested code)
    outcome: str | None = None
    outcome_seen: bool | None = None
    outcome_step: int | None = None  # on a patch step tested in view: the python_test step that showed it
    outcome_detail: str | None = None  # the sandbox's detail for that outcome, when it gave one
    summary: str | None = None  # FINAL text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Episode:
    """One rollout's state machine. Feed replies with `step`; read `steps`, `summary()` at the end."""

    config: ProtocolConfig
    run_tests: RunTests
    solution: str = STUB
    steps: list[Step] = field(default_factory=list)
    calls_used: int = 0
    done: bool = False
    stop_reason: str | None = None
    error: str | None = None
    _awaiting_prediction: Step | None = None  # patch step whose prediction is the next reply
    _untested: Step | None = None  # patch step whose state is the current solution and has no outcome yet
    _pre_patch: str | None = None  # the solution before `_awaiting_prediction`'s patch (for REVISE)
    _outcomes: dict[str, tuple[Outcome, str | None]] = field(default_factory=dict)

    # -- public -----------------------------------------------------------------------------------------------
    @property
    def awaiting_prediction(self) -> bool:
        return self._awaiting_prediction is not None

    @property
    def budget_exhausted(self) -> bool:
        return self.calls_used >= self.config.budget

    def step(self, reply: str) -> str | None:
        """Take one assistant reply; return the next user message, or None once the episode has ended."""
        if self.done:
            raise RuntimeError("episode already ended")
        index = len(self.steps)
        if self._awaiting_prediction is not None:
            step = self._predict(index, reply)
        else:
            step = self._act(index, reply)
        self.steps.append(step)
        if not self.done and self._awaiting_prediction is None and self.budget_exhausted:
            self.finish("budget")
        elif not self.done and len(self.steps) >= self.config.model_call_cap:
            self.finish("max_turns")
        if self.done:
            step.result_sent = False
            if step.action == "python_test" and step.outcome_seen:
                self._unsee(step)
            return None
        return step.result

    def finish(self, stop_reason: str, error: str | None = None) -> None:
        """End the episode (idempotent): settle the hidden outcome of an untested patch."""
        if self.done:
            return
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {STOP_REASONS}, got {stop_reason!r}")
        self._awaiting_prediction = None  # a cut-off prediction: the patch stays, prediction stays null
        self._shadow_untested()
        self.done, self.stop_reason, self.error = True, stop_reason, error

    def summary(self) -> dict[str, Any]:
        """Episode-level facts for the record (reward and final outcome come from the task's own check). Patch
        counts are over patch steps (``applied``), so an edit_on_revise replacement counts as a patch."""
        patches = [s for s in self.steps if s.applied]
        tests = [s for s in self.steps if s.action == "python_test"]
        edits = [s for s in self.steps if s.edited_from is not None]
        return {
            "budget": self.config.budget,
            "test_cost": self.config.test_cost,
            "calls_used": self.calls_used,
            "budget_exhausted": self.budget_exhausted,
            "stop_reason": self.stop_reason,
            "n_model_calls": len(self.steps),
            "n_patches": len(patches),
            "n_tests": len(tests),
            "n_test_calls": sum(s.cost for s in tests),
            "n_tests_refused": sum(s.error == "test_unaffordable" for s in tests),
            "n_errors": sum(s.status == "error" for s in self.steps),
            "n_predictions": sum(s.action == "prediction" for s in self.steps),
            "n_malformed_predictions": sum(s.prediction == MALFORMED for s in patches),
            "n_revised": sum(s.reverted for s in patches),
            "n_forced": sum(bool(s.forced) for s in patches),
            "ever_revised": any(s.reverted for s in patches),
            "n_edit_revisions": len(edits),
            "n_edit_errors": sum(s.edit_error is not None for s in self.steps),
            "ever_edited": bool(edits),
            "max_revision_depth": max((s.revision_depth for s in patches), default=0),
            "first_patch_outcome": patches[0].outcome if patches else None,
            "final_solution": self.solution,
            "error": self.error,
        }

    # -- internals --------------------------------------------------------------------------------------------
    def _test(self, code: str) -> tuple[Outcome, str | None]:
        if code not in self._outcomes:
            result = self.run_tests(code)
            detail = getattr(result, "detail", None)
            outcome = Outcome(getattr(result, "outcome", result))
            self._outcomes[code] = (outcome, detail[:DETAIL_CHARS] if isinstance(detail, str) else None)
        return self._outcomes[code]

    def _shadow_untested(self) -> None:
        """The current state is about to change (or the episode ends) before a test in view: run it hidden."""
        patch = self._untested
        if patch is not None and patch.patched_code is not None:
            outcome, patch.outcome_detail = self._test(patch.patched_code)
            patch.outcome, patch.outcome_seen = outcome.value, False
        self._untested = None

    def _unsee(self, test: Step) -> None:
        """The budget ran out on a python_test: it ran, but its result never reached the model."""
        test.outcome_seen = False
        for s in self.steps:
            if s.outcome_step == test.index:
                s.outcome_seen, s.outcome_step = False, None

    def _spend(self, step: Step, calls: int = 1) -> None:
        self.calls_used += calls
        step.counted = True
        step.cost += calls
        step.calls_used = self.calls_used

    def _error(self, step: Step, kind: str, **fmt: Any) -> Step:
        step.status, step.error = "error", kind
        step.result = error_result(ERRORS[kind].format(tools=", ".join(self.config.tools), **fmt))
        return step

    def _act(self, index: int, reply: str) -> Step:
        action = parse_action(reply)
        if action.kind == "final":
            step = Step(index, "final", reply, "final", action_line=action.line, summary=action.summary)
            step.calls_used = self.calls_used
            self.finish("final")
            return step
        step = Step(index, "invalid", reply, "error", action_line=action.line, tool=action.tool)
        self._spend(step)  # every non-FINAL reply here is a tool call, valid or not
        if action.kind == "none":
            return self._error(step, "no_action")
        tool = action.tool or ""
        if tool not in self.config.tools:
            return self._error(step, "test_unavailable" if tool in TOOLS else "unknown_tool", tool=tool)
        step.action = tool
        args, problem = _call_args(tool, action.args_text)
        if args is not None:
            step.args = json.dumps(args, ensure_ascii=False)
        if problem is None:
            assert args is not None
            if tool == "apply_patch":
                problem = self._patch(step, args)
            else:
                problem = _path_problem(args["file_path" if tool == "read_file" else "project_path"])
        if problem is not None:
            return self._error(step, problem[0], **problem[1])
        if tool == "python_test":
            return self._python_test(step)
        step.status = "success"
        step.result = read_result(self.solution) if tool == "read_file" else RESULT_PATCH_APPLIED
        return step

    def _patch(self, step: Step, args: dict[str, Any]) -> Problem | None:
        """Apply a patch to the current solution and make `step` its patch step; or return what is wrong with it
        (nothing changes then)."""
        find, replace = args["find"], args["replace"]
        step.find, step.replace = find, replace
        if (problem := _path_problem(args.get("file_path", SOLUTION_FILE))) is not None:
            return problem
        if not find:
            return "find_empty", {}
        count = self.solution.count(find)
        if count == 0:
            return "find_not_found", {"path": SOLUTION_FILE}
        if count > 1:
            return "find_ambiguous", {"path": SOLUTION_FILE, "count": count}
        self._shadow_untested()  # the previous patch's state is about to change untested
        self._pre_patch = self.solution
        self.solution = self.solution.replace(find, replace, 1)
        step.applied, step.patched_code = True, self.solution
        self._untested = step
        if self.config.predictive:
            self._awaiting_prediction = step
        return None

    def _python_test(self, step: Step) -> Step:
        cost, left = self.config.test_cost, self.config.budget - (self.calls_used - step.cost)
        if left < cost:  # refused: the reply keeps its one call, nothing runs
            return self._error(step, "test_unaffordable", cost=cost, left=left)
        self._spend(step, cost - step.cost)
        outcome, step.outcome_detail = self._test(self.solution)
        step.outcome, step.outcome_seen = outcome.value, True
        if outcome is Outcome.PASS:
            step.status, step.result = "success", RESULT_TESTS_PASSED
        else:
            step.status, step.result = "failed", RESULT_TESTS_FAILED.format(outcome=outcome.value)
        if self._untested is not None:  # tested in view: exactly that patch's state
            self._untested.outcome, self._untested.outcome_seen = outcome.value, True
            self._untested.outcome_step, self._untested.outcome_detail = step.index, step.outcome_detail
            self._untested = None
        if self.config.variant == "irreversible":  # the test is final: graded on this state, result unseen (`step`)
            self.finish("final_test")
        return step

    def _predict(self, index: int, reply: str) -> Step:
        patch = self._awaiting_prediction
        assert patch is not None
        self._awaiting_prediction = None
        parsed = parse_prediction(reply)
        if self.config.variant == "forced_keep":
            decision = "KEEP"
        elif parsed.prediction != "PASS":  # non-PASS (MALFORMED included) forces REVISE
            decision = "REVISE"
        else:
            decision = parsed.decision or "REVISE"
        step = Step(index, "prediction", reply, "success", patch_step=patch.index)
        step.prediction, step.decision_sampled, step.decision = parsed.prediction, parsed.decision, decision
        step.forced = parsed.decision != decision
        for name in ("prediction", "decision_sampled", "decision", "forced"):
            setattr(patch, name, getattr(step, name))
        patch.prediction_step = index
        lines = []
        if not parsed.valid:
            step.status, step.error = "error", "malformed_prediction"
            lines.append(ERRORS["malformed_prediction"].format(fate="reverted" if decision == "REVISE" else "kept"))
        if decision == "REVISE":
            self._shadow_untested()  # hidden outcome of the patched code, before the revert
            assert self._pre_patch is not None
            self.solution = self._pre_patch
            patch.reverted = True
            if not self.config.revise_costs_call and patch.counted:
                self.calls_used -= 1  # budget_neutral: REVISE gives its call back
                patch.counted, patch.cost = False, 0
            if parsed.valid:
                lines.append(PATCH_REVERTED)
            if self.config.variant == "edit_on_revise":
                edit = self._replace(step, patch, reply)
                if edit is not None:
                    lines.append(edit)
        elif parsed.valid:
            lines.append(PATCH_KEPT)
        step.calls_used = self.calls_used
        if step.edit_error is not None:
            step.status, step.error = "error", step.error or step.edit_error
        step.result = f"status: {step.status}\n" + "\n".join(lines)
        return step

    def _replace(self, step: Step, revised: Step, reply: str) -> str | None:
        """edit_on_revise: apply the REVISE reply's replacement patch to the reverted solution (see the rules);
        return the answer's line about it (None: a plain revert at the cap)."""
        depth, cap = revised.revision_depth + 1, self.config.max_chained_revisions
        action = replacement_action(reply)
        is_patch = action.kind == "call" and action.tool == "apply_patch"
        if depth > cap:  # only a revert; an attempted replacement is refused, any other action line ignored
            return self._edit_error(step, "revision_cap", cap=cap) if is_patch else None
        if action.kind == "none":
            return self._edit_error(step, "replacement_missing")
        if not is_patch:
            return self._edit_error(step, "replacement_not_patch", tool=action.tool or "FINAL")
        step.tool, step.action_line = action.tool, action.line
        args, problem = _call_args("apply_patch", action.args_text)
        if args is not None:
            step.args = json.dumps(args, ensure_ascii=False)
        if problem is None:
            assert args is not None
            problem = self._patch(step, args)
        if problem is not None:  # the error a tool call's patch would get, as the replacement's
            step.edit_error = problem[0]
            return ERRORS["replacement_failed"].format(detail=ERRORS[problem[0]].format(**problem[1]))
        # applied: this step is now the replacement's patch step; its prediction fields wait for its own prediction
        for name in ("prediction", "decision_sampled", "decision", "forced"):
            setattr(step, name, None)
        step.edited_from, step.revision_depth = revised.index, depth
        return REPLACEMENT_APPLIED.format(depth=depth, cap=cap)

    @staticmethod
    def _edit_error(step: Step, kind: str, **fmt: Any) -> str:
        step.edit_error = kind
        return ERRORS[kind].format(**fmt)


Problem = tuple[str, dict[str, Any]]
"""An error kind (a key of ERRORS) and its format arguments."""


def _path_problem(raw: Any) -> Problem | None:
    path = resolve_path(raw)
    if path is None:
        return "path_outside_workdir", {"path": raw}
    if path != SOLUTION_FILE:
        return "no_such_file", {"path": raw}
    return None


def _call_args(tool: str, args_text: str | None) -> tuple[dict[str, Any] | None, Problem | None]:
    """The parsed arguments of a known tool's call, or what is wrong with them (missing required string args)."""
    try:
        args = parse_args(args_text or "")
    except ValueError as e:
        return None, ("malformed_json", {"tool": tool, "detail": e})
    missing = [k for k in REQUIRED_ARGS[tool] if not isinstance(args.get(k), str)]
    if missing:
        return args, (
            "missing_args",
            {"tool": tool, "args": ", ".join(REQUIRED_ARGS[tool]), "example": TOOL_EXAMPLES[tool]},
        )
    return args, None
