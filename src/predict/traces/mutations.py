"""The fault catalogue: small, named, deterministic mutations of a gold solution.

Each operator is a function ``op(tree) -> list[Site]`` over a freshly parsed ``ast.Module``: one `Site` per place
it can mutate, in ``ast.walk`` order (so the list depends on the code only). A site's ``make()`` mutates that tree
in place and returns the mutant's source (``ast.unparse``; `syntax_break` edits the unparsed text, since a syntax
error has no tree). `mutate(code, operator, site)` parses the code afresh for every mutant, so sites never see each
other's edits, and `candidates(code, target, seed)` lists mutants in a seeded order: same code + seed, same
mutants in the same order.

What class a mutant produces is never assumed: `Operator.reaches` only says which classes it is *tried* for, and the
trace stage keeps a mutant only when the sandbox confirms the class it was tried for.
"""

from __future__ import annotations

import ast
import hashlib
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from predict.vocabulary import Outcome

AF, RE, SE, TO = Outcome.ASSERTION_FAILURE, Outcome.RUNTIME_ERROR, Outcome.SYNTAX_ERROR, Outcome.TIMEOUT


@dataclass(frozen=True)
class Site:
    """One place an operator can mutate: what it does (for the record) and how to make the mutant."""

    description: str
    make: Callable[[], str]


@dataclass(frozen=True)
class Mutant:
    operator: str
    description: str
    code: str


@dataclass(frozen=True)
class Operator:
    name: str
    func: Callable[[ast.Module], list[Site]]
    reaches: frozenset[Outcome]
    """The classes this operator is tried for (the sandbox decides what a mutant actually is)."""
    fallback: bool = False
    """Tried only after every natural operator for the class (e.g. an injected raise)."""


def parse(code: str) -> ast.Module:
    """``ast.parse`` without the warnings MBPP code raises (invalid escape sequences such as ``"\\w"``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(code)


def normalize(code: str) -> str:
    """The canonical form of a solution: what ``ast.unparse`` makes of it (comments and layout dropped)."""
    return ast.unparse(parse(code))


def _line(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def _set(node: ast.AST, name: str, value: object, tree: ast.Module) -> Callable[[], str]:
    def make() -> str:
        setattr(node, name, value)
        return ast.unparse(ast.fix_missing_locations(tree))

    return make


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


# ---------------------------------------------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------------------------------------------
_ARITH: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
}


def swap_arithmetic(tree: ast.Module) -> list[Site]:
    """``a + b`` -> ``a - b``, ``*`` -> ``+``, ``//`` -> ``*``, ``%`` -> ``//``, ... (also in ``x += 1``)."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _ARITH:
            new = _ARITH[type(node.op)]
            desc = f"{type(node.op).__name__} -> {new.__name__} at {_line(node)}"
            sites.append(Site(desc, _set(node, "op", new(), tree)))
    return sites


_COMPARE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


def swap_comparison(tree: ast.Module) -> list[Site]:
    """``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    ops = list(node.ops)
                    ops[i] = _COMPARE[type(op)]()
                    desc = f"{type(op).__name__} -> {type(ops[i]).__name__} at {_line(node)}"
                    sites.append(Site(desc, _set(node, "ops", ops, tree)))
    return sites


def _shift(expr: ast.expr, delta: int) -> ast.expr:
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return ast.Constant(expr.value + delta)
    return ast.BinOp(expr, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(abs(delta)))


def off_by_one_range(tree: ast.Module) -> list[Site]:
    """``range(a, n)`` -> ``range(a, n + 1)`` / ``range(a + 1, n)``: a loop that runs one step too far or short."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" and node.args:
            stop = 0 if len(node.args) == 1 else 1
            for i, delta in ((stop, +1), (0, +1)) if stop else ((0, +1),):
                args = list(node.args)
                args[i] = _shift(args[i], delta)
                which = "stop" if i == stop else "start"
                sites.append(Site(f"range {which} {delta:+d} at {_line(node)}", _set(node, "args", args, tree)))
    return sites


def off_by_one_index(tree: ast.Module) -> list[Site]:
    """``x[i]`` -> ``x[i + 1]``, ``x[k]`` -> ``x[k + 1]``, ``x[:n]`` -> ``x[:n + 1]`` (loads only)."""
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript) or not isinstance(node.ctx, ast.Load):
            continue
        index = node.slice
        if isinstance(index, ast.Slice):
            for part in ("lower", "upper"):
                bound = getattr(index, part)
                if bound is not None:
                    sites.append(Site(f"slice {part} +1 at {_line(node)}", _set(index, part, _shift(bound, 1), tree)))
        elif isinstance(index, ast.Name | ast.Constant | ast.BinOp) and not isinstance(getattr(index, "value", 0), str):
            sites.append(Site(f"index +1 at {_line(node)}", _set(node, "slice", _shift(index, 1), tree)))
    return sites


