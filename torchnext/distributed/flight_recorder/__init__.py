"""The flight recorder: what every rank's communication ops did, dumped when a job hangs.

Use it as a module, the way it has always been used::

    from torchnext.distributed import flight_recorder as fr
    fr.enable()                      # or TORCHNEXT_FR_ENABLE=1 before the import
    fr.install_signal_handler()      # `kill -USR1 <pid>` dumps, even mid-hang
    fr.dump()                        # on demand

The parts: :mod:`.recorder` (the process-wide switch, what this package's functions
are), :mod:`.buffer` (the ring of op entries), :mod:`.format` (the dump file),
:mod:`.patch` (wrappers around plain ``torch.distributed`` calls),
:mod:`.dump_signal` (dumping from a signal), :mod:`.exits` (a worker's last record),
and the offline side: :mod:`.analyzer`, :mod:`.crossgroup`, :mod:`.report`,
:mod:`.export`, :mod:`.timeline` (HTML), :mod:`.chrome_trace` (Perfetto) and the ``torchnext fr`` command (:mod:`.cli`).

What not to assume: names are loaded on first use, so reading the analyzer never
loads the recording side and the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext._lazy import lazy_exports

if TYPE_CHECKING:
    from torchnext.distributed.flight_recorder.analyzer import analyze, load_dumps
    from torchnext.distributed.flight_recorder.chrome_trace import write_chrome_trace
    from torchnext.distributed.flight_recorder.recorder import (
        FlightRecorder,
        FlightRecorderConfig,
        attach,
        disable,
        dump,
        enable,
        get_recorder,
        install_signal_handler,
        is_enabled,
    )

__all__ = [
    "FlightRecorder",
    "FlightRecorderConfig",
    "analyze",
    "attach",
    "disable",
    "dump",
    "enable",
    "get_recorder",
    "install_signal_handler",
    "is_enabled",
    "load_dumps",
    "write_chrome_trace",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FlightRecorder": "recorder",
        "FlightRecorderConfig": "recorder",
        "attach": "recorder",
        "disable": "recorder",
        "dump": "recorder",
        "enable": "recorder",
        "get_recorder": "recorder",
        "install_signal_handler": "recorder",
        "is_enabled": "recorder",
        "analyze": "analyzer",
        "load_dumps": "analyzer",
        "write_chrome_trace": "chrome_trace",
    },
)
