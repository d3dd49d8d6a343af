"""The README fits on a screen and every page it sends a reader to is there.

README.md holds what a researcher needs to run the study (at most README_MAX_LINES lines); the rest lives in docs/,
one page per topic, each linked from the README; a guide's dated measurements live in its log,
benchmarks/log/<topic>.md, which the guide links. Every relative link in README.md, docs/*.md and the logs resolves
to a file of the checkout (and to a heading, where it names an anchor), and every repository path or `predict.*` name
written in backticks exists: a module that moves without its docs fails here, naming the page, the line and the path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
LOGS = REPO / "benchmarks" / "log"
"""The dated measurements logs, one per topic, beside the benchmarks' JSON; the guides in docs/ link them."""
README_MAX_LINES = 200
"""Issue 27: a README a researcher reads in five minutes."""

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_TOP = ("src/", "tests/", "benchmarks/", "workflow/", "config/", "envs/", "resources/", "docs/", "slurm/", ".ci/")
"""Where a backticked token starts for it to be read as a path of this checkout (results/, logs/ are run outputs)."""
NOT_MODULES = {"predict.isolation": "the parquet schema-metadata key of the isolation record (docs/verifier.md)"}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted(LOGS.glob("*.md"))]


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a link or path in a shell example is not a reference)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links to their text, lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown page, a repeated heading getting -1, -2 as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(prose(path)):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every relative link on a page; web and mail links are not ours to check."""
    text = prose(path)
    for match in LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            yield line_of(text, match.start()), target


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """Each relative link of a page that names no file of the checkout, or no heading of the page it names."""
    problems = []
    for line, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{line}: [{target}]"
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            problems.append(f"{where} names no file of the checkout")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            problems.append(f"{where}: {dest.name} has no heading with the anchor #{anchor}")
    return problems


def brace_expand(path: str) -> list[str]:
    """`workflow/profiles/{local,slurm}` -> each path it names."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [p for part in match.group(1).split(",") for p in brace_expand(head + part + tail)]


def missing_code_paths(path: Path, root: Path = REPO) -> list[str]:
    """Backticked paths of the checkout (`src/predict/serve.py`, `workflow/rules/*.smk`) that name nothing."""
    problems = []
    text = prose(path)
    for match in CODE_SPAN.finditer(text):
        token = match.group(1).strip().split(" ")[0]  # `benchmarks/sft_speed.py gpu`: the script
        if not token.startswith(REPO_TOP) or "<" in token:
            continue  # not a path of the checkout, or a placeholder such as <dir>
        for candidate in brace_expand(token):
            if not any(root.glob(candidate.rstrip("/"))):
                problems.append(f"{path.relative_to(root)}:{line_of(text, match.start())}: `{token}` names nothing")
                break
    return problems


def defines(module: Path, name: str) -> bool:
    """Whether a module's source defines `name` (a def, a class, an assignment, or a method of one)."""
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^{name}\s*[:=]"
    return re.search(pattern, module.read_text(), flags=re.M) is not None


def missing_module_names(path: Path, root: Path = REPO) -> list[str]:
    """Backticked `predict.a.b.name`s whose module is not under src/predict, or that the module does not define."""
    problems = []
    text = prose(path)
    for match in CODE_SPAN.finditer(text):
        token = match.group(1)
        if not re.fullmatch(r"predict(\.\w+)+", token) or token in NOT_MODULES:
            continue
        parts = token.split(".")
        module = None
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module or package
            base = root / "src" / Path(*parts[:cut])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    module, rest = candidate, parts[cut:]
                    break
            if module:
                break
        where = f"{path.relative_to(root)}:{line_of(text, match.start())}: `{token}`"
        if module is None or len(parts) == 1 or (module.name == "__init__.py" and rest and not defines(module, rest[0])):
            problems.append(f"{where} is no module under src/predict")
        elif rest and not all(defines(module, name) for name in rest):
            problems.append(f"{where}: {module.relative_to(root)} defines no {'.'.join(rest)}")
    return problems


def test_the_readme_fits_on_a_screen() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md is {lines} lines, more than {README_MAX_LINES}: move measurements and notes to a page in docs/ "
        "and link it from the README")


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), "\n".join(broken_links(page))


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_every_backticked_path_and_module_name_exists(page: Path) -> None:
    """Guides only: a measurements log is history, and may name a script that has since been replaced."""
    problems = missing_code_paths(page) + missing_module_names(page)
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(README)}
    unlinked = [str(p.relative_to(REPO)) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages no README link leads to: {unlinked}"


def test_every_measurements_log_is_linked_from_a_guide() -> None:
    """A log no guide links is a log nobody finds: its guide says today's numbers and sends the reader there."""
    logs = sorted(LOGS.glob("*.md"))
    assert logs, "benchmarks/log/ holds no measurements log"
    linked = {(page.parent / target.partition("#")[0]).resolve()
              for page in DOCS.glob("*.md") for _, target in links(page)}
    orphans = [str(p.relative_to(REPO)) for p in logs if p.resolve() not in linked]
    assert not orphans, f"measurements logs no page of docs/ links: {orphans}"


DATED_HEADING = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bsession\b", flags=re.I)
"""A heading that names a date or a session heads a dated measurement log, not a guide's section."""


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: str(p.relative_to(REPO)))
def test_no_guide_holds_a_dated_log(page: Path) -> None:
    """Guides say how to use a thing and today's numbers; dated runs live in benchmarks/log/<topic>.md."""
    dated = [f"{page.relative_to(REPO)}:{line_of(prose(page), m.start())}: {m.group(1)}"
             for m in HEADING.finditer(prose(page)) if DATED_HEADING.search(m.group(1))]
    assert not dated, ("dated sections in a guide (move them verbatim to benchmarks/log/<topic>.md and keep today's "
                       "numbers with a link):\n" + "\n".join(dated))


