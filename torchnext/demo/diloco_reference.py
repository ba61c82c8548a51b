"""DiLoCo over replica groups, simulated in one process: what a failure-free run computes.

Use :func:`reference_diloco` to check a run of :mod:`torchnext.demo.hsdp_trainer` with
``--diloco H`` (R replica groups of G processes, FSDP2 inside each group): it holds one
whole model per replica group and replays the same data, the same inner steps and the
same outer steps, so a failure-free run's round losses equal it up to float rounding,
and a run with failures can be compared with what it would have reached without them.

One round, as the run does it (``fully_shard`` averages the gradients of a group's G
processes, each of which trains on its own piece of the group's share)::

    for each replica group r:
        for each inner step k:                        # H, or H / F with fragments
            loss = mean over its G processes of the mean loss of their piece k
            loss.backward(); inner[r].step()
    f = fragment of this round                        # every parameter when F == 1
    global[f].grad = mean over r of (global[f] - model[r][f])
    outer.step(); model[r][f] = global[f] for every r

A run with failures is replayed from its records (:class:`RoundRecord`, one per committed
round): only the groups that committed a round contribute to its sync (a group that died
in it trained, and is dropped), each on the data slice it trained on; a group that
appears after the first round starts as a copy of a group that committed the round
before (its healer: global parameters, outer and inner optimizer, local parameters).

What not to assume: with more than two groups a restarted group's shards may come from
different healers, which the replay does not model; it runs on one process, slowly (R models, no sharding); keep it to
the small models of the tests and the benchmark.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from torchnext.demo.hsdp_tasks import SAMPLES, build_model, heldout_data, make_data
from torchnext.demo.hsdp_trainer import INNER_LR
from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig, split_range
from torchnext.distributed.training.semisync import SyncConfig
from torchnext.distributed.training.semisync_fragments import fragment_plan

__all__ = ["DiLoCoReference", "RoundRecord", "reference_diloco"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundRecord:
    """One committed round of a run, as its records tell it."""

    groups: Mapping[str, int] = field(default_factory=dict)
    """Replica group id -> the data rank of its first process (shard 0), for every group
    that committed the round."""
    world: int
    """Data-parallel slices the round's global batch was split into (processes at the
    round's start)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DiLoCoReference:
    """What a failure-free DiLoCo run over replica groups computes."""

    round_losses: list[float]
    """Each round's mean inner loss over every process (what ``run_round`` reports)."""
    heldout_losses: list[float]
    """The held-out loss of the global parameters after each round."""

    @property
    def heldout_loss(self) -> float:
        """The held-out loss after the last round."""
        return self.heldout_losses[-1]


def reference_diloco(
    *,
    rounds: int,
    width: int,
    seed: int,
    batch: int,
    groups: int,
    group_size: int,
    sync: SyncConfig,
    inner_lr: float = INNER_LR,
    history: Sequence[RoundRecord] | None = None,
) -> DiLoCoReference:
    """Simulate ``rounds`` DiLoCo rounds of ``groups`` replica groups of ``group_size``
    processes (see the module docstring); ``batch`` is the round's global batch.
    ``history`` (one record per round) replays a run with failures instead."""
    if history is None:
        everyone = {f"g{r}": r * group_size for r in range(groups)}
        history = [RoundRecord(groups=everyone, world=groups * group_size)] * rounds
    if len(history) != rounds:
        raise ValueError(f"reference_diloco: {len(history)} round records for rounds={rounds}")
    base = build_model(width, seed)
    replicas: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
    global_params = [p.detach().clone() for p in base.parameters()]
    outer = torch.optim.SGD(
        global_params, lr=sync.outer_lr, momentum=sync.outer_momentum, nesterov=sync.nesterov
    )
    plan = fragment_plan([p.numel() for p in global_params], sync.fragments)
    steps = sync.steps_per_round
    x, y = make_data(SAMPLES, seed)
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=SAMPLES, global_batch_size=batch, seed=seed)
    )
    losses: list[float] = []
    heldout: list[float] = []
    xh, yh = heldout_data(seed)
    evaluator = copy.deepcopy(base)
    for r, record in enumerate(history):
        healer = next(iter(replicas.values()), None)
        for rid in record.groups:
            if rid not in replicas:  # the first round's groups, or a restarted one
                if healer is None:
                    fresh = copy.deepcopy(base)
                    replicas[rid] = (fresh, torch.optim.Adam(fresh.parameters(), lr=inner_lr))
                else:
                    replicas[rid] = copy.deepcopy(healer)
        for gone in [rid for rid in replicas if rid not in record.groups]:
            del replicas[gone]  # died in this round (its training there is dropped) or before
        total = 0.0
        for rid, first_rank in record.groups.items():
            model, opt = replicas[rid]
            shares = [sampler.indices(first_rank + s, record.world) for s in range(group_size)]
            for k in range(steps):
                opt.zero_grad(set_to_none=True)
                per = []
                for share in shares:
                    a, b = split_range(len(share), k, steps)
                    i = torch.tensor(share[a:b], dtype=torch.int64)
                    per.append(torch.nn.functional.cross_entropy(model(x[i]), y[i]))
                torch.stack(per).mean().backward()
                opt.step()
                total += sum(float(v.detach()) for v in per)
        contributors = len(record.groups)
        losses.append(total / (contributors * group_size * steps))
        models = [m for m, _ in replicas.values()]
        fragment = plan[r % len(plan)]
        with torch.no_grad():
            params = [list(m.parameters()) for m in models]
            for j in fragment:
                deltas = [global_params[j] - ps[j] for ps in params]
                global_params[j].grad = torch.stack(deltas).mean(dim=0)  # over contributors
            outer.step()
            for j in fragment:
                for ps in params:
                    ps[j].copy_(global_params[j])  # every replica group starts equal
                global_params[j].grad = None
        sampler.commit()
        with torch.no_grad():
            for param, agreed in zip(evaluator.parameters(), global_params, strict=True):
                param.copy_(agreed)
            heldout.append(float(torch.nn.functional.cross_entropy(evaluator(xh), yh)))
    return DiLoCoReference(round_losses=losses, heldout_losses=heldout)
