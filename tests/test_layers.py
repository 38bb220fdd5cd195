"""The layering the design promises, read from the source: which package may import which,
no import cycles (counting imports inside functions and `if TYPE_CHECKING:` blocks), no
function longer than a screen, and a config check that loads no JAX.

    staleness ← servers ← coordinator ← drivers, sim ← run ← trainer_actors ← main;  drivers ← distributed ← run
    model ← rollout;  model ← train;  the coordinator knows no JAX, no threads, no model
    Ray: only asyncrl.distributed imports it, and only a run configured for it loads it
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "asyncrl"
SHARED = {"asyncrl.registry", "asyncrl.errors", "asyncrl.config_args", "asyncrl.jsonfile",
          "asyncrl.cli", "asyncrl.profiles", "asyncrl.records",
          "asyncrl.sections"}  # import-light leaves any layer may use
HEAVY = {"jax", "flax", "optax", "orbax", "threading", "ray"}

# layer -> (asyncrl modules it may import besides itself and SHARED, third-party it may not)
RULES = {
    "asyncrl.staleness": (set(), HEAVY - {"threading"} | {"numpy"}),
    "asyncrl.servers": ({"asyncrl.staleness"}, set()),
    "asyncrl.coordinator": ({"asyncrl.staleness", "asyncrl.servers.trajectory"}, HEAVY),
    "asyncrl.model": (set(), set()),
    "asyncrl.rollout": ({"asyncrl.model"}, set()),
    "asyncrl.train": ({"asyncrl.model"}, set()),
    "asyncrl.rewards": (set(), {"jax", "flax"}),
    "asyncrl.data": ({"asyncrl.rewards"}, {"jax", "flax"}),
    "asyncrl.sim": ({"asyncrl.coordinator", "asyncrl.servers.trajectory", "asyncrl.staleness",
                     "asyncrl.metrics"}, {"jax", "flax", "optax", "orbax"}),
    "asyncrl.drivers": ({"asyncrl.coordinator", "asyncrl.servers", "asyncrl.staleness",
                         "asyncrl.rollout", "asyncrl.model", "asyncrl.rewards", "asyncrl.policy",
                         "asyncrl.train.checkpoint", "asyncrl.data"}, {"ray"}),
    # A third driver of the same core: it may reuse the threaded one, never change the core.
    "asyncrl.distributed": ({"asyncrl.drivers", "asyncrl.coordinator", "asyncrl.servers",
                             "asyncrl.staleness", "asyncrl.rollout", "asyncrl.model",
                             "asyncrl.train.trainer", "asyncrl.train.losses",
                             "asyncrl.train.checkpoint", "asyncrl.placement"}, set()),
}
# Only the run (and the distributed package itself) may reach for the Ray backend; main joins
# the trainer group (asyncrl.distributed.trainer_group, no Ray) before JAX's backend starts.
# asyncrl.trainer_actors starts the job's processes, as main does: it sits above the run.
MAY_IMPORT_DISTRIBUTED = {"asyncrl.run", "asyncrl.config", "asyncrl.distributed", "asyncrl.main",
                          "asyncrl.trainer_actors"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, top_level_only: bool = False) -> set[str]:
    """Every module `path` imports (`from a import b` counts a.b when a.b is a module)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                        (PACKAGE.parent / candidate.replace(".", "/") / "__init__.py").exists():
                    found.add(candidate)
    return found


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations() -> list[str]:
    found = []
    for name, path in modules().items():
        if not within(name, MAY_IMPORT_DISTRIBUTED):
            found += [f"{name} imports {i}" for i in sorted(imports(path))
                      if within(i, ["asyncrl.distributed"])]
        for layer, (allowed, banned) in RULES.items():
            if not within(name, [layer]):
                continue
            for imported in sorted(imports(path)):
                top = imported.split(".")[0]
                if top in banned:
                    found.append(f"{name} imports {imported}")
                elif top == "asyncrl" and imported != "asyncrl" and not within(
                        imported, {layer} | allowed | SHARED):
                    found.append(f"{name} imports {imported}")
    return found


