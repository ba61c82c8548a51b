"""The processes of ``ft-vs-torchft``: settings, the two systems' workers, the Lighthouse.

Every worker trains the same model on the same data and appends what it does to a
JSON-lines log (``time.monotonic``, one clock for the machine); the harness
(``ft_vs_torchft.py``) reads the logs. A worker starts a step only while its step count
is below a target the harness keeps in a control store, so one job can wait at a step
boundary while the other is timed. The processes are started as
``ft_vs_torchft.py --worker torchnext|torchft ...`` and ``... --run-lighthouse``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

NPROC = 4
SEED = 0
GLOBAL_BATCH = 48
SHARE = GLOBAL_BATCH // NPROC
D_MODEL, LAYERS, HEADS, SEQ = 128, 5, 4, 64
CORPUS_CHARS = 20_000
INSTALL_HINT = "pip install 'torch==2.13.0' -e '.[bench]'"
MAX_IDLE_S = 1800.0
"""A worker held at a step boundary longer than this exits (the harness is gone)."""
FOREVER = 1 << 40
"""Gate target that lets a job run freely."""
TUNE_WINDOW_STEPS = 20
"""Steps per window of the fault-free tuning check (held for a moment in between)."""


# ----------------------------------------------------------------------------- settings


def _ms(value: timedelta) -> int:
    return round(value.total_seconds() * 1000)


@dataclass(frozen=True)
class FtSetting:
    """torchft's knobs: the Lighthouse's, the Manager's and the gloo process group's."""

    name: str
    heartbeat_timeout: timedelta
    """Lighthouse: a replica without a heartbeat for this long is dead."""
    quorum_tick: timedelta
    """Lighthouse: how often it re-checks for a quorum while waiting."""
    join_timeout: timedelta
    """Lighthouse: how long it waits for healthy stragglers to join a quorum."""
    min_replicas: int
    """Lighthouse ``--min_replicas`` and ``Manager(min_replica_size=)``."""
    pg_timeout: timedelta
    """``ProcessGroupGloo(timeout=)``: every gloo op and the reconfiguration rendezvous."""
    timeout: timedelta
    """``Manager(timeout=)``: should_commit, checkpoint transfer, futures."""
    quorum_timeout: timedelta
    """``Manager(quorum_timeout=)``: one quorum request."""
    connect_timeout: timedelta
    """``Manager(connect_timeout=)``: connecting to the Lighthouse and managers."""
    heartbeat_interval: timedelta
    """``Manager(heartbeat_interval=)``: how often a replica heartbeats the Lighthouse."""

    def values(self) -> dict[str, int]:
        """Every knob in milliseconds (``min_replicas`` as a count)."""
        out: dict[str, int] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, timedelta):
                out[f"{f.name}_ms"] = _ms(value)
            elif isinstance(value, int):
                out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps({"name": self.name, **self.values()})

    @classmethod
    def from_json(cls, text: str) -> FtSetting:
        raw = json.loads(text)
        kwargs: dict[str, Any] = {"name": raw["name"], "min_replicas": int(raw["min_replicas"])}
        for f in dataclasses.fields(cls):
            if f"{f.name}_ms" in raw:
                kwargs[f.name] = timedelta(milliseconds=int(raw[f"{f.name}_ms"]))
        return cls(**kwargs)


def _seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


def _millis(ms: float) -> timedelta:
    return timedelta(milliseconds=ms)


TORCHFT_DEFAULT = FtSetting(
    name="default",
    heartbeat_timeout=_millis(5000),  # torchft_lighthouse --help
    quorum_tick=_millis(100),
    join_timeout=_millis(60_000),
    min_replicas=1,  # required flag; torchft's README starts the Lighthouse with 1
    pg_timeout=_seconds(60),  # ProcessGroupGloo()
    timeout=_seconds(60),  # Manager()
    quorum_timeout=_seconds(60),
    connect_timeout=_seconds(60),
    heartbeat_interval=_millis(100),
)


def _tuned(name: str, heartbeat_ms: float, pg_ms: float, tick_ms: float) -> FtSetting:
    # Failure detection is bounded by the heartbeat timeout (a dead replica leaves the
    # quorum) and the gloo timeout (a survivor that is not the dead one's ring neighbour
    # waits for it); the join timeout need not exceed the heartbeat timeout (a cold
    # replacement takes seconds to start, so waiting for it only delays the survivors);
    # min_replicas = N - 1 keeps a quorum of the survivors of one failure and no smaller.
    # The Manager's timeouts bound the paths a SIGKILL does not take (should_commit, a
    # checkpoint transfer, a quorum request): short, but well above their normal times.
    return FtSetting(
        name=name,
        heartbeat_timeout=_millis(heartbeat_ms),
        quorum_tick=_millis(tick_ms),
        join_timeout=_millis(heartbeat_ms),
        min_replicas=NPROC - 1,
        pg_timeout=_millis(pg_ms),
        timeout=_seconds(10),
        quorum_timeout=_seconds(20),
        connect_timeout=_seconds(10),
        heartbeat_interval=_millis(max(10.0, heartbeat_ms / 5)),
    )


TUNE_LADDER = [
    _tuned("hb100-pg50", 100, 50, 10),  # the MLP tuning of the issue
    _tuned("hb200-pg200", 200, 200, 10),
    _tuned("hb500-pg500", 500, 500, 20),
    _tuned("hb1000-pg1000", 1000, 1000, 50),
    _tuned("hb2000-pg3000", 2000, 3000, 100),
]
"""Fastest first; the tuned setting is the first that runs fault-free without a false failure."""


# ----------------------------------------------------------------------------- workers


def _example() -> dict[str, Any]:
    """The definitions of ``examples/fault_tolerant_transformer.py``, without its torchnext imports.

    The model and data come from the example itself; its ``from torchnext... import``
    lines are left out so that a torchft worker does not import torchnext (half a
    second of every cold start); nothing of the example that the benchmark uses needs it.
    """
    path = Path(__file__).resolve().parent.parent / "examples" / "fault_tolerant_transformer.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"ft-vs-torchft trains the model of {path}, which is missing; run it from a "
            "torchnext source checkout"
        )
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchnext"))
    ]
    namespace: dict[str, Any] = {"__name__": "fault_tolerant_transformer", "__file__": str(path)}
    exec(compile(tree, str(path), "exec"), namespace)  # noqa: S102 - the example's own code
    return namespace


def build_model() -> tuple[Any, Any, Any]:
    """(dataset, model, AdamW): identical on every replica of both systems."""
    import torch

    ex = _example()
    torch.manual_seed(SEED)
    data = ex["CharWindows"](ex["corpus"](CORPUS_CHARS, seed=SEED), SEQ)
    model = ex["CharTransformer"](len(data.vocab), D_MODEL, LAYERS, HEADS, SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return data, model, opt


def _batch(data: Any, indices: list[int]) -> tuple[Any, Any]:
    import torch

    pairs = [data[i] for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _loss(model: Any, x: Any, y: Any) -> Any:
    import torch

    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="mean")


class _Log:
    """One worker's JSON-lines log; every line is flushed (a SIGKILL loses nothing written)."""

    def __init__(self, folder: str) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = open(Path(folder) / f"p{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115

    def write(self, record: str, /, **fields: Any) -> None:
        self._fh.write(json.dumps({"k": record, "t": time.monotonic(), **fields}) + "\n")


class _Gate:
    """Lets a worker start step ``s`` only while ``s`` is below the harness's target."""

    def __init__(self, ctl: str, job: str) -> None:
        import torch.distributed as dist

        host, _, port = ctl.rpartition(":")
        self._store = dist.TCPStore(
            host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self._key = f"{job}/target"

    def wait(self, step: int) -> None:
        deadline = time.monotonic() + MAX_IDLE_S
        while step >= int(self._store.add(self._key, 0)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"held at step {step} for {MAX_IDLE_S:.0f} s; harness gone?")
            time.sleep(0.01)


def torchnext_worker(args: argparse.Namespace) -> int:
    import torch

    from torchnext.distributed import ElasticSampler, Manager, ManagerEvent, SamplerConfig
    from torchnext.distributed.launch.exits import EXIT_EVICTED

    torch.set_num_threads(1)
    log = _Log(args.log_dir)
    log.write("start", spare=os.environ.get("TORCHNEXT_SPARE", ""))
    gate = _Gate(args.ctl, args.job)
    data, model, opt = build_model()
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=len(data), global_batch_size=GLOBAL_BATCH, seed=SEED)
    )

    def on_event(event: ManagerEvent) -> None:
        log.write("ev", kind=event.kind, epoch=event.epoch, step=event.step)

    def optimizer_step() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    log.write("ready")  # asks to join from here (a warm spare first waits to be assigned)
    try:
        manager = Manager.from_env(
            model, opt, sampler, on_event=on_event, optimizer_step=optimizer_step
        )
    except TimeoutError:
        return EXIT_EVICTED
    log.write("member", member=manager.member_id)
    attempt = {"t": 0.0, "epoch": -1}

    def closure(indices: list[int]) -> Any:
        # Entered after start_step: the membership is settled and its first collective
        # (the step-count exchange) has completed.
        attempt["t"], attempt["epoch"] = time.monotonic(), int(manager.group.epoch)
        return _loss(model, *_batch(data, indices))

    try:
        while True:
            gate.wait(manager.step)
            result = manager.run_step(closure, loss_reduction="mean")
            now = time.monotonic()
            log.write(
                "step",
                step=result.step,
                mid=attempt["epoch"],
                world=result.world_size,
                ok=True,
                committed=result.committed,
                t_ar=now - result.commit_s,  # the gradient all-reduce (and loss) completed
                t_ready=attempt["t"],
                t_start=attempt["t"],  # the step's compute starts when recovery is over
                samples=GLOBAL_BATCH,
                compute_s=result.compute_s,
                allreduce_s=result.allreduce_s,
                commit_s=result.commit_s,
            )
    except Exception as exc:
        if manager.evicted(exc):
            return EXIT_EVICTED
        raise