def _wrong_value(value: ast.expr) -> ast.expr:
    if isinstance(value, ast.Constant):
        v = value.value
        if isinstance(v, bool):
            return ast.Constant(not v)
        if isinstance(v, int | float):
            return ast.Constant(v + 1)
        if isinstance(v, str):
            return ast.Constant(v + "!" if v else "!")
        return ast.Constant(0)
    if isinstance(value, ast.Compare | ast.BoolOp) or (isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)):
        return ast.UnaryOp(ast.Not(), value)
    return ast.Constant(None)


def wrong_return(tree: ast.Module) -> list[Site]:
    """``return expr`` returns the wrong thing: a flipped bool, a constant + 1, a negated test, else ``None``."""
    return [
        Site(f"wrong return value at {_line(node)}", _set(node, "value", _wrong_value(node.value), tree))
        for node in ast.walk(tree)
        if isinstance(node, ast.Return) and node.value is not None
    ]


def drop_statement(tree: ast.Module) -> list[Site]:
    """Drop one statement of a function body (or a top-level import); an emptied body gets ``pass``."""
    sites = []
    for owner in ast.walk(tree):
        for field in ("body", "orelse"):
            body = getattr(owner, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if not isinstance(stmt, ast.stmt) or isinstance(stmt, ast.FunctionDef | ast.ClassDef):
                    continue
                if isinstance(owner, ast.Module) and not isinstance(stmt, ast.Import | ast.ImportFrom):
                    continue
                rest = body[:i] + body[i + 1 :]
                new = rest or ([ast.Pass()] if field == "body" else [])
                desc = f"dropped {type(stmt).__name__} at {_line(stmt)}"
                sites.append(Site(desc, _set(owner, field, new, tree)))
    return sites


_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def swap_variables(tree: ast.Module) -> list[Site]:
    """Two variables trade places: the first two distinct name arguments of a call, or ``a - b`` -> ``b - a``."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            names = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name)]
            pairs = [(i, j) for i in names for j in names if i < j and node.args[i].id != node.args[j].id]  # type: ignore[attr-defined]
            if pairs:
                i, j = pairs[0]
                args = list(node.args)
                args[i], args[j] = args[j], args[i]
                sites.append(Site(f"swapped call arguments {i}, {j} at {_line(node)}", _set(node, "args", args, tree)))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, _NON_COMMUTATIVE)
            and isinstance(node.left, ast.Name)
            and isinstance(node.right, ast.Name)
            and node.left.id != node.right.id
        ):

            def make(node: ast.BinOp = node) -> str:
                node.left, node.right = node.right, node.left
                return ast.unparse(tree)

            sites.append(Site(f"swapped operands {node.left.id}, {node.right.id} at {_line(node)}", make))
    return sites


def negate_condition(tree: ast.Module) -> list[Site]:
    """The test of an ``if`` / ``while`` / conditional expression is negated."""
    return [
        Site(f"negated {type(node).__name__} test at {_line(node)}", _set(node, "test", ast.UnaryOp(ast.Not(), node.test), tree))
        for node in ast.walk(tree)
        if isinstance(node, ast.If | ast.While | ast.IfExp)
    ]


def swap_boolean_operator(tree: ast.Module) -> list[Site]:
    """``and`` <-> ``or``."""
    return [
        Site(
            f"{type(node.op).__name__} -> {'Or' if isinstance(node.op, ast.And) else 'And'} at {_line(node)}",
            _set(node, "op", ast.Or() if isinstance(node.op, ast.And) else ast.And(), tree),
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.BoolOp)
    ]


def wrong_function_name(tree: ast.Module) -> list[Site]:
    """A top-level function is defined under a slightly wrong name (``f`` -> ``f_``): the tests cannot call it."""
    return [
        Site(f"def {node.name} -> {node.name}_ at {_line(node)}", _set(node, "name", node.name + "_", tree))
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    ]


def inject_raise(tree: ast.Module) -> list[Site]:
    """``raise ValueError(...)`` before a return of a function (or at the end of a body without one)."""
    sites = []
    for fn in _functions(tree):
        for owner in ast.walk(fn):
            body = getattr(owner, "body", None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.Return):
                    raise_ = ast.Raise(ast.Call(ast.Name("ValueError", ast.Load()), [ast.Constant("unexpected input")], []))
                    new = body[:i] + [raise_] + body[i:]
                    sites.append(Site(f"raise before the return at {_line(stmt)}", _set(owner, "body", new, tree)))
    return sites


def syntax_break(tree: ast.Module) -> list[Site]:
    """A missing ``:`` at the end of a block header, or a missing closing bracket (text edits of the source)."""
    source = ast.unparse(tree)
    lines = source.split("\n")
    sites = []
    for i, line in enumerate(lines):
        end = line.rstrip()
        if end.endswith(":") or (end.endswith(")") and line.count("(") == line.count(")")):
            edited = lines[:i] + [end[:-1]] + lines[i + 1 :]
            sites.append(Site(f"missing '{end[-1]}' at line {i + 1}", lambda e=edited: "\n".join(e)))
    return sites


def non_terminating_loop(tree: ast.Module) -> list[Site]:
    """A ``while`` loop loses an update of its state (``i += 1`` dropped), so it may never end."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While):
            for i, stmt in enumerate(node.body):
                if isinstance(stmt, ast.AugAssign):
                    new = node.body[:i] + node.body[i + 1 :] or [ast.Pass()]
                    sites.append(Site(f"dropped loop update at {_line(stmt)}", _set(node, "body", new, tree)))
    return sites


def inject_infinite_loop(tree: ast.Module) -> list[Site]:
    """``while True: pass`` ahead of a function's first statement (for code without a ``while`` loop to break)."""
    sites = []
    for fn in _functions(tree):
        spin = ast.While(ast.Constant(True), [ast.Pass()], [])
        sites.append(Site(f"while True: pass at the start of {fn.name}", _set(fn, "body", [spin, *fn.body], tree)))
    return sites


OPERATORS: tuple[Operator, ...] = (
    Operator("swap_arithmetic", swap_arithmetic, frozenset({AF, RE})),
    Operator("swap_comparison", swap_comparison, frozenset({AF, RE})),
    Operator("off_by_one_range", off_by_one_range, frozenset({AF, RE})),
    Operator("off_by_one_index", off_by_one_index, frozenset({AF, RE})),
    Operator("drop_statement", drop_statement, frozenset({AF, RE})),
    Operator("swap_variables", swap_variables, frozenset({AF, RE})),
    Operator("negate_condition", negate_condition, frozenset({AF, RE})),
    Operator("swap_boolean_operator", swap_boolean_operator, frozenset({AF, RE})),
    Operator("wrong_function_name", wrong_function_name, frozenset({RE})),
    Operator("wrong_return", wrong_return, frozenset({AF}), fallback=True),
    Operator("inject_raise", inject_raise, frozenset({RE}), fallback=True),
    Operator("syntax_break", syntax_break, frozenset({SE})),
    Operator("non_terminating_loop", non_terminating_loop, frozenset({TO})),
    Operator("inject_infinite_loop", inject_infinite_loop, frozenset({TO}), fallback=True),
)
BY_NAME: dict[str, Operator] = {op.name: op for op in OPERATORS}
REACHABLE: tuple[str, ...] = tuple(o.value for o in Outcome if any(o in op.reaches for op in OPERATORS))
"""Every class some operator is tried for: what the `balanced` mix spreads over."""


def sites(code: str, operator: str) -> list[Site]:
    """The sites of `operator` in `code` (its tree freshly parsed)."""
    return BY_NAME[operator].func(parse(code))


def mutate(code: str, operator: str, site: int, *, normalized: str | None = None) -> Mutant | None:
    """The mutant at `site` of `operator`; None when there is no such site or the edit changes nothing
    (`normalized`: `normalize(code)`, when the caller has it)."""
    found = sites(code, operator)
    if not 0 <= site < len(found):
        return None
    mutant = found[site].make()
    if mutant == (normalized if normalized is not None else normalize(code)):
        return None
    return Mutant(operator, found[site].description, mutant)


def _rng(code: str, seed: int, salt: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{salt}:{code}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def candidates(
    code: str,
    target: Outcome | str,
    seed: int,
    *,
    limit: int = 12,
    fallbacks: int = 2,
) -> list[Mutant]:
    """Mutants of `code` to try for class `target`, in a seeded order: up to `limit` from the natural operators,
    then up to `fallbacks` from the fallback operators. Within each group the operators take turns (in a seeded
    order, each with its sites in a seeded order), so an operator with many sites (drop_statement) does not crowd
    out the others. Same code + target + seed, same list."""
    target = Outcome(target)
    normalized = normalize(code)
    rng = _rng(normalized, seed, target.value)
    out: list[Mutant] = []
    seen: set[str] = set()
    for fallback, cap in ((False, limit), (True, fallbacks)):
        ops = [op for op in OPERATORS if target in op.reaches and op.fallback == fallback]
        rng.shuffle(ops)
        queues = []
        for op in ops:
            order = list(range(len(sites(normalized, op.name))))
            rng.shuffle(order)
            queues.append((op.name, order))
        taken = 0
        while taken < cap and any(order for _, order in queues):
            for name, order in queues:
                if not order or taken >= cap:
                    continue
                mutant = mutate(normalized, name, order.pop(0), normalized=normalized)
                if mutant is not None and mutant.code not in seen:
                    seen.add(mutant.code)
                    out.append(mutant)
                    taken += 1
    return out
