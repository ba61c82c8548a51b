"""Healing transport: stream training state from a live peer to a joiner over TCP.

Use it to bring a replacement (or lagging) process up to date without touching disk:
the *healer* runs a :class:`StateServer` and publishes its address; the *joiner* calls
:func:`fetch_state` and gets back the same nested structure of tensors and plain
values (model and optimizer ``state_dict``, data position, RNG states, step).

Wire format, chosen for speed and safety: an 8-byte length and a JSON header that
describes the structure (dicts, lists, tuples, numbers, strings) and every tensor's
dtype and shape, then the tensors' raw bytes back to back. Nothing is unpickled, so a
peer can never make the receiver run code; tensors are received straight into their
final storage (``recv_into``), with no intermediate copy.

Before sending, the healer compares the joiner's model description (names, dtypes,
shapes of its ``"model"`` entries) with its own and refuses a mismatch with a
:class:`~torchnext.errors.HealingError` that names the first differing entries.

What not to assume: tensors arrive on CPU (move them yourself); every wait is bounded
by the ``timeout`` given; a server serves one snapshot per :meth:`StateServer.serve`
call and keeps its listening socket between calls.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from torchnext.errors import CommTimeoutError, HealingError, HealingRefusedError

__all__ = [
    "rng_state",
    "set_rng_state",
    "TransferStats",
    "StateServer",
    "fetch_state",
    "describe_tensors",
    "check_compatible",
    "local_address_towards",
]

_LEN = struct.Struct("<Q")
_MAX_HEADER_BYTES = 256 * 1024 * 1024
_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class TransferStats:
    """One state transfer, as measured by the side that reports it."""

    peer: str
    """Member id of the other side."""
    total_bytes: int
    """Tensor payload bytes (the header is not counted)."""
    seconds: float
    """Wall time from connection accepted/opened to last byte."""

    @property
    def mb_per_s(self) -> float:
        return self.total_bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")


# ---------------------------------------------------------------------------- encoding


def _encode(obj: Any, tensors: list[torch.Tensor], path: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"T": len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        flat = torch.from_numpy(np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy())
        tensors.append(flat)
        return {"N": len(tensors) - 1, "np": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors, path)
    if isinstance(obj, dict):
        return {
            "d": [
                [_encode(k, tensors, path), _encode(v, tensors, f"{path}.{k}" if path else str(k))]
                for k, v in obj.items()
            ]
        }
    if isinstance(obj, tuple):
        return {"t": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return {"l": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]}
    raise HealingError(
        f"state entry {path or '<root>'} has type {type(obj).__name__}, which the healing "
        "transport does not carry; keep state to tensors, numpy arrays, numbers, strings, "
        "None and dict/list/tuple of those."
    )


def _decode(node: Any, tensors: list[torch.Tensor]) -> Any:
    if not isinstance(node, dict):
        return node
    if "T" in node:
        return tensors[node["T"]]
    if "N" in node:
        raw = tensors[node["N"]].numpy()
        return (
            np.frombuffer(raw.tobytes(), dtype=np.dtype(node["np"])).reshape(node["shape"]).copy()
        )
    if "d" in node:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in node["d"]}
    if "t" in node:
        return tuple(_decode(v, tensors) for v in node["t"])
    if "l" in node:
        return [_decode(v, tensors) for v in node["l"]]
    raise HealingError(
        f"healing header holds an unknown node {sorted(node)!r}; peers differ in version?"
    )


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise HealingError(f"healing header names dtype {name!r}, which this torch does not have.")
    return dtype


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8)


def describe_tensors(obj: Any, prefix: str = "") -> list[tuple[str, str, tuple[int, ...]]]:
    """``(path, dtype, shape)`` of every tensor in ``obj``, in a stable order."""
    out: list[tuple[str, str, tuple[int, ...]]] = []
    if isinstance(obj, torch.Tensor):
        out.append((prefix, str(obj.dtype).removeprefix("torch."), tuple(obj.shape)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(describe_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.extend(describe_tensors(v, f"{prefix}[{i}]"))
    return out


def check_compatible(
    mine: Iterable[tuple[str, str, tuple[int, ...]]],
    theirs: Iterable[tuple[str, str, tuple[int, ...]]],
    *,
    who: str,
) -> None:
    """Raise :class:`HealingError` naming the first differences between two model descriptions."""
    a = {p: (d, tuple(s)) for p, d, s in mine}
    b = {p: (d, tuple(s)) for p, d, s in theirs}
    problems = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            problems.append(f"{path}: only in {who}'s model {b[path]}")
        elif path not in b:
            problems.append(f"{path}: missing from {who}'s model (expected {a[path]})")
        elif a[path] != b[path]:
            problems.append(f"{path}: {who} has {b[path]}, the group has {a[path]}")
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise HealingRefusedError(
            f"refusing to heal {who}: its model differs from the group's: {shown}{more}. "
            "Start the replacement with the same model definition and arguments as the others."
        )


# ---------------------------------------------------------------------------- socket io


def _deadline_left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise CommTimeoutError(
            f"healing: timed out while {what}; raise the heal timeout if state is large."
        )
    return left


def _send_msg(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_exact_into(sock: socket.socket, view: memoryview, deadline: float, what: str) -> None:
    got = 0
    n = len(view)
    while got < n:
        sock.settimeout(_deadline_left(deadline, what))
        try:
            k = sock.recv_into(view[got:], min(n - got, _CHUNK_BYTES))
        except TimeoutError:
            raise CommTimeoutError(f"healing: timed out while {what}") from None
        if k == 0:
            raise HealingError(
                f"healing: peer closed the connection while {what} ({got}/{n} bytes)"
            )
        got += k


def _recv_msg(sock: socket.socket, deadline: float, what: str) -> bytes:
    head = bytearray(_LEN.size)
    _recv_exact_into(sock, memoryview(head), deadline, what)
    (n,) = _LEN.unpack(head)
    if n > _MAX_HEADER_BYTES:
        raise HealingError(f"healing: header of {n} bytes while {what} is implausible; wrong peer?")
    body = bytearray(n)
    _recv_exact_into(sock, memoryview(body), deadline, what)
    return bytes(body)


def local_address_towards(host: str, port: int) -> str:
    """The local IP address this machine uses to reach ``host:port`` (peers can reach it too)."""
    if host in ("localhost", "127.0.0.1", "::1", ""):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, port))  # no packet is sent for UDP connect
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


# ---------------------------------------------------------------------------- server


class StateServer:
    """Listening socket on the healer; :meth:`serve` sends one snapshot to named joiners."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.create_server((host, port), backlog=16)
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        self.token = secrets.token_hex(8)
        """Shared secret a joiner must present; published next to the address."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def serve(
        self,
        state: Any,
        *,
        joiners: Iterable[str],
        timeout: timedelta,
        check_entries: Callable[[Any, str], list[str]] | None = None,
    ) -> list[TransferStats]:
        """Send ``state`` to each member id in ``joiners``; return one stats per transfer.

        A joiner whose model differs, or for whom ``check_entries(its entries, its
        name)`` returns problems (the registered state entries it sent with its
        request), is sent a refusal (it raises on its side) and is reported here by a
        :class:`HealingError` after the others were served. Raises
        :class:`CommTimeoutError` if not every joiner connected within ``timeout``.
        """
        wanted = set(joiners)
        tensors: list[torch.Tensor] = []
        tree = _encode(state, tensors, "")
        raw = [_as_bytes(t) for t in tensors]
        metas: list[dict[str, Any]] = [
            {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "nbytes": int(r.numel()),
            }
            for t, r in zip(tensors, raw, strict=True)
        ]
        model_spec = describe_tensors(state.get("model", {})) if isinstance(state, dict) else []
        header = json.dumps({"ok": True, "tree": tree, "tensors": metas}).encode()
        deadline = time.monotonic() + timeout.total_seconds()
        stats: list[TransferStats] = []
        refused: list[HealingRefusedError] = []
        while wanted:
            self._sock.settimeout(
                _deadline_left(deadline, f"waiting for joiners {sorted(wanted)} to connect")
            )
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                raise CommTimeoutError(
                    f"healing: joiners {sorted(wanted)} did not connect within {timeout}"
                ) from None
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                start = time.monotonic()
                try:
                    request = json.loads(_recv_msg(conn, deadline, "reading a heal request"))
                except (HealingError, CommTimeoutError, ValueError, OSError):
                    continue  # a stray or broken connection; keep waiting for the real joiners
                peer = str(request.get("member_id", ""))
                if request.get("token") != self.token or peer not in wanted:
                    _send_msg(
                        conn,
                        json.dumps({"ok": False, "error": "unknown joiner or bad token"}).encode(),
                    )
                    continue
                theirs = [(p, d, tuple(s)) for p, d, s in request.get("model_spec", [])]
                try:
                    check_compatible(model_spec, theirs, who=f"joiner {peer!r}")
                    problems = (
                        check_entries(request.get("entries", {}), f"joiner {peer!r}")
                        if check_entries is not None
                        else []
                    )
                    if problems:
                        raise HealingRefusedError(
                            f"refusing to heal joiner {peer!r}: " + "; ".join(problems) + ". "
                            "Register the same state entries (Manager.register or state=) "
                            "on every member, replacements included."
                        )
                except HealingRefusedError as exc:
                    _send_msg(conn, json.dumps({"ok": False, "error": str(exc)}).encode())
                    wanted.discard(peer)
                    refused.append(exc)
                    continue
                _send_msg(conn, header)
                for r in raw:
                    if r.numel():
                        conn.sendall(r.numpy().data)
                # The joiner acknowledges after it received everything, so a transfer
                # counts only when its bytes arrived, not when they left our buffer.
                _recv_msg(conn, deadline, f"waiting for {peer!r} to acknowledge")
                stats.append(
                    TransferStats(
                        peer=peer,
                        total_bytes=sum(m["nbytes"] for m in metas),
                        seconds=time.monotonic() - start,
                    )
                )
                wanted.discard(peer)
        if refused:
            raise refused[0]
        return stats

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> StateServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- client


def fetch_state(
    address: str,
    *,
    member_id: str,
    token: str,
    model_spec: list[tuple[str, str, tuple[int, ...]]],
    timeout: timedelta,
    peer: str = "healer",
    entries: dict[str, bool] | None = None,
) -> tuple[Any, TransferStats]:
    """Receive the healer's state at ``address`` (``host:port``); bounded by ``timeout``.

    ``model_spec`` is :func:`describe_tensors` of the joiner's own model state dict and
    ``entries`` its registered state entries (name -> replicated); the healer refuses a
    mismatch, which raises :class:`HealingRefusedError` here with its reason.
    """
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit():
        raise HealingError(f"healing address {address!r} is not host:port")
    deadline = time.monotonic() + timeout.total_seconds()
    start = time.monotonic()
    try:
        sock = socket.create_connection(
            (host, int(port_text)), timeout=_deadline_left(deadline, "connecting")
        )
    except OSError as exc:
        raise HealingError(f"healing: cannot connect to {peer} at {address}: {exc}") from exc
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        try:
            request = {
                "member_id": member_id,
                "token": token,
                "model_spec": model_spec,
                "entries": dict(entries or {}),
            }
            _send_msg(sock, json.dumps(request).encode())
            header = json.loads(_recv_msg(sock, deadline, f"reading the state header from {peer}"))
            if not header.get("ok"):
                raise HealingRefusedError(
                    str(header.get("error", "healer refused without a reason"))
                )
            tensors: list[torch.Tensor] = []
            total = 0
            for meta in header["tensors"]:
                buf = torch.empty(int(meta["nbytes"]), dtype=torch.uint8)
                if buf.numel():
                    _recv_exact_into(
                        sock, buf.numpy().data, deadline, f"receiving state from {peer}"
                    )
                total += buf.numel()
                dtype = _dtype_from_name(meta["dtype"])
                tensors.append(buf.view(dtype).reshape(meta["shape"]))
            _send_msg(sock, b"ack")
        except OSError as exc:
            raise HealingError(f"healing: connection to {peer} at {address} failed: {exc}") from exc
        state = _decode(header["tree"], tensors)
    return state, TransferStats(peer=peer, total_bytes=total, seconds=time.monotonic() - start)


def rng_state() -> dict[str, Any]:
    """This process's torch, NumPy, Python (and CUDA) random states, for a heal."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (on the healed replica)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