def torchft_worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    torch.set_num_threads(1)
    setting = FtSetting.from_json(args.ft_setting)
    log = _Log(args.log_dir)
    log.write("start", spare="")
    gate = _Gate(args.ctl, args.job)
    data, model, opt = build_model()
    gen = torch.Generator().manual_seed(SEED)
    order = torch.randperm(len(data), generator=gen).tolist()
    # This replica group's own store (one rank per group), as torchrun would host it.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        log.write("healed")

    manager = Manager(
        pg=ProcessGroupGloo(timeout=setting.pg_timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=setting.min_replicas,
        timeout=setting.timeout,
        quorum_timeout=setting.quorum_timeout,
        connect_timeout=setting.connect_timeout,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"r{args.slot}",
        heartbeat_interval=setting.heartbeat_interval,
    )
    receive = manager.load_state_dict

    def received(state: dict[str, int]) -> None:
        # Runs in the quorum thread once the checkpoint from a peer has arrived, before
        # the step that applies it: the healed state is in this process.
        receive(state)
        log.write("heal_received")

    manager.load_state_dict = received  # type: ignore[method-assign]
    ddp = DistributedDataParallel(manager, model)
    log.write("member", member=f"r{args.slot}")
    log.write("ready")  # asks the Lighthouse for a quorum from here
    quorum = {"t": 0.0}

    def quorum_done(_fut: object) -> None:
        quorum["t"] = time.monotonic()

    while True:
        step = manager.current_step()
        gate.wait(step)
        t_start = time.monotonic()
        # torchft.Optimizer's zero_grad and step, spelled out to see the commit decision.
        manager.start_quorum()
        opt.zero_grad(set_to_none=True)
        future = manager._quorum_future  # noqa: SLF001 - timestamp of the quorum only
        if future is not None:
            future.add_done_callback(quorum_done)
        start = (step * GLOBAL_BATCH + args.slot * SHARE) % len(order)
        indices = [order[(start + i) % len(order)] for i in range(SHARE)]
        _loss(ddp, *_batch(data, indices)).backward()  # the comm hook waits for the all-reduce
        t_ar = time.monotonic()
        ok = manager.errored() is None
        world = manager.num_participants()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        committed = manager.should_commit()
        if committed:
            opt.step()
        log.write(
            "step",
            step=manager.current_step(),
            mid=int(manager._quorum_id),  # noqa: SLF001
            world=world,
            ok=ok,
            committed=committed,
            t_ar=t_ar,
            t_ready=quorum["t"],
            t_start=t_start,
            samples=SHARE * world if committed else 0,
        )


def run_lighthouse(args: argparse.Namespace) -> int:
    """Runs a torchft Lighthouse until stdin closes (the harness exited or closed it)."""
    from torchft.coordination import LighthouseServer

    s = FtSetting.from_json(args.ft_setting)
    server = LighthouseServer(
        bind="[::]:0",
        min_replicas=s.min_replicas,
        join_timeout_ms=_ms(s.join_timeout),
        quorum_tick_ms=_ms(s.quorum_tick),
        heartbeat_timeout_ms=_ms(s.heartbeat_timeout),
    )
    print(server.address(), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.shutdown()
    return 0
