"""Concurrent compiles' front ends go heaviest first (compiler/compile.py), and a compile
of the example module prints no MLIR module it does not keep."""

from __future__ import annotations

import threading
import time

import pytest

from compiler.compile import Turns


def _wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def _queue(turns: Turns, weights: list[float]) -> list[float]:
    """Hold a turn, queue one thread per weight behind it (in list order), release; the order served."""
    served: list[float] = []
    release = threading.Event()

    def holder() -> None:
        with turns.turn(1e9):
            release.wait(10)

    def waiter(weight: float) -> None:
        with turns.turn(weight):
            served.append(weight)

    first = threading.Thread(target=holder)
    first.start()
    _wait_for(lambda: turns._held)
    threads = []
    for n, weight in enumerate(weights):
        thread = threading.Thread(target=waiter, args=(weight,))
        thread.start()
        threads.append(thread)
        _wait_for(lambda n=n: len(turns._waiting) == n + 1)
    release.set()
    for thread in [first, *threads]:
        thread.join(10)
    return served


def test_heaviest_waiter_goes_first() -> None:
    assert _queue(Turns(), [1.0, 5.0, 3.0, 4.0]) == [5.0, 4.0, 3.0, 1.0]


def test_equal_weights_go_in_arrival_order() -> None:
    turns = Turns()
    order: list[int] = []
    release = threading.Event()

    def holder() -> None:
        with turns.turn():
            release.wait(10)

    def waiter(n: int) -> None:
        with turns.turn(2.0):
            order.append(n)

    first = threading.Thread(target=holder)
    first.start()
    _wait_for(lambda: turns._held)
    threads = []
    for n in range(4):
        threads.append(threading.Thread(target=waiter, args=(n,)))
        threads[-1].start()
        _wait_for(lambda n=n: len(turns._waiting) == n + 1)
    release.set()
    for thread in [first, *threads]:
        thread.join(10)
    assert order == [0, 1, 2, 3]


def test_a_turn_is_given_back_when_its_work_raises() -> None:
    turns = Turns()
    with pytest.raises(RuntimeError), turns.turn(3.0):
        raise RuntimeError("front end failed")
    done = threading.Event()

    def next_one() -> None:
        with turns.turn():
            done.set()

    thread = threading.Thread(target=next_one)
    thread.start()
    assert done.wait(10)
    thread.join(10)


def test_a_matmul_is_guessed_heavier_than_an_elementwise_add(example_specs_sm90) -> None:
    from compiler.compile import front_end_weight

    weights = {label: front_end_weight(spec) for label, spec in example_specs_sm90.items()}
    adds = [w for label, w in weights.items() if label.startswith("add")]
    matmuls = [w for label, w in weights.items() if label.startswith("matmul")]
    assert adds and matmuls and min(matmuls) > max(adds) > 0


def test_run_stages_returns_only_the_stages_kept(example_specs_sm90) -> None:
    from compiler import triton_compat as tc

    spec = example_specs_sm90["add"]
    parsed = tc.parse_options(spec.target, spec.triton_options())
    src = tc.ast_source(spec.kernel, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
    outputs, metadata = tc.run_stages(src, spec.target, parsed, keep={"ttir", "cubin"})
    assert set(outputs) == {"ttir", "cubin"}
    assert "tt.func" in outputs["ttir"] and outputs["cubin"][:4] == b"\x7fELF"
    assert metadata["name"] == spec.name


def test_a_waiter_interrupted_leaves_the_queue_and_holds_up_nobody() -> None:
    """A KeyboardInterrupt (or any exception) while waiting must not leave a ticket on top of the queue."""
    turns = Turns()
    release = threading.Event()
    raised: list[BaseException] = []

    def holder() -> None:
        with turns.turn():
            release.wait(10)

    def interrupted() -> None:
        original = turns._changed.wait
        calls = 0

        def wait_then_raise(timeout=None):
            nonlocal calls
            calls += 1
            if calls == 2:  # woken once, then interrupted
                raise KeyboardInterrupt
            return original(0.05)

        turns._changed.wait = wait_then_raise  # type: ignore[method-assign]
        try:
            with turns.turn(100.0):
                pass
        except KeyboardInterrupt as exc:
            raised.append(exc)
        finally:
            turns._changed.wait = original  # type: ignore[method-assign]

    first = threading.Thread(target=holder)
    first.start()
    _wait_for(lambda: turns._held)
    heavy = threading.Thread(target=interrupted)
    heavy.start()
    heavy.join(10)
    assert raised and len(turns._waiting) == 0
    release.set()
    first.join(10)
    done = threading.Event()

    def light() -> None:
        with turns.turn(1.0):
            done.set()

    later = threading.Thread(target=light)
    later.start()
    assert done.wait(10)
    later.join(10)
