"""The bounded store client: a connection ended on purpose fails its call with the reason."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from torchnext.distributed.launch.bounded_store import BoundedTCPStore
from torchnext.distributed.launch.store import host_store
from torchnext.errors import StaleEpochError, StoreUnreachableError

TIMEOUT = timedelta(seconds=20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def client() -> Iterator[BoundedTCPStore]:
    port = _free_port()
    server = host_store("127.0.0.1", port, TIMEOUT)
    store = BoundedTCPStore("127.0.0.1", port, timeout=TIMEOUT)
    try:
        yield store
    finally:
        store.close()
        del server


def _blocked_wait(store: BoundedTCPStore, reason: BaseException | None) -> BaseException:
    """Reset ``store`` (with ``reason``) while another thread waits on a key that never
    comes; returns what that wait raised. The reset repeats until the wait ends: a reset
    that came before the wait was sent is followed by one that cuts it."""
    box: dict[str, Any] = {}

    def waiter() -> None:
        try:
            store.wait(["never-set"], timedelta(seconds=15))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while thread.is_alive() and time.monotonic() < deadline:
        store.reset(reason)
        thread.join(0.05)
    if thread.is_alive():
        raise AssertionError("a reset did not end a call blocked on the store within 10 s")
    return box["error"]


def test_a_reset_with_a_reason_raises_it_in_the_call_it_cut(client: BoundedTCPStore) -> None:
    reason = StaleEpochError("member w1 was left out of epoch 1")
    error = _blocked_wait(client, reason)
    assert error is reason
    # The store is fine: the next call opens a fresh connection and works.
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_a_reset_without_a_reason_is_a_store_failure(client: BoundedTCPStore) -> None:
    error = _blocked_wait(client, None)
    assert isinstance(error, StoreUnreachableError), repr(error)
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_a_reason_applies_only_to_the_connection_it_cut(client: BoundedTCPStore) -> None:
    _blocked_wait(client, StaleEpochError("gone"))
    # A later failure on a new connection is what it is: a wait that ran out.
    with pytest.raises(RuntimeError) as info:
        client.wait(["never-set"], timedelta(milliseconds=200))
    assert not isinstance(info.value, StaleEpochError)
