"""The GEMM autotuner: time the routes once per problem class, keep the winner on disk.

Use it through :func:`torchnext.gemm.gemm`, which asks :func:`choose` on every call. A problem
class is (device, dtypes, M rounded up to a power of two, K, N, bias, epilogue signature,
thread count, torch build); the first call of a class times every route that applies on the
call's own inputs, checks each against the reference route (``aten+eager``: torch's GEMM, then
the steps as eager code), and stores the fastest. ATen is kept unless another route beats it
by more than :data:`MARGIN` in the median and in three runs of four, so a route that cannot
win never replaces torch's own: :func:`fallback`, which is torch's GEMM with the steps in place
on its fresh output (``aten+inplace``, the same operations without a new tensor per step), or
``aten+eager`` for a call without steps or with an operand of another dtype.

The store is one small JSON file per class in :func:`cache_dir`, written to a temporary file
and renamed into place (``os.replace`` is atomic on POSIX), so concurrent processes sharing
the folder read either no file or a whole one, never a torn one; two processes tuning the
same class at once both write a valid choice and the later one stays. A file that does not
parse is treated as absent and rewritten. In memory, a dictionary answers repeat calls in a
dictionary lookup.

``TORCHNEXT_GEMM_AUTOTUNE``: ``on`` (default) tunes unseen classes; ``cached`` uses stored
choices and ATen otherwise (no timing at run time); ``off`` always takes ATen.

What not to assume: a choice is only as good as the machine was quiet when it was timed;
delete the folder (or call :func:`clear`) to tune again. Under ``torch.compile`` tracing no
timing runs: the stored choice or ATen is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from torchnext import _env
from torchnext.compat.gemm_internals import torch_version_key
from torchnext.errors import GemmInputError
from torchnext.gemm import prepared
from torchnext.gemm.routes import Problem, Route, route, routes_for

__all__ = [
    "MARGIN",
    "cache_dir",
    "choose",
    "clear",
    "clearly_faster",
    "fallback",
    "problem_key",
    "remembered",
    "tuned_choices",
]

log = logging.getLogger(__name__)

# A route replaces ATen only when at least this much faster (median of interleaved runs),
# and faster in three runs of four (see clearly_faster).
MARGIN = 0.03
_TUNE_BUDGET_S = 0.03
"""About how long each route is timed for when tuning a class (interleaved runs)."""
_MIN_REPS, _MAX_REPS = 7, 41
_REFERENCE = "aten+eager"
_MODES = ("on", "cached", "off")

_memory: dict[tuple[object, ...], Route] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where tuned choices live (``TORCHNEXT_GEMM_CACHE_DIR`` or the user's cache folder)."""
    configured = _env.TORCHNEXT_GEMM_CACHE_DIR.get()
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchnext" / "gemm"


def _bucket(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def problem_key(p: Problem) -> tuple[object, ...]:
    """The problem class a choice is kept for (hashable, cheap: it runs on every call).

    The torch build is not part of it: it is fixed within a process, and the files on disk
    carry it (see :func:`_file_for`).
    """
    a = p.a_MK
    m, k = a.shape
    n = p.b_KN.shape[1]
    # is_cuda is the cheapest device test; other devices pay for device.type.
    device = "cuda" if a.is_cuda else ("cpu" if a.is_cpu else a.device.type)
    return (
        device,
        a.dtype,
        p.b_KN.dtype,
        p.out_dtype,
        _bucket(m),
        k,
        n,
        p.bias_N is not None,
        p.epilogue.signature(m, n),
        torch.get_num_threads(),
    )


_VERSION = torch_version_key()


def _file_for(key: tuple[object, ...]) -> Path:
    digest = hashlib.sha256(repr((key, _VERSION)).encode()).hexdigest()[:24]
    return cache_dir() / f"{digest}.json"


def _mode() -> str:
    mode = _env.TORCHNEXT_GEMM_AUTOTUNE.get().strip().lower()
    if mode not in _MODES:
        raise GemmInputError(
            f"TORCHNEXT_GEMM_AUTOTUNE={mode!r}: expected one of {', '.join(_MODES)}; unset it "
            "for the default 'on'"
        )
    return mode


def _read(key: tuple[object, ...]) -> str | None:
    path = _file_for(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != repr((key, _VERSION)):
        return None  # a torn/foreign file, or a hash collision: treat as absent
    choice = record.get("route")
    return choice if isinstance(choice, str) else None


def _write(key: tuple[object, ...], choice: str, timings: dict[str, float]) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "key": repr((key, _VERSION)),
            "route": choice,
            "median_s": timings,
            "time": time.time(),
        }
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tune-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, _file_for(key))
    except OSError as exc:  # a read-only cache folder costs re-tuning, never a failure
        log.warning("torchnext.gemm: cannot store a tuned choice in %s: %s", folder, exc)


def choose(p: Problem) -> Route:
    """The route for ``p``: remembered, read from disk, or tuned now (see the module doc)."""
    key = problem_key(p)
    known = _memory.get(key)
    if known is not None:
        return known
    mode = _mode()
    if mode == "off":
        return route(fallback(p))
    with _lock:
        remembered = _memory.get(key)
        if remembered is not None:
            return remembered
        name = _read(key)
        if name is None and (mode == "cached" or torch.compiler.is_compiling()):
            return route(fallback(p))
        if name is None:
            name, timings = _tune(p)
            _write(key, name, timings)
        try:
            chosen = route(name)
        except KeyError:  # a choice stored by another torchnext version
            name, timings = _tune(p)
            _write(key, name, timings)
            chosen = route(name)
        _memory[key] = chosen
    return chosen


