"""The torch 2.14.0 release notes' breaking changes and deprecations, mapped to rules.

Every item of the "Backwards Incompatible Changes" and "Deprecations" lists, and every
earlier linalg/amp deprecation the upgrade tool promises, appears here once, with the
rule codes that handle it or a written reason why the tool does not. A test checks
that each item has one or the other and that every code exists, so a release-notes
item cannot be forgotten silently.

Do not assume an item with a reason is harmless: the reason says what to do by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NoteItem", "NOTE_ITEMS"]


@dataclass(frozen=True, kw_only=True)
class NoteItem:
    """One release-notes entry."""

    section: str
    """``"bc"`` (Backwards Incompatible Changes), ``"deprecation"`` or ``"legacy"``."""
    area: str
    """The release notes' heading (``"Linear Algebra Frontend"``...)."""
    title: str
    """Short description."""
    prs: tuple[str, ...]
    """Upstream pull requests (empty for legacy items)."""
    rules: tuple[str, ...] = ()
    """Rule codes that find (and fix) it."""
    wont_handle: str = ""
    """Why no rule handles it, and what to do instead."""

    def __post_init__(self) -> None:
        if self.section not in ("bc", "deprecation", "legacy"):
            raise ValueError(f"NoteItem.section={self.section!r}: use bc, deprecation or legacy")
        if bool(self.rules) == bool(self.wont_handle.strip()):
            raise ValueError(
                f"NoteItem {self.title!r}: give exactly one of rules={self.rules} or a "
                "wont_handle reason"
            )


def _n(**kwargs: object) -> NoteItem:
    return NoteItem(**kwargs)  # type: ignore[arg-type]


