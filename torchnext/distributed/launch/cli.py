"""``torchnext run``: launch a fault-tolerant training script on this machine.

Single machine::

    torchnext run --nproc 4 --max-restarts 3 train.py --lr 0.1

Multi-node: one agent per node and one shared store endpoint, the same command line
on every node (only ``--node-rank`` differs). Node 0's agent hosts the store at the
endpoint's port, bound to ``--store-host`` (loopback unless told: give an interface the
other nodes reach, or ``0.0.0.0``); the other agents connect to it::

    torchnext run --nproc 8 --nnodes 2 --node-rank 0 --store-addr node0:29600 --store-host 0.0.0.0 train.py
    torchnext run --nproc 8 --nnodes 2 --node-rank 1 --store-addr node0:29600 --store-host 0.0.0.0 train.py

Alongside torchrun (when a scheduler already wraps jobs in torchrun): let torchrun start
exactly one agent per node, and let the agent start and replace the workers::

    torchrun --nnodes 2 --nproc-per-node 1 --no-python sh -c \
        'torchnext run --nproc 8 --nnodes 2 --node-rank "$GROUP_RANK" \
                       --store-addr node0:29600 --store-host 0.0.0.0 train.py'

At the end, node 0's agent keeps the store up until every other agent has said
goodbye (or has shown no sign of life for 30 s), so no node loses the store while its
workers are still exiting.

Keep torchrun's own ``--max-restarts`` at 0: it restarts a whole node's workers, which
is what the agent exists to avoid. The agent on node 0 is a single point of failure
(it hosts the store), as torchft's lighthouse is.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2] if __doc__ else None
    parser.add_argument("--nproc", type=int, required=True, help="workers to start on this node")
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="replacements allowed in all (default 3)"
    )
    parser.add_argument("--nnodes", type=int, default=1, help="agents in the job (one per node)")
    parser.add_argument(
        "--node-rank", type=int, default=0, help="this agent's index among the nodes"
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
        "--log-dir", default="", help="write each worker's output to DIR/<member>.log"
    )
    parser.add_argument(
        "-m", "--module", action="store_true", help="run SCRIPT as a module (python -m)"
    )
    parser.add_argument("script", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def main(args: argparse.Namespace) -> int:
    from torchnext.distributed.launch.agent import Agent, AgentConfig
    from torchnext.errors import StoreUnreachableError

    try:
        config = AgentConfig(
            nproc=args.nproc,
            max_restarts=args.max_restarts,
            store_host=args.store_host,
            store_port=args.store_port,
            store_addr=args.store_addr,
            node_rank=args.node_rank,
            world_size=args.nproc * args.nnodes,
            nnodes=args.nnodes,
            log_dir=args.log_dir,
            store_timeout=timedelta(seconds=30),
        )
    except ValueError as exc:
        print(f"torchnext run: {exc}", file=sys.stderr)
        return 2
    if args.nnodes > 1 and not args.store_addr:
        print(
            "torchnext run: --nnodes > 1 needs --store-addr host:port, the store endpoint "
            "every node reaches (node 0's agent hosts it)",
            file=sys.stderr,
        )
        return 2
    command = (["-m"] if args.module else []) + [args.script, *args.script_args]
    agent = Agent(command, config)
    try:
        agent.start()
    except StoreUnreachableError as exc:
        print(f"torchnext run: {exc}", file=sys.stderr)
        agent.close()
        return 2
    try:
        return agent.run()
    finally:
        agent.close()
