"""A 2-rank gloo program: one tensor-parallel MLP compiled with the overlap pass off and on.

``python overlap_program.py OUT.json`` writes, for each setting and each compiled graph
(forward, backward), read from Inductor's scheduler after all its passes (the order it
runs): the order of the collectives, Inductor's own peak-memory estimate, and how many
compute nodes run while a collective is in flight; plus whether outputs and gradients are
bit-identical.
Run by ``test_overlap.py``; the 2.14 guarantees are checked there.
"""

from __future__ import annotations

import json
import socket
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def own_code(fn: Any, name: str) -> Any:
    """``fn`` with a code object of its own: Dynamo caches compiled graphs per code object,
    and with identical parameter shapes a second model would reuse the first's graph."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _worker(rank: int, port: int, out: str) -> None:
    import torch._inductor.config as config
    from torch._inductor.memory import (
        assign_memory_planning_info_for_scheduler_buffers,
        estimate_peak_memory,
        get_freeable_input_buf,
    )
    from torch._inductor.virtualized import V
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.utils._ordered_set import OrderedSet

    from torchnext.compat.inductor_passes import last_overlap_report
    from torchnext.compile import is_collective, simple_overlap_enabled

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    mesh = init_device_mesh("cpu", (2,))
    graphs: list[dict[str, Any]] = []

    def measure(nodes: list[Any]) -> list[Any]:
        assign_memory_planning_info_for_scheduler_buffers(nodes, V.graph.scheduler.name_to_buf)
        inputs = OrderedSet(V.graph.graph_inputs.keys())
        peak, _ = estimate_peak_memory(
            nodes, get_freeable_input_buf(nodes, inputs), OrderedSet(V.graph.get_output_names())
        )
        graphs[-1]["inductor_peak_bytes"] = int(peak)
        # The order Inductor will run, read from its scheduler nodes (after every pass).
        scheduled, in_flight, hidden = [], 0, 0
        for snode in nodes:
            kernel = str(getattr(snode.node, "python_kernel_name", ""))
            if "_c10d_functional" in kernel and "wait_tensor" not in kernel:
                names = [o.name for o in getattr(snode.node, "origins", ()) if is_collective(o)]
                scheduled.append(",".join(sorted(names)))
                in_flight += 1
            elif "wait_tensor" in kernel:
                in_flight = max(0, in_flight - 1)
            elif in_flight:
                hidden += 1
        graphs[-1]["scheduled_order"] = scheduled
        graphs[-1]["compute_in_flight"] = hidden
        report = last_overlap_report()
        if report is not None:
            graphs[-1]["swaps"] = report.collective_swaps + report.wait_swaps
            config.post_grad_custom_post_pass.last_report = None
        return nodes

    def record_order(graph: torch.fx.Graph) -> None:
        graphs.append({"order": [n.name for n in graph.nodes if is_collective(n)]})

    config.post_grad_custom_pre_pass = record_order
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(1), requires_grad=True)
    results = {}
    for flag in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 128),
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 128),
        )
        plan = {
            "0": ColwiseParallel(),
            "2": RowwiseParallel(),
            "3": ColwiseParallel(),
            "5": RowwiseParallel(),
        }
        tp = parallelize_module(model, mesh, plan)
        compiled = torch.compile(own_code(lambda t, tp=tp: tp(t), f"step_{flag}"))
        start = len(graphs)
        with simple_overlap_enabled(flag):
            # measure runs last among Inductor's scheduler passes, after the overlap's own.
            last = [*config.reorder_for_compute_comm_overlap_passes, measure]
            with config.patch(
                reorder_for_compute_comm_overlap=True, reorder_for_compute_comm_overlap_passes=last
            ):
                y = compiled(x)
                y.sum().backward()
        results[str(flag)] = {
            "graphs": graphs[start:],
            "y": y.detach(),
            "grads": [p.grad.to_local() for p in model.parameters()] + [x.grad.clone()],
        }
        x.grad = None
    off, on = results["False"], results["True"]
    same = torch.equal(off["y"], on["y"]) and all(
        torch.equal(a, b) for a, b in zip(off["grads"], on["grads"], strict=True)
    )
    if rank == 0:
        summary = {k: v["graphs"] for k, v in results.items()}
        Path(out).write_text(json.dumps({"graphs": summary, "bit_identical": same}))
    dist.destroy_process_group()


def main(out: str) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port, out), nprocs=2, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
