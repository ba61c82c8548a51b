"""Flight-recorder cost: per-op recording (with and without stacks) and dumping 2000 entries.

``record_us``: one op recorded through the hook path a group pays for
(``hooks.op_started`` + ``op_finished`` with the recorder registered), minus the same
calls with no observer. ``record_stack_us``: the same with Python stacks. Also the
overhead on a real (world-size 1) gloo ``all_reduce`` of 4 floats through the wrapped
``torch.distributed`` function. ``dump_2000_ms``: writing a full 2000-entry buffer to
JSON; ``dump_locked_ms``: the same while another thread holds the recorder's lock (it
must not block). Bars (issue): <= 2 us, <= 20 us, <= 100 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from torchnext.benchmarking import PairedDifference, Report, Timing, compare, paired_difference
from torchnext.distributed import flight_recorder
from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
from torchnext.distributed.flight_recorder import patch as fr_patch
from torchnext.distributed.group import hooks

INNER = 2000


def _info(seq: int) -> hooks.OpInfo:
    return hooks.OpInfo(
        group_name="default",
        epoch=0,
        seq=seq,
        op="allreduce",
        rank=0,
        ranks=(0, 1, 2, 3),
        input_sizes=((1024,),),
        input_dtypes=("float32",),
        output_sizes=((1024,),),
        output_dtypes=("float32",),
    )


def _hook_loop(info: hooks.OpInfo) -> None:
    for _ in range(INNER):
        hooks.op_finished(hooks.op_started(info), "completed")


def _net(base: Timing, other: Timing, scale: float) -> PairedDifference:
    """``other - base`` per repetition, scaled (e.g. to microseconds per op)."""
    d = paired_difference(base.samples_s, other.samples_s)
    return PairedDifference(d.median * scale, d.lo * scale, d.hi * scale, d.pairs)


def _interval(d: PairedDifference) -> str:
    return f"[{d.lo:.3f}, {d.hi:.3f}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench fr-overhead")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args(argv)
    reps = 7 if args.quick else 41
    info = _info(1)
    tmp = tempfile.TemporaryDirectory(prefix="torchnext-fr-bench-")
    plain = FlightRecorder(FlightRecorderConfig(dump_dir=tmp.name))
    stacked = FlightRecorder(FlightRecorderConfig(dump_dir=tmp.name, stacks=True))

    def with_observer(rec: FlightRecorder) -> None:
        hooks.register_observer(rec)
        try:
            _hook_loop(info)
        finally:
            hooks.unregister_observer(rec)

    t = compare(
        {
            "no observer": lambda: _hook_loop(info),
            "recorder": lambda: with_observer(plain),
            "recorder+stacks": lambda: with_observer(stacked),
        },
        reps=reps,
        warmup=1,
    )
    base_us = t["no observer"].median_s / INNER * 1e6
    # Net costs: medians of the per-repetition differences (compare interleaves the
    # candidates, so neighbours share the machine's state), with bootstrap intervals.
    record = _net(t["no observer"], t["recorder"], 1e6 / INNER)
    stack = _net(t["no observer"], t["recorder+stacks"], 1e6 / INNER)
    record_us, stack_us = record.median, stack.median

    # A real collective through the wrapped torch.distributed function, interleaved with
    # the unwrapped original.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.ones(4)
    flight_recorder.enable(FlightRecorderConfig(dump_dir=tmp.name))
    wrapped = dist.all_reduce
    original = fr_patch.original("all_reduce")

    def loop(fn: Callable[..., object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(200):
                fn(x)

        return run

    # Loopback latency is bimodal here: three times the repetitions for this pair.
    ar = compare({"off": loop(original), "on": loop(wrapped)}, reps=3 * reps, warmup=1)
    t_off, t_on = ar["off"], ar["on"]
    flight_recorder.disable()
    dist.destroy_process_group()
    allreduce = _net(t_off, t_on, 1e6 / 200)
    allreduce_overhead_us = allreduce.median
    allreduce_pct = allreduce.relative_to(t_off.median_s / 200 * 1e6)

    full = FlightRecorder(
        FlightRecorderConfig(dump_dir=tmp.name, lock_timeout=timedelta(milliseconds=20))
    )
    for i in range(1, 2001):
        full.on_finish(full.on_start(_info(i)), "completed")
    dump_t = compare({"dump": lambda: full.dump()}, reps=reps, warmup=1)["dump"]
    release = threading.Event()
    holder = threading.Thread(
        target=lambda: (full._lock.acquire(), release.wait(60), full._lock.release())
    )
    holder.start()
    try:
        locked_t = compare({"dump_locked": lambda: full.dump()}, reps=max(3, reps // 3), warmup=0)[
            "dump_locked"
        ]
    finally:
        release.set()
        holder.join()
    tmp.cleanup()

    report = Report(
        name="fr-overhead",
        columns=["case", "median", "p10", "p90", "ci95", "unit"],
    )
    report.add(
        case="hook path, no observer",
        median=base_us,
        p10=t["no observer"].p10_s / INNER * 1e6,
        p90=t["no observer"].p90_s / INNER * 1e6,
        ci95="-",
        unit="us/op",
    )
    report.add(
        case="recorder (net)",
        median=record_us,
        p10=t["recorder"].p10_s / INNER * 1e6 - base_us,
        p90=t["recorder"].p90_s / INNER * 1e6 - base_us,
        ci95=_interval(record),
        unit="us/op",
    )
    report.add(
        case="recorder+stacks (net)",
        median=stack_us,
        p10=t["recorder+stacks"].p10_s / INNER * 1e6 - base_us,
        p90=t["recorder+stacks"].p90_s / INNER * 1e6 - base_us,
        ci95=_interval(stack),
        unit="us/op",
    )
    report.add(
        case="gloo all_reduce(4 floats), FR off",
        median=t_off.median_s / 200 * 1e6,
        p10=t_off.p10_s / 200 * 1e6,
        p90=t_off.p90_s / 200 * 1e6,
        ci95="-",
        unit="us/op",
    )
    report.add(
        case="gloo all_reduce(4 floats), FR on",
        median=t_on.median_s / 200 * 1e6,
        p10=t_on.p10_s / 200 * 1e6,
        p90=t_on.p90_s / 200 * 1e6,
        ci95="-",
        unit="us/op",
    )
    report.add(
        case="gloo all_reduce(4 floats), FR on - off",
        median=allreduce_overhead_us,
        p10="-",
        p90="-",
        ci95=_interval(allreduce),
        unit="us/op",
    )
    report.add(
        case="dump 2000 entries",
        median=dump_t.median_s * 1e3,
        p10=dump_t.p10_s * 1e3,
        p90=dump_t.p90_s * 1e3,
        ci95="-",
        unit="ms",
    )
    report.add(
        case="dump 2000, lock held by a hung thread",
        median=locked_t.median_s * 1e3,
        p10=locked_t.p10_s * 1e3,
        p90=locked_t.p90_s * 1e3,
        ci95="-",
        unit="ms",
    )
    report.summary = {
        "record_us": round(record_us, 3),
        "record_stack_us": round(stack_us, 3),
        "dump_2000_ms": round(dump_t.median_s * 1e3, 2),
        "dump_2000_locked_ms": round(locked_t.median_s * 1e3, 2),
        "plain_dist_allreduce_overhead_us": round(allreduce_overhead_us, 2),
        "record_us_ci95": [round(record.lo, 3), round(record.hi, 3)],
        "record_stack_us_ci95": [round(stack.lo, 3), round(stack.hi, 3)],
        "plain_dist_allreduce_overhead_us_ci95": [round(allreduce.lo, 2), round(allreduce.hi, 2)],
        "plain_dist_allreduce_overhead_pct": round(100 * allreduce_pct.median, 2),
        "plain_dist_allreduce_overhead_pct_ci95": [
            round(100 * allreduce_pct.lo, 2),
            round(100 * allreduce_pct.hi, 2),
        ],
    }
    report.notes.append(
        "record_us/record_stack_us are net of the hook dispatch a group pays anyway; "
        "bars: <= 2 us, <= 20 us, dump <= 100 ms"
    )
    report.notes.append(
        "net rows: median of per-repetition differences between interleaved candidates, "
        "with the 95 % bootstrap interval of that median (ci95)"
    )
    report.write()
    return 0
