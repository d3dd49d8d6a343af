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
  arguments, unknown tool, path outside the workdir, missing/ambiguous find text).
* Budget: after the call that spends the last unit the episode ends (``budget_exhausted``) without another model
  call, except that a successful patch still gets its pending prediction in the predictive protocol (the
  prediction can refund the call under ``revise_costs_call=False``, and then the episode goes on).
* Predictive protocol: the reply after a successful ``apply_patch`` result must be
  ``<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>``. It is not a tool call. A non-PASS prediction
  forces REVISE. REVISE reverts the patch and answers with `RESULT_PATCH_REVERTED`, which says nothing about the
  patch's outcome; KEEP answers `RESULT_PATCH_KEPT`. A malformed prediction line is recorded as
  ``prediction="MALFORMED"`` (the raw reply is kept on the step), counts as a non-PASS prediction (so REVISE,
  unless the variant is forced_keep) and is answered with a ``status: error`` message naming the expected format
  and what happened to the patch.
* Variants: ``forced_keep`` makes every effective decision KEEP (predictions are still asked for and recorded);
  ``budget_neutral`` makes REVISE free (``revise_costs_call=False``) or, when a budget is given for it, raises the
  budget to that value (see `ProtocolConfig.resolve`).
* Shadow execution: every successful patch gets a verified outcome. A patch is "tested in view" when a
  python_test runs on exactly its solution state before anything changes that state (read_file and failed
  patches change nothing) and its result reaches the model (not the budget-ending call); then the test's outcome
  is the patch's, with ``outcome_seen=True``. Otherwise (a later
  patch, a REVISE, or the end of the episode comes first) the patched code is run hidden, before any revert, and
  its outcome is recorded with ``outcome_seen=False``.
* Test results are memoised per solution text within an episode, so re-testing unchanged code is consistent and
  free.
* If the episode is cut off (model error, model-call cap) while a prediction is pending, the patch stays applied
  and its prediction and decision stay null.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from predict.outcomes import OUTCOMES, Outcome

SOLUTION_FILE = "solution.py"
STUB = "# Write your function here.\n"
TOOLS: tuple[str, ...] = ("read_file", "apply_patch", "python_test")
PROTOCOLS: tuple[str, ...] = ("reactive", "predictive")
VARIANTS: tuple[str, ...] = ("none", "forced_keep", "budget_neutral")
DECISIONS: tuple[str, ...] = ("KEEP", "REVISE")
PREDICTION_CLASSES: tuple[str, ...] = OUTCOMES
MALFORMED = "MALFORMED"
STOP_REASONS: tuple[str, ...] = ("final", "budget", "error", "max_turns")

Protocol = Literal["reactive", "predictive"]
Variant = Literal["none", "forced_keep", "budget_neutral"]
RunTests = Callable[[str], Any]
"""solution text -> an Outcome (or anything with `.outcome` and optionally `.detail`, like a sandbox Verdict)."""

# Runtime layout: the files the task, harness and program share inside the rollout's workdir.
TASK_FILE = ".predict/task.json"  # {"task_id", "test_list", "test_setup_code"}: written by the task's setup
RESULT_FILE = ".predict/result.json"  # the program's episode result, copied into trace.info
DETAIL_CHARS = 500  # sandbox detail kept per verified outcome

# ---------------------------------------------------------------------------------------------------------------
# Tool-result strings: exactly what the model gets back as the next user message.
# ---------------------------------------------------------------------------------------------------------------
RESULT_PATCH_APPLIED = "status: success\npatch applied"
RESULT_TESTS_PASSED = "status: success\ntests passed"
RESULT_TESTS_FAILED = "status: failed\ntests failed (actual: {outcome})"
# The neutral answers to a prediction message: they reveal nothing about the patch's outcome.
RESULT_PATCH_KEPT = "status: success\npatch kept"
RESULT_PATCH_REVERTED = "status: success\npatch reverted"

PREDICTION_FORMAT = "<PREDICTION>CLASS</PREDICTION> <DECISION>KEEP|REVISE</DECISION>"


def read_result(text: str) -> str:
    return f"status: success\n{text}"


def tests_failed_result(outcome: Outcome | str) -> str:
    return RESULT_TESTS_FAILED.format(outcome=Outcome(outcome).value)


def error_result(message: str) -> str:
    return f"status: error\n{message}"


