"""One underlying trace -> each arm's chat messages, produced by stepping the real `Episode`.

A `Trace` is arm-independent: the task, the gold code and, for a recovery trace, the faulty code (a verified mutant),
its operator and its verified class. `render` turns it into the model's replies for one protocol, feeds them one
by one to `protocol.Episode` (with `run_tests` answering from the sandbox's verdicts) and records the messages
``[system, user task, assistant, user result, ..., assistant FINAL]`` exactly as the rollout program would send
them. Every string comes from `predict.env.protocol` (system prompt, task prompt, action / prediction / FINAL
lines, tool results), so a trace replays through `Episode` to the same tool results by construction, and `render`
refuses a trace that does not end with FINAL on a solution that passes.

The replies (no reasoning text, no ``<think>``: the assistant turns are the action lines themselves):

* direct, both arms: read_file -> apply_patch(stub -> gold) [Arm B: ``PASS`` / ``KEEP``] -> python_test -> FINAL.
* recovery, Arm A: read_file -> apply_patch(stub -> faulty) -> python_test (fails with the verified class) ->
  apply_patch(the smallest unique edit faulty -> gold) -> python_test (passes) -> FINAL.
* recovery, Arm B, ``recovery_style: revise`` (default): read_file -> apply_patch(stub -> faulty) ->
  ``<PREDICTION>{verified class}</PREDICTION> <DECISION>REVISE</DECISION>`` (the patch is reverted; the episode
  runs it hidden, so its verified outcome is recorded) -> apply_patch(stub -> gold) -> ``PASS`` / ``KEEP`` ->
  python_test -> FINAL. Every prediction is the patch's verified class, and the decision is the one the protocol
  forces for it.
* recovery, Arm B, ``recovery_style: keep_test``: the Arm A patches exactly, each followed by ``PASS`` / ``KEEP``;
  the faulty patch's prediction is then *wrong* (PASS for a failing patch), which is the price of showing Arm B a
  failing test and a targeted repair.

Under the environment variants (`predict.vocabulary.ENVIRONMENT_VARIANTS`; a run with its own SFT, `predict.runs`) the
replies follow the variant's own rules, and the episode that checks them is the variant's:

* irreversible: the trace tests once, at the end: the final ``python_test ... -> FINAL`` of each trace above becomes
  ``python_test`` alone (the episode ends on it, graded on the gold it tests; its result is never sent, so it is
  the last message). Arm A's recovery cannot test the faulty patch first: read_file -> apply_patch(stub -> faulty)
  -> read_file (the one observation there is before the test: the code as written) -> apply_patch(the repair) ->
  python_test. Arm B's revise recovery: ... -> ``<PREDICTION>{verified class}</PREDICTION>
  <DECISION>REVISE</DECISION>`` -> apply_patch(stub -> gold) -> ``PASS`` / ``KEEP`` -> python_test. keep_test:
  Arm A's patches, each followed by ``PASS`` / ``KEEP``.
* blind: no python_test anywhere: ``python_test -> FINAL`` becomes FINAL (its summary claims no test result), and
  the failing test in Arm A's (and keep_test's) recovery becomes the read_file above. Arm B's revise recovery
  predicts the faulty patch's verified class (the episode's hidden shadow verifies it) and REVISEs, as in the study.

Every other variant is not rendered (`TRACE_VARIANTS`): those runs train from their base arm's SFT. The budget is
never the limit: the longest trace uses 5 calls (4 + test_cost under irreversible, within its scaled budget).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from predict.config import allowed_values
from predict.config.models import TracesSettings
from predict.env.protocol import (
    SOLUTION_FILE,
    STUB,
    Episode,
    ProtocolConfig,
    call_line,
    final_line,
    prediction_line,
)
from predict.vocabulary import TRACE_VARIANTS, Outcome

ROLES: tuple[str, ...] = ("direct", "recovery")
RECOVERY_STYLES: tuple[str, ...] = allowed_values(TracesSettings, "recovery_style")  # revise, keep_test
STUB_FIND = STUB.rstrip("\n")  # the patch replaces the stub's one line; the file keeps its final newline

READ = call_line("read_file", {"file_path": SOLUTION_FILE})
TEST = call_line("python_test", {"project_path": SOLUTION_FILE})


class TraceError(ValueError):
    """A trace that does not replay as intended (names the task and what went wrong)."""


@dataclass(frozen=True)
class Trace:
    """One underlying trace, shared by both arms."""

    task_id: int
    role: str  # direct | recovery
    prompt: str  # protocol.task_prompt(text, test_list)
    function: str  # the function the task asks for (named in the FINAL summary)
    gold: str  # gold code (normalized); solution.py ends as gold + "\n"
    faulty: str | None = None  # recovery: the mutant the first patch writes
    operator: str | None = None
    mutation: str | None = None  # the operator's description of the site
    verified_class: str | None = None  # recovery: the sandbox's class of the faulty solution

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise TraceError(f"task {self.task_id}: role must be one of {ROLES}, got {self.role!r}")
        if (self.role == "recovery") != (self.faulty is not None and self.verified_class is not None):
            raise TraceError(f"task {self.task_id}: a recovery trace needs faulty code and its verified class")


def solution_text(code: str) -> str:
    """solution.py after a patch that replaced the stub's line with `code`."""
    return STUB.replace(STUB_FIND, code, 1)


def patch_line(find: str, replace: str) -> str:
    return call_line("apply_patch", {"find": find, "replace": replace})


