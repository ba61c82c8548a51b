"""Flight recorder for every backend: capture communication ops, dump them when things go wrong.

Use it to find out, after a distributed job hung or failed, which rank skipped a
collective, which one called it with another size or dtype, and where each rank was
stuck. One call turns it on for the whole process::

    from torchnext.distributed import flight_recorder as fr
    fr.enable()                                  # or TORCHNEXT_FR_ENABLE=1
    fr.install_signal_handler()                  # optional: `kill -USR1 <pid>` dumps
    ...
    fr.dump()                                    # on demand

Once enabled it records every op of torchnext's groups (through
:mod:`torchnext.distributed._hooks`) and every plain ``torch.distributed`` collective
and point-to-point call (through wrappers, any backend: gloo included). It dumps by
itself when an op fails, times out or is revoked, and when a group it is
:func:`attach`-ed to is revoked. Dumps are JSON files, one per rank and incident, in
``TORCHNEXT_FR_DUMP_DIR`` (default ``./torchnext-fr``); read them with
``torchnext fr analyze DIR`` (:mod:`torchnext.distributed.fr_analyze`).

What not to assume: the recorder is process-wide and Python-level (it sees what
Python calls; a collective issued from C++ only is invisible); timestamps are host
times at call and return, not device times.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from torchnext.distributed import _fr_patch, _hooks
from torchnext.distributed._fr_buffer import FlightRecorder, FlightRecorderConfig

__all__ = [
    "FlightRecorder",
    "FlightRecorderConfig",
    "enable",
    "disable",
    "is_enabled",
    "get_recorder",
    "dump",
    "attach",
    "install_signal_handler",
]

logger: logging.Logger = logging.getLogger(__name__)

_recorder: FlightRecorder | None = None
_enabled = False
_lock = threading.Lock()


class _RevocableGroup(Protocol):
    def add_revoke_callback(self, fn: Callable[[Any], None]) -> None: ...


def _config_from_env() -> FlightRecorderConfig:
    from torchnext._env import TORCHNEXT_FR_BUFFER_SIZE, TORCHNEXT_FR_DUMP_DIR, TORCHNEXT_FR_STACKS

    return FlightRecorderConfig(
        buffer_size=TORCHNEXT_FR_BUFFER_SIZE.get(),
        stacks=TORCHNEXT_FR_STACKS.get(),
        dump_dir=TORCHNEXT_FR_DUMP_DIR.get(),
    )


def get_recorder() -> FlightRecorder:
    """The process's recorder (created from the environment's settings on first use)."""
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = FlightRecorder(_config_from_env())
        return _recorder


def _current() -> FlightRecorder | None:
    return _recorder if _enabled else None


def enable(
    config: FlightRecorderConfig | None = None, *, torch_distributed: bool = True
) -> FlightRecorder:
    """Start recording; returns the recorder. Idempotent; a new ``config`` replaces the buffer.

    Args:
        config: buffer size, stacks, dump folder...; default from ``TORCHNEXT_FR_*``.
        torch_distributed: also record plain ``torch.distributed`` calls (wraps its
            functions; see :mod:`torchnext.distributed._fr_patch` for the one caveat).
    """
    global _recorder, _enabled
    with _lock:
        if config is not None and (_recorder is None or _recorder.config != config):
            if _recorder is not None:
                _hooks.unregister_observer(_recorder)
            _recorder = FlightRecorder(config)
        elif _recorder is None:
            _recorder = FlightRecorder(_config_from_env())
        recorder = _recorder
        _enabled = True
    _hooks.register_observer(recorder)
    if torch_distributed:
        _fr_patch.patch(_current)
    return recorder


def disable() -> None:
    """Stop recording (the buffer is kept and can still be dumped)."""
    global _enabled
    with _lock:
        _enabled = False
        recorder = _recorder
    if recorder is not None:
        _hooks.unregister_observer(recorder)
    _fr_patch.unpatch()


def is_enabled() -> bool:
    return _enabled


def dump(directory: str | Path | None = None, *, reason: str = "on_demand") -> Path:
    """Write this rank's dump now; returns the file's path."""
    return get_recorder().dump(directory, reason=reason)


def attach(group: Any, recorder: FlightRecorder | None = None) -> None:
    """Dump when ``group`` is revoked, and name its backend in the dumps.

    ``group`` is anything with ``add_revoke_callback`` (a
    :class:`~torchnext.distributed.FaultTolerantGroup`); its ``name``, ``backend`` and
    ``rank`` attributes are used when present. The dump records the revoke's epoch,
    suspects and reason, which the analyzer reports.
    """
    rec = recorder if recorder is not None else get_recorder()
    name = getattr(group, "name", None)
    backend = getattr(group, "backend", None)
    if isinstance(name, str):
        rec.set_group_info(name, backend=str(backend) if backend else None)

    def on_revoke(err: Any) -> None:
        epoch = int(getattr(err, "epoch", getattr(group, "epoch", 0)) or 0)
        rec._auto_dump(
            "revoke",
            epoch,
            revoke={
                "group": name,
                "epoch": epoch,
                "suspects": list(getattr(err, "suspects", ()) or ()),
                "reason": str(getattr(err, "reason", "") or err),
            },
        )

    group.add_revoke_callback(on_revoke)


_installed: dict[int, Any] = {}


def install_signal_handler(signum: int = signal.SIGUSR1) -> None:
    """Dump when the process receives ``signum`` (main thread only; chains earlier handlers).

    The handler runs between bytecodes of the main thread, possibly while that thread
    is inside the recorder; the dump's bounded lock wait keeps it from deadlocking.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "install_signal_handler: call it from the main thread (Python delivers signals there)"
        )
    if signum in _installed:
        return
    previous = signal.getsignal(signum)

    def handler(sig: int, frame: FrameType | None) -> None:
        try:
            get_recorder().dump(reason=f"signal{sig}")
        except Exception:  # noqa: BLE001 - a signal handler must not raise into user code
            logger.exception("flight recorder: dump on signal %d failed", sig)
        if callable(previous):
            previous(sig, frame)

    _installed[signum] = previous
    signal.signal(signum, handler)


def _maybe_enable_from_env() -> None:
    from torchnext._env import TORCHNEXT_FR_ENABLE

    if TORCHNEXT_FR_ENABLE.get() and not _enabled:
        enable()


_maybe_enable_from_env()
