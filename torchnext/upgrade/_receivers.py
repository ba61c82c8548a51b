"""Receiver-type inference: which expressions are provably a ``torch.Tensor``.

Tensor-method rules (``A.cholesky()``, ``A.qr()``...) fire only on receivers this module
proves to be tensors. Library classes define methods with the names of removed Tensor
methods, so a call on ``self``, on an instance of a user class or on a name of unknown
type is neither reported nor rewritten: a wrong rewrite is worse than a miss.

Proofs, each by syntax only:

* a call of a torch function that returns a tensor (factories, ``torch.linalg`` functions
  with one result, ``nn.Parameter``);
* a name bound to such an expression, annotated ``torch.Tensor`` / ``nn.Parameter``, or
  unpacked from a torch function whose results are all tensors (``Q, R = linalg.qr(A)``);
* a tensor's tensor-valued attribute (``A.mT``), an index into a tensor, a tensor method
  that returns a tensor (``A.double()``), arithmetic with a tensor operand.

Name bookkeeping (which names hold tensors in which scope) stays in the transformer; this
module only judges one expression given a name lookup.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

__all__ = [
    "TENSOR_ANNOTATIONS",
    "is_tensor_expr",
    "tensor_tuple_call",
]

# torch.<name>(...) functions whose result is one tensor.
_TORCH_TENSOR_FUNCS = frozenset(
    "randn rand randint randperm randn_like rand_like randint_like normal bernoulli multinomial "
    "zeros ones eye empty full tensor as_tensor asarray from_numpy arange linspace logspace "
    "zeros_like ones_like empty_like full_like stack cat concat concatenate hstack vstack "
    "matmul mm bmm mv dot outer einsum kron diag diag_embed diagonal tril triu clone "
    "cholesky_solve cholesky_inverse inverse det logdet pinverse matrix_power matrix_exp "
    "trace transpose permute reshape flatten squeeze unsqueeze where abs exp log sqrt sum "
    "mean prod cumsum softmax log_softmax sigmoid tanh relu add sub mul div pow neg "
    "real imag conj view_as_real view_as_complex complex polar block_diag cdist".split()
)

# torch.linalg.<name>(...) functions whose result is one tensor.
_LINALG_TENSOR_FUNCS = frozenset(
    "cholesky inv pinv det matrix_norm vector_norm norm solve solve_triangular matrix_exp "
    "matrix_power matrix_rank multi_dot cross vecdot householder_product eigvals eigvalsh "
    "svdvals cond tensorinv tensorsolve lu_solve ldl_solve diagonal".split()
)

# torch(.linalg) functions returning a tuple whose every element is a tensor.
_TUPLE_FUNCS = frozenset(
    {
        *(
            f"torch.linalg.{n}"
            for n in "qr eigh eig svd slogdet lu lu_factor lu_factor_ex "
            "cholesky_ex inv_ex solve_ex ldl_factor ldl_factor_ex".split()
        ),
        *(f"torch.{n}" for n in "sort topk std_mean var_mean aminmax frexp".split()),
    }
)

# Classes whose instances are tensors.
_TENSOR_CLASSES = frozenset(
    {
        "torch.Tensor",
        "torch.nn.Parameter",
        "torch.nn.parameter.Parameter",
        "torch.nn.Buffer",
        "torch.nn.parameter.Buffer",
    }
)

TENSOR_ANNOTATIONS = frozenset(
    {*_TENSOR_CLASSES, "torch.tensor._Tensor", "torch.FloatTensor", "torch.DoubleTensor"}
)
"""Qualified annotations that make a parameter or an annotated name a tensor."""

# Attributes of a tensor that are tensors themselves.
_TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})

# Tensor methods whose result is a tensor (called on a proven tensor).
_TENSOR_METHODS = frozenset(
    "clone detach contiguous float double half bfloat16 cfloat cdouble to cuda cpu t "
    "transpose permute reshape view view_as expand expand_as flatten squeeze unsqueeze "
    "abs neg exp log sqrt sum mean matmul mm bmm add sub mul div pow conj tril triu diag "
    "diagonal inverse requires_grad_ type_as masked_fill narrow select index_select "
    "repeat tile roll flip".split()
)

_ARITHMETIC = (
    cst.Add,
    cst.Subtract,
    cst.Multiply,
    cst.Divide,
    cst.MatrixMultiply,
    cst.Power,
)

Qualify = Callable[[cst.BaseExpression], "str | None"]
NameLookup = Callable[[str], bool]


def _tensor_call(call: cst.Call, qualify: Qualify, is_name: NameLookup) -> bool:
    q = qualify(call.func)
    if q is not None:
        if q in _TENSOR_CLASSES:
            return True
        head, _, leaf = q.rpartition(".")
        if head == "torch":
            return leaf in _TORCH_TENSOR_FUNCS
        return head == "torch.linalg" and leaf in _LINALG_TENSOR_FUNCS
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in _TENSOR_METHODS
        and is_tensor_expr(func.value, qualify, is_name)
    )


def is_tensor_expr(node: cst.BaseExpression, qualify: Qualify, is_name: NameLookup) -> bool:
    """True when ``node`` provably evaluates to a tensor; False when unknown."""
    if isinstance(node, cst.Name):
        return is_name(node.value)
    if isinstance(node, cst.Attribute):
        return node.attr.value in _TENSOR_ATTRS and is_tensor_expr(node.value, qualify, is_name)
    if isinstance(node, cst.Subscript):
        return is_tensor_expr(node.value, qualify, is_name)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _ARITHMETIC):
        return is_tensor_expr(node.left, qualify, is_name) or is_tensor_expr(
            node.right, qualify, is_name
        )
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return is_tensor_expr(node.expression, qualify, is_name)
    if isinstance(node, cst.Call):
        return _tensor_call(node, qualify, is_name)
    return False


def tensor_tuple_call(node: cst.BaseExpression, qualify: Qualify) -> bool:
    """``node`` calls a torch function whose results are all tensors (for unpacking)."""
    return isinstance(node, cst.Call) and qualify(node.func) in _TUPLE_FUNCS
