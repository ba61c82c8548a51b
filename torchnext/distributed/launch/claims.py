"""Checks between the agents of one job: one agent per node rank, one job shape.

Use :func:`claim_node` when an agent starts, before it starts any worker. Two mistakes
on a multi-node job otherwise only show later, and badly: two agents given the same
``--node-rank`` start workers with the same member ids (the group refuses them after
its store timeout, naming ids, not agents), and agents given different ``--nnodes`` or
``--nproc`` tell their workers different world sizes (the group waits for members that
never come, up to the store timeout). Here each agent compares the job's shape with the one the first agent wrote, then
claims its node rank, each with one ``compare_set``, so the second agent of a pair fails
at once, with an error naming the other agent and the fix.

A claim names the agent's host and pid. A claim left by an agent that is gone from the
same host (a restarted agent: the pid no longer runs) is taken over; any other is
refused.

What not to assume: the check needs the job's store, so it runs after connecting; an
agent that never starts is not detected here (the group's store timeout reports it).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

from torchnext.distributed.launch.keys import AGENT_CLAIM_KEY_PREFIX, JOB_SHAPE_KEY
from torchnext.errors import AgentConflictError

__all__ = ["JobShape", "claim_node"]


@dataclass(frozen=True)
class JobShape:
    """What every agent of a job must agree on."""

    nnodes: int
    nproc: int
    world_size: int

    def describe(self) -> str:
        return f"world size {self.world_size} (--nnodes {self.nnodes} x --nproc {self.nproc})"


def claim_node(store: Any, *, node_rank: int, shape: JobShape) -> None:
    """Check the job's shape, then claim ``node_rank`` for this agent; raise on a clash."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "shape": asdict(shape)}
    first = _decode(store.compare_set(JOB_SHAPE_KEY, "", json.dumps({**me, "node": node_rank})))
    theirs = JobShape(**first.get("shape", asdict(shape)))
    if theirs != shape:
        raise AgentConflictError(
            f"this agent (node {node_rank} on host {me['host']}) runs a job of "
            f"{shape.describe()}, but the agent of node {first.get('node', '?')} on host "
            f"{first.get('host', '?')} (pid {first.get('pid', '?')}) started it with "
            f"{theirs.describe()}. Give every agent the same --nnodes and --nproc (under "
            "torchrun: the same --nnodes)."
        )
    key = f"{AGENT_CLAIM_KEY_PREFIX}{node_rank}"
    mine = json.dumps(me, sort_keys=True)
    held = _decode(store.compare_set(key, "", mine))
    if not _same_agent(held, me) and _gone(held):
        held = _decode(store.compare_set(key, json.dumps(held, sort_keys=True), mine))
    if not _same_agent(held, me):
        raise AgentConflictError(
            f"node rank {node_rank} is already taken by the agent on host "
            f"{held.get('host', '?')} (pid {held.get('pid', '?')}); this agent on host "
            f"{me['host']} (pid {me['pid']}) was given the same --node-rank. Give every "
            f"agent of the job its own --node-rank, from 0 to {shape.nnodes - 1}."
        )


def _same_agent(claim: dict[str, Any], me: dict[str, Any]) -> bool:
    return claim.get("host") == me["host"] and claim.get("pid") == me["pid"]


def _decode(raw: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"host": "?", "pid": "?", "shape": {}}
    return value if isinstance(value, dict) else {}


def _gone(claim: dict[str, Any]) -> bool:
    """A claim by an agent of this host whose process no longer runs."""
    if claim.get("host") != socket.gethostname() or not isinstance(claim.get("pid"), int):
        return False
    try:
        os.kill(int(claim["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