# Error messages say what was wrong and how to fix it; the `kind` keys are what the step records.
ERRORS: dict[str, str] = {
    "no_action": (
        "no action line found. Reply with exactly one action line: "
        'CALL <tool> {{"arg": "value"}} (tools: read_file, apply_patch, python_test) or FINAL: <summary>.'
    ),
    "malformed_json": (
        "malformed JSON arguments for {tool}: {detail}. Put the arguments on the same line as one JSON object, "
        'e.g. CALL apply_patch {{"find": "old text", "replace": "new text"}} (use \\n for newlines).'
    ),
    "missing_args": "{tool} needs the string argument(s) {args}, e.g. {example}.",
    "unknown_tool": "unknown tool {tool!r}. Available tools: read_file, apply_patch, python_test.",
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
CALL python_test {{"project_path": "solution.py"}}
  runs the task's tests on solution.py and reports the outcome class: PASS, ASSERTION_FAILURE, RUNTIME_ERROR, \
SYNTAX_ERROR, TIMEOUT or OTHER.
FINAL: <one-line summary>
  ends the episode; solution.py as it is then is graded.

The JSON arguments go on the same line as CALL. You have a budget of {budget} tool calls; a reply that is not a \
valid action also uses one. When the budget is spent the episode ends and solution.py is graded as it is."""

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


def call_line(tool: str, args: dict[str, str]) -> str:
    """A well-formed action line, as a model that follows the system prompt writes it (used by the SFT traces)."""
    return f"CALL {tool} {json.dumps(args, ensure_ascii=False)}"


def final_line(summary: str) -> str:
    return f"FINAL: {summary}"


def prediction_line(prediction: str, decision: str) -> str:
    """The prediction reply in `PREDICTION_FORMAT`."""
    return f"<PREDICTION>{prediction}</PREDICTION> <DECISION>{decision}</DECISION>"


def task_prompt(text: str, test_list: list[str] | tuple[str, ...]) -> str:
    """The MBPP task prompt: the task text plus its asserts, as in the study's rollouts."""
    return f"{text}\nYour code should pass these tests:\n\n" + "\n".join(test_list)


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProtocolConfig:
    """What the program enforces in one episode (already resolved: see `resolve`)."""

    protocol: Protocol = "reactive"
    variant: Variant = "none"
    budget: int = 8
    revise_costs_call: bool = True
    max_model_calls: int | None = None
    """Hard cap on model replies; None = the most the budget can use (see `model_call_cap`)."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant != "none" and self.protocol != "predictive":
            raise ValueError(f"variant {self.variant!r} needs the predictive protocol")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.max_model_calls is not None and self.max_model_calls < 1:
            raise ValueError(f"max_model_calls must be >= 1, got {self.max_model_calls}")

    @classmethod
    def resolve(
        cls,
        protocol: str = "reactive",
        variant: str = "none",
        budget: int = 8,
        revise_costs_call: bool = True,
        budget_neutral_budget: int | None = None,
        max_model_calls: int | None = None,
    ) -> ProtocolConfig:
        """Apply the variant: budget_neutral = the raised budget when one is given, else a free REVISE."""
        if variant == "budget_neutral":
            if budget_neutral_budget is not None:
                budget = budget_neutral_budget
            else:
                revise_costs_call = False
        return cls(protocol, variant, budget, revise_costs_call, max_model_calls)  # type: ignore[arg-type]

    @property
    def predictive(self) -> bool:
        return self.protocol == "predictive"

    @property
    def model_call_cap(self) -> int:
        """Replies the program asks for at most. Every tool call can be followed by one prediction, plus FINAL:
        2*budget+1 never binds while REVISE costs a call; a free REVISE can loop, so then the cap is 4*budget+1
        (hitting it ends the episode with stop_reason max_turns)."""
        if self.max_model_calls is not None:
            return self.max_model_calls
        return 2 * self.budget + 1 if self.revise_costs_call or not self.predictive else 4 * self.budget + 1

    def system_prompt(self) -> str:
        text = _SYSTEM_COMMON.format(budget=self.budget)
        if not self.predictive:
            return text
        if self.variant == "forced_keep":
            return text + _SYSTEM_PREDICTIVE_FORCED_KEEP
        return text + _SYSTEM_PREDICTIVE.format(revise_cost="" if self.revise_costs_call else ", refunded")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_CALL = re.compile(r"^\s*CALL\s+(\S+)(.*)$")
_FINAL = re.compile(r"^\s*FINAL:(.*)$")
_PREDICTION = re.compile(
    r"<PREDICTION>\s*([^<\n]*?)\s*</PREDICTION>\s*<DECISION>\s*([^<\n]*?)\s*</DECISION>", re.IGNORECASE
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


def parse_prediction(reply: str) -> Prediction:
    """The prediction line. Tags are matched case-insensitively and values are upper-cased; anything else (missing
    tags, unknown class, unknown decision) makes the whole line MALFORMED (a parsable decision is still kept)."""
    m = _PREDICTION.search(strip_thinking(reply))
    if m is None:
        return Prediction(MALFORMED, None, False)
    cls_, decision = m.group(1).strip().upper(), m.group(2).strip().upper()
    decision_ok = decision in DECISIONS
    if cls_ not in PREDICTION_CLASSES or not decision_ok:
        return Prediction(MALFORMED, decision if decision_ok else None, False)
    return Prediction(cls_, decision, True)


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
    calls_used: int = 0  # budget calls used after this step
    # apply_patch
    find: str | None = None
    replace: str | None = None
    applied: bool = False
    patched_code: str | None = None
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
        """Episode-level facts for the record (reward and final outcome come from the task's own check)."""
        patches = [s for s in self.steps if s.action == "apply_patch" and s.applied]
        predictions = [s for s in self.steps if s.action == "prediction"]
        return {
            "budget": self.config.budget,
            "calls_used": self.calls_used,
            "budget_exhausted": self.budget_exhausted,
            "stop_reason": self.stop_reason,
            "n_model_calls": len(self.steps),
            "n_patches": len(patches),
            "n_tests": sum(s.action == "python_test" for s in self.steps),
            "n_errors": sum(s.status == "error" for s in self.steps),
            "n_predictions": len(predictions),
            "n_malformed_predictions": sum(s.prediction == MALFORMED for s in predictions),
            "n_revised": sum(s.reverted for s in patches),
            "n_forced": sum(bool(s.forced) for s in predictions),
            "ever_revised": any(s.reverted for s in patches),
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

    def _spend(self, step: Step) -> None:
        self.calls_used += 1
        step.counted = True
        step.calls_used = self.calls_used

    def _error(self, step: Step, kind: str, **fmt: Any) -> Step:
        step.status, step.error = "error", kind
        step.result = error_result(ERRORS[kind].format(**fmt))
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
        if tool not in TOOLS:
            return self._error(step, "unknown_tool", tool=tool)
        step.action = tool
        try:
            args = parse_args(action.args_text or "")
        except ValueError as e:
            return self._error(step, "malformed_json", tool=tool, detail=e)
        step.args = json.dumps(args, ensure_ascii=False)
        missing = [k for k in REQUIRED_ARGS[tool] if not isinstance(args.get(k), str)]
        if missing:
            return self._error(
                step, "missing_args", tool=tool, args=", ".join(REQUIRED_ARGS[tool]), example=TOOL_EXAMPLES[tool]
            )
        if tool == "read_file":
            return self._read_file(step, args["file_path"])
        if tool == "apply_patch":
            return self._apply_patch(step, args)
        return self._python_test(step, args["project_path"])

    def _check_path(self, step: Step, raw: Any) -> str | None:
        path = resolve_path(raw)
        if path is None:
            self._error(step, "path_outside_workdir", path=raw)
            return None
        if path != SOLUTION_FILE:
            self._error(step, "no_such_file", path=raw)
            return None
        return path

    def _read_file(self, step: Step, raw_path: str) -> Step:
        if self._check_path(step, raw_path) is None:
            return step
        step.status, step.result = "success", read_result(self.solution)
        return step

    def _apply_patch(self, step: Step, args: dict[str, Any]) -> Step:
        find, replace = args["find"], args["replace"]
        step.find, step.replace = find, replace
        path = self._check_path(step, args.get("file_path", SOLUTION_FILE))
        if path is None:
            return step
        if not find:
            return self._error(step, "find_empty")
        count = self.solution.count(find)
        if count == 0:
            return self._error(step, "find_not_found", path=path)
        if count > 1:
            return self._error(step, "find_ambiguous", path=path, count=count)
        self._shadow_untested()  # the previous patch's state is about to change untested
        self._pre_patch = self.solution
        self.solution = self.solution.replace(find, replace, 1)
        step.status, step.result, step.applied, step.patched_code = "success", RESULT_PATCH_APPLIED, True, self.solution
        self._untested = step
        if self.config.predictive:
            self._awaiting_prediction = step
        return step

    def _python_test(self, step: Step, raw_path: str) -> Step:
        if self._check_path(step, raw_path) is None:
            return step
        outcome, step.outcome_detail = self._test(self.solution)
        step.outcome, step.outcome_seen = outcome.value, True
        if outcome is Outcome.PASS:
            step.status, step.result = "success", RESULT_TESTS_PASSED
        else:
            step.status, step.result = "failed", tests_failed_result(outcome)
        if self._untested is not None:  # tested in view: exactly that patch's state
            self._untested.outcome, self._untested.outcome_seen = outcome.value, True
            self._untested.outcome_step, self._untested.outcome_detail = step.index, step.outcome_detail
            self._untested = None
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
        if decision == "REVISE":
            self._shadow_untested()  # hidden outcome of the patched code, before the revert
            assert self._pre_patch is not None
            self.solution = self._pre_patch
            patch.reverted = True
            if not self.config.revise_costs_call and patch.counted:
                self.calls_used -= 1  # budget_neutral: REVISE gives its call back
                patch.counted = False
        step.calls_used = self.calls_used
        if parsed.valid:
            step.result = RESULT_PATCH_REVERTED if decision == "REVISE" else RESULT_PATCH_KEPT
        else:
            fate = "reverted" if decision == "REVISE" else "kept"
            self._error(step, "malformed_prediction", fate=fate)
        for name in ("prediction", "decision_sampled", "decision", "forced"):
            setattr(patch, name, getattr(step, name))
        patch.prediction_step = index
        return step
