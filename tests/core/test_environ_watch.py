"""EnvironMemo: a value read from the C environment is read again after any change to it, however
made (os.environ, os.putenv, C setenv/putenv/unsetenv), and never kept while it changes under it."""

from __future__ import annotations

import ctypes
import os

import pytest

from kernel_cache.settings import environ_watch
from kernel_cache.settings.environ_watch import EnvironMemo

NAME = "KERNEL_CACHE_TEST_ENVIRON_WATCH"
pytestmark = pytest.mark.skipif(environ_watch._ENVIRON is None, reason="no readable C environ here")
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p


def _c_getenv() -> str | None:  # what a native library (Triton's C++) reads
    found = libc.getenv(NAME.encode())
    return None if found is None else found.decode()


@pytest.fixture
def memo():
    reads = []

    def read():
        reads.append(1)
        return _c_getenv()

    memo = EnvironMemo(read)
    memo.reads, memo.held = reads, []
    yield memo
    os.environ.pop(NAME, None)
    os.unsetenv(NAME)


def test_an_unchanged_environment_is_read_once(memo):
    assert memo.get() is None and memo.get() is None and memo.get() is None
    assert len(memo.reads) == 1


@pytest.mark.parametrize("change", ["os.environ", "os.putenv", "setenv", "putenv"])
def test_every_way_of_setting_a_variable_is_seen(memo, change):
    assert memo.get() is None
    for value in ("1", "2", "1"):  # a new value, another, then the first again
        if change == "os.environ":
            os.environ[NAME] = value
        elif change == "os.putenv":
            os.putenv(NAME, value)
        elif change == "setenv":
            assert libc.setenv(NAME.encode(), value.encode(), 1) == 0
        else:  # the string becomes part of the environment: kept alive (and unedited) from then on
            memo.held.append(ctypes.create_string_buffer(f"{NAME}={value}".encode()))
            assert libc.putenv(memo.held[-1]) == 0
        assert memo.get() == value == _c_getenv()
        assert memo.get() == value
    assert len(memo.reads) == 4  # the first read, then one per change


def test_unsetting_and_clearing_is_seen(memo):
    os.environ[NAME] = "x"
    assert memo.get() == "x"
    os.unsetenv(NAME)  # behind os.environ's back
    assert memo.get() is None
    libc.setenv(NAME.encode(), b"y", 1)
    assert memo.get() == "y"
    saved = {key: value for key, value in os.environ.items() if key != NAME}
    try:  # clearenv empties the array (environ may become NULL): read each time, never a stale value
        assert libc.clearenv() == 0
        assert memo.get() is None
        assert memo.get() is None
    finally:
        for key, value in saved.items():
            os.putenv(key, value)
    assert memo.get() is None
    os.environ[NAME] = "z"
    assert memo.get() == "z"


def test_a_value_read_while_the_environment_changes_is_not_kept():
    calls = []

    def read():
        calls.append(1)
        value = _c_getenv()
        if len(calls) == 1:
            os.environ[NAME] = "during"  # a neighbour's setenv between our read and our look at the array
        return value

    memo = EnvironMemo(read)
    try:
        assert memo.get() is None  # what was read, returned once
        assert memo.get() == "during" and len(calls) == 2  # but not kept: read again
        assert memo.get() == "during" and len(calls) == 2
    finally:
        os.environ.pop(NAME, None)


def test_without_a_readable_environ_every_get_reads(monkeypatch):
    monkeypatch.setattr(environ_watch, "_ENVIRON", None)
    calls = []
    memo = EnvironMemo(lambda: calls.append(1) or len(calls))
    assert [memo.get(), memo.get(), memo.get()] == [1, 2, 3]