def test_the_two_set_up_commands_are_the_ones_ci_runs() -> None:
    """The README's set-up commands (install + the embedded default; install + the tests) run word for word in
    .ci/run, which starts from a clean clone: a README command that drifts from CI is no longer known to work."""
    setup = re.search(r"^## Set up\n(.*?)^## ", README.read_text(), flags=re.M | re.S)
    assert setup, "README.md has no '## Set up' section"
    commands = re.findall(r"^```bash\n(.*?)\n```", setup.group(1), flags=re.M | re.S)
    assert commands == [
        "bash envs/install.sh && .venv/bin/snakemake --profile workflow/profiles/local all",
        "bash envs/install.sh && .venv/bin/python -m pytest",
    ], commands
    ci_lines = [line.split() for line in (REPO / ".ci" / "run").read_text().splitlines()
                if not line.lstrip().startswith("#")]
    for command in commands:
        for step in command.split(" && "):
            words = step.split()
            assert any(line[: len(words)] == words for line in ci_lines), f".ci/run never runs `{step}`"


def test_the_checks_catch_a_stale_link_anchor_path_and_module(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "predict").mkdir(parents=True)
    (tmp_path / "src" / "predict" / "serving.py").write_text("class VLLMServer:\n    def reload(self): ...\n")
    (tmp_path / "docs" / "serving.md").write_text("# One vLLM server per local run (`serving.shared`)\n\n## Measured\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/serving.md#one-vllm-server-per-local-run-servingshared) [ok](docs/serving.md#measured)\n"
        "[gone](src/predict/serve.py) [no heading](docs/serving.md#speed) [web](https://example.org/x)\n"
        "`src/predict/serving.py` `src/predict/serve.py` `predict.serving.VLLMServer.reload` `predict.serve`\n"
        "`predict.serving.SharedServer`\n\n```bash\n[in a shell example](nowhere.md) `src/nowhere.py`\n```\n")
    assert broken_links(page, tmp_path) == [
        "README.md:2: [src/predict/serve.py] names no file of the checkout",
        "README.md:2: [docs/serving.md#speed]: serving.md has no heading with the anchor #speed"]
    assert missing_code_paths(page, tmp_path) == ["README.md:3: `src/predict/serve.py` names nothing"]
    assert missing_module_names(page, tmp_path) == [
        "README.md:3: `predict.serve` is no module under src/predict",
        "README.md:4: `predict.serving.SharedServer`: src/predict/serving.py defines no SharedServer"]


def test_every_docs_page_the_code_points_to_exists() -> None:
    """Code, configs and CI that send a reader to `docs/<page>.md` (a comment, an error message, the report's
    header) name a page that is there."""
    tops = ("src", "tests", "benchmarks", "config", "workflow", "envs", ".ci")
    sources = [p for top in tops for p in (REPO / top).rglob("*")
               if p.is_file() and p.suffix in {".py", ".yaml", ".smk", ".sh", ".txt", ""}
               and "__pycache__" not in p.parts]
    sources.append(REPO / "Snakefile")
    named = {(p.relative_to(REPO), m.group(0)) for p in sources
             for m in re.finditer(r"\bdocs/[\w.-]+\.md\b", p.read_text(errors="replace"))}
    assert named, "no source names a docs page: the scan found nothing to check"
    missing = sorted(f"{src}: {page}" for src, page in named if not (REPO / page).is_file())
    assert not missing, "pages the code names that docs/ lacks:\n" + "\n".join(missing)


CONFIG_FILE = re.compile(r"\.(ya?ml|json)$")


def swallowed_targets(text: str) -> list[str]:
    """Targets written after `--configfile` on a snakemake command line: the option takes every word up to the next
    option, so `--configfile config/gpu-slice.yaml all` reads a config file named 'all' and runs nothing."""
    found = []
    for line in text.splitlines():
        words = line.strip().lstrip("#").split()
        if not any(w.endswith("snakemake") for w in words) or "--configfile" not in words:
            continue
        for i, word in enumerate(words):
            if word != "--configfile":
                continue
            for value in words[i + 1:]:
                if value.startswith("-") or value.startswith("#") or value in {"&&", "||", ";", "|"}:
                    break
                if not CONFIG_FILE.search(value.strip("`")):
                    found.append(f"{value!r} in: {line.strip()}")
    return found


def test_no_documented_snakemake_command_puts_a_target_after_configfile() -> None:
    """Seen on the H200 (2026-12-06): the guide's slice command, `... --configfile config/gpu-slice.yaml all`, stopped
    at once with "No such file or directory: 'all'". Guides, configs, profiles and CI name the target first."""
    tops = ("docs", "config", "workflow", "envs", ".ci")
    sources = [README, *(p for top in tops for p in (REPO / top).rglob("*")
                         if p.is_file() and p.suffix in {".md", ".yaml", ".sh", ".smk", ""})]
    bad = [f"{p.relative_to(REPO)}: {hit}" for p in sources for hit in swallowed_targets(p.read_text(errors="replace"))]
    assert not bad, "\n".join(bad)
    assert swallowed_targets("snakemake --profile x --configfile config/gpu-slice.yaml all") == [
        "'all' in: snakemake --profile x --configfile config/gpu-slice.yaml all"]
