"""``torchnext doctor``: what this machine and this torch can do, and who provides it.

Prints the torch version, devices, distributed backends, whether Triton is present,
every ``TORCHNEXT_*`` variable, and, for each 2.14 capability, whether the running
torch has it natively, torchnext provides it, or it is unavailable here (and why).
Run it first when a 2.14 name is missing or behaves differently. The capability rows and
the backport line read the same table (:data:`torchnext._capabilities.CAPABILITIES`), so
they cannot disagree about what is native. What not to assume: it reports this process's
torch as it is now; a ``backport.install()`` done elsewhere does not show here.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import sys
from typing import Any

__all__ = ["collect", "add_arguments", "main"]


def _backends() -> dict[str, bool]:
    import torch.distributed as dist

    if not dist.is_available():
        return {"gloo": False, "nccl": False, "mpi": False}
    return {
        "gloo": bool(dist.is_gloo_available()),
        "nccl": bool(dist.is_nccl_available()),
        "mpi": bool(dist.is_mpi_available()),
    }


def _devices() -> list[str]:
    import torch

    devices = [f"cpu ({torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            devices.append(f"cuda:{i} {torch.cuda.get_device_name(i)}")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def collect() -> dict[str, Any]:
    """Everything the doctor reports, as one JSON-serialisable object."""
    import torch

    from torchnext import __version__
    from torchnext._capabilities import probe_all
    from torchnext._env import describe

    triton_present = importlib.util.find_spec("triton") is not None
    backport: dict[str, Any] = {}
    try:
        backport_module = importlib.import_module("torchnext.backport")
        report = getattr(backport_module, "report", None)
        if callable(report):
            backport = report()
    except Exception as exc:  # noqa: BLE001 - doctor must always print something
        backport = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "torchnext": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "devices": _devices(),
        "backends": _backends(),
        "triton": triton_present,
        "capabilities": [s.as_dict() for s in probe_all()],
        "gemm": _gemm_candidates(),
        "backport": backport,
        "env": describe(),
    }


def _gemm_candidates() -> list[dict[str, str]]:
    """torchnext.gemm's candidate routes per device here, and why one is missing."""
    import torch

    from torchnext.gemm import gemv, grouped, routes

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for family, table in (
            ("gemm", routes.available_routes(device)),
            ("gemv", gemv.available_routes(device)),
            (
                "grouped_mm",
                {
                    k: "available" if ok else "not here"
                    for k, ok in grouped.available_routes(device).items()
                },
            ),
        ):
            rows += [
                {"device": device, "candidate": f"{family}: {name}", "status": status}
                for name, status in table.items()
            ]
    torchao = importlib.util.find_spec("torchao") is not None
    rows.append(
        {
            "device": "any",
            "candidate": "scaled_mm: torchao operands (NVFP4Tensor, MXTensor)",
            "status": "available" if torchao else "missing: pip install 'torchnext[gemm]'",
        }
    )
    return rows


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")


def main(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    print(f"torchnext {info['torchnext']}  torch {info['torch']}  python {info['python']}")
    print(f"platform  {info['platform']}")
    print(f"devices   {', '.join(info['devices'])}")
    backends = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in info["backends"].items())
    print(f"backends  {backends}")
    print(f"triton    {'present' if info['triton'] else 'absent (install torchnext[gpu])'}")
    print()
    _print_table(
        [[c["name"], c["status"], c["detail"]] for c in info["capabilities"]],
        ["capability", "status", "detail"],
    )
    print()
    _print_table(
        [[g["device"], g["candidate"], g["status"]] for g in info["gemm"]],
        ["device", "gemm candidate", "status"],
    )
    if info["backport"]:
        print()
        rules = info["backport"].get("dtensor_rules")
        if rules:
            print(
                f"DTensor sharding rules: {rules['total']} operators "
                f"({rules['torch']} by torch, {rules['torchnext']} by torchnext; "
                f"torch 2.14.1 has {rules['torch_2_14']})"
            )
        print(f"backport  {json.dumps(info['backport'])}")
    set_vars = [v for v in info["env"] if v["set"] == "True"]
    print()
    print(f"{len(info['env'])} TORCHNEXT_* variables known, {len(set_vars)} set")
    for v in set_vars:
        print(f"  {v['name']}={v['value']}")
    return 0