def remembered(p: Problem) -> bool:
    """Whether this process keeps a choice for ``p``'s problem class (tuned or read)."""
    return problem_key(p) in _memory


def fallback(p: Problem) -> str:
    """torch's own route for ``p``, kept where no other wins: the steps in place on the GEMM's
    fresh output, which eager code would compute the same, or ``aten+eager`` where an operand
    of another dtype would promote eager code's result (in place keeps the GEMM's dtype) and
    for a call without steps. Callers run ``aten+eager`` while autograd records."""
    if not p.epilogue.steps:
        return _REFERENCE
    dtype = p.a_MK.dtype
    if any(t.dtype != dtype for t in p.epilogue.captured if t is not p.epilogue.amax_into):
        return _REFERENCE
    return "aten+inplace"


def _sync(p: Problem) -> None:
    if p.a_MK.device.type == "cuda":
        torch.cuda.synchronize(p.a_MK.device)


def _close(got: torch.Tensor, want: torch.Tensor, k: int) -> bool:
    # Routes differ in summation order and in the dtype the steps run in: allow the output
    # dtype's rounding plus float32 accumulation over K.
    eps = torch.finfo(want.dtype).eps if want.is_floating_point() else 0.0
    tol = 8 * eps + 4 * k * torch.finfo(torch.float32).eps
    scale = want.detach().abs().float().amax().clamp_min(1.0)
    return bool(((got.float() - want.float()).abs().amax() <= tol * scale).item())


def _tune(p: Problem) -> tuple[str, dict[str, float]]:
    """Time each applicable route on ``p``'s inputs, interleaved; the winner's name."""
    candidates = routes_for(p)
    amax = p.epilogue.amax_into
    saved = None if amax is None else amax.clone()
    reference = route(_REFERENCE).run(p)
    default = fallback(p)
    k = p.a_MK.shape[1]
    usable: list[Route] = []
    warm_s: dict[str, float] = {}
    for r in candidates:
        try:
            out = r.run(p)  # the first run compiles, packs, warms caches: not timed
            _sync(p)
            start = time.perf_counter()
            r.run(p)
            _sync(p)
            warm_s[r.name] = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - a route that fails here is not chosen
            log.debug("torchnext.gemm: route %s failed on %s: %s", r.name, problem_key(p), exc)
            continue
        if r.name != _REFERENCE and (out.shape != reference.shape or not _close(out, reference, k)):
            log.debug("torchnext.gemm: route %s disagrees with ATen; not chosen", r.name)
            continue
        usable.append(r)
    if default not in (r.name for r in usable):
        default = _REFERENCE  # the in-place run failed: torch's eager chain is what is left
    fastest = min(warm_s.values(), default=0.0)
    usable = [r for r in usable if r.name == default or warm_s[r.name] <= 2 * fastest]
    # Routes more than twice as slow as the fastest warm run are dropped; the rest are timed
    # interleaved (order rotating), so drift of the machine hits them alike, for about
    # _TUNE_BUDGET_S each: 7 runs of a large call, up to 41 of a small one, whose single
    # runs are noisy enough on a busy machine to crown the wrong route with 7.
    samples: dict[str, list[float]] = {r.name: [] for r in usable}
    reps = min(_MAX_REPS, max(_MIN_REPS, int(_TUNE_BUDGET_S / max(fastest, 1e-6))))
    if fastest >= 0.05:
        reps = 3
    for rep in range(reps):
        order = usable[rep % len(usable) :] + usable[: rep % len(usable)]
        for r in order:
            _sync(p)
            start = time.perf_counter()
            r.run(p)
            _sync(p)
            samples[r.name].append(time.perf_counter() - start)
    if saved is not None and amax is not None:
        amax.copy_(saved)
    medians = {name: statistics.median(s) for name, s in samples.items() if s}
    best = min(medians, key=medians.__getitem__, default=default)
    if best != default and not clearly_faster(samples[best], samples.get(default, [])):
        best = default
    log.info("torchnext.gemm: tuned %s -> %s (%s)", problem_key(p), best, medians)
    return best, medians


def clearly_faster(route_s: list[float], reference_s: list[float]) -> bool:
    """Whether a route's times beat the reference's clearly: its median by :data:`MARGIN`,
    and its upper quartile below the reference's median (a route that is faster only in
    its lucky runs stays out)."""
    if not route_s:
        raise ValueError("clearly_faster(route_s=[]): pass at least one timing of the route")
    if not reference_s:
        return True
    reference = statistics.median(reference_s)
    upper = statistics.quantiles(route_s, n=4)[2] if len(route_s) >= 2 else route_s[0]
    return statistics.median(route_s) <= reference * (1 - MARGIN) and upper < reference


def tuned_choices() -> dict[str, str]:
    """This process's remembered choices (problem class -> route), for inspection."""
    return {repr(k): v.name for k, v in _memory.items()}


def clear(*, disk: bool = False) -> None:
    """Forget remembered choices (and, with ``disk=True``, delete the stored ones)."""
    with _lock:
        _memory.clear()
        prepared.clear()
        if disk:
            for path in cache_dir().glob("*.json"):
                path.unlink(missing_ok=True)
