"""The fault catalogue on a small hand-written function, the seeded candidate order, the mix and the repair edit."""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest

from predict.sandbox import check_once
from predict.traces import mutations
from predict.traces.render import repair_edit, solution_text
from predict.traces.stage import TracesConfigError, mix_counts
from predict.vocabulary import Outcome

SAMPLE = mutations.normalize(
    """
import math

def score(xs, n):
    total = 0
    i = 0
    while i < n:
        total += xs[i] * 2
        i += 1
    for j in range(1, n):
        if xs[j] > 0 and j != 3:
            total = total - j
    return total == 0 or math.pow(total, n)
"""
)
TESTS = ["assert score([1, 2, 3], 3) == 729"]

# For each operator: a snippet that one of its mutants of SAMPLE contains (or, with "-", lacks).
EXPECTED = {
    "swap_arithmetic": "xs[i] + 2",
    "swap_comparison": "while i <= n:",
    "off_by_one_range": "range(1, n + 1)",
    "off_by_one_index": "xs[i + 1]",
    "drop_statement": "-i += 1",
    "swap_variables": "j - total",
    "negate_condition": "while not i < n:",
    "swap_boolean_operator": "xs[j] > 0 or j != 3",
    "wrong_function_name": "def score_(",
    "wrong_return": "return not (total == 0 or",
    "inject_raise": "raise ValueError",
    "syntax_break": "for j in range(1, n)\n",
    "non_terminating_loop": "-i += 1",
    "inject_infinite_loop": "while True:\n        pass",
}


def test_sample_passes_its_test() -> None:
    assert check_once(solution_text(SAMPLE), TESTS).outcome is Outcome.PASS


def test_every_operator_is_covered_here() -> None:
    assert set(EXPECTED) == set(mutations.BY_NAME)


@pytest.mark.parametrize("name", sorted(mutations.BY_NAME))
def test_operator_mutates_the_sample(name: str) -> None:
    sites = mutations.sites(SAMPLE, name)
    assert sites, f"{name} finds no site in the sample"
    mutants = [mutations.mutate(SAMPLE, name, i) for i in range(len(sites))]
    assert all(m is not None and m.code != SAMPLE for m in mutants)
    codes = [m.code for m in mutants if m is not None]
    snippet = EXPECTED[name]
    if snippet.startswith("-"):
        assert any(snippet[1:] not in c for c in codes)
    else:
        assert any(snippet in c for c in codes), codes
    for code in codes:  # a mutant is valid Python, except what syntax_break makes
        if name == "syntax_break":
            with pytest.raises(SyntaxError):
                ast.parse(code)
        else:
            ast.parse(code)
    assert mutations.mutate(SAMPLE, name, len(sites)) is None


@pytest.mark.parametrize("name", sorted(mutations.BY_NAME))
def test_operator_is_deterministic_and_leaves_input_alone(name: str) -> None:
    first = [mutations.mutate(SAMPLE, name, i) for i in range(len(mutations.sites(SAMPLE, name)))]
    again = [mutations.mutate(SAMPLE, name, i) for i in range(len(mutations.sites(SAMPLE, name)))]
    assert first == again
    assert len({m.code for m in first if m}) == len(first), "two sites made the same mutant"


@pytest.mark.parametrize(
    ("name", "pick", "expected"),
    [
        ("swap_boolean_operator", lambda c: "total == 0 and" in c, Outcome.ASSERTION_FAILURE),
        ("wrong_function_name", lambda c: True, Outcome.RUNTIME_ERROR),
        ("inject_raise", lambda c: True, Outcome.RUNTIME_ERROR),
        ("syntax_break", lambda c: True, Outcome.SYNTAX_ERROR),
        ("non_terminating_loop", lambda c: "i += 1" not in c, Outcome.TIMEOUT),
        ("inject_infinite_loop", lambda c: True, Outcome.TIMEOUT),
    ],
)
def test_operator_reaches_its_class_in_the_sandbox(name: str, pick: Callable[[str], bool], expected: Outcome) -> None:
    mutant = next(
        m for i in range(len(mutations.sites(SAMPLE, name)))
        if (m := mutations.mutate(SAMPLE, name, i)) and pick(m.code)
    )
    assert expected in mutations.BY_NAME[name].reaches
    assert check_once(solution_text(mutant.code), TESTS, timeout_s=1.0).outcome is expected


def test_candidates_are_seeded_and_only_try_operators_for_the_class() -> None:
    a = mutations.candidates(SAMPLE, "RUNTIME_ERROR", 42)
    assert a == mutations.candidates(SAMPLE, "RUNTIME_ERROR", 42)
    assert a != mutations.candidates(SAMPLE, "RUNTIME_ERROR", 7)
    assert all(Outcome.RUNTIME_ERROR in mutations.BY_NAME[m.operator].reaches for m in a)
    assert len({m.code for m in a}) == len(a)
    natural = [m for m in a if not mutations.BY_NAME[m.operator].fallback]
    assert a[: len(natural)] == natural, "fallback operators come last"
    assert len({m.operator for m in natural[:4]}) == 4, "operators take turns"
    timeout = mutations.candidates(SAMPLE, "TIMEOUT", 42)
    assert [m.operator for m in timeout] == ["non_terminating_loop"] * 2 + ["inject_infinite_loop"]
    assert {m.operator for m in mutations.candidates(SAMPLE, "SYNTAX_ERROR", 42)} == {"syntax_break"}


def test_mix_counts() -> None:
    assert mix_counts("study", 70) == {"ASSERTION_FAILURE": 58, "RUNTIME_ERROR": 12}
    assert mix_counts("study", 45) == {"ASSERTION_FAILURE": 37, "RUNTIME_ERROR": 8}
    assert mix_counts("balanced", 70) == {"ASSERTION_FAILURE": 18, "RUNTIME_ERROR": 18, "SYNTAX_ERROR": 17,
                                          "TIMEOUT": 17}
    assert mix_counts({"TIMEOUT": 1, "SYNTAX_ERROR": 3}, 4) == {"SYNTAX_ERROR": 3, "TIMEOUT": 1}
    assert sum(mix_counts("balanced", 7).values()) == 7
    with pytest.raises(TracesConfigError, match="OTHER"):
        mix_counts({"OTHER": 1}, 3)
    with pytest.raises(TracesConfigError, match="unknown mix"):
        mix_counts("uniform", 3)


@pytest.mark.parametrize("name", ["drop_statement", "inject_raise", "swap_variables", "syntax_break"])
def test_repair_edit_is_a_small_unique_patch_back_to_gold(name: str) -> None:
    for i in range(len(mutations.sites(SAMPLE, name))):
        mutant = mutations.mutate(SAMPLE, name, i)
        assert mutant is not None
        current, target = solution_text(mutant.code), solution_text(SAMPLE)
        find, replace = repair_edit(current, target)
        assert current.count(find) == 1
        assert current.replace(find, replace, 1) == target
        assert len(find) < len(current) or len(current.splitlines()) <= 2


def test_repair_edit_widens_an_ambiguous_find() -> None:
    current = "x = 1\ny = 2\nx = 1\nz = 3\n"
    target = "x = 1\ny = 2\nx = 1\nw = 1\nz = 3\n"
    find, replace = repair_edit(current, target)
    assert current.count(find) == 1 and current.replace(find, replace, 1) == target
