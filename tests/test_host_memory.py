"""glibc malloc settings for XLA:CPU buffers (asyncrl/host_memory.py)."""

import platform
import sys

import pytest

from asyncrl import host_memory

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt is glibc's")


@glibc_linux
def test_the_settings_apply_and_a_callers_environment_variable_wins():
    assert host_memory.tune_host_malloc({}) == {
        "mmap_threshold": host_memory.MMAP_THRESHOLD,
        "trim_threshold": host_memory.TRIM_THRESHOLD, "arena_max": host_memory.ARENA_MAX}
    applied = host_memory.tune_host_malloc({"MALLOC_ARENA_MAX": "4"})
    assert "arena_max" not in applied and "mmap_threshold" in applied


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("musl", ""))
    assert host_memory.tune_host_malloc({}) == {}
