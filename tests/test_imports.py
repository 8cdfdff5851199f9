"""The package's import structure, as docs/architecture.md draws it: no cycle between its
parts, each layer blind to the ones above it, and the modules every process imports light."""

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "isoflop_cli"

# What a part must not import (directly or lazily inside a function): the brief's "the CLI knows
# nothing of torch; the recipe knows nothing of Ray or the grid", and config below what reads it.
BLIND = {
    "config": {"recipe", "grid", "dispatch", "sweep", "fit", "race", "cli", "head", "slurm", "memory"},
    "recipe": {
        "grid",
        "dispatch",
        "sweep",
        "head",
        "slurm",
        "fit",
        "race",
        "cli",
        "preflight",
        "continuation",
        "report",
        "calibrate",
        "memory",
    },
    "fit": {"recipe", "grid", "dispatch", "sweep", "head", "slurm", "cli", "race"},
    "tasks": {"config", "recipe", "grid", "dispatch", "sweep", "fit", "race", "cli"},
    "rewards": {"config", "recipe", "grid", "dispatch", "sweep", "fit", "race", "cli"},
    "flops": {"config", "recipe", "grid", "dispatch", "sweep", "fit", "race", "cli"},
    "store": {"config", "recipe", "grid", "dispatch", "sweep", "fit", "race", "cli", "head"},
    "errors": {"*"},
    "joblog": {"*"},
    "launchers": {"*"},  # the registry: its classes are imported by name, only when a sweep uses them
}
THIRD_PARTY_BLIND = {
    "recipe": {"ray"},
    "config": {"torch", "ray", "scipy", "pandas"},
    "grid": {"torch", "ray"},
    "memory": {"torch"},
}


def _part(module: str) -> str | None:
    """The part of the package a module belongs to: `isoflop_cli.fit.band` -> `fit`."""
    names = module.split(".")
    return names[1] if names[0] == "isoflop_cli" and len(names) > 1 else None


def _imports(path: Path) -> list[str]:
    """Every module a file imports, at module level or inside functions, leaving out imports under
    `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    skip = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return found


def _graph() -> dict[str, dict[str, set[str]]]:
    """part -> {imported part or third-party top-level name -> the files that import it}."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        part = _part(module)
        if part in (None, "__init__", "__main__"):
            continue
        edges = graph.setdefault(part, {})
        for name in _imports(path):
            target = _part(name) if name.startswith("isoflop_cli.") else name.split(".")[0]
            if target and target != part and target != "isoflop_cli":
                edges.setdefault(target, set()).add(path.relative_to(PACKAGE.parent).as_posix())
    return graph


def _cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_the_packages_parts():
    graph = _graph()
    cycle = _cycle(graph)
    assert cycle is None, (
        "import cycle: "
        + " -> ".join(cycle)
        + "; "
        + "; ".join(f"{a} -> {b} in {sorted(graph[a][b])}" for a, b in itertools.pairwise(cycle))
    )


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b": {"a.py"}}, "b": {"c": {"b.py"}}, "c": {"a": {"c.py"}, "d": {"c.py"}}, "d": {}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert _cycle(graph) is None


@pytest.mark.parametrize("part", sorted(BLIND))
def test_each_layer_is_blind_to_the_layers_above(part):
    edges = _graph().get(part, {})
    banned = set(edges) & PARTS if "*" in BLIND[part] else set(edges) & BLIND[part]
    banned |= set(edges) & THIRD_PARTY_BLIND.get(part, set())
    assert not banned, {b: sorted(edges[b]) for b in banned}


PARTS = {
    p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())
} - {"__init__", "__main__"}


@pytest.mark.parametrize(
    "module, heavy",
    [
        ("isoflop_cli.config", ("scipy", "torch", "pandas", "ray", "matplotlib")),  # every process and Ray job loads it
        ("isoflop_cli.cli", ("torch", "ray", "transformers", "matplotlib")),  # `isoflop --help`, `plan`, `status`
        ("isoflop_cli.grid", ("torch", "ray", "scipy")),
    ],
)
def test_light_modules_stay_light(module, heavy):
    """Imported, and for config also used: a config loaded and checked (the registries it reads
    import nothing heavy on the way)."""
    use = "; isoflop_cli.config.load()" if module == "isoflop_cli.config" else ""
    code = f"import sys, {module}{use}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert not loaded, f"importing {module} loads {loaded}"


def test_config_values_are_checked_apart_from_the_machine():
    """`config/validate.py` checks a config's values; what depends on the machine it runs on (files
    written, processes started, packages found) is `config/machine.py`'s, which the preflight also
    asks of every node."""
    machine = {"os", "shutil", "subprocess", "tempfile", "importlib"}
    found = {name.split(".")[0] for name in _imports(PACKAGE / "config" / "validate.py")}
    assert not found & machine, sorted(found & machine)


def test_the_samplers_do_not_import_each_other():
    """Both build on `recipe/rollouts.py`; `make_sampler` finds each through the registry."""
    for a, b in (("sampler", "vllm_sampler"), ("vllm_sampler", "sampler")):
        assert not any(
            name.startswith(f"isoflop_cli.recipe.{b}") for name in _imports(PACKAGE / "recipe" / f"{a}.py")
        ), (a, b)


@pytest.mark.parametrize(
    "pattern",
    [
        r"sampler\.name\s*[!=]=",
        r"reward\.name\s*[!=]=\s*\"prm\"",
        r"\bs\.name\s*==\s*\"vllm\"",
        r"launcher\s*[!=]=\s*\"",
        r"\bs\.name\s*!=\s*\"vllm\"",
        r"task(_cfg)?\.name\s*[!=]=\s*\"arith\"",
    ],
)
def test_no_module_compares_sampler_reward_task_or_launcher_names(pattern):
    """What a sampler, reward, task or launcher needs is on its registry entry (samplers.py,
    rewards.py, tasks/, launchers.py)."""
    import re

    found = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for p in PACKAGE.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert not found, found
