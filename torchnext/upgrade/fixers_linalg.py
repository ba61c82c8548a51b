"""Fixers for the linalg removals and deprecations (TNU001, TNU002, TNU2xx).

Each function maps one old call to its ``torch.linalg`` form with the same meaning:
arguments are bound by name first (``input=`` becomes the positional matrix, reordered
signatures such as ``lu_solve`` and ``triangular_solve`` are swapped), literal flags are
folded, non-literal flags become keywords or conditional expressions, and anything that
cannot be bound statically (``*args``) is reported without a fix rather than guessed.
Method forms (``A.qr()``) reuse the same code with the receiver as the first argument.
"""

from __future__ import annotations

import libcst as cst

from torchnext.upgrade._cst import (
    Unbindable,
    bind,
    bool_literal,
    int_literal,
    make_call,
    negate,
    paren_if_needed,
    str_literal,
)
from torchnext.upgrade._site import Diagnosis, Site, call_rule, method_rule

__all__: list[str] = []

_NOT_BOUND = "arguments could not be matched statically (starred or unknown); fix by hand"


def _fixed(site: Site, code: str, fix: cst.BaseExpression, *, unsafe: bool = False) -> Diagnosis:
    unsafe = unsafe or site.method_unsafe
    detail = "receiver is not provably a tensor" if site.method_unsafe else ""
    return Diagnosis(code, fix=fix, unsafe=unsafe, detail=detail)


def _bind(
    site: Site, positional: list[str], kw: tuple[str, ...] = ("out",)
) -> dict[str, cst.BaseExpression]:
    return bind(site.call, positional, kw, receiver=site.receiver)


def _reads(site: Site, index: int, attr: str) -> bool:
    """The site reads only result ``index`` of the old tuple: ``[i]``, ``.attr`` or an
    unpacking whose other targets are ``_`` placeholders (``x, _ = ...``)."""
    return site.wrapper in (("index", index), ("attr", attr), ("keep", index))


# ------------------------------------------------------------------ TNU001 cholesky


@call_rule("TNU001", "torch.cholesky", "torch.Tensor.cholesky")
@method_rule("TNU001", "cholesky")
def cholesky(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "upper"])
    except Unbindable:
        return Diagnosis("TNU001", detail=_NOT_BOUND)
    if "input" not in a:
        return Diagnosis("TNU001", detail=_NOT_BOUND)
    upper = a.get("upper")
    if bool_literal(upper) is False:
        upper = None
    call = make_call(
        site.torch("linalg.cholesky"), [a["input"]], [("upper", upper), ("out", a.get("out"))]
    )
    return _fixed(site, "TNU001", call)


# ------------------------------------------------------------------ TNU002 qr


def _qr_mode(some: cst.BaseExpression | None) -> cst.BaseExpression | None:
    lit = bool_literal(some)
    if some is None or lit is True:
        return None  # "reduced" is linalg.qr's default
    if lit is False:
        return cst.SimpleString('"complete"')
    return cst.IfExp(
        test=some, body=cst.SimpleString('"reduced"'), orelse=cst.SimpleString('"complete"')
    )


@call_rule("TNU002", "torch.qr", "torch.Tensor.qr")
@method_rule("TNU002", "qr")
def qr(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "some"])
    except Unbindable:
        return Diagnosis("TNU002", detail=_NOT_BOUND)
    if "input" not in a:
        return Diagnosis("TNU002", detail=_NOT_BOUND)
    call = make_call(
        site.torch("linalg.qr"),
        [a["input"]],
        [("mode", _qr_mode(a.get("some"))), ("out", a.get("out"))],
    )
    return _fixed(site, "TNU002", call)


# ------------------------------------------------------------------ TNU201 symeig


