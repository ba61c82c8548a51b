"""How the members of a new RMA window reach each other: shared memory or TCP, per peer.

At creation every member publishes its segment's name, dtype, size, host and doorbell
(one all-gather over the store), then decides per peer: a peer on this host (same
shared-memory namespace) is mapped, so a put is one ``memcpy``; a peer elsewhere, or
every peer with ``transport="tcp"``, is reached through that peer's progress server.
A member that some peer cannot map starts its own progress server, which hands
requests to the window's serving side. Creation ends when every member has mapped
every segment it needs (a barrier); then each member unlinks its segment's name.

What not to assume: "same host" means same host *and* same ``/dev/shm``; containers on
one host are different hosts here unless they share it.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch

from torchnext.distributed.rma._progress import ProgressServer, RemotePeer, RequestHandler
from torchnext.distributed.rma._shm import Segment, host_id
from torchnext.distributed.rma.config import WindowConfig
from torchnext.distributed.rma.rendezvous import StoreRendezvous
from torchnext.errors import WindowError

__all__ = ["Connections", "connect"]


@dataclass(frozen=True)
class Connections:
    """What a member holds after creation, per rank of the group."""

    numels: list[int]
    """Elements in each rank's window."""
    bells: list[str]
    """Each rank's doorbell address ("" for ranks on other hosts: they cannot be rung)."""
    peers: dict[int, Segment | RemotePeer]
    """Every other rank: its mapped segment, or the channel to its progress server."""
    server: ProgressServer | None
    """This member's progress server, when some peer reaches it over TCP."""


def connect(
    rendezvous: StoreRendezvous,
    *,
    rank: int,
    size: int,
    config: WindowConfig,
    own: Segment,
    bell_address: str,
    handler: RequestHandler,
) -> Connections:
    """Collective: exchange, map or connect every peer, then unlink ``own``'s name."""
    dtype = own.dtype
    me: dict[str, Any] = {
        "host": host_id(),
        "path": str(own.path),
        "dtype": str(dtype),
        "numel": own.numel,
        "pid": os.getpid(),
        "bell": bell_address,
    }
    peers = [json.loads(s) for s in rendezvous.all_gather("info", json.dumps(me))]
    for r, p in enumerate(peers):
        if p["dtype"] != str(dtype):
            raise WindowError(
                f"Window creation: rank {r} registered dtype {p['dtype']}, this rank {dtype}; "
                "every member must register the same dtype"
            )
    transport = config.transport
    remote = [
        r
        for r, p in enumerate(peers)
        if r != rank and (transport == "tcp" or p["host"] != me["host"])
    ]
    if transport == "shm" and remote:
        raise WindowError(
            f"Window creation: transport='shm' but ranks {remote} are on another host; use 'auto'"
        )
    server: ProgressServer | None = None
    reached: dict[int, Segment | RemotePeer] = {}
    try:
        if transport == "tcp" or any(p["host"] != me["host"] for p in peers):
            server = ProgressServer(handler, _bind_addr(config, peers, me["host"]))
        addrs = rendezvous.all_gather("addr", server.address if server else "")
        for r, p in enumerate(peers):
            if r == rank:
                continue
            if r in remote:
                if not addrs[r]:
                    raise WindowError(
                        f"Window creation: rank {r} is remote but runs no progress server"
                    )
                reached[r] = RemotePeer(addrs[r], r)
            else:
                reached[r] = _map(p, size, dtype, r)
        rendezvous.barrier("mapped")
    except BaseException:
        # Nothing half-made survives a failed creation: the caller only unlinks its own.
        if server is not None:
            server.close()
        for peer in reached.values():
            peer.close()
        raise
    own.unlink()  # every member has mapped it: no name left behind, even after SIGKILL
    return Connections(
        numels=[int(p["numel"]) for p in peers],
        # Doorbells are reachable on this host only (abstract Unix sockets).
        bells=[str(p.get("bell", "")) if p["host"] == me["host"] else "" for p in peers],
        peers=reached,
        server=server,
    )


def _map(peer: dict[str, Any], size: int, dtype: torch.dtype, rank: int) -> Segment:
    try:
        return Segment.open(peer["path"], world=size, dtype=dtype, numel=int(peer["numel"]))
    except OSError as exc:
        raise WindowError(
            f"Window creation: cannot map rank {rank}'s segment {peer['path']} ({exc}); the "
            "members do not share /dev/shm (separate containers?): pass "
            "WindowConfig(transport='tcp')"
        ) from None


def _bind_addr(config: WindowConfig, peers: list[dict[str, Any]], my_host: str) -> str:
    if config.bind_addr:
        return config.bind_addr
    from torchnext._env import TORCHNEXT_RMA_ADDR

    configured = TORCHNEXT_RMA_ADDR.get()
    if configured:
        return configured
    if all(p["host"] == my_host for p in peers):
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())
