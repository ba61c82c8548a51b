"""Flight recorder and RMA windows: native torch 2.14.1 next to torch 2.13 + torchnext.

The dump of torchnext's recorder must carry every key of PyTorch's own gloo recorder
dump, with the same version, op names, sizes, dtypes and sequence numbers for the same
calls (that is what lets PyTorch's analyzer read it). For windows, 2.14.1 has none on
gloo; torchnext's offers the native method names, and works there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

_OPS = """
import json, torch, torch.distributed as dist
{setup}
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
dist.broadcast(t, 0)
dist.all_gather([torch.zeros(4)], t)
dist.barrier()
doc = {dump}
dist.destroy_process_group()
entries = doc["entries"]
print(json.dumps({{
    "version": doc["version"],
    "top": sorted(doc),
    "entry_keys": sorted(entries[0]),
    "names": [e["profiling_name"] for e in entries],
    "seq": [e["collective_seq_id"] for e in entries],
    "sizes": [[e["input_sizes"], e["output_sizes"]] for e in entries],
    "dtypes": [[e["input_dtypes"], e["output_dtypes"]] for e in entries],
}}))
"""
_NATIVE = _OPS.format(setup="", dump="json.loads(torch._C._distributed_c10d._dump_fr_trace_json())")
_OURS = _OPS.format(
    setup="from torchnext.distributed import flight_recorder as fr\nfr.enable()",
    dump="fr.get_recorder().to_dict()",
)


def _run_here(program: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_dump_layout_matches_native_gloo_recorder(run_on_torch213: Callable[[str], Any]) -> None:
    native = _run_here(_NATIVE)
    ours_213 = run_on_torch213(_OURS)
    ours_214 = _run_here(_OURS)
    assert ours_213 == ours_214  # same dump whichever torch runs underneath
    assert ours_213["version"] == native["version"] == "2.10"
    assert set(native["top"]) <= set(ours_213["top"])
    assert set(native["entry_keys"]) <= set(ours_213["entry_keys"])
    for key in ("names", "seq", "sizes", "dtypes"):
        assert ours_213[key] == native[key], key


def test_windows_on_gloo(run_on_torch213: Callable[[str], Any]) -> None:
    import torch

    native_methods = {m for m in dir(torch._C._distributed_c10d.Window) if not m.startswith("_")}
    probe = _run_here(
        """
import json, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    dist._new_window(torch.ones(4))
    print(json.dumps("created"))
except RuntimeError as exc:
    print(json.dumps(str(exc)))
"""
    )
    assert "does not support new_window" in probe
    ours = run_on_torch213(
        """
import json, torch, torch.distributed as dist
from torchnext.distributed.rma import StoreGroup, Window
win = Window.create(StoreGroup(dist.HashStore(), 0, 1), torch.zeros(4))
win.put(torch.ones(2), 0, 1)
win.signal(0)
win.wait_signal(0)
print(json.dumps({"data": win.tensor.tolist(), "get": win.get(0, 1, 2).tolist(),
                  "methods": sorted(m for m in dir(win) if not m.startswith("_"))}))
"""
    )
    assert ours["data"] == [0.0, 1.0, 1.0, 0.0] and ours["get"] == [1.0, 1.0]
    shared = {"put", "signal", "wait_signal", "map_remote_tensor"}
    assert shared <= native_methods and shared <= set(ours["methods"])
