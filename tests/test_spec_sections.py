"""The run's spec: resolved once, frozen, typed; and each component reads only its own section.

Two views of "reads": every attribute a module takes from a section while a real tiny run
trains (the spec and its sections record their readers), and every `x.<section>.<field>`
written in the package's source (the code paths a local run does not take: Ray, TPU hosts).
"""

import ast
import dataclasses
import pathlib
import sys

import pytest

from asyncrl.config import SECTIONS, RunSpec, resolve, with_overrides
from asyncrl.config_args import ConfigError
from asyncrl.sections import Section
from experiments.grpo import get_config

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A component's own sections: what it may read. Everything else is a composer, which reads
# several and hands each component its own (or plain values taken from them).
OWNERS = {
    "asyncrl.model": {"model"},
    "asyncrl.policy": {"model", "task"},  # loads the policy; renders a task's prompts
    "asyncrl.data": {"task"},
    "asyncrl.rewards": {"rewards"},
    "asyncrl.rollout": {"rollout"},
    "asyncrl.train": {"train", "checkpoint"},
    "asyncrl.coordinator": {"coordinator", "staleness"},
    "asyncrl.staleness": set(),
    "asyncrl.servers": set(),
    "asyncrl.eval.accuracy": {"eval"},
    "asyncrl.eval.section": {"eval"},
    "asyncrl.placement": {"mesh"},
    "asyncrl.metrics": {"log"},
    # The simulator's own config holds the live run's coordinator section (one schema).
    "asyncrl.sim": {"coordinator"},
    # The Ray backend's GPU and actor accounting: which devices the mesh asks of which node.
    "asyncrl.distributed": {"distributed", "mesh"},
}
# Composers: the run and the commands, the drivers that assemble rollouts (the threaded one
# and the Ray one), and the machinery that converts and records a spec.
COMPOSERS = ("asyncrl.config", "asyncrl.sections", "asyncrl.config_args", "asyncrl.run",
             "asyncrl.drivers", "asyncrl.distributed.rollouts", "asyncrl.trainer_actors",
             "asyncrl.main", "asyncrl.plan", "asyncrl.eval.__main__", "asyncrl.export",
             "asyncrl.run_checkpoint", "asyncrl.run_folder", "asyncrl.cli", "asyncrl.ablations",
             # A measured live run's config made into a simulated run's.
             "asyncrl.sim.calibrate")


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def owner_of(module: str) -> str | None:
    """The most specific OWNERS entry `module` falls in; None for a composer or outside."""
    if any(within(module, c) for c in COMPOSERS) or not within(module, "asyncrl"):
        return None
    matches = [p for p in OWNERS if within(module, p)]
    if not matches:
        raise AssertionError(f"{module} is neither a component (OWNERS) nor a composer: say "
                             f"which sections it may read")
    return max(matches, key=len)


def trespasses(reads: set[tuple[str, str]]) -> list[str]:
    found = []
    for module, section in sorted(reads):
        owner = owner_of(module)
        if owner is not None and section not in OWNERS[owner]:
            found.append(f"{module} reads config.{section}")
    return found


# ---------------------------------------------------------------- the source

# The names the whole spec goes by where it is held: `c.rollout`, `self.spec.train`.
SPEC_NAMES = {"c", "config", "spec", "cfg"}


def section_reads(module: str, source: str) -> set[tuple[str, str]]:
    """(module, section) for each `x.<section>.<field>` in `source` whose field (or method)
    is one of that section's (`c.train.batch_size`, `self.c.rollout.max_len`), and each
    `<spec>.<section>` taken from a name the whole spec goes by (`d = c.distributed`)."""
    fields = {name: {f.name for f in dataclasses.fields(cls)} | _members(cls)
              for name, cls in section_classes().items()}
    reads = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr in fields):
            continue
        holder = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(
            node.value, "id", None)
        if holder in SPEC_NAMES:
            reads.add((module, node.attr))
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr in fields and node.attr in fields[node.value.attr]):
            reads.add((module, node.value.attr))
    return reads


