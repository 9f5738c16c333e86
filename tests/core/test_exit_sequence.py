"""What reaches the cache at exit, in one order (`kernel_cache/at_exit.py`): compile workers, warm
sets, then the counters, whichever a process used first; a failing step stops
none after it; the one atexit hook is registered at first use, never at import."""

from __future__ import annotations

import pytest
from conftest import run_python

from kernel_cache import at_exit


def test_steps_run_in_the_sequence_order_whatever_order_they_were_added():
    code = """
import atexit, sys
from kernel_cache import at_exit
at_exit.add("counters", lambda: print("counters"))
at_exit.add("compile workers", lambda: 1 / 0)
at_exit.add("warm sets", lambda: print("warm sets"))
at_exit.add("warm sets", lambda: print("a second warm-set step"))
"""
    assert run_python(code).stdout.split("\n")[:2] == ["warm sets", "counters"]


def test_importing_registers_no_exit_hook_and_a_session_registers_one():
    code = """
import atexit
calls = []
real = atexit.register
ours = ("kernel_cache", "compiler", "lowering")
ours_of = lambda fn: (getattr(fn, "__module__", None) or "").split(".")[0] in ours  # (a builtin has no module)
atexit.register = lambda fn, *a, **k: (calls.append(fn.__qualname__) if ours_of(fn) else None, real(fn, *a, **k))[1]
import kernel_cache, lowering
print(calls)
kernel_cache.current_session(); kernel_cache.configure(kernel_cache.Config())
print(calls)
"""
    before, after = run_python(code).stdout.splitlines()[-2:]
    assert before == "[]" and after == "['run_steps']"


def test_an_unknown_step_is_refused():
    with pytest.raises(ValueError, match="no exit step 'later'"):
        at_exit.add("later", lambda: None)
