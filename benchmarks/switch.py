"""switch with K small branches: torchnext's switch vs a ladder of nested conds (vs native).

For K = 2, 4, 8, 16 and each implementation it measures the Inductor compile time
(first call after a reset, FX graph cache off), the node count of the captured Dynamo
graph (all subgraphs), and the median call time in eager and compiled mode. Under
``torch.compile`` torchnext's switch is one flat node for K >= 3 and one ``cond`` for
K = 2. Runtimes of every K, for torchnext and the ladder, come from one interleaved,
rotating run in this process; torch 2.14.1's native ``switch`` is measured the same way
in a subprocess of a torch 2.14 python when one is found (``--torch214-python``, default
``.venv-214/bin/python`` of the checkout), so its times compare less tightly.

Bars (from the issue): compile time grows no worse than linearly in K; compiled
runtime at K=16 within 1.25x of K=2; node count no larger than the ladder's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchnext.benchmarking import Report, compare

_N = 256  # elements per operand: "small branches"


def _branches(k: int) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    return [lambda x, j=j: (x * (j + 1)).sin() + j for j in range(k)]


def _ladder(index: torch.Tensor, branches: list[Callable[..., Any]], x: torch.Tensor) -> Any:
    """``branches[index](x)`` as if/elif/else: cond(i==0, b0, cond(i==1, b1, ...))."""

    def level(j: int, x: torch.Tensor) -> Any:
        if j == len(branches) - 1:
            return branches[j](x)
        return torch.cond(index == j, branches[j], lambda x: level(j + 1, x), (x,))

    return level(0, x)


def _impls(native: bool) -> dict[str, Callable[..., Any]]:
    if native:
        from torch._higher_order_ops import switch as native_switch

        return {"native": lambda i, b, x: native_switch(i, b, (x,))}
    from torchnext.control_flow import switch

    return {"tree": lambda i, b, x: switch(i, b, (x,)), "ladder": _ladder}


def _count_nodes(fn: Callable[..., Any], args: tuple[Any, ...]) -> int:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return sum(
        len(mod.graph.nodes)
        for gm in graphs
        for mod in gm.modules()
        if isinstance(mod, torch.fx.GraphModule)
    )


def _own_code(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``fn`` with a code object of its own, so Dynamo keeps a separate cache for it.

    Dynamo caches compiled graphs per code object; closures of one ``def`` share one, so
    every (implementation, K) would queue in one cache, and a call would first fail the
    guards of the entries compiled for other K, which costs time that grows with their
    number and has nothing to do with dispatch.
    """
    code = fn.__code__.replace(co_name=f"call_{tag}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return own


def _measure(native: bool, ks: list[int], reps: int) -> dict[str, dict[int, dict[str, float]]]:
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False  # measure compiling, not cache hits
    impls = _impls(native)
    x = torch.randn(_N)
    # Pay Inductor's one-time start-up (imports, C++ toolchain probe) before timing.
    torch._dynamo.reset()
    torch.compile(_ladder, fullgraph=True)(torch.tensor(0), _branches(2), x)
    out: dict[str, dict[int, dict[str, float]]] = {name: {} for name in impls}
    compiled: dict[str, Callable[[], Any]] = {}
    eager: dict[str, Callable[[], Any]] = {}
    for k in ks:
        branches = _branches(k)
        index = torch.tensor(k // 2)
        for name, impl in impls.items():

            def call(
                i: torch.Tensor, x: torch.Tensor, impl: Any = impl, branches: Any = branches
            ) -> Any:
                return impl(i, branches, x)

            call = _own_code(call, f"{name}_k{k}")
            rec = out[name].setdefault(k, {})
            rec["nodes"] = _count_nodes(call, (index, x))
            torch._dynamo.reset()
            start = time.perf_counter()
            call(index, x)  # eager first call: traces once (2.14 semantics)
            rec["eager_first_s"] = time.perf_counter() - start
            # The faster of two cold compiles: a single one is at the mercy of other load.
            rec["compile_s"] = float("inf")
            for _ in range(2):
                torch._dynamo.reset()
                fn = torch.compile(call, fullgraph=True)
                start = time.perf_counter()
                result = fn(index, x)
                rec["compile_s"] = min(rec["compile_s"], time.perf_counter() - start)
            torch.testing.assert_close(result, branches[k // 2](x))
            compiled[f"{name}/{k}"] = lambda fn=fn, index=index: fn(index, x)
            eager[f"{name}/{k}"] = lambda call=call, index=index: call(index, x)
    # Runtimes: every implementation at every K in one interleaved, rotating run, so
    # the K=16 : K=2 ratio compares calls made side by side, not minutes apart. The
    # warm-up rounds recompile what the cold-compile resets above evicted.
    for mode, candidates, mode_reps in (("compiled", compiled, 3 * reps), ("eager", eager, reps)):
        timings = compare(candidates, reps=mode_reps, warmup=3, inner=20)
        for key, timing in timings.items():
            name, k_text = key.split("/")
            rec = out[name][int(k_text)]
            rec[f"{mode}_us"] = timing.median_s * 1e6
            rec[f"{mode}_spread"] = timing.spread
            rec[f"{mode}_p10_us"] = timing.p10_s * 1e6
    return out


def _native_python(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    root = Path(__file__).resolve().parent.parent
    candidate = root / ".venv-214" / "bin" / "python"
    return candidate if candidate.exists() else None


def _run_native(python: Path, ks: list[int], reps: int) -> dict[str, Any] | None:
    cmd = [str(python), str(Path(__file__).resolve()), "--native-only", "--ks", *map(str, ks)]
    cmd += ["--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        print(f"native run failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench switch", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="K = 2, 16 and fewer repetitions")
    parser.add_argument("--ks", type=int, nargs="*", default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--torch214-python", default=None, help="python with torch 2.14 for native")
    parser.add_argument("--no-native", action="store_true", help="skip the native 2.14 run")
    parser.add_argument("--native-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if __name__ not in sys.modules:
        # Loaded from a file path without a sys.modules entry; Dynamo imports a traced
        # function's module by name to guard its globals, so give it one.
        module = types.ModuleType(__name__)
        module.__dict__.update(globals())
        sys.modules[__name__] = module
    ks = args.ks or ([2, 16] if args.quick else [2, 4, 8, 16])
    reps = args.reps or (7 if args.quick else 15)
    if args.native_only:
        data = _measure(True, ks, reps)["native"]
        print(json.dumps({str(k): v for k, v in data.items()}))
        return 0

    results = _measure(False, ks, reps)
    native: dict[str, Any] | None = None
    python = None if args.no_native else _native_python(args.torch214_python)
    if python is not None:
        native = _run_native(python, ks, reps)

    report = Report(
        name="switch",
        columns=["k", "mode", "compile_s", "nodes", "runtime_us"]
        + ["ladder_compile_s", "ladder_nodes", "ladder_runtime_us"]
        + ["native_compile_s", "native_nodes", "native_runtime_us"],
    )
    for k in ks:
        tree, ladder = results["tree"][k], results["ladder"][k]
        nat = native.get(str(k)) if native else None
        for mode in ("eager", "compiled"):
            # compile_s: Inductor compile for "compiled"; the first (tracing) call for "eager".
            key = "compile_s" if mode == "compiled" else "eager_first_s"
            report.add(
                k=k,
                mode=mode,
                compile_s=tree[key],
                nodes=int(tree["nodes"]),
                runtime_us=tree[f"{mode}_us"],
                ladder_compile_s=ladder[key],
                ladder_nodes=int(ladder["nodes"]),
                ladder_runtime_us=ladder[f"{mode}_us"],
                native_compile_s=nat[key] if nat else None,
                native_nodes=int(nat["nodes"]) if nat else None,
                native_runtime_us=nat[f"{mode}_us"] if nat else None,
            )
    k_lo, k_hi = min(ks), max(ks)
    tree = results["tree"]
    compile_ratios = {k: tree[k]["compile_s"] / tree[k_lo]["compile_s"] for k in ks}
    report.summary = {
        "compile_ratio_vs_k_ratio": {str(k): round(compile_ratios[k] / (k / k_lo), 3) for k in ks},
        "compile_linear_ok": all(compile_ratios[k] <= k / k_lo for k in ks),
        f"compiled_runtime_ratio_k{k_hi}_vs_k{k_lo}": tree[k_hi]["compiled_us"]
        / tree[k_lo]["compiled_us"],
        "compiled_runtime_ok": tree[k_hi]["compiled_us"] / tree[k_lo]["compiled_us"] <= 1.25,
        # The 10th percentile is less sensitive to other load on a shared machine.
        f"compiled_runtime_p10_ratio_k{k_hi}_vs_k{k_lo}": tree[k_hi]["compiled_p10_us"]
        / tree[k_lo]["compiled_p10_us"],
        f"ladder_compiled_runtime_ratio_k{k_hi}_vs_k{k_lo}": results["ladder"][k_hi]["compiled_us"]
        / results["ladder"][k_lo]["compiled_us"],
        "nodes_le_ladder": all(tree[k]["nodes"] <= results["ladder"][k]["nodes"] for k in ks),
        "max_spread": max(
            statistics.fmean([tree[k]["compiled_spread"], tree[k]["eager_spread"]]) for k in ks
        ),
        "native_measured": native is not None,
    }
    report.notes.append(
        "runtimes of every K and of tree and ladder come from one interleaved run; native "
        "ran the same way in a torch 2.14 subprocess right after, so compare its times "
        "less tightly"
    )
    report.notes.append(
        f"{_N}-element float32 operand, index K//2, CPU, {torch.get_num_threads()} threads"
    )
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
