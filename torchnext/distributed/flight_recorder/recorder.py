"""Flight recorder for every backend: capture communication ops, dump them when things go wrong.

Use it to find out, after a distributed job hung or failed, which rank skipped a
collective, which one called it with another size or dtype, and where each rank was
stuck. One call turns it on for the whole process::

    from torchnext.distributed import flight_recorder as fr
    fr.enable()                                  # or TORCHNEXT_FR_ENABLE=1
    fr.install_signal_handler()                  # `kill -USR1 <pid>` dumps, even mid-hang
    ...
    fr.dump()                                    # on demand

Once enabled it records every op of torchnext's groups (through
:mod:`torchnext.distributed.group.hooks`) and every plain ``torch.distributed`` collective
and point-to-point call (through wrappers, any backend: gloo included). It dumps by
itself when an op fails, times out or is revoked, and when a group it is
:func:`attach`-ed to is revoked; enabled from the environment, also when an op has
run for ``TORCHNEXT_FR_STUCK_DUMP_S`` seconds (default 60). Dumps are JSON files, one
per rank and incident, in ``TORCHNEXT_FR_DUMP_DIR`` (default ``./torchnext-fr``); read
them with ``torchnext fr analyze DIR`` (:mod:`torchnext.distributed.flight_recorder.analyzer`).

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
from typing import Any, Protocol

from torchnext.distributed.flight_recorder import dump_signal as _fr_signal
from torchnext.distributed.flight_recorder import patch as _fr_patch
from torchnext.distributed.flight_recorder.buffer import FlightRecorder, FlightRecorderConfig
from torchnext.distributed.group import hooks as _hooks

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
    "enable_from_env",
]

logger: logging.Logger = logging.getLogger(__name__)

_recorder: FlightRecorder | None = None
_enabled = False
_lock = threading.Lock()


class _RevocableGroup(Protocol):
    def add_revoke_callback(self, fn: Callable[[Any], None]) -> None: ...


def _config_from_env(*, enabled_from_env: bool = False) -> FlightRecorderConfig:
    """The ``TORCHNEXT_FR_*`` settings; the stuck-op watchdog defaults on only for env-enabling.

    A job that turns the recorder on with ``TORCHNEXT_FR_ENABLE=1`` changed no code, so
    nothing else would catch a hang before gloo's 30-minute timeout: it gets the
    watchdog's 60 s default. Code that calls :func:`enable` keeps no watchdog unless
    it, or ``TORCHNEXT_FR_STUCK_DUMP_S``, asks for one.
    """
    from torchnext._env import (
        TORCHNEXT_FR_BUFFER_SIZE,
        TORCHNEXT_FR_DUMP_DIR,
        TORCHNEXT_FR_STACKS,
        TORCHNEXT_FR_STUCK_DUMP_S,
    )

    stuck = TORCHNEXT_FR_STUCK_DUMP_S
    return FlightRecorderConfig(
        buffer_size=TORCHNEXT_FR_BUFFER_SIZE.get(),
        stacks=TORCHNEXT_FR_STACKS.get(),
        dump_dir=TORCHNEXT_FR_DUMP_DIR.get(),
        stuck_dump_after=stuck.get() if enabled_from_env or stuck.is_set() else None,
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
            functions; see :mod:`torchnext.distributed.flight_recorder.patch` for the one caveat).
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
        rec.auto_dump(
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


def install_signal_handler(signum: int = signal.SIGUSR1) -> None:
    """Dump when the process receives ``signum``, even while its main thread is blocked.

    Call it from the main thread; a second call for the same signal does nothing. The
    dump (reason ``signal<N>``, the usual file name) is written by a daemon thread that
    the signal wakes at once, so ``kill -USR1 <pid>`` on a rank stuck inside a gloo
    collective dumps within milliseconds instead of when the collective times out.
    The handler installed before is still called, on the main thread, when Python
    runs handlers there. See :mod:`torchnext.distributed.flight_recorder.dump_signal` for the one
    thing that sends dumps back to the main thread (another owner of the process's
    signal wakeup fd).
    """
    _fr_signal.install(signum, _dump_on_signal)


def _dump_on_signal(signum: int) -> None:
    # Not get_recorder() when a recorder exists: the main thread may hold _lock (on the
    # main-thread fallback this runs inside it), and the dump must not wait for it.
    recorder = _recorder if _recorder is not None else get_recorder()
    recorder.dump(reason=f"signal{signum}")


def enable_from_env() -> bool:
    """Enable the recorder if ``TORCHNEXT_FR_ENABLE`` asks for it; whether it is on.

    ``import torchnext.distributed`` calls this when the variable is set, so a job
    switched on from its environment records from its first op. It does nothing
    when the recorder is already on.
    """
    from torchnext._env import TORCHNEXT_FR_ENABLE

    if TORCHNEXT_FR_ENABLE.get() and not _enabled:
        enable(_config_from_env(enabled_from_env=True))
    return _enabled