@call_rule("TNU201", "torch.symeig", "torch.Tensor.symeig", tuple_aware=True)
@method_rule("TNU201", "symeig", tuple_aware=True)
def symeig(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "eigenvectors", "upper"])
    except Unbindable:
        return Diagnosis("TNU201", detail=_NOT_BOUND)
    if "input" not in a or "out" in a:
        return Diagnosis(
            "TNU201", detail=_NOT_BOUND if "input" not in a else "`out=` has no equivalent"
        )
    upper = a.get("upper")
    lit_upper = bool_literal(upper)
    uplo: cst.BaseExpression
    if upper is None or lit_upper is True:
        uplo = cst.SimpleString('"U"')
    elif lit_upper is False:
        uplo = cst.SimpleString('"L"')
    else:
        uplo = cst.IfExp(test=upper, body=cst.SimpleString('"U"'), orelse=cst.SimpleString('"L"'))
    vectors = bool_literal(a.get("eigenvectors")) if "eigenvectors" in a else False
    if site.wrapper == ("keep", 0):
        # `e, _ = symeig(A, ...)`: the eigenvectors are dropped whatever `eigenvectors` is;
        # only dropping an expression that may have side effects needs a look.
        flag = a.get("eigenvectors")
        dropped = vectors is None and not isinstance(flag, cst.Name | cst.Attribute)
        call = make_call(site.torch("linalg.eigvalsh"), [a["input"]], [("UPLO", uplo)])
        return _fixed(site, "TNU201", call, unsafe=dropped)
    if vectors is True:
        call = make_call(site.torch("linalg.eigh"), [a["input"]], [("UPLO", uplo)])
        if site.wrapper is not None:
            return _fixed(site, "TNU201", _rewrap(site, call))
        return _fixed(site, "TNU201", call)
    if vectors is False and site.wrapper in (("index", 0), ("attr", "eigenvalues")):
        return _fixed(
            site, "TNU201", make_call(site.torch("linalg.eigvalsh"), [a["input"]], [("UPLO", uplo)])
        )
    return Diagnosis(
        "TNU201",
        detail="eigenvalues only: use `torch.linalg.eigvalsh(A, UPLO=...)` where the result is read",
    )


def _rewrap(site: Site, call: cst.BaseExpression) -> cst.BaseExpression:
    """Put the ``[i]`` / ``.attr`` the tuple-aware site was called with back on ``call``."""
    if site.wrapper is None:
        return call
    kind, value = site.wrapper
    if kind == "index":
        return cst.Subscript(
            value=call, slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(value))))]
        )
    return cst.Attribute(value=call, attr=cst.Name(str(value)))


# ------------------------------------------------------------------ TNU202 eig, TNU203 lstsq


@call_rule("TNU202", "torch.eig", "torch.Tensor.eig")
@method_rule("TNU202", "eig")
def eig(site: Site) -> Diagnosis | None:
    return Diagnosis(
        "TNU202", detail="`torch.linalg.eig` returns complex tensors; adapt the readers"
    )


@call_rule("TNU203", "torch.lstsq", "torch.Tensor.lstsq")
@method_rule("TNU203", "lstsq")
def lstsq(site: Site) -> Diagnosis | None:
    return Diagnosis("TNU203", detail="arguments swap and the solution is no longer padded")


# ------------------------------------------------------------------ TNU204 solve


@call_rule("TNU204", "torch.solve", "torch.Tensor.solve", tuple_aware=True)
@method_rule("TNU204", "solve", tuple_aware=True)
def solve(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "A"])
    except Unbindable:
        return Diagnosis("TNU204", detail=_NOT_BOUND)
    if not _reads(site, 0, "solution") or "out" in a:
        return Diagnosis("TNU204", detail="the (solution, LU) tuple is used; fix by hand")
    if "input" not in a or "A" not in a:
        return Diagnosis("TNU204", detail=_NOT_BOUND)
    return _fixed(site, "TNU204", make_call(site.torch("linalg.solve"), [a["A"], a["input"]]))


# ------------------------------------------------------------------ TNU205 matrix_rank


@call_rule("TNU205", "torch.matrix_rank", "torch.Tensor.matrix_rank")
@method_rule("TNU205", "matrix_rank")
def matrix_rank(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "tol", "symmetric"])
    except Unbindable:
        return Diagnosis("TNU205", detail=_NOT_BOUND)
    if "input" not in a:
        return Diagnosis("TNU205", detail=_NOT_BOUND)
    tol = a.get("tol")
    if isinstance(tol, cst.Name) and tol.value == "None":
        tol = None
    sym = a.get("symmetric")
    if bool_literal(sym) is False:
        sym = None
    call = make_call(
        site.torch("linalg.matrix_rank"),
        [a["input"]],
        [("atol", tol), ("hermitian", sym), ("out", a.get("out"))],
    )
    return _fixed(site, "TNU205", call)


# ------------------------------------------------------------------ TNU206 lu, TNU207 lu_solve


@call_rule("TNU206", "torch.lu", "torch.Tensor.lu")
@method_rule("TNU206", "lu")
def lu(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["A", "pivot", "get_infos"])
    except Unbindable:
        return Diagnosis("TNU206", detail=_NOT_BOUND)
    if "A" not in a or "out" in a:
        return Diagnosis(
            "TNU206", detail=_NOT_BOUND if "A" not in a else "`out=` differs; fix by hand"
        )
    infos = bool_literal(a.get("get_infos")) if "get_infos" in a else False
    if infos is None:
        return Diagnosis("TNU206", detail="non-literal `get_infos`: pick lu_factor or lu_factor_ex")
    pivot = a.get("pivot")
    if bool_literal(pivot) is True:
        pivot = None
    name = "linalg.lu_factor_ex" if infos else "linalg.lu_factor"
    return _fixed(site, "TNU206", make_call(site.torch(name), [a["A"]], [("pivot", pivot)]))