def section_reads_in_source() -> set[tuple[str, str]]:
    reads = set()
    for path in sorted((ROOT / "asyncrl").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        reads |= section_reads(module, path.read_text())
    return reads


def section_classes() -> dict[str, type]:
    return {f.name: _resolved_type(f) for f in dataclasses.fields(RunSpec) if f.name in SECTIONS}


def _resolved_type(field):
    import asyncrl.config as config_module

    return getattr(config_module, field.type) if isinstance(field.type, str) else field.type


def _members(cls) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_") and name not in ("name",)}


def test_no_component_names_another_components_section_in_its_source():
    assert trespasses(section_reads_in_source()) == []


def test_the_source_check_sees_a_trespass():
    """The checker can fail: in a data module, a field of the rollout's section read through
    any name, or the rollout's section taken from the whole spec, is reported; the task's
    section and unrelated attributes named like a section are not."""
    source = ("def f(c, r, trainer, jax):\n"
              "    bucket = r.rollout.prompt_bucket\n"
              "    d = c.distributed\n"
              "    return c.task.kinds, trainer.mesh, jax.checkpoint\n")
    assert trespasses(section_reads("asyncrl.data.sources", source)) == [
        "asyncrl.data.sources reads config.distributed",
        "asyncrl.data.sources reads config.rollout"]
    assert trespasses(section_reads("asyncrl.run", source)) == []


# ---------------------------------------------------------------- a real run

class Reads:
    """Who read which section: (module, section) pairs."""

    def __init__(self):
        self.pairs: set[tuple[str, str]] = set()


def audited(spec: RunSpec, reads: Reads) -> RunSpec:
    """`spec` whose sections record each module that takes an attribute from them (a field,
    a property or a method), and whose whole records each module that takes a section."""

    def recording(cls, section_name):
        def __getattribute__(self, attr):
            if not attr.startswith("__"):
                reads.pairs.add((sys._getframe(1).f_globals.get("__name__", "?"), section_name))
            return object.__getattribute__(self, attr)

        return type(f"Audited{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})

    sections = {}
    for name in SECTIONS:
        section = getattr(spec, name)
        values = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
        sections[name] = recording(type(section), name)(**values)
    return recording(RunSpec, "*")(seed=spec.seed, **sections)


@pytest.fixture(scope="module")
def tiny_run_reads(tmp_path_factory):
    from asyncrl.run import run

    config = with_overrides(get_config("tiny"), {"train.steps": 2, "eval.heldout_size": 4,
                                                 "eval.every_steps": 1,
                                                 "checkpoint.every_steps": 1})
    reads = Reads()
    run(audited(resolve(config), reads), tmp_path_factory.mktemp("audited"))
    return reads.pairs


def test_a_real_run_reads_each_section_only_where_it_is_owned(tiny_run_reads):
    # The audit saw the components at work (or it would pass by seeing nothing).
    readers = {module for module, _ in tiny_run_reads}
    for component in ("asyncrl.rollout.section", "asyncrl.eval.accuracy", "asyncrl.policy",
                      "asyncrl.data.sources", "asyncrl.train.settings"):
        assert component in readers, sorted(readers)
    assert trespasses({pair for pair in tiny_run_reads if pair[1] != "*"}) == []


def test_only_composers_hold_the_whole_spec(tiny_run_reads):
    holders = {module for module, section in tiny_run_reads if section == "*"}
    assert [m for m in sorted(holders) if owner_of(m) is not None] == []


# ---------------------------------------------------------------- the spec itself

def test_the_spec_is_frozen_typed_and_round_trips_through_pickle():
    import pickle

    spec = resolve(get_config("tiny"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.train.steps = 3
    with pytest.raises(TypeError):
        spec.coordinator.admission_params["verl"] = {}
    assert isinstance(spec.train.learning_rate, float) and isinstance(spec.task.kinds, tuple)
    assert pickle.loads(pickle.dumps(spec)) == spec  # what a Ray actor receives
    assert resolve(spec) is spec


@pytest.mark.parametrize("changes, message", [
    ({"train.steps": "4"}, r"config.train.steps = '4' is not allowed: expected an int"),
    ({"mesh.colocate": 1}, r"config.mesh.colocate = 1 is not allowed: expected True or False"),
    ({"rollout.top_p": "high"}, r"config.rollout.top_p = 'high' is not allowed: expected a number"),
    ({"task.kinds": "add2"}, r"config.task.kinds = 'add2' is not allowed: expected a tuple"),
])
def test_a_value_of_the_wrong_type_is_named_with_its_type(changes, message):
    config = get_config("tiny")
    for dotted, value in changes.items():  # as a config file would set it, past ConfigDict's types
        section, field = dotted.split(".")
        with config[section].ignore_type():
            config[section][field] = value
    with pytest.raises(ConfigError, match=message):
        resolve(config)


def test_a_field_a_section_does_not_declare_or_lacks_is_named():
    config = get_config("tiny")
    config.train.unlock()
    config.train.learning_rat = 1e-3
    with pytest.raises(ConfigError, match=r"config.train.learning_rat: no such field"):
        resolve(config)
    config = get_config("tiny")
    del config.rollout["top_p"]
    with pytest.raises(ConfigError, match=r"config.rollout.top_p is missing"):
        resolve(config)


def test_every_section_is_declared_beside_the_package_that_reads_it():
    for name, cls in section_classes().items():
        assert issubclass(cls, Section) and cls.name == name
        module = cls.__module__
        owner = owner_of(module)
        assert owner is not None and name in OWNERS[owner], (name, module)


@pytest.mark.parametrize("changes, message", [
    ({"model.preset": "replace"}, r"config.model.preset = 'replace' is not allowed: a "
     r"ModelConfig preset: tiny, smollm2_135m, "),
    ({"model.param_dtype": "float16"}, r"config.model.param_dtype = 'float16' is not allowed: "
     r"one of float32, bfloat16"),
    ({"rollout.top_p": 0.0}, r"config.rollout.top_p = 0.0 is not allowed: expected a number in "
     r"\(0, 1\]"),
    ({"rollout.top_k": -1}, r"config.rollout.top_k = -1 is not allowed: expected an int ≥ 0"),
    ({"eval.max_new_tokens": 0}, r"config.eval.max_new_tokens = 0 is not allowed"),
])
def test_fields_checked_once_the_spec_declares_them(changes, message):
    with pytest.raises(ConfigError, match=message):
        resolve(with_overrides(get_config("tiny"), changes))


def test_a_config_recorded_before_a_field_was_added_resolves_as_it_ran():
    """A run folder's run.json (evaluation and export read it) from before train.attention
    and train.tokens_per_row existed: dense attention, a trajectory per row."""
    config = get_config("tiny")
    for field in ("attention", "tokens_per_row"):
        del config.train[field]
    spec = resolve(config)
    assert (spec.train.attention, spec.train.tokens_per_row) == ("dense", 0)
    del config.train["remat"]  # not added later: every config has always set it
    with pytest.raises(ConfigError, match=r"config.train.remat is missing"):
        resolve(config)
