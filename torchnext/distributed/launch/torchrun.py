"""What torchrun put in a process's environment, for ``torchnext run`` and the workers.

Use it where torchnext meets a job already wrapped in torchrun (schedulers often do):

* ``torchnext run`` started by torchrun, one agent per node
  (``torchrun --nproc-per-node 1 ... -m torchnext -- run --nproc 8 train.py``), takes the
  node count, its node rank and the store from torchrun's environment: the job's store
  is torchrun's (``MASTER_ADDR:MASTER_PORT``), so no agent hosts one of its own;
* a training script that torchrun started *directly* (no agent) is told, once, how to
  launch it: torchrun stops and restarts every worker when one fails, which is the
  restart torchnext exists to avoid.

What not to assume: detection reads torchrun's variables (``TORCHELASTIC_RUN_ID``,
``GROUP_RANK``, ``LOCAL_WORLD_SIZE``, ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``); another launcher that sets the same names looks like torchrun.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PER_PROCESS_VARIABLES", "TorchrunEnv", "torchrun_env", "worker_launch_error"]

PER_PROCESS_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_ERROR_FILE",
)
"""torchrun's per-process variables: right for the agent it started, wrong for the
workers the agent starts, so the agent does not pass them on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchrunEnv:
    """The parts of torchrun's environment torchnext uses."""

    rank: int
    """Global rank torchrun gave this process."""
    world_size: int
    """Processes torchrun started in the whole job."""
    local_world_size: int
    """Processes torchrun started on this node (``--nproc-per-node``)."""
    group_rank: int
    """This node's index (torchrun's ``GROUP_RANK``)."""
    group_world_size: int
    """Nodes in the job."""
    master_addr: str
    master_port: int
    run_id: str

    @property
    def store_addr(self) -> str:
        """``host:port`` of the job's store (hosted by torchrun's agent on the master node)."""
        return f"{self.master_addr}:{self.master_port}"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} in the environment is not an integer") from None


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """torchrun's environment, or None when this process was not started by torchrun."""
    env = os.environ if environ is None else environ
    if not env.get("TORCHELASTIC_RUN_ID") and not (env.get("GROUP_RANK") and env.get("RANK")):
        return None
    world = _int(env, "WORLD_SIZE", 1)
    return TorchrunEnv(
        rank=_int(env, "RANK", 0),
        world_size=world,
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
        group_rank=_int(env, "GROUP_RANK", 0),
        group_world_size=_int(env, "GROUP_WORLD_SIZE", 1),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500),
        run_id=env.get("TORCHELASTIC_RUN_ID", ""),
    )


def worker_launch_error(env: TorchrunEnv, what: str) -> str:
    """The message for a training script torchrun started without a torchnext agent."""
    return (
        f"{what}: this process was started by torchrun directly (rank {env.rank} of "
        f"{env.world_size}), without a torchnext agent. torchrun stops and restarts every "
        "worker when one fails; torchnext heals in place, so its agent must start the "
        "workers. Launch one agent per node instead:\n"
        f"    torchrun --nnodes {env.group_world_size} --nproc-per-node 1 ... "
        f"-m torchnext -- run --nproc {env.local_world_size} SCRIPT [ARGS]\n"
        f"or, without torchrun: torchnext run --nproc {env.local_world_size} SCRIPT [ARGS]"
    )
