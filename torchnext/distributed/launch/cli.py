"""``torchnext run``: launch a fault-tolerant training script on this machine.

Single machine::

    torchnext run --nproc 4 --max-restarts 3 train.py --lr 0.1
    torchnext run --nproc 4 --spares 1 train.py     # a warm spare replaces a dead worker
    torchnext run --nproc 4 --group-size 2 train.py # 2 replica groups of 2 (HSDP)

A warm spare runs the script up to ``Manager.from_env`` and waits there: code before
that line runs in the spare too (see ``torchnext.distributed.is_spare``).

Multi-node: one agent per node and one shared store endpoint, the same command line
on every node (only ``--node-rank`` differs). Node 0's agent hosts the store at the
endpoint's port, bound to ``--store-host`` (loopback unless told: give an interface the
other nodes reach, or ``0.0.0.0``); the other agents connect to it::

    torchnext run --nproc 8 --nnodes 2 --node-rank 0 --store-addr node0:29600 --store-host 0.0.0.0 train.py
    torchnext run --nproc 8 --nnodes 2 --node-rank 1 --store-addr node0:29600 --store-host 0.0.0.0 train.py

A store that survives the loss of any one machine: keep it on an etcd cluster (3 or 5
members on different hosts) instead of node 0's agent. Every agent connects to it, none
hosts one, and the last path segment names the job's keys (use the scheduler's job id)::

    torchnext run --nproc 8 --nnodes 2 --node-rank 0 --store etcd://h1:2379,h2:2379,h3:2379/job7 train.py
    torchnext run --nproc 8 --nnodes 2 --node-rank 1 --store etcd://h1:2379,h2:2379,h3:2379/job7 train.py

Alongside torchrun (when a scheduler already wraps jobs in torchrun): let torchrun start
exactly one agent per node, and let the agent start and replace the workers. The agent
reads the node count, its node rank and the store from torchrun's environment (the job's
store is torchrun's, at ``MASTER_ADDR:MASTER_PORT``; no agent hosts one)::

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-endpoint node0:29500 ... \
        -m torchnext -- run --nproc 8 train.py

The ``--`` keeps torchrun from reading torchnext's flags (several have the same names).
Flags given to ``torchnext run`` win over what torchrun's environment says.

At the end, node 0's agent keeps the store up until every other agent has said
goodbye (or has shown no sign of life for 30 s), so no node loses the store while its
workers are still exiting.

Stopping: SIGTERM or SIGINT (a scheduler cancelling the job, Ctrl-C) stops the agent's
workers (SIGTERM, then SIGKILL after a grace period), says so, and exits with 128 plus the
signal's number. Only SIGKILL leaves them running (the ``kill_agent`` fault): they carry on
without their agent, and the job goes on.

Keep torchrun's own ``--max-restarts`` at 0: it restarts a whole node's workers, which
is what the agent exists to avoid. With a TCP store the agent on node 0 is a single
point of failure (it hosts the store), as torchft's lighthouse is; with ``--store
etcd://...`` no agent is.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2] if __doc__ else None
    parser.add_argument("--nproc", type=int, required=True, help="workers to start on this node")
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="replacements allowed in all (default 3)"
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=1,
        metavar="G",
        help="processes per replica group (HSDP: the model is sharded G ways inside a "
        "group); a group is restarted whole when one of its processes dies; must divide "
        "--nproc (default 1: every process is a replica)",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=0,
        metavar="S",
        help="warm spares to keep started on this node (script run up to Manager.from_env): "
        "a dead worker is replaced by one within a second instead of a cold start (default 0)",
    )
    parser.add_argument(
        "--nnodes", type=int, default=None, help="agents in the job, one per node (default 1)"
    )
    parser.add_argument(
        "--node-rank", type=int, default=None, help="this agent's index among the nodes (default 0)"
    )
    parser.add_argument(
        "--store-host",
        default="127.0.0.1",
        help="interface the hosted store binds to (default loopback)",
    )
    parser.add_argument(
        "--store-port", type=int, default=0, help="port of the hosted store (0: a free one)"
    )
    parser.add_argument(
        "--store-addr", default="", help="store endpoint shared by all nodes (node 0 hosts it)"
    )
    parser.add_argument(
        "--store",
        default="",
        metavar="URL",
        help="the job's store as a URL: etcd://h1:2379,h2:2379,h3:2379/JOB keeps it on an "
        "etcd cluster that no agent hosts (survives losing any one host; JOB names the "
        "job's keys, use a fresh one per job); tcp://host:port is --store-addr",
    )
    parser.add_argument(
        "--log-dir", default="", help="write each worker's output to DIR/<member>.log"
    )
    parser.add_argument(
        "--events",
        default="",
        metavar="FILE",
        help="append every fault, shrink, grow, heal, recovery and exit to FILE as JSON lines",
    )
    parser.add_argument(
        "-m", "--module", action="store_true", help="run SCRIPT as a module (python -m)"
    )
    parser.add_argument("script", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def _from_torchrun(args: argparse.Namespace) -> str | None:
    """Fill unset flags from torchrun's environment; an error text when it is unusable."""
    from torchnext.distributed.launch.torchrun import torchrun_env

    try:
        torchrun = torchrun_env()
    except ValueError as exc:
        return str(exc)
    args.store_hosted_elsewhere = False
    if torchrun is None:
        args.nnodes = 1 if args.nnodes is None else args.nnodes
        args.node_rank = 0 if args.node_rank is None else args.node_rank
        return None
    if torchrun.local_world_size != 1:
        return (
            f"torchrun started {torchrun.local_world_size} agents on this node; give torchrun "
            "--nproc-per-node 1 (the agent starts the --nproc workers itself)"
        )
    if args.nnodes is None:
        args.nnodes = torchrun.group_world_size
    if args.node_rank is None:
        args.node_rank = torchrun.group_rank
    if not args.store_addr:
        args.store_addr = torchrun.store_addr
        args.store_hosted_elsewhere = True
    print(
        f"torchnext run: under torchrun (run {torchrun.run_id or '?'}): node {args.node_rank} "
        f"of {args.nnodes}, store {args.store_addr}",
        file=sys.stderr,
    )
    return None


