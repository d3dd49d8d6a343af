"""The package's layout stays one a newcomer reads (issue 27): no module named like a standard-library module (a
`predict/signal.py` or `predict/io.py` reads as the standard one in a traceback and in an import line), no module over
~900 lines but the two that are one piece by design, and about a dozen modules at the top level, the rest in packages
named by what they own."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "predict"
# The sandbox's child side re-executes itself with the standard library alone: one file. The protocol keeps every
# rule in its docstring and every string in one module.
ONE_PIECE = {"sandbox/child.py", "env/protocol.py"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_named_like_a_standard_library_module() -> None:
    clashes = [str(p.relative_to(PACKAGE)) for p in _modules()
               if p.stem in sys.stdlib_module_names] + [str(d.relative_to(PACKAGE)) for d in PACKAGE.rglob("*")
                                                          if d.is_dir() and d.name in sys.stdlib_module_names]
    assert clashes == []


def test_no_module_is_over_900_lines_but_the_ones_kept_whole() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > 900 and str(p.relative_to(PACKAGE)) not in ONE_PIECE}
    assert long == {}


def test_about_a_dozen_modules_at_the_top_level() -> None:
    top = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 12, sorted(top)
