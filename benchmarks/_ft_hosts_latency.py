"""Store-operation latency for ``torchnext bench ft-hosts`` and its scale model.

:func:`store_latency` times each store operation the group's protocols use (``set``,
``get``, ``check``, ``add``, ``compare_set``, ``multi_get`` of 8 and 64 keys) against a
job's store, from this process (outside every test host, through the bridge, as a
worker on another host reaches it), one call at a time: the round trip a member sees
when the store is idle. :func:`store_throughput` has several threads call ``check`` at
once for a while (or ``multi_get`` of 64 keys, which prices each key a heartbeat reads)
and reads the server processes' CPU time from ``/proc`` before and after: the server's
cost per call, which is what a store serving thousands of members runs out of. (The
calls per second are bounded by these callers too, and by the CPUs they share with the
server, so they are a floor of what the store can serve.) :func:`pg_build_time` times
the fixed part of opening an epoch: a 2-rank gloo group built through the store (two
threads of this process). ``benchmarks/ft_scale_model.py`` reads all three from
``ft-hosts.json``.

What not to assume: the job is parked while this runs (no training traffic), so these
are idle-store figures; keys live under ``ftbench/latency/`` and never meet the job's.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchnext.distributed.launch.store import connect_store

__all__ = ["Throughput", "pg_build_time", "store_latency", "store_throughput"]

_PREFIX = "ftbench/latency/"


def _close(store: Any) -> None:
    close = getattr(store, "close", None)  # an EtcdStore lives until closed
    if callable(close):
        close()


def store_latency(url: str, *, reps: int = 200) -> dict[str, float]:
    """Median seconds of one call of each operation (``<op>_s``), and per extra key
    of a ``multi_get`` (``multi_get_per_key_s``)."""
    store = connect_store(url, timedelta(seconds=30))
    try:
        keys8 = [f"{_PREFIX}k{i}" for i in range(8)]
        keys64 = [f"{_PREFIX}k{i}" for i in range(64)]
        for k in keys64:
            store.set(k, "12345678")
        store.set(f"{_PREFIX}cas", "taken")
        ops: dict[str, Callable[[int], object]] = {
            "set": lambda i: store.set(f"{_PREFIX}s{i % 16}", "x"),
            "get": lambda i: store.get(keys8[0]),
            "check": lambda i: store.check([keys8[0]]),
            "add": lambda i: store.add(f"{_PREFIX}n", 1),
            "compare_set": lambda i: store.compare_set(f"{_PREFIX}cas", "", "mine"),
            "multi_get_8": lambda i: store.multi_get(keys8),
            "multi_get_64": lambda i: store.multi_get(keys64),
        }
        out: dict[str, float] = {}
        for name, op in ops.items():
            for i in range(10):  # warm the connection and the server's paths
                op(i)
            samples = []
            for i in range(reps):
                t0 = time.perf_counter()
                op(i)
                samples.append(time.perf_counter() - t0)
            out[f"{name}_s"] = statistics.median(samples)
        out["multi_get_per_key_s"] = max(0.0, (out["multi_get_64_s"] - out["multi_get_8_s"]) / 56)
        return out
    finally:
        _close(store)


@dataclass(frozen=True)
class Throughput:
    """What several callers got from a store together, and what it cost the server."""

    ops_per_s: float
    server_cpu_per_op_s: float | None
    """Server processes' CPU time per call (less their idle CPU over as long); None
    when no server process was given."""


def _cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds of every thread of ``pids`` so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def store_throughput(
    url: str,
    *,
    keys: int = 1,
    threads: int = 4,
    seconds: float = 2.0,
    server_pids: list[int] | None = None,
) -> Throughput:
    """Calls per second that ``threads`` clients get from the store together (``check``
    of one key, or ``multi_get`` of ``keys`` keys), and the server's CPU per call."""
    counts = [0] * threads
    stop = threading.Event()
    stores = [connect_store(url, timedelta(seconds=30)) for _ in range(threads)]
    names = [f"{_PREFIX}k{i}" for i in range(keys)]
    for name in names:
        stores[0].set(name, "12345678")

    def hammer(i: int) -> None:
        while not stop.is_set():
            if keys == 1:
                stores[i].check(names)
            else:
                stores[i].multi_get(names)
            counts[i] += 1

    pids = server_pids or []
    workers = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(threads)]
    try:
        idle0 = _cpu_s(pids)
        time.sleep(seconds)  # the server's idle CPU over as long, to subtract
        idle = _cpu_s(pids) - idle0
        busy0 = _cpu_s(pids)
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        time.sleep(seconds)  # the measured interval
        stop.set()
        for w in workers:
            w.join(timeout=30)
        took = time.perf_counter() - t0
        busy = _cpu_s(pids) - busy0
    finally:
        for s in stores:
            _close(s)
    calls = sum(counts)
    cpu = max(0.0, busy - idle * took / seconds) / calls if pids and calls else None
    return Throughput(calls / took, cpu)


def _build_pair(stores: list[Any], prefix: str) -> float:
    """Seconds for two threads to build the two ranks of one gloo group."""
    import torch.distributed as dist

    groups: list[Any] = [None, None]

    def build(rank: int) -> None:
        store = dist.PrefixStore(prefix, stores[rank])
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))

    threads = [threading.Thread(target=build, args=(r,), daemon=True) for r in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    took = time.perf_counter() - t0
    if any(g is None for g in groups):
        raise TimeoutError(f"a 2-rank gloo group under {prefix!r} was not built within 60 s")
    return took


def pg_build_time(url: str, *, reps: int = 5) -> float:
    """Median seconds to build a 2-rank gloo process group through the store at ``url``."""
    stores = [connect_store(url, timedelta(seconds=30)) for _ in range(2)]
    try:
        return statistics.median(_build_pair(stores, f"{_PREFIX}pg/{i}") for i in range(reps))
    finally:
        for s in stores:
            _close(s)
