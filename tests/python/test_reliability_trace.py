"""opreg.trace() is per thread and nestable: a block records the calls of its own thread only,
and an outer block also records what an inner block records."""

from __future__ import annotations

import threading

import torch

import opreg

KERNEL = "kernel:cpu_loop"
DECLINED = "fallback(declined by kernel:cpu_loop)"


def scale_add(x):
    return torch.ops.opreg_example.scale_add(x, x, 0.5)


def test_nested_blocks_each_record_and_the_outer_keeps_its_own_records():
    x = torch.randn(8)
    with opreg.trace() as outer:
        scale_add(x)
        with opreg.trace() as inner:
            scale_add(x.double())
        scale_add(x)
    scale_add(x.double())  # after both blocks: recorded nowhere
    assert inner.impls() == [DECLINED]
    assert outer.impls() == [KERNEL, DECLINED, KERNEL]


def test_two_threads_see_only_their_own_calls():
    barrier = threading.Barrier(2)
    seen: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def worker(name, x):
        try:
            with opreg.trace() as t:
                barrier.wait()  # both blocks open before either calls
                for _ in range(20):
                    scale_add(x)
                barrier.wait()  # neither closes before the other has called
            seen[name] = t.impls()
        except BaseException as error:  # surfaced below, not lost in the thread
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=("float", torch.randn(8))),
        threading.Thread(target=worker, args=("double", torch.randn(8).double())),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert seen == {"float": [KERNEL] * 20, "double": [DECLINED] * 20}


def test_a_thread_without_a_block_records_nothing_into_another_threads_block():
    x = torch.randn(8)
    with opreg.trace() as t:
        other = threading.Thread(target=scale_add, args=(x.double(),))
        other.start()
        other.join()
        scale_add(x)
    assert t.impls() == [KERNEL]
