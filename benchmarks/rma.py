"""RMA windows vs two-sided gloo send/recv on one host: latency and bandwidth, 8 B to 64 MB.

Two worker processes (this script re-run with ``--worker``) meet on a TCPStore hosted
by the benchmark process. For every size, rank 0 times, side by side and interleaved
(:func:`torchnext.benchmarking.compare`; rank 1 runs the same schedule as the passive
side), ``k`` back-to-back transfers of the size followed by one small acknowledgement,
so each candidate measures *delivered* data:

* ``sendrecv``: gloo ``send`` from rank 0, ``recv`` on rank 1, then a 1-element ack back;
* ``put``: ``put`` into rank 1's window, then ``signal``/``wait_signal`` both ways;
* ``get``: ``get`` from rank 1's window (complete on return; the reference is gloo
  ``send`` from rank 1 to rank 0, ``recv`` on rank 0, then an ack);
* ``put_tcp``: ``put`` through the progress server (what members on other hosts use).

Per size it reports microseconds per transfer and GB/s, and the put/get speedups over
send/recv. Headline key: ``put_1mb_speedup_vs_sendrecv`` (bar: >= 2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 8 << 20, 64 << 20]
QUICK_SIZES = [8, 4096, 1 << 20, 8 << 20]


def _iters(nbytes: int) -> int:
    return max(1, min(200, (4 << 20) // max(nbytes, 1)))


def _measure(
    rank: int, nbytes: int, win: Any, win_tcp: Any, reps: int
) -> tuple[dict[str, Any], int]:
    """Both ranks run the same interleaved schedule; rank 0's timings are the result."""
    from torchnext.benchmarking import compare

    n = max(1, nbytes // 4)
    buf = torch.ones(n)
    ack = torch.zeros(1)
    k = _iters(nbytes)

    def sendrecv() -> None:
        for _ in range(k):
            if rank == 0:
                dist.send(buf, 1)
            else:
                dist.recv(buf, 0)
        if rank == 0:
            dist.recv(ack, 1)
        else:
            dist.send(ack, 0)

    def recvsend() -> None:  # the two-sided counterpart of a get
        for _ in range(k):
            if rank == 1:
                dist.send(buf, 0)
            else:
                dist.recv(buf, 1)
        if rank == 1:
            dist.recv(ack, 0)
        else:
            dist.send(ack, 1)

    def put(w: Any) -> None:
        if rank == 0:
            for _ in range(k):
                w.put(buf, 1)
            w.signal(1)
            w.wait_signal(1)
        else:
            w.wait_signal(0)
            w.signal(0)

    def get() -> None:
        if rank == 0:
            for _ in range(k):
                win.get(1, 0, n, out=buf)

    timings = compare(
        {
            "sendrecv": sendrecv,
            "put": lambda: put(win),
            "recvsend": recvsend,
            "get": get,
            "put_tcp": lambda: put(win_tcp),
        },
        reps=reps,
        warmup=1,
    )
    return timings, k


def _worker(rank: int, port: int, sizes: list[int], reps: int, out_path: str) -> None:
    from torchnext.distributed.rma import StoreGroup, Window, WindowConfig

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=2)
    group = StoreGroup(dist.PrefixStore("rma", store), rank, 2, name="bench")
    max_elems = max(sizes) // 4
    win = Window.allocate(group, (max_elems,), torch.float32)
    win_tcp = Window.allocate(group, (max_elems,), torch.float32, WindowConfig(transport="tcp"))
    rows = []
    for nbytes in sizes:
        timings, k = _measure(rank, nbytes, win, win_tcp, reps)
        dist.barrier()
        if rank == 0:
            us = {name: t.median_s / k * 1e6 for name, t in timings.items()}
            spread = {name: t.spread for name, t in timings.items()}
            rows.append(
                {"size_bytes": max(1, nbytes // 4) * 4, "iters": k, "us": us, "spread": spread}
            )
    win.fence()
    win_tcp.fence()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    win.close()
    win_tcp.close()
    dist.destroy_process_group()


def _human(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench rma")
    parser.add_argument("--quick", action="store_true", help="4 sizes, fewer repetitions")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        _worker(
            args.worker, args.port, [int(s) for s in args.sizes.split(",")], args.reps, args.out
        )
        return 0

    from torchnext.benchmarking import Report

    sizes = QUICK_SIZES if args.quick else SIZES
    reps = 5 if args.quick else 11
    from torchnext.distributed.launch.store import host_store

    store = host_store("127.0.0.1", 0, timedelta(seconds=60))
    with tempfile.TemporaryDirectory(prefix="torchnext-rma-bench-") as tmp:
        out_path = os.path.join(tmp, "rows.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--port",
            str(store.port),
            "--sizes",
            ",".join(map(str, sizes)),
            "--reps",
            str(reps),
            "--out",
            out_path,
        ]
        procs = [subprocess.Popen([*cmd, "--worker", str(r)]) for r in range(2)]
        deadline = time.monotonic() + 900
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode != 0 for p in procs):
            print(
                f"rma benchmark: a worker failed (exit codes {[p.returncode for p in procs]})",
                file=sys.stderr,
            )
            return 1
        with open(out_path) as f:
            rows = json.load(f)
    report = Report(
        name="rma",
        columns=[
            "size",
            "sendrecv_us",
            "put_us",
            "put_tcp_us",
            "recvsend_us",
            "get_us",
            "sendrecv_GBps",
            "put_GBps",
            "get_GBps",
            "put_speedup",
            "get_speedup",
        ],
    )
    summary: dict[str, float] = {}
    for row in rows:
        us, nbytes = row["us"], row["size_bytes"]
        put_x = us["sendrecv"] / us["put"]
        get_x = us["recvsend"] / us["get"]
        report.add(
            size=_human(nbytes),
            size_bytes=nbytes,
            sendrecv_us=us["sendrecv"],
            put_us=us["put"],
            put_tcp_us=us["put_tcp"],
            recvsend_us=us["recvsend"],
            get_us=us["get"],
            sendrecv_GBps=nbytes / us["sendrecv"] / 1e3,
            put_GBps=nbytes / us["put"] / 1e3,
            get_GBps=nbytes / us["get"] / 1e3,
            put_speedup=put_x,
            get_speedup=get_x,
            spread=row["spread"],
        )
        if nbytes == 1 << 20:
            summary["put_1mb_speedup_vs_sendrecv"] = round(put_x, 2)
            summary["get_1mb_speedup_vs_sendrecv"] = round(get_x, 2)
        if nbytes == 8:
            summary["put_8b_latency_us"] = round(us["put"], 2)
            summary["sendrecv_8b_latency_us"] = round(us["sendrecv"], 2)
        if nbytes == max(r["size_bytes"] for r in rows):
            summary[f"put_{_human(nbytes).replace(' ', '').lower()}_GBps"] = round(
                nbytes / us["put"] / 1e3, 2
            )
    report.summary = summary
    report.notes.append(
        "each figure is per transfer, k back-to-back transfers then one small ack/signal each way; "
        "put_tcp is the cross-host path forced on one host"
    )
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
