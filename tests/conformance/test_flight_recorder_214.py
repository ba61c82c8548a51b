"""Flight recorder and RMA windows: native torch 2.14.1 next to torch 2.13 + torchnext.

The dump of torchnext's recorder must carry every key of PyTorch's own gloo recorder
dump, with the same version, op names, sizes, dtypes and sequence numbers for the same
calls (that is what lets PyTorch's analyzer read it), and 2.14.1's ``torchfrtrace`` must
read what ``torchnext fr export`` writes on 2.13. For windows, 2.14.1 has none on
gloo; torchnext's offers the native method names, and works there.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


_GLOO_SCRIPT = """
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from torchnext.distributed import flight_recorder as fr

rank = int(os.environ["TORCHNEXT_MEMBER_ID"].rsplit("w", 1)[1])
dump_dir, init_file, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
dist.init_process_group(
    "gloo", init_method="file://" + init_file, rank=rank, world_size=3,
    timeout=timedelta(seconds=4),
)
try:
    for i in range(5):
        # "abort": rank 2 receives more bytes than its buffer holds; gloo aborts it.
        n = 4 if (scenario == "abort" and rank == 2 and i == 3) else 16 + i
        dist.broadcast(torch.ones(n), 0)
except Exception:
    pass
fr.dump(reason="end")
"""


@pytest.mark.parametrize("scenario", ["clean", "abort"])
def test_torch_214_torchfrtrace_reads_the_export_of_213_dumps(
    torch213_python: str, tmp_path: Path, scenario: str
) -> None:
    """Real gloo dumps from torch 2.13 + torchnext, exported there, read by 2.14.1's analyzer."""
    script = tmp_path / "train.py"
    script.write_text(_GLOO_SCRIPT)
    dumps, out = tmp_path / "dumps", tmp_path / "export"
    # The 2.14.1 environment's scripts first on PATH: the printed command names its torchfrtrace.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    run = subprocess.run(
        [torch213_python, "-m", "torchnext", "run", "--nproc", "3", "--max-restarts", "0",
         str(script), str(dumps), str(tmp_path / "init"), scenario],
        capture_output=True, text=True, timeout=90, check=False, env=env,
    )  # fmt: skip
    export = subprocess.run(
        [torch213_python, "-m", "torchnext", "fr", "export", str(dumps), str(out)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert export.returncode == 0, run.stderr[-2000:] + export.stderr
    command = shlex.split(export.stdout.strip().splitlines()[-1])
    incomplete = scenario == "abort"
    assert command == ["torchfrtrace", str(out), "-p", "torchnext_fr_rank"] + (
        ["--allow-incomplete-ranks"] if incomplete else []
    ), export.stdout
    trace = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    text = trace.stdout + trace.stderr
    assert trace.returncode == 0 and "Traceback" not in text, text
    if incomplete:
        assert "missed FR dumps from ranks ({2})" in text, text
    else:
        assert "has errors" not in text and "MISMATCH" not in text, text
