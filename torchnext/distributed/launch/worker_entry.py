"""Entry point ``torchnext run`` wraps each worker in: runs the user's script, records bugs.

An uncaught exception is a *bug*, not a crash: its traceback is written to the file
named by ``TORCHNEXT_ERROR_FILE`` so the agent can show it and refrain from restarting
the worker (a restart would raise again). Crashes (signals) leave no such file. The
traceback is the one Python would print for the script run directly: it starts at the
user's script, without this file's and ``runpy``'s frames, and it is printed once, by
the agent (here only when there is no file to write it to).

Two exceptions are not bugs, and leave with an exit code instead of a traceback: a
worker that its group fenced out (a :class:`~torchnext.errors.StaleEpochError`, or any
exception once one of its groups was evicted: it hung, or its host was cut off and came
back) exits with ``EXIT_EVICTED`` and is replaced; one whose store stopped answering (a
:class:`~torchnext.errors.StoreLostError`) says so in one line and exits with
``EXIT_STORE_LOST``.

At exit, after the script's own exit handlers, every fault-tolerant group the script
left open is shut down: a group's monitor thread is a daemon that talks to the store,
and one caught inside a store call when the interpreter finalizes aborts the process
(``terminate called without an active exception``, SIGABRT), which the agent would
take for a crash of a worker that had in fact finished.
Usage: ``python <path of this file> script.py [args]`` or ``... -m package.module [args]``.
The agent runs this file by path, not with ``-m``, so starting a worker does not import
``torchnext.distributed`` (and torch) before the user's script does; ``sys.path[0]`` is
then set as Python would set it for the user's script (its folder, or the working
directory with ``-m``).
"""

from __future__ import annotations

import sys

# Run by path, Python put this file's folder first on sys.path; take it off before any
# other import so no module of this package can shadow a top-level one.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    del sys.path[0]

import atexit  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import traceback  # noqa: E402
from types import TracebackType  # noqa: E402

from torchnext._env import TORCHNEXT_ERROR_FILE  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: worker_entry script.py [args] | -m module [args]", file=sys.stderr)
        return 2
    as_module = argv[0] == "-m"
    target = argv[1] if as_module else argv[0]
    rest = argv[2:] if as_module else argv[1:]
    sys.argv = [target, *rest]
    sys.path.insert(0, "" if as_module else os.path.dirname(os.path.abspath(target)))
    # Registered before the script runs, so it runs after every handler the script
    # (or a module it imports) registers: those may still use their groups.
    atexit.register(_shut_down_groups)
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:
        code = _not_a_bug(exc)
        if code is not None:
            return code
        _report(exc)
        return 1
    return 0


def _not_a_bug(exc: BaseException) -> int | None:
    """The exit code of an eviction or a lost store (said in one line), else None."""
    errors = sys.modules.get("torchnext.errors")
    if errors is None or isinstance(exc, KeyboardInterrupt):
        return None
    from torchnext.distributed.launch.exits import EXIT_EVICTED, EXIT_STORE_LOST

    seen: list[BaseException] = [exc]
    module = sys.modules.get("torchnext.distributed.group.fault_tolerant_group")
    if module is not None:
        seen += [e for e in (g.errored() for g in module.live_groups()) if e is not None]
    for error in seen:
        if isinstance(error, errors.StoreLostError):
            print(f"worker: the job's store is lost: {error}", file=sys.stderr, flush=True)
            return EXIT_STORE_LOST
    for error in seen:
        if isinstance(error, errors.StaleEpochError):
            print(f"worker: evicted by the group, exiting: {error}", file=sys.stderr, flush=True)
            return EXIT_EVICTED
    return None


def _shut_down_groups() -> None:
    """Stop the groups the script left open, so no monitor thread outlives the interpreter."""
    module = sys.modules.get("torchnext.distributed.group.fault_tolerant_group")
    if module is None:
        return  # the script made no group (and this must not import torch)
    for group in module.live_groups():
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway; never mask the exit code
            pass


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames of this file and of ``runpy`` (which ran the script)."""
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    return tb


def _report(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__)))
    path = TORCHNEXT_ERROR_FILE.get()
    if path:
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError:
            pass  # no file for the agent to print: print it here instead
        else:
            return  # the agent prints it, once, with the worker's exit
    sys.stderr.write(text)
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
