"""One program, run on any torch: every 2.14 sharding rule on a 2-rank gloo DTensor.

``python dtensor_cases.py OUT.json [--backport] [--only OP,...]`` starts two gloo ranks.
Each runs every case of :data:`CASES` with its tensor inputs placed ``Shard(0)``,
``Shard(-1)``, ``Replicate()`` and ``Partial()`` (floating inputs only), and for an
``out=`` overload with the ``out=`` tensors placed like the functional result or
replicated. Rank 0 writes one record per case: the result's placements and its full
value, or the error, and the value of the same call on plain tensors. The unit suite
checks the values on 2.13 with torchnext; the conformance suite puts the records of
native 2.14.1 and of 2.13 + torchnext side by side.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

aten = torch.ops.aten
F64 = torch.float64
Builder = Callable[[torch.Generator], tuple[list[Any], dict[str, Any]]]


def _x(*shape: int, dtype: torch.dtype = F64) -> Callable[[torch.Generator], torch.Tensor]:
    def make(g: torch.Generator) -> torch.Tensor:
        t = torch.rand(shape, generator=g, dtype=F64)
        return t.to(dtype) if dtype is not F64 else t

    return make


def _case(*args: Any, **kwargs: Any) -> Builder:
    def build(g: torch.Generator) -> tuple[list[Any], dict[str, Any]]:
        def value(a: Any) -> Any:
            if isinstance(a, list):
                return [value(v) for v in a]
            return a(g) if callable(a) and not isinstance(a, torch._ops.OpOverload) else a

        return [value(a) for a in args], {k: value(v) for k, v in kwargs.items()}

    return build


def _index(*shape: int, high: int) -> Callable[[torch.Generator], torch.Tensor]:
    return lambda g: torch.randint(0, high, shape, generator=g)


def _symmetric(g: torch.Generator) -> torch.Tensor:
    a = torch.rand(4, 4, generator=g, dtype=F64)
    return a + a.T + 4 * torch.eye(4, dtype=F64)


X2 = _x(4, 6)
X3 = _x(2, 4, 6)
X4 = _x(2, 2, 6, 6)
X5 = _x(2, 2, 4, 4, 4)
SCALAR = _x()

# op -> how to build its functional arguments (tensors placed by the runner).
CASES: dict[str, Builder] = {
    "aten._adaptive_avg_pool2d.out": _case(X4, [2, 2]),
    "aten._adaptive_avg_pool3d.out": _case(X5, [2, 2, 2]),
    "aten.adaptive_avg_pool1d.out": _case(X3, [2]),
    "aten.adaptive_max_pool2d.out": _case(X4, [2, 2]),
    "aten.adaptive_max_pool3d.out": _case(X5, [2, 2, 2]),
    "aten.avg_pool1d.out": _case(X3, [2]),
    "aten.avg_pool2d.out": _case(X4, [2, 2]),
    "aten.avg_pool3d.out": _case(X5, [2, 2, 2]),
    "aten.fractional_max_pool2d.output": _case(X4, [2, 2], [3, 3], _x(2, 2, 2)),
    "aten.fractional_max_pool3d.output": _case(X5, [2, 2, 2], [2, 2, 2], _x(2, 2, 3)),
    "aten.max_pool2d_with_indices.out": _case(X4, [2, 2]),
    "aten.max_pool3d_with_indices.out": _case(X5, [2, 2, 2]),
    "aten._log_softmax.out": _case(X2, 1, False),
    "aten._log_softmax_backward_data.out": _case(X2, X2, 1, F64),
    "aten._softmax.out": _case(X2, 0, False),
    "aten._softmax_backward_data.out": _case(X2, X2, 1, F64),
    "aten.nll_loss_forward.output": _case(X2, _index(4, high=6), None, 1, -100),
    "aten.nll_loss_backward.grad_input": _case(
        SCALAR, X2, _index(4, high=6), None, 1, -100, lambda g: torch.tensor(4.0, dtype=F64)
    ),
    "aten.nll_loss2d_forward.output": _case(X4, _index(2, 6, 6, high=2), None, 1, -100),
    "aten.nll_loss2d_backward.grad_input": _case(
        SCALAR, X4, _index(2, 6, 6, high=2), None, 1, -100, lambda g: torch.tensor(72.0, dtype=F64)
    ),
    "aten.all.all_out": _case(_x(4, 6, dtype=torch.bool)),
    "aten.all.out": _case(_x(4, 6, dtype=torch.bool), 1),
    "aten.any.all_out": _case(_x(4, 6, dtype=torch.bool)),
    "aten.any.dims_out": _case(_x(4, 6, dtype=torch.bool), [0]),
    "aten.argmax.out": _case(X2, 1),
    "aten.argmin.out": _case(X2, 0),
    "aten.max.unary_out": _case(X2),
    "aten.min.unary_out": _case(X2),
    "aten.mean.dtype_out": _case(X2),
    "aten.median.out": _case(X2),
    "aten.nanmedian.out": _case(X2),
    "aten.nansum.out": _case(X2),
    "aten.prod.out": _case(X2),
    "aten.sum.out": _case(X2),
    "aten.sum.IntList_out": _case(X2, [1]),
    "aten.logsumexp.out": _case(X2, [1]),
    "aten.linalg_vector_norm.out": _case(X2),
    "aten.norm.Scalar_out": _case(X2),
    "aten.histc.out": _case(X2, 4, 0, 1),
    "prims.amax.default": _case(X2, [1]),
    "prims.amin.default": _case(X2, [0, 1]),
    "aten.cummax.out": _case(X2, 1),
    "aten.cummin.out": _case(X2, 0),
    "aten.cumprod.out": _case(X2, 0),
    "aten.cumsum.out": _case(X2, 1),
    "aten.logcumsumexp.out": _case(X2, 1),
    "aten.cumprod_.default": _case(X2, 1),
    "aten.cumsum_.default": _case(X2, 0),
    "aten.sort.values": _case(X2, 1),
    "aten.sort.values_stable": _case(X2, stable=True, dim=0),
    "aten.topk.values": _case(X2, 2, 1),
    "aten._linalg_eigh.eigenvalues": _case(_symmetric),
    "aten._linalg_svd.U": _case(X2, False),
    "aten.linalg_qr.out": _case(_x(6, 4)),
    "aten.diag.out": _case(X2),
    "aten.diag_embed.out": _case(X2),
    "aten.diagonal_copy.out": _case(X2),
    "aten.tril.out": _case(X2),
    "aten.triu.out": _case(X2, 1),
    "aten.tril_.default": _case(X2),
    "aten.triu_.default": _case(X2, -1),
    "aten.dot.out": _case(_x(6), _x(6)),
    "aten.cat.out": _case([X2, X2], 1),
    "aten.gather.out": _case(X2, 1, _index(4, 3, high=6)),
    "aten.scatter.src_out": _case(X2, 1, _index(4, 3, high=6), _x(4, 3)),
    "aten.scatter.value_out": _case(X2, 0, _index(2, 6, high=4), 2.5),
    "aten.scatter_add.out": _case(X2, 1, _index(4, 3, high=6), _x(4, 3)),
    "aten.scatter_add_.default": _case(X2, 1, _index(4, 3, high=6), _x(4, 3)),
    "aten.select_backward.out": _case(_x(6), [4, 6], 0, 1),
    "aten.slice_backward.out": _case(_x(2, 6), [4, 6], 0, 1, 3, 1),
    "aten.slice_scatter.out": _case(X2, _x(4, 2), 1, 2, 4, 1),
    "aten.t_.default": _case(X2),
    "aten.fill.Scalar_out": _case(X2, 3.5),
    "aten.zero.out": _case(X2),
    "aten._foreach_addcdiv.Scalar": _case([X2, X2], [X2, X2], [_x(4, 6), _x(4, 6)], 0.5),
    "aten._foreach_addcdiv.ScalarList": _case([X2, X2], [X2, X2], [X2, X2], [0.5, 2.0]),
    "aten._foreach_addcmul.ScalarList": _case([X2, X2], [X2, X2], [X2, X2], [0.5, 2.0]),
}


def _resolve(name: str) -> Any:
    namespace, op_name, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


def _as_list(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _placement_names(placements: Any) -> list[str]:
    return [str(p) for p in placements]


def _run_case(op_name: str, placement: str, out_placement: str | None, mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from torchnext.compat.dtensor_rule_table import RULES

    rules = {r.op: r for r in RULES}
    rule = rules[op_name]
    op, base = _resolve(op_name), _resolve(rule.base)
    out_names = [a.name for a in op._schema.arguments if a.is_out]
    g = torch.Generator().manual_seed(sum(map(ord, op_name)))
    args, kwargs = CASES[op_name](g)

    def place(t: Any) -> Any:
        if isinstance(t, list):
            return [place(v) for v in t]
        if not isinstance(t, torch.Tensor):
            return t
        if placement == "Partial()":
            if not t.is_floating_point():
                return distribute_tensor(t, mesh, [Replicate()])
            return DTensor.from_local(t * 0.5, mesh, [Partial()], run_check=False)
        p = {"Shard(0)": Shard(0), "Shard(-1)": Shard(t.dim() - 1), "Replicate()": Replicate()}[
            placement
        ]
        if t.dim() == 0:
            p = Replicate()
        return distribute_tensor(t, mesh, [p])

    # The sharding cache keys ignore the out= tensors' placements (in 2.13 and 2.14):
    # start each case cold, so a record shows the rule, not the previous case.
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    record: dict[str, Any] = {"op": op_name, "placement": placement, "out": out_placement}
    if rule.kind == "out":
        plain_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ref = _as_list(base(*plain_in, **kwargs))
    elif rule.kind == "inplace":
        ref = [base(*args, **kwargs)]
    else:
        ref = _as_list(op(*args, **kwargs))
    record["ref"] = _plain(ref)
    try:
        dargs = [place(a) for a in args]
        if rule.kind == "out":
            outs = [
                distribute_tensor(
                    torch.zeros_like(r),
                    mesh,
                    [Shard(0) if out_placement == "Shard(0)" and r.dim() > 0 else Replicate()],
                )
                for r in ref
            ]
            record["out_placements"] = [_placement_names(o.placements) for o in outs]
            op(*dargs, **kwargs, **dict(zip(out_names, outs, strict=True)))
            result = outs
        elif rule.kind == "inplace":
            op(dargs[0], *dargs[1:], **kwargs)
            result = [dargs[0]]
        else:
            result = _as_list(op(*dargs, **kwargs))
        flat = [r for item in result for r in (item if isinstance(item, list) else [item])]
        record["placements"] = [_placement_names(r.placements) for r in flat]
        record["value"] = [_plain(r.full_tensor()) for r in flat]
    except Exception as exc:  # noqa: BLE001 - the record is the outcome
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        record["trace"] = traceback.format_exc()
    return record


# Operators neither 2.13 nor 2.14 shards: they must keep torch's own error.
UNREGISTERED: dict[str, Builder] = {
    "aten.renorm.default": _case(X2, 2, 0, 1.0),
    "aten.bincount.default": _case(_index(8, high=4)),
}


def _run_unregistered(op_name: str, mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    args, kwargs = UNREGISTERED[op_name](torch.Generator().manual_seed(0))
    record: dict[str, Any] = {"op": op_name, "placement": "Shard(0)", "out": None}
    try:
        result = _resolve(op_name)(
            distribute_tensor(args[0], mesh, [Shard(0)]), *args[1:], **kwargs
        )
        record["placements"] = [_placement_names(result.placements)]
        record["value"] = [_plain(result.full_tensor())]
    except Exception as exc:  # noqa: BLE001 - the record is the outcome
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return record


def _worker(rank: int, port: int, out_path: str, backport: bool, only: list[str]) -> None:
    torch.set_num_threads(1)
    # A bounded wait: a case that desynchronises the ranks fails instead of hanging.
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=30),
    )
    from torch.distributed.device_mesh import init_device_mesh

    from torchnext.compat.dtensor_rule_table import RULES

    if backport:
        import torchnext.backport

        torchnext.backport.install()
    kinds = {r.op: r.kind for r in RULES}
    mesh = init_device_mesh("cpu", (2,))
    records = []
    for op_name in only or list(CASES):
        outs: list[str | None] = ["Replicate()", "Shard(0)"] if kinds[op_name] == "out" else [None]
        for placement in ("Shard(0)", "Shard(-1)", "Replicate()", "Partial()"):
            for out_placement in outs:
                try:
                    records.append(_run_case(op_name, placement, out_placement, mesh))
                except Exception:  # noqa: BLE001 - a broken case must not hang the peer
                    crash = traceback.format_exc()
                    records.append({"op": op_name, "placement": placement, "crash": crash})
    if not only:
        records.extend(_run_unregistered(op_name, mesh) for op_name in UNREGISTERED)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"torch": torch.__version__, "records": records}, f)
    # Leave together: a rank that tears gloo down while its peer still talks to it can
    # abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    out_path = argv[0]
    backport = "--backport" in argv
    only = []
    if "--only" in argv:
        only = argv[argv.index("--only") + 1].split(",")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Both ranks hash strings alike: DTensor picks among equal-cost redistributions in
    # set order, and with per-process hash seeds the two ranks could pick different
    # collectives for one case (aten.sum.out on a Partial input did, about one run in
    # three) and wait on each other until gloo's timeout broke every later case.
    os.environ["PYTHONHASHSEED"] = "0"
    mp.start_processes(
        _worker, args=(port, out_path, backport, only), nprocs=2, start_method="spawn"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