def package_of(module: str) -> str:
    """asyncrl.run.log -> asyncrl.run; a top-level module (asyncrl.config) is its own, and so
    is a command (`python -m asyncrl.eval`: asyncrl.eval.__main__), which nothing imports: it
    sits above the package it is named after, and may resolve a whole run's spec, whose
    sections live in the packages that read them (the eval section in asyncrl.eval)."""
    if module.endswith(".__main__"):
        return module
    return ".".join(module.split(".")[:2])


def cycles(group=lambda module: module) -> list[list[str]]:
    """Strongly connected components of the import graph with > 1 module (or, with `group`
    = package_of, > 1 package). Every import counts, a deferred one inside a function or a
    type-only one too: either still ties the two modules together, so neither can be read,
    tested or changed alone. A package's `__init__` is not an edge to the modules under it
    (importing `a.b` runs `a/__init__` first, not the other way round), so only imports its
    own code makes count for it."""
    names = modules()
    graph: dict[str, set[str]] = {group(name): set() for name in names}
    for name, path in names.items():
        graph[group(name)] |= {group(i) for i in imports(path)
                               if i in names and group(i) != group(name)}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_package_imports_across_a_forbidden_arrow():
    assert violations() == []


def test_no_import_cycles():
    # A package's __init__ importing its own modules is not a cycle unless they import it back.
    assert cycles() == []


def test_no_package_imports_a_package_that_imports_it_back():
    # Modules can avoid a cycle while their packages do not (run.train_config once tied the
    # run, the planner and evaluation together): neither package could be understood alone.
    assert cycles(package_of) == []


MAX_FUNCTION_LINES = 100


def long_functions() -> list[str]:
    """Every function or method in the package longer than MAX_FUNCTION_LINES lines (its
    decorators, docstring and comments included: what a reader has to hold at once)."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_function_is_longer_than_a_screen():
    assert long_functions() == []


def test_the_checks_catch_a_cycle_through_a_deferred_import_and_a_long_function(
        tmp_path, monkeypatch):
    before = set(long_functions())
    copy = tmp_path / "asyncrl"
    import shutil
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "staleness" / "loop_a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from asyncrl.staleness import loop_b\n")
    (copy / "staleness" / "loop_b.py").write_text(
        "def later():\n    from asyncrl.staleness import loop_a\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (copy / "staleness" / "long.py").write_text(f"@staticmethod\ndef long():\n{body}")
    # The coordinator imports servers.trajectory; a servers module importing the coordinator
    # back ties the packages without any module cycle.
    (copy / "servers" / "back.py").write_text("from asyncrl.coordinator import core\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    assert ["asyncrl.staleness.loop_a", "asyncrl.staleness.loop_b"] in cycles()
    assert not any("asyncrl.servers.back" in c for c in cycles())
    assert ["asyncrl.coordinator", "asyncrl.servers"] in cycles(package_of)
    assert set(long_functions()) - before == {
        f"asyncrl.staleness.long.long: {MAX_FUNCTION_LINES + 2} lines"}


def test_the_rules_catch_a_forbidden_import(tmp_path, monkeypatch):
    """The checker itself can fail: a coordinator module that imports JAX or the model is
    reported (run on a copy of the package with one such module added)."""
    copy = tmp_path / "asyncrl"
    import shutil
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "coordinator" / "bad.py").write_text("import jax\nfrom asyncrl.model import apply\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    assert violations() == ["asyncrl.coordinator.bad imports asyncrl.model",
                            "asyncrl.coordinator.bad imports jax"]


# The model package's import-light modules: the names a config is checked against.
LIGHT_MODEL_MODULES = {"asyncrl.model", "asyncrl.model.chat", "asyncrl.model.errors",
                       "asyncrl.model.remat", "asyncrl.model.config", "asyncrl.model.section",
                       "asyncrl.model.attention_names"}


@pytest.mark.parametrize("module", ["asyncrl.config", "asyncrl.coordinator.core",
                                    "asyncrl.staleness", "asyncrl.sim.config"])
def test_validating_a_config_and_the_core_load_no_jax_and_no_model(module):
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(sorted(m for m in sys.modules "
                               "if m.split('.')[0] in ('jax', 'flax', 'grain', 'orbax', 'ray') "
                               f"or m.startswith('asyncrl.model') and m not in {LIGHT_MODEL_MODULES!r}))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_the_local_backend_loads_no_ray():
    """Ray is an optional extra: a run module that imports it at the top would need it always."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, asyncrl.run, asyncrl.main; "
                               "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