NOTE_ITEMS: tuple[NoteItem, ...] = (
    # ---------------------------------------------------------- Backwards Incompatible Changes
    _n(
        section="bc",
        area="torch.nn",
        title='LinearCrossEntropyOptions acc_policy="balanced"',
        prs=("#188283",),
        rules=("TNU006",),
    ),
    _n(
        section="bc",
        area="Autograd",
        title="clamp / min / max boundary subgradients",
        prs=("#191142",),
        rules=("TNU401",),
    ),
    _n(
        section="bc",
        area="Distributed",
        title="custom ProcessGroup new_group() must accept backend=",
        prs=("#188489",),
        rules=("TNU005",),
    ),
    _n(
        section="bc",
        area="Distributed",
        title="NCCL symmetric pools no longer upgrade late segments",
        prs=("#192112",),
        rules=("TNU008",),
    ),
    _n(
        section="bc",
        area="Distributed",
        title="split_group() returns NON_GROUP_MEMBER, not None",
        prs=("#190725",),
        rules=("TNU004",),
    ),
    _n(
        section="bc",
        area="Linear Algebra Frontend",
        title="torch.cholesky / Tensor.cholesky removed",
        prs=("#186817",),
        rules=("TNU001",),
    ),
    _n(
        section="bc",
        area="Linear Algebra Frontend",
        title="torch.qr / Tensor.qr removed",
        prs=("#186815",),
        rules=("TNU002",),
    ),
    _n(
        section="bc",
        area="Profiler",
        title="profiler use_cuda removed",
        prs=("#192543",),
        rules=("TNU003", "TNU009"),
    ),
    _n(
        section="bc",
        area="Dynamo",
        title="tvm backend: relay path removed",
        prs=("#190766", "#189639"),
        rules=("TNU007",),
    ),
    _n(
        section="bc",
        area="C++ Frontend",
        title="zero-argument isIntegral overloads removed",
        prs=("#187115",),
        wont_handle="C++ source; the tool reads Python. Pass includeBool=false where the compiler stops.",
    ),
    _n(
        section="bc",
        area="Release Engineering",
        title="setup.py is a deprecation shim",
        prs=("#180248",),
        wont_handle=(
            "Affects build commands of PyTorch itself (shell/CI), not Python code that uses torch; "
            "use `python -m build` or pip."
        ),
    ),
    _n(
        section="bc",
        area="MPS",
        title="C++ MPS macOS-version helper renamed",
        prs=("#188645",),
        wont_handle="C++ source; rename at::mps::is_macos_13_or_newer to is_macos_at_least by hand.",
    ),
    _n(
        section="bc",
        area="Complex Frontend",
        title="bfloat16 complex promotion gives bcomplex32",
        prs=("#186928",),
        wont_handle=(
            "Depends on runtime dtypes: static analysis cannot tell when a bfloat16 tensor meets "
            "a complex scalar. Cast to complex64 explicitly where a not-implemented error appears."
        ),
    ),
    # ---------------------------------------------------------- Deprecations
    _n(
        section="deprecation",
        area="Autograd",
        title="SAC respect_saved_tensors_hooks default",
        prs=("#190581",),
        rules=("TNU104",),
    ),
    _n(
        section="deprecation",
        area="Distributed",
        title="compile_on_one_rank moved to torch.compiler.config",
        prs=("#187869",),
        rules=("TNU105",),
    ),
    _n(
        section="deprecation",
        area="Distributed",
        title="_set_pg_timeout replaced by set_timeout",
        prs=("#187387",),
        rules=("TNU106",),
    ),
    _n(
        section="deprecation",
        area="Profiler",
        title="profiler_metrics / profiler_measure_per_kernel ignored",
        prs=("#187204",),
        rules=("TNU103",),
    ),
    _n(
        section="deprecation",
        area="Profiler",
        title="with_modules deprecated",
        prs=("#192808",),
        rules=("TNU102",),
    ),
    _n(
        section="deprecation",
        area="Dynamo",
        title="enable_faithful_generator_behavior is a no-op",
        prs=("#189894",),
        rules=("TNU109",),
    ),
    _n(
        section="deprecation",
        area="CUDA",
        title="CUDAGraph.register_generator_state deprecated",
        prs=("#176753",),
        rules=("TNU107",),
    ),
    _n(
        section="deprecation",
        area="CUDA",
        title="GreenContext.set_context / pop_context deprecated",
        prs=("#188419",),
        rules=("TNU108",),
    ),
    _n(
        section="deprecation",
        area="JIT",
        title="TorchScript APIs emit FutureWarning",
        prs=("#189914",),
        rules=("TNU101",),
    ),
    # ---------------------------------------------------------- earlier linalg / amp
    _n(section="legacy", area="linalg", title="torch.symeig", prs=(), rules=("TNU201",)),
    _n(section="legacy", area="linalg", title="torch.eig", prs=(), rules=("TNU202",)),
    _n(section="legacy", area="linalg", title="torch.lstsq", prs=(), rules=("TNU203",)),
    _n(section="legacy", area="linalg", title="torch.solve", prs=(), rules=("TNU204",)),
    _n(section="legacy", area="linalg", title="torch.matrix_rank", prs=(), rules=("TNU205",)),
    _n(section="legacy", area="linalg", title="torch.lu", prs=(), rules=("TNU206",)),
    _n(section="legacy", area="linalg", title="torch.lu_solve", prs=(), rules=("TNU207",)),
    _n(section="legacy", area="linalg", title="torch.triangular_solve", prs=(), rules=("TNU208",)),
    _n(section="legacy", area="linalg", title="torch.norm", prs=(), rules=("TNU209",)),
    _n(section="legacy", area="linalg", title="torch.range", prs=(), rules=("TNU210",)),
    _n(section="legacy", area="linalg", title="torch.ger", prs=(), rules=("TNU211",)),
    _n(section="legacy", area="linalg", title="torch.svd", prs=(), rules=("TNU212",)),
    _n(section="legacy", area="linalg", title="torch.chain_matmul", prs=(), rules=("TNU213",)),
    _n(section="legacy", area="linalg", title="torch.pinverse", prs=(), rules=("TNU214",)),
    _n(
        section="legacy",
        area="amp",
        title="torch.cuda.amp.autocast / torch.cpu.amp.autocast",
        prs=(),
        rules=("TNU215",),
    ),
)