def _store_url(args: argparse.Namespace) -> str | None:
    """Fold ``--store URL`` into ``--store-addr``; an error text when they conflict."""
    url = getattr(args, "store", "")
    if not url:
        return None
    if args.store_addr:
        return "give the store once: --store URL or --store-addr host:port, not both"
    if url.startswith("tcp://"):
        url = url[len("tcp://") :]
    elif "://" in url and not url.startswith("etcd://"):
        return (
            f"--store {url!r}: unknown scheme; use etcd://h1:2379,h2:2379,h3:2379/JOB "
            "or tcp://host:port"
        )
    args.store_addr = url
    return None


def _refuse_finished_namespace(addr: str, timeout: timedelta) -> str | None:
    """An etcd namespace that holds a finished job's keys would end this job at once."""
    from torchnext.distributed.launch.keys import FINISHED_KEY
    from torchnext.distributed.launch.store import connect_store

    store = connect_store(addr, timeout)
    try:
        if store.check([FINISHED_KEY]):
            return (
                f"the etcd namespace of {addr} holds the keys of a job that finished; give "
                "this job its own namespace (etcd://.../<job id>), or delete the old keys "
                "(etcdctl del --prefix /<namespace>/)"
            )
        return None
    finally:
        store.close()


class _Stopped(BaseException):
    """Raised in the agent's thread by SIGTERM (a BaseException: no handler of the agent's
    catches it, and its ``finally`` blocks stop the workers)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM into :class:`_Stopped` and SIGINT into ``KeyboardInterrupt`` here: by
    default SIGTERM ends the interpreter without running ``finally`` blocks, and the
    workers would run on without their agent (and their store, on node 0)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        # Once: a second SIGTERM (a scheduler repeating itself) must not cut the workers'
        # stop short; the stop is bounded by the agent's grace period.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(args: argparse.Namespace) -> int:
    """Run ``torchnext run``; SIGTERM or SIGINT stop the workers and exit with 128 + signal."""
    try:
        with _stop_on_signals():
            return _main(args)
    except _Stopped as stopped:
        name = signal.Signals(stopped.signum).name
        print(f"torchnext run: stopped by {name}; its workers were stopped", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        print("torchnext run: interrupted (SIGINT); its workers were stopped", file=sys.stderr)
        return 128 + int(signal.SIGINT)


def _main(args: argparse.Namespace) -> int:
    from torchnext._env import TORCHNEXT_STORE_TIMEOUT
    from torchnext.distributed.launch.agent import Agent, AgentConfig
    from torchnext.errors import AgentConflictError, StoreUnreachableError

    problem = _store_url(args) or _from_torchrun(args)
    if problem is not None:
        print(f"torchnext run: {problem}", file=sys.stderr)
        return 2
    try:
        config = AgentConfig(
            nproc=args.nproc,
            max_restarts=args.max_restarts,
            group_size=args.group_size,
            spares=args.spares,
            store_host=args.store_host,
            store_port=args.store_port,
            store_addr=args.store_addr,
            store_hosted_elsewhere=args.store_hosted_elsewhere,
            node_rank=args.node_rank,
            world_size=args.nproc * args.nnodes,
            nnodes=args.nnodes,
            log_dir=args.log_dir,
            events_file=args.events,
            store_timeout=TORCHNEXT_STORE_TIMEOUT.get(),
        )
    except ValueError as exc:
        print(f"torchnext run: {exc}", file=sys.stderr)
        return 2
    if args.nnodes > 1 and not args.store_addr:
        print(
            "torchnext run: --nnodes > 1 needs --store-addr host:port, the store endpoint "
            "every node reaches (node 0's agent hosts it), or --store etcd://h1:2379,.../JOB",
            file=sys.stderr,
        )
        return 2
    command = (["-m"] if args.module else []) + [args.script, *args.script_args]
    with Agent(command, config) as agent:  # its exit stops the workers, however we leave
        try:
            if args.store_addr.startswith("etcd://"):
                problem = _refuse_finished_namespace(args.store_addr, config.store_timeout)
                if problem is not None:
                    print(f"torchnext run: {problem}", file=sys.stderr)
                    return 2
                print(f"torchnext run: store on etcd at {args.store_addr}", file=sys.stderr)
            agent.start()
        except (StoreUnreachableError, AgentConflictError) as exc:
            print(f"torchnext run: {exc}", file=sys.stderr)
            return 2
        return agent.run()