@call_rule("TNU207", "torch.lu_solve", "torch.Tensor.lu_solve")
@method_rule("TNU207", "lu_solve")
def lu_solve(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "LU_data", "LU_pivots"])
    except Unbindable:
        return Diagnosis("TNU207", detail=_NOT_BOUND)
    if not {"input", "LU_data", "LU_pivots"} <= a.keys():
        return Diagnosis("TNU207", detail=_NOT_BOUND)
    call = make_call(
        site.torch("linalg.lu_solve"),
        [a["LU_data"], a["LU_pivots"], a["input"]],
        [("out", a.get("out"))],
    )
    return _fixed(site, "TNU207", call)


# ------------------------------------------------------------------ TNU208 triangular_solve


@call_rule("TNU208", "torch.triangular_solve", "torch.Tensor.triangular_solve", tuple_aware=True)
@method_rule("TNU208", "triangular_solve", tuple_aware=True)
def triangular_solve(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "A", "upper", "transpose", "unitriangular"])
    except Unbindable:
        return Diagnosis("TNU208", detail=_NOT_BOUND)
    if not _reads(site, 0, "solution") or "out" in a:
        return Diagnosis("TNU208", detail="the (solution, A) tuple is used; fix by hand")
    if "input" not in a or "A" not in a:
        return Diagnosis("TNU208", detail=_NOT_BOUND)
    upper: cst.BaseExpression = a.get("upper") or cst.Name("True")  # old default: upper
    matrix = a["A"]
    transpose = bool_literal(a["transpose"]) if "transpose" in a else False
    if transpose is None:
        return Diagnosis("TNU208", detail="non-literal `transpose`; fix by hand")
    if transpose:
        matrix = cst.Attribute(value=paren_if_needed(matrix), attr=cst.Name("mT"))
        upper = negate(upper)
    unit = a.get("unitriangular")
    if bool_literal(unit) is False:
        unit = None
    call = make_call(
        site.torch("linalg.solve_triangular"),
        [matrix, a["input"]],
        [("upper", upper), ("unitriangular", unit)],
    )
    return _fixed(site, "TNU208", call)


# ------------------------------------------------------------------ TNU209 norm


@call_rule("TNU209", "torch.norm")
def norm(site: Site) -> Diagnosis | None:
    try:
        a = bind(site.call, ["input", "p", "dim", "keepdim", "out", "dtype"])
    except Unbindable:
        return Diagnosis("TNU209", detail=_NOT_BOUND)
    if "input" not in a:
        return Diagnosis("TNU209", detail=_NOT_BOUND)
    p = a.get("p")
    p_str = str_literal(p)
    numeric = isinstance(p, cst.Integer | cst.Float) or int_literal(p) is not None
    if isinstance(p, cst.UnaryOperation) and isinstance(p.expression, cst.Float):
        numeric = True
    is_none = isinstance(p, cst.Name) and p.value == "None"
    tail = [("keepdim", a.get("keepdim")), ("dtype", a.get("dtype")), ("out", a.get("out"))]
    if p is None or is_none or p_str == "fro":
        call = make_call(
            site.torch("linalg.vector_norm"), [a["input"]], [("dim", a.get("dim")), *tail]
        )
    elif numeric:
        call = make_call(
            site.torch("linalg.vector_norm"),
            [a["input"]],
            [("ord", p), ("dim", a.get("dim")), *tail],
        )
    elif p_str == "nuc" and a.get("dim") is not None:
        call = make_call(
            site.torch("linalg.matrix_norm"),
            [a["input"]],
            [("ord", p), ("dim", a.get("dim")), *tail],
        )
    else:
        return Diagnosis("TNU209", detail="`p` is not a literal; choose vector_norm or matrix_norm")
    return Diagnosis("TNU209", fix=call)


# ------------------------------------------------------------------ TNU210 range


