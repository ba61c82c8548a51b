"""The DiLoCo half of ``ft-sharded``: DDP-style Manager against DiLoCo on the same samples.

Every case trains the character transformer of ``examples/fault_tolerant_transformer.py``
(small: d_model 64, 2 layers, 4 heads, sequence 32), built from one seed, on the same
pinned data (the example's corpus, its last 10 % of windows held out), for the same
samples: DDP-style ``steps = rounds x H`` steps of ``STEP_BATCH`` samples, DiLoCo
``rounds`` rounds of ``H`` inner steps of ``STEP_BATCH`` samples (all members
together). Members are processes of a :class:`~torchnext.testing.MultiProcessHarness`
over gloo, one thread each. Every member appends to a JSON-lines log after each step
or round: its wire bytes (``FaultTolerantGroup.wire_bytes`` plus the heal bytes it
received, :func:`~torchnext.distributed.group.wire.with_heal`), the world size and the
time; the figures below are read from those logs, so a killed member's bytes up to its
last committed round count too.

Cases: ``ddp`` (Manager, AdamW every step), ``diloco`` (H inner AdamW steps, outer
Nesterov SGD), ``diloco_faults`` (the same with kill -9 of a member every few rounds,
each victim replaced by a fresh process that heals, the last one not replaced),
``streaming`` (the same as ``diloco`` with ``fragments``). The held-out loss is
computed by harness rank 0 (never killed) on its final parameters.

What not to assume: the wire bytes are the group's modelled counts (see
:mod:`torchnext.distributed.group.wire`), not socket captures; step times on a shared
2-core machine are noisy (medians are reported).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

SEED = 0
NPROC = 2
D_MODEL, LAYERS, HEADS, SEQ = 64, 2, 4, 32
CORPUS_CHARS = 20_000
HELDOUT_FRACTION = 0.1
HELDOUT_WINDOWS = 256
STEP_BATCH = 16
"""Samples per (inner) step, all members together."""
LR = 3e-3
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9
HEARTBEAT_S = "3"
DONE_KEY = "ft-sharded/done"


@dataclass(frozen=True)
class Plan:
    """One case: what trains, how long, and which members die."""

    case: str
    mode: str
    """``ddp`` or ``diloco``."""
    rounds: int
    sync_every: int
    fragments: int = 1
    kills: int = 0
    """kill -9s during the run (each victim after ``kill_after`` rounds of its life)."""
    kill_after: int = 3
    log_dir: str = ""

    @property
    def steps(self) -> int:
        return self.rounds * self.sync_every


@dataclass
class CaseResult:
    case: str
    heldout_loss: float | None = None
    wire_bytes: int = 0
    wire_by_kind: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    step_s: float | None = None
    """DDP: median committed step; DiLoCo: median round time less its sync, / H."""
    sync_s: float | None = None
    """DiLoCo: median sync (all-reduce, vote, outer step) of a round."""
    kills: int = 0
    heals: int = 0
    wall_s: float = 0.0
    error: str = ""

    @property
    def bytes_per_step(self) -> float | None:
        return self.wire_bytes / self.steps if self.steps else None


# ----------------------------------------------------------------------------- data


def _example() -> Any:
    from torchnext.demo.hsdp_tasks import load_example

    return load_example(
        Path(__file__).resolve().parent.parent / "examples" / "fault_tolerant_transformer.py"
    )


def build() -> tuple[Any, int, list[int], Any]:
    """(dataset, training windows, held-out windows, model): identical in every process."""
    import torch

    ex = _example()
    torch.manual_seed(SEED)
    data = ex.CharWindows(ex.corpus(CORPUS_CHARS, seed=SEED), SEQ)
    n_train = int(len(data) * (1 - HELDOUT_FRACTION))
    first = n_train + SEQ  # no held-out window overlaps a training one
    stride = max(1, (len(data) - first) // HELDOUT_WINDOWS)
    heldout = list(range(first, len(data), stride))[:HELDOUT_WINDOWS]
    model = ex.CharTransformer(len(data.vocab), D_MODEL, LAYERS, HEADS, SEQ)
    return data, n_train, heldout, model


def batch_loss(model: Any, data: Any, indices: list[int]) -> Any:
    import torch

    x_BT = torch.stack([data[i][0] for i in indices])
    y_BT = torch.stack([data[i][1] for i in indices])
    logits_BTV = model(x_BT)
    return torch.nn.functional.cross_entropy(logits_BTV.flatten(0, 1), y_BT.flatten())


def heldout_loss(model: Any, data: Any, heldout: list[int]) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        losses = [
            float(batch_loss(model, data, heldout[i : i + 64])) for i in range(0, len(heldout), 64)
        ]
    model.train()
    return statistics.fmean(losses)


# ----------------------------------------------------------------------------- workers


def _group(ctx: Any, plan: Plan) -> tuple[Any, bool]:
    """The member's group: created by the initial members, joined by a replacement once
    the member it replaces was evicted (or never, if the run finished first)."""
    from torchnext.distributed import FaultTolerantGroup
    from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX

    if ctx.rank < NPROC:
        return FaultTolerantGroup.from_env(), False
    victim = f"w{ctx.rank - 1 if ctx.rank > NPROC else 1}"
    key = EVICTED_KEY_PREFIX + victim
    while not ctx.store.check([key]):
        if ctx.store.check([DONE_KEY]):
            return None, True
        time.sleep(0.1)  # the store offers no wait on two keys
    group = FaultTolerantGroup.join(
        ctx.store, member_id=ctx.member_id, timeout=timedelta(seconds=120)
    )
    return group, True


def worker(ctx: Any, plan: Plan) -> dict[str, Any]:
    import torch

    from torchnext.distributed import DiLoCo, ElasticSampler, Manager, SamplerConfig, SyncConfig
    from torchnext.distributed.group.wire import with_heal

    group, joining = _group(ctx, plan)
    if group is None:
        return {"joined": False}
    data, n_train, heldout, model = build()
    inner = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    log = Path(plan.log_dir) / f"{ctx.member_id}.jsonl"
    per_call = STEP_BATCH * (plan.sync_every // plan.fragments if plan.mode == "diloco" else 1)
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=n_train, global_batch_size=per_call, seed=SEED)
    )
    life = {"rounds": 0}

    def closure(indices: list[int]) -> torch.Tensor:
        ctx.checkpoint(f"life:{life['rounds']}")
        return batch_loss(model, data, indices)

    with log.open("a") as out:
        if plan.mode == "ddp":
            manager = Manager(group, model, inner, sampler, joining=joining)

            def wire() -> dict[str, int]:
                return with_heal(group.wire_bytes(), manager.heal_stats)

            t_last = time.monotonic()
            while manager.step < plan.steps:
                result = manager.run_step(closure, loss_reduction="mean")
                now = time.monotonic()
                out.write(
                    json.dumps(
                        {
                            "step": result.step,
                            "dt": now - t_last,
                            "sync_s": None,
                            "world": result.world_size,
                            "wire": wire(),
                        }
                    )
                    + "\n"
                )
                out.flush()
                t_last = now
            manager.finish()
            done_at, heals = manager.step, len(manager.heal_stats)
        else:
            config = SyncConfig(
                sync_every=plan.sync_every,
                outer_lr=OUTER_LR,
                outer_momentum=OUTER_MOMENTUM,
                fragments=plan.fragments,
            )
            diloco = DiLoCo(model, inner, sampler, config=config, group=group, joining=joining)
            t_last = time.monotonic()
            total_rounds = plan.rounds * plan.fragments
            while diloco.rounds < total_rounds:
                result = diloco.run_round(closure)
                life["rounds"] += 1
                now = time.monotonic()
                out.write(
                    json.dumps(
                        {
                            "step": result.step,
                            "dt": now - t_last,
                            "sync_s": diloco.sync_s,
                            "world": result.world_size,
                            "wire": diloco.wire_bytes(),
                        }
                    )
                    + "\n"
                )
                out.flush()
                t_last = now
            diloco.finish()
            done_at, heals = diloco.rounds, len(diloco.manager.heal_stats)
            with torch.no_grad():  # evaluate the agreed parameters (local ones may differ)
                for p, g in zip(diloco.params, diloco.global_params, strict=True):
                    p.copy_(g)
    value: dict[str, Any] = {"joined": True, "done_at": done_at, "heals": heals}
    if ctx.rank == 0:
        value["heldout_loss"] = heldout_loss(model, data, heldout)
        ctx.store.set(DONE_KEY, "1")
    group.shutdown()
    return value


# ----------------------------------------------------------------------------- harness


def run_case(plan: Plan, log_root: Path, timeout: timedelta) -> CaseResult:
    """Run one case's members (and replacements) to the end; read the figures."""
    from torchnext.testing import Fault, MultiProcessHarness

    log_dir = log_root / plan.case
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = Plan(**{**asdict(plan), "log_dir": str(log_dir)})
    # Victims: w1, then each replacement (harness ranks NPROC, NPROC + 1, ...); the last
    # victim is not replaced (a joiner admitted at the very last round would find nobody
    # left to heal from), so the run ends with the survivors, on the same samples.
    victims = [1] + [NPROC + i for i in range(plan.kills - 1)] if plan.kills else []
    faults = [Fault(rank=r, at=f"life:{plan.kill_after}", kind="kill") for r in victims]
    out = CaseResult(case=plan.case)
    t0 = time.monotonic()
    env = {"TORCHNEXT_HEARTBEAT_TIMEOUT": HEARTBEAT_S}
    with MultiProcessHarness(NPROC, faults=faults, env=env) as h:
        h.start(worker, plan)
        for _ in range(plan.kills - 1):
            h.spawn(worker, plan)  # each waits for the member it replaces to be evicted
        result = h.join(timeout)
    out.wall_s = time.monotonic() - t0
    out.kills = sum(1 for r in result if r.outcome == "killed")
    bad = [r for r in result if r.outcome not in ("returned", "killed")]
    if bad:
        out.error = result.describe()[-1500:]
    if result[0].outcome == "returned":
        out.heldout_loss = result[0].value.get("heldout_loss")
    _read_logs(plan, log_dir, out)
    return out


def _read_logs(plan: Plan, log_dir: Path, out: CaseResult) -> None:
    by_kind: dict[str, int] = {}
    rows0: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("*.jsonl")):
        lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
        if not lines:
            continue
        for kind, n in lines[-1]["wire"].items():
            by_kind[kind] = by_kind.get(kind, 0) + int(n)
        # Heals from the logs: a healed replacement may have been killed since.
        out.heals += 1 if lines[-1]["wire"].get("heal", 0) > 0 else 0
        if path.stem == "w0":
            rows0 = lines
    out.wire_by_kind = by_kind
    out.wire_bytes = sum(by_kind.values())
    out.steps = plan.steps
    # The first round/step includes the start (first sync, heals): left out of the times.
    steady = rows0[1:] or rows0
    if plan.mode == "ddp":
        out.step_s = statistics.median(r["dt"] for r in steady) if steady else None
        return
    inner_steps = plan.sync_every // plan.fragments
    if steady:
        out.step_s = statistics.median((r["dt"] - r["sync_s"]) / inner_steps for r in steady)
        out.sync_s = statistics.median(r["sync_s"] for r in steady)
