"""Observer hooks on every communication op of torchnext's groups.

The flight recorder (and anything else that wants to watch ops: metrics, NaN checks)
registers an :class:`OpObserver`; a group calls :func:`op_started` before it issues an
op and :func:`op_finished` when the op completes, fails or is revoked. With no observer
registered the cost is one truthiness test of a list, so groups call these
unconditionally.

Observers must not raise and must not block: they run on the communication path. An
observer that raises is removed and the error reported once through ``logging``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

__all__ = [
    "OpInfo",
    "OpObserver",
    "describe",
    "register_observer",
    "unregister_observer",
    "op_started",
    "op_finished",
]

logger: logging.Logger = logging.getLogger(__name__)

OpState = Literal["completed", "failed", "revoked", "timed_out"]


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What an op is about to do. Tensors are described, never kept (no memory pinned)."""

    group_name: str
    """Stable name of the group (same on every member), e.g. ``"default"`` or ``"default/split0"``."""
    epoch: int
    """Membership epoch the op runs in."""
    seq: int
    """Per-group sequence number of this op (collective and point-to-point counted apart)."""
    op: str
    """Op name in PyTorch's flight-recorder vocabulary: ``allreduce``, ``broadcast``, ``send``..."""
    rank: int
    """This process's rank in the group."""
    ranks: tuple[int, ...]
    """Global ranks of the group's members, in group-rank order."""
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    is_p2p: bool = False
    timeout_ms: int = 0


class OpObserver(Protocol):
    def on_start(self, info: OpInfo) -> int:
        """Called before the op is issued; returns a token passed to ``on_finish``."""
        ...

    def on_finish(self, token: int, state: OpState) -> None:
        """Called once when the op ends in ``state``."""
        ...


observers: list[OpObserver] = []
"""The registered observers; read it to skip work nobody watches, change it only
through :func:`register_observer` and :func:`unregister_observer`."""


def register_observer(observer: OpObserver) -> None:
    if observer not in observers:
        observers.append(observer)


def unregister_observer(observer: OpObserver) -> None:
    if observer in observers:
        observers.remove(observer)


def describe(tensors: list[torch.Tensor]) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Sizes and dtype names of ``tensors``, as OpInfo wants them."""
    return tuple(tuple(t.shape) for t in tensors), tuple(
        str(t.dtype).removeprefix("torch.") for t in tensors
    )


def op_started(info: OpInfo) -> list[tuple[OpObserver, int]] | None:
    """Notify observers; returns the tokens to hand to :func:`op_finished` (None if none)."""
    if not observers:
        return None
    tokens = []
    for obs in list(observers):
        try:
            tokens.append((obs, obs.on_start(info)))
        except Exception:  # noqa: BLE001 - an observer must never break communication
            logger.exception("op observer %r raised in on_start; removing it", obs)
            unregister_observer(obs)
    return tokens


def op_finished(tokens: list[tuple[OpObserver, int]] | None, state: OpState) -> None:
    if not tokens:
        return
    for obs, token in tokens:
        try:
            obs.on_finish(token, state)
        except Exception:  # noqa: BLE001
            logger.exception("op observer %r raised in on_finish; removing it", obs)
            unregister_observer(obs)
