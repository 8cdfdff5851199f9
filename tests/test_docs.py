"""The README and docs/ stay true to the repository and the CLI: every relative link resolves to a
file inside the repository (and an anchor to a heading there), nothing points outside it, every
`isoflop ...` command shown parses with options its subcommand has, every schema key is documented
with its default, and the README's install section names the extras pyproject.toml pins."""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from functools import cache
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.config.schema import SweepConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(isoflop [^`]+)`")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (links there are not links)."""
    return FENCE.sub("", text(page))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in prose(page).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            found.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return found


def test_the_pages_exist_and_the_readme_is_short():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 5
    lines = text(ROOT / "README.md").count("\n")
    assert lines <= 300, f"README.md has {lines} lines (at most 300: the rest belongs in docs/)"
    for command in ("make sweep", "make test"):
        assert command in text(ROOT / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_relative_links_resolve_inside_the_repository(page):
    problems = []
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not problems, problems


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_nothing_points_outside_the_repository(page):
    body = text(page)
    for outside in ("../shared", "shared/design", "shared/data", "/work/"):
        assert outside not in body, f"{page.name} mentions {outside}"


def shown_commands(page: Path) -> list[list[str]]:
    """Every `isoflop ...` command line of the page's fenced code blocks, as argv after `isoflop`
    (continuation lines joined, comments and leading VAR=value assignments dropped)."""
    commands = []
    for block in FENCE.findall(text(page)):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError as e:
                raise AssertionError(f"{page.name}: cannot split {line!r}: {e}") from None
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]
            if words and (words[0] == "isoflop" or words[0].endswith("/isoflop")):
                commands.append(words[1:])
    return commands


def subcommand(name: str):
    group = typer.main.get_command(app)
    return group.commands.get(name)


def accepted(command) -> set[str]:
    """The command's option names (typer carries its own click, so options are told by their kind)."""
    options = [param for param in command.params if param.param_type_name == "option"]
    return {opt for param in options for opt in (*param.opts, *param.secondary_opts)} | {"--help"}


COMMANDS = [(page, argv) for page in PAGES for argv in shown_commands(page)]


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20  # the tour, the cluster pages, the fits ...
    assert {argv[0] for _, argv in COMMANDS} >= {"plan", "sweep", "status", "fit"}


@pytest.mark.parametrize("page, argv", COMMANDS, ids=[f"{p.name}:{' '.join(a)[:60]}" for p, a in COMMANDS])
def test_a_shown_command_parses(page, argv):
    """The command with --help appended: the subcommand exists and takes every option given (no
    compute happens: click answers --help before the command runs)."""
    assert argv, f"{page.name}: a bare `isoflop`"
    command = subcommand(argv[0])
    assert command is not None, f"{page.name}: no subcommand {argv[0]!r} in `isoflop {' '.join(argv)}`"
    unknown = [w.split("=")[0] for w in argv[1:] if w.startswith("--") and w.split("=")[0] not in accepted(command)]
    assert not unknown, f"{page.name}: `isoflop {argv[0]}` has no option {unknown}"
    result = CliRunner().invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, (
        f"{page.name}: `isoflop {' '.join(argv)} --help` -> {result.exit_code}: {result.output}"
    )


INLINE_COMMANDS = [(page, m) for page in PAGES for m in INLINE.findall(prose(page))]


@pytest.mark.parametrize("page, shown", INLINE_COMMANDS, ids=[f"{p.name}:{s[:60]}" for p, s in INLINE_COMMANDS])
def test_a_command_named_in_prose_exists_with_its_options(page, shown):
    """`isoflop NAME [--opt ...]` in a table or sentence: the subcommand exists and takes each option."""
    name = shown.split()[1]
    command = subcommand(name)
    assert command is not None, f"{page.name}: no subcommand {name!r} in `{shown}`"
    unknown = sorted(set(OPTION.findall(shown)) - accepted(command))
    assert not unknown, f"{page.name}: `isoflop {name}` has no option {unknown}"


def test_every_subcommand_is_documented():
    readme = text(ROOT / "README.md")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        if not command.hidden:
            assert f"`isoflop {name}" in readme, f"the README's command table lacks `isoflop {name}`"


def schema_keys(cls=SweepConfig, prefix="") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        kind = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(type(kind), f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def test_every_config_key_is_in_the_configuration_page():
    page = text(ROOT / "docs" / "configuration.md")
    rows = {m.group(1) for m in re.finditer(r"^\| `([\w.@]+)` \|", page, re.M)}
    missing = [k for k in schema_keys() if k not in rows]
    assert not missing, f"docs/configuration.md has no row for {missing}"
    stale = sorted(
        k
        for k in rows
        if "." in k and k.split(".")[0] in {f.name for f in dataclasses.fields(SweepConfig)} and k not in schema_keys()
    )
    assert not stale, f"docs/configuration.md documents keys the schema lacks: {stale}"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_the_readme_names_what_the_extras_pin():
    import tomllib

    extras = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    readme = text(ROOT / "README.md")
    missing = [req for reqs in extras.values() for req in reqs if f"`{req}`" not in readme]
    assert not missing, f"the README's install table lacks {missing} (pyproject.toml's extras)"