def repair_edit(current: str, target: str) -> tuple[str, str]:
    """The smallest line-level find/replace that turns `current` into `target` with a find text that occurs exactly
    once in `current` (widened by whole lines of context until it does)."""
    a, b = current.splitlines(keepends=True), target.splitlines(keepends=True)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    lo, hi_a, hi_b = head, len(a) - tail, len(b) - tail  # a[lo:hi_a] -> b[lo:hi_b]
    grow_up = True
    while True:
        find = "".join(a[lo:hi_a])
        if find and current.count(find) == 1:
            replace = "".join(b[lo:hi_b])
            assert current.replace(find, replace, 1) == target
            return find, replace
        if (grow_up and lo > 0) or hi_a >= len(a):
            lo -= 1
        else:
            hi_a, hi_b = hi_a + 1, hi_b + 1
        grow_up = not grow_up
        if lo < 0:
            raise TraceError("no unique find text (current and target are identical?)")


def replies(trace: Trace, config: ProtocolConfig, recovery_style: str = "revise") -> list[str]:
    """The assistant replies of `trace` under `config`'s protocol."""
    if recovery_style not in RECOVERY_STYLES:
        raise TraceError(f"recovery_style must be one of {RECOVERY_STYLES}, got {recovery_style!r}")
    if config.variant not in TRACE_VARIANTS:
        raise TraceError(f"traces are rendered under variants {', '.join(TRACE_VARIANTS)}, not {config.variant!r}")
    keep = [prediction_line(Outcome.PASS.value, "KEEP")] if config.predictive else []
    to_gold = [patch_line(STUB_FIND, trace.gold), *keep]
    if config.variant == "irreversible":
        finish, observe = [TEST], READ  # the one test is the end; before it, only the code can be looked at
    elif config.variant == "blind":
        finish, observe = [final_line(f"solution.py defines {trace.function}.")], READ
    else:
        finish, observe = [TEST, final_line(f"solution.py defines {trace.function} and passes the tests.")], TEST
    if trace.role == "direct":
        return [READ, *to_gold, *finish]
    assert trace.faulty is not None and trace.verified_class is not None
    to_faulty = patch_line(STUB_FIND, trace.faulty)
    if config.predictive and recovery_style == "revise":
        revise = prediction_line(trace.verified_class, "REVISE")
        return [READ, to_faulty, revise, *to_gold, *finish]
    find, replace = repair_edit(solution_text(trace.faulty), solution_text(trace.gold))
    return [READ, to_faulty, *keep, observe, patch_line(find, replace), *keep, *finish]


def render(
    trace: Trace, config: ProtocolConfig, run_tests: Callable[[str], Any], recovery_style: str = "revise"
) -> tuple[list[dict[str, str]], Episode]:
    """Step an `Episode` through the trace's replies; the messages are what the model sees and says (returned with
    the finished episode)."""
    episode = Episode(config, run_tests)
    messages = [{"role": "system", "content": config.system_prompt()}, {"role": "user", "content": trace.prompt}]
    for reply in replies(trace, config, recovery_style):
        if episode.done:
            raise TraceError(f"task {trace.task_id}: the episode ended ({episode.stop_reason}) before {reply[:40]!r}")
        messages.append({"role": "assistant", "content": reply})
        result = episode.step(reply)
        if result is not None:
            messages.append({"role": "user", "content": result})
    check(trace, episode, recovery_style)
    return messages, episode


def check(trace: Trace, episode: Episode, recovery_style: str) -> None:
    """The rendered episode is what the trace says: FINAL on gold (irreversible: the one python_test, on gold), no
    errors, every result but the last one's sent, python_test only where the variant allows it (blind: never;
    irreversible: once, last), and each patch's verified outcome as intended (faulty: the verified class; gold:
    PASS); Arm B's predictions as documented."""
    variant = episode.config.variant
    where = f"task {trace.task_id} ({trace.role}, {episode.config.protocol}, variant {variant})"
    ending = "final_test" if variant == "irreversible" else "final"
    if episode.stop_reason != ending or episode.solution != solution_text(trace.gold):
        raise TraceError(f"{where}: ended with {episode.stop_reason!r}, solution is gold: "
                         f"{episode.solution == solution_text(trace.gold)}")
    last = episode.steps[-1]
    bad = [s for s in episode.steps if s.status == "error" or not s.result_sent and s is not last]
    if bad:
        raise TraceError(f"{where}: step {bad[0].index} ({bad[0].action}) {bad[0].status}: {bad[0].result!r}")
    tests = [s.index for s in episode.steps if s.action == "python_test" or s.tool == "python_test"]
    if variant != "none" and tests != ([last.index] if variant == "irreversible" else []):
        raise TraceError(f"{where}: python_test at steps {tests}")
    patches = [s for s in episode.steps if s.action == "apply_patch" and s.applied]
    expected = [Outcome.PASS.value] if trace.role == "direct" else [trace.verified_class, Outcome.PASS.value]
    if [p.outcome for p in patches] != expected:
        raise TraceError(f"{where}: patch outcomes {[p.outcome for p in patches]}, expected {expected}")
    if episode.config.predictive:
        labels_true = recovery_style == "revise" or trace.role == "direct"
        for p in patches:
            if labels_true and p.prediction != p.outcome:
                raise TraceError(f"{where}: patch {p.index} predicted {p.prediction}, verified {p.outcome}")
