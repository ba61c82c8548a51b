"""Entry point ``torchnext run`` wraps each worker in: runs the user's script, records bugs.

An uncaught exception is a *bug*, not a crash: its traceback is written to the file
named by ``TORCHNEXT_ERROR_FILE`` so the agent can show it and refrain from restarting
the worker (a restart would raise again). Crashes (signals) leave no such file.
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

import os  # noqa: E402
import runpy  # noqa: E402
import traceback  # noqa: E402

from torchnext._env import TORCHNEXT_ERROR_FILE  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: _worker_entry script.py [args] | -m module [args]", file=sys.stderr)
        return 2
    as_module = argv[0] == "-m"
    target = argv[1] if as_module else argv[0]
    rest = argv[2:] if as_module else argv[1:]
    sys.argv = [target, *rest]
    sys.path.insert(0, "" if as_module else os.path.dirname(os.path.abspath(target)))
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        text = traceback.format_exc()
        path = TORCHNEXT_ERROR_FILE.get()
        if path:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
