"""The ``ast`` gate must never hide a site: one minimal file per kind of trigger."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade.engine import EngineOptions, process_source  # noqa: E402
from torchnext.upgrade.gate import may_have_sites  # noqa: E402
from torchnext.upgrade.registry import resolve_selection  # noqa: E402

SNIPPETS = {
    "class decorator": "import torch\n@torch.jit.interface\nclass A:\n    pass\n",
    "function decorator": "import torch\n@torch.jit.script\ndef f(x):\n    return x\n",
    "profiler attribute": (
        "import torch\nwith torch.autograd.profiler.profile() as p:\n    pass\nprint(p.use_cuda)\n"
    ),
    "split_group": "import torch.distributed as dist\ng = dist.split_group()\nif g is None:\n    pass\n",
    "new_group": (
        "import torch.distributed as dist\nclass G(dist.ProcessGroup):\n"
        "    def new_group(self, ranks):\n        pass\n"
    ),
    "tvm import": "import torch\nfrom torch._dynamo.backends.tvm import tvm_auto_scheduler\n",
    "attribute rename": "import torch\nx = torch.distributed.config.compile_on_one_rank\n",
    "statement removal": "import torch\ng.register_generator_state(s)\n",
    "method on factory": "import torch\nq = torch.eye(2).qr()\n",
    "from-import call": "import torch\nfrom torch import qr as q\nq(a)\n",
    "tuple wrapper": "import torch\nx = torch.solve(b, a)[0]\n",
    "clamp method": "import torch\ny = x.clamp_min(0.0)\n",
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_gate_lets_every_trigger_through(name: str) -> None:
    source = SNIPPETS[name]
    options = EngineOptions(active=resolve_selection(["ALL"]), fix_level="unsafe")
    assert may_have_sites(source, options.active)
    findings, _ = process_source(source, options, use_gate=False)
    assert findings, f"{name}: the snippet should have a finding"
    assert process_source(source, options) == process_source(source, options, use_gate=False)


def test_gate_skips_files_without_sites() -> None:
    active = resolve_selection(["ALL"])
    assert not may_have_sites("import torch\nx = torch.linalg.norm(y)\nz = range(3)\n", active)
    assert not may_have_sites("import numpy as np\nq, r = np.linalg.qr(a)\n", active)
    assert may_have_sites("def f(:\n", active)  # unparsable: let LibCST report it