@call_rule("TNU210", "torch.range")
def range_(site: Site) -> Diagnosis | None:
    try:
        a = bind(
            site.call,
            ["start", "end", "step"],
            ("out", "dtype", "layout", "device", "requires_grad"),
        )
    except Unbindable:
        return Diagnosis("TNU210", detail=_NOT_BOUND)
    if "start" not in a or "end" not in a:
        return Diagnosis("TNU210", detail=_NOT_BOUND)
    start, end = int_literal(a["start"]), int_literal(a["end"])
    step = int_literal(a.get("step")) if "step" in a else 1
    if start is None or end is None or step is None or step == 0:
        return Diagnosis(
            "TNU210", detail="non-integer-literal bounds: use torch.arange(start, end + step, step)"
        )
    # torch.range includes `end`; for integers arange(start, end +/- 1, step) has the same elements.
    new_end = end + (1 if step > 0 else -1)
    pos: list[cst.BaseExpression] = [a["start"], _int_node(new_end)]
    if "step" in a:
        pos.append(a["step"])
    dtype = a.get("dtype") or make_call(site.torch("get_default_dtype"))
    keywords = [("dtype", dtype)] + [
        (k, a.get(k)) for k in ("out", "layout", "device", "requires_grad")
    ]
    return Diagnosis("TNU210", fix=make_call(site.torch("arange"), pos, keywords))


def _int_node(value: int) -> cst.BaseExpression:
    if value < 0:
        return cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer(str(-value)))
    return cst.Integer(str(value))


# ------------------------------------------------------------------ TNU211 ger


@call_rule("TNU211", "torch.ger", "torch.Tensor.ger")
@method_rule("TNU211", "ger")
def ger(site: Site) -> Diagnosis | None:
    if site.receiver is not None:
        func = site.call.func
        if not isinstance(func, cst.Attribute):
            return None
        return _fixed(
            site, "TNU211", site.call.with_changes(func=func.with_changes(attr=cst.Name("outer")))
        )
    return Diagnosis("TNU211", fix=site.call.with_changes(func=site.torch("outer")))


# ------------------------------------------------------------------ TNU212 svd


@call_rule("TNU212", "torch.svd", "torch.Tensor.svd", tuple_aware=True)
@method_rule("TNU212", "svd", tuple_aware=True)
def svd(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "some", "compute_uv"])
    except Unbindable:
        return Diagnosis("TNU212", detail=_NOT_BOUND)
    if "input" not in a or "out" in a:
        return Diagnosis("TNU212", detail=_NOT_BOUND if "input" not in a else "`out=` differs")
    if _reads(site, 1, "S"):
        return _fixed(site, "TNU212", make_call(site.torch("linalg.svdvals"), [a["input"]]))
    if site.wrapper is not None and site.wrapper[0] == "unpack" and "compute_uv" not in a:
        # `U, S, V = torch.svd(A, some)`: the transformer adds `V = V.mH` after the statement.
        some = a.get("some")
        lit = bool_literal(some)
        full = (
            None
            if some is None or lit is True
            else (cst.Name("True") if lit is False else negate(some))
        )
        call = make_call(
            site.torch("linalg.svd"), [a["input"]], [("full_matrices", full or cst.Name("False"))]
        )
        return _fixed(site, "TNU212", call)
    return Diagnosis(
        "TNU212",
        detail="use `U, S, Vh = torch.linalg.svd(A, full_matrices=not some)` and `V = Vh.mH`",
    )


# ------------------------------------------------------------------ TNU213 chain_matmul


@call_rule("TNU213", "torch.chain_matmul")
def chain_matmul(site: Site) -> Diagnosis | None:
    mats = [arg for arg in site.call.args if arg.keyword is None]
    out = [arg for arg in site.call.args if arg.keyword is not None]
    if (
        len(mats) < 2
        or any(m.star for m in mats)
        or any(k.keyword and k.keyword.value != "out" for k in out)
    ):
        return Diagnosis("TNU213", detail="needs two or more explicit matrices for multi_dot")
    lst = cst.List([cst.Element(m.value) for m in mats])
    keywords = [("out", out[0].value)] if out else []
    return Diagnosis("TNU213", fix=make_call(site.torch("linalg.multi_dot"), [lst], keywords))


# ------------------------------------------------------------------ TNU214 pinverse


@call_rule("TNU214", "torch.pinverse", "torch.Tensor.pinverse")
@method_rule("TNU214", "pinverse")
def pinverse(site: Site) -> Diagnosis | None:
    try:
        a = _bind(site, ["input", "rcond"], ())
    except Unbindable:
        return Diagnosis("TNU214", detail=_NOT_BOUND)
    if "input" not in a:
        return Diagnosis("TNU214", detail=_NOT_BOUND)
    rtol = a.get("rcond") or cst.Float("1e-15")
    return _fixed(
        site, "TNU214", make_call(site.torch("linalg.pinv"), [a["input"]], [("rtol", rtol)])
    )
