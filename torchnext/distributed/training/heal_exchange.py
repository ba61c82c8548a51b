"""One state transfer between a healer and a joiner, arranged through the group's store.

Use it from the training :class:`~torchnext.distributed.training.manager.Manager`: a
member chosen as a healer calls :meth:`HealExchange.serve` with its state, a joiner
calls :meth:`HealExchange.fetch` with the healer's member id. The healer listens on
its own socket (:class:`~torchnext.distributed.training.healing.StateServer`) and
publishes its address and a one-time token under the epoch's key; the joiner waits for
that key, bounded, and gives up early when the group is revoked meanwhile.

What not to assume: one exchange object serves every heal of its member (the
listening socket is kept between heals); :meth:`close` releases it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.training.healing import (
    StateServer,
    TransferStats,
    fetch_state,
    local_address_towards,
)
from torchnext.errors import CommTimeoutError, HealingError

__all__ = ["HealExchange"]

_HEAL_KEY = "torchnext/heal"

Emit = Callable[..., None]
"""``emit(kind, **detail)``: reports a manager event."""


class HealExchange:
    """The healer's and the joiner's halves of a heal for one member (see the module docstring)."""

    def __init__(
        self, group: FaultTolerantGroup, *, heal_host: str, timeout: timedelta, emit: Emit
    ) -> None:
        self.group = group
        self.heal_host = heal_host
        self.timeout = timeout
        self.emit = emit
        self._server: StateServer | None = None

    def _key(self, member_id: str) -> str:
        return f"{_HEAL_KEY}/{self.group.epoch}/{member_id}"

    def _server_now(self) -> StateServer:
        if self._server is None:
            host = self.heal_host
            if not host:
                store = self.group.store
                host = local_address_towards(
                    str(getattr(store, "host", "127.0.0.1")), int(getattr(store, "port", 0))
                )
            self._server = StateServer(host=host)
        return self._server

    def serve(
        self,
        state: dict[str, Any],
        joiners: list[str],
        check_entries: Callable[[Any, str], list[str]],
    ) -> list[TransferStats]:
        """Send ``state`` to ``joiners`` (member ids), refusing those ``check_entries`` rejects."""
        server = self._server_now()
        self.emit("serving_heal", to=joiners)
        self.group.store.set(
            self._key(str(self.group.member_id)),
            json.dumps({"address": server.address, "token": server.token}),
        )
        served = server.serve(
            state, joiners=joiners, timeout=self.timeout, check_entries=check_entries
        )
        for s in served:
            self.emit(
                "served_heal",
                to=s.peer,
                bytes=s.total_bytes,
                seconds=s.seconds,
                mb_per_s=s.mb_per_s,
            )
        return served

    def fetch(
        self,
        source_id: str,
        *,
        model_spec: list[tuple[str, str, tuple[int, ...]]],
        entries: dict[str, bool],
    ) -> tuple[Any, TransferStats]:
        """Receive the state of ``source_id`` once it has published where to get it."""
        self.emit("healing", source=source_id)
        info = self._wait_key(self._key(source_id))
        return fetch_state(
            info["address"],
            member_id=str(self.group.member_id),
            token=info["token"],
            model_spec=model_spec,
            timeout=self.timeout,
            peer=source_id,
            entries=entries,
        )

    def _wait_key(self, key: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout.total_seconds()
        store = self.group.store
        while not store.check([key]):
            if self.group.is_revoked:
                raise HealingError(
                    f"{self.group.member_id}: group revoked while waiting for the healer ({key})"
                )
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{self.group.member_id}: healer did not publish {key} within {self.timeout}"
                )
            time.sleep(0.005)
        return dict(json.loads(store.get(key)))

    def close(self) -> None:
        """Release the listening socket (a later :meth:`serve` opens a new one)."""
        if self._server is not None:
            self._server.close()
            self._server = None
