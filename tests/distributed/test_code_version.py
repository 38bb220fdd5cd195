"""The code-version check every Ray actor makes at its start, without Ray: the fingerprint of
a package's source, and the one-line error a mismatch raises."""

import dataclasses
import shutil

import pytest

from asyncrl.cli import exit_on_user_error
from asyncrl.distributed.code_version import (CodeVersionError, check_code_version,
                                              code_version, fingerprint)
from asyncrl.errors import UserError


def small_package(root):
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("VERSION = 1\n")
    (root / "sub" / "mod.py").write_text("def f():\n    return 'a'\n")
    return root


def test_two_copies_differing_in_one_byte_have_different_fingerprints(tmp_path):
    a = small_package(tmp_path / "a" / "pkg")
    b = tmp_path / "b" / "pkg"
    shutil.copytree(a, b)
    assert fingerprint(a) == fingerprint(b)  # where the copy lies does not count
    assert fingerprint(a).startswith("sha256:") and len(fingerprint(a)) == len("sha256:") + 16
    (b / "sub" / "mod.py").write_text("def f():\n    return 'b'\n")  # one byte
    assert fingerprint(a) != fingerprint(b)
    # a file moved (same bytes, other path) and a file added count too; caches do not
    moved = tmp_path / "c" / "pkg"
    shutil.copytree(a, moved)
    (moved / "sub" / "mod.py").rename(moved / "sub" / "other.py")
    assert fingerprint(moved) != fingerprint(a)
    cached = tmp_path / "d" / "pkg"
    shutil.copytree(a, cached)
    (cached / "__pycache__").mkdir()
    (cached / "__pycache__" / "x.py").write_text("stale\n")
    assert fingerprint(cached) == fingerprint(a)


def test_this_processes_fingerprint_is_computed_once():
    assert code_version() is code_version()
    assert code_version().startswith("sha256:")


def test_a_mismatch_raises_one_line_naming_both_versions_and_the_host(capsys):
    check_code_version("sha256:aaaa", "rollout instance 1", "10.0.0.3", here="sha256:aaaa")
    check_code_version("", "rollout instance 1", "10.0.0.3", here="sha256:bbbb")  # unchecked
    with pytest.raises(CodeVersionError) as raised:
        check_code_version("sha256:aaaa", "rollout instance 1", "10.0.0.3", here="sha256:bbbb")
    message = str(raised.value)
    assert isinstance(raised.value, UserError) and "\n" not in message
    assert "sha256:aaaa" in message and "sha256:bbbb" in message
    assert "rollout instance 1" in message and "10.0.0.3" in message
    # main's entry point ends it as one `error:` line, status 2
    with pytest.raises(SystemExit) as exited:
        exit_on_user_error(lambda: check_code_version("sha256:aaaa", "trainer actor 1", "h1",
                                                      here="sha256:bbbb"))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: trainer actor 1 on host h1 ")


def test_the_instance_spec_carries_the_drivers_fingerprint():
    from asyncrl.distributed.actor import InstanceSpec

    field, = [f for f in dataclasses.fields(InstanceSpec) if f.name == "code_version"]
    assert field.default_factory is code_version  # taken where the spec is made: the driver
