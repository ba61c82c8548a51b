"""Re-raise torch's own error type with a message that names the culprit.

torch 2.14 reports bad branches and bad loop bodies with Dynamo's exception types
(``TorchRuntimeError``, ``UncapturedHigherOrderOpError``); code that catches those must
keep working, so torchnext raises a subclass of *the type torch raised* that is also a
:class:`~torchnext.errors.TorchnextError`, with a message naming the branch or carry.
"""

from __future__ import annotations

from torchnext.errors import TorchnextError

__all__ = ["retyped"]


_SUBCLASSES: dict[type[BaseException], type[BaseException]] = {}


def _subclass(base: type[BaseException]) -> type[BaseException]:
    if base not in _SUBCLASSES:
        _SUBCLASSES[base] = type(
            base.__name__, (TorchnextError, base), {"__module__": "torchnext.errors"}
        )
    return _SUBCLASSES[base]


def retyped(original: BaseException, message: str) -> BaseException | None:
    """An instance of ``type(original)`` + TorchnextError carrying ``message``; ``None`` if
    that type cannot be built from a message alone."""
    text = str(original).strip()
    first_line = text.splitlines()[0] if text else type(original).__name__
    try:
        return _subclass(type(original))(f"{message}\n(torch reported: {first_line})")
    except TypeError:
        return None
