"""Typed errors raised by torchnext, in one place.

Every error subclasses :class:`TorchnextError` *and* the builtin exception a caller
would already catch (``RuntimeError``, ``TimeoutError``, ``ValueError``...), so code
written against plain PyTorch keeps working: ``except RuntimeError`` still catches a
revoked collective, ``except TimeoutError`` still catches a bounded wait that ran out.

Messages follow one rule: name the argument or resource, show the bad value, say the
fix. Errors that cross a thread or process boundary keep the original traceback text
in ``remote_traceback``.

Sections below belong to the package areas; add new errors to your area's section.
"""

from __future__ import annotations

__all__ = [
    "TorchnextError",
    # distributed
    "CommError",
    "CommRevokedError",
    "CommTimeoutError",
    "StaleEpochError",
    "GroupShutdownError",
    "StoreUnreachableError",
    "StoreLostError",
    "StoreRequestError",
    "EtcdNotInstalledError",
    "AgreementError",
    "MembershipError",
    "CollectiveMismatchError",
    "HealingError",
    "HealingRefusedError",
    "ReplicaDivergenceError",
    "TrainingStateError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointMismatchError",
    "LaunchEnvironmentError",
    "AgentConflictError",
    "ReplicaLayoutError",
    "ReplicaIncompleteError",
    "OptimizerStepError",
    "WindowError",
    "WindowRevokedError",
    "FlightRecorderDumpError",
    "FlightRecorderExportError",
    # testing harness
    "WorkerFailedError",
    "HarnessTimeoutError",
    "HostNetworkError",
    # linalg
    "NotPositiveDefiniteError",
    "ConvergenceError",
    "LinAlgInputError",
    # control flow / compile
    "UnsupportedComplexOpError",
    "DynamicSpecError",
    "ControlFlowError",
    "CudaGraphCaptureError",
    # gemm
    "GemmInputError",
    "GemmUnsupportedError",
    # upgrade
    "UpgradeError",
    # benchmarks / cli
    "BenchmarkNotFoundError",
]


class TorchnextError(Exception):
    """Base of every torchnext error; always combined with a builtin exception type."""


# --------------------------------------------------------------------------- distributed


class CommError(TorchnextError, RuntimeError):
    """A collective or point-to-point operation of a fault-tolerant group failed."""


class CommRevokedError(CommError):
    """The group's epoch was revoked (ULFM semantics): every pending and future op fails.

    Attributes:
        epoch: the revoked epoch.
        suspects: global ranks suspected to have failed (may be empty if unknown).
        reason: the first failure that caused the revoke, as text.
    """

    def __init__(
        self, message: str, *, epoch: int, suspects: tuple[int, ...] = (), reason: str = ""
    ) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.suspects = suspects
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_revoked, (str(self), self.epoch, self.suspects, self.reason))


def _rebuild_revoked(
    message: str, epoch: int, suspects: tuple[int, ...], reason: str
) -> CommRevokedError:
    return CommRevokedError(message, epoch=epoch, suspects=suspects, reason=reason)


class CommTimeoutError(TorchnextError, TimeoutError):
    """A bounded wait on a collective, the store or a peer ran out."""


class StaleEpochError(CommError):
    """A process from an old epoch tried to act in a newer one (fencing)."""


class GroupShutdownError(CommError):
    """An operation was issued on a group that was shut down."""


class StoreUnreachableError(TorchnextError, ConnectionError):
    """The rendezvous store could not be reached at the named address."""


class StoreLostError(StoreUnreachableError):
    """The job's store has not answered for the whole store timeout: its host is down, or
    this host is cut off from it. The group cannot go on here; the process should exit
    (``torchnext run`` workers exit with ``EXIT_STORE_LOST``)."""


class StoreRequestError(TorchnextError, RuntimeError):
    """The store answered, but refused the request (an etcd store: a value over the
    cluster's request size limit, a bad argument); retrying would fail the same way."""


class EtcdNotInstalledError(TorchnextError, FileNotFoundError):
    """The etcd server binary was not found where a test or benchmark cluster starts it
    (install ``torchnext[etcd]``, which ships it, or Debian's ``etcd-server``)."""


class AgreementError(CommError):
    """Survivors could not agree on a membership within the bound."""


class MembershipError(TorchnextError, ValueError):
    """A membership request names ranks that are not, or cannot be, members."""


class CollectiveMismatchError(CommError, ValueError):
    """Members called a collective with different ops, shapes, dtypes or roots."""


class HealingError(CommError):
    """A joining process could not receive or apply state from a live peer."""


class HealingRefusedError(HealingError):
    """The healer refused a joiner whose model differs from the group's (do not retry)."""


class TrainingStateError(TorchnextError, ValueError):
    """State registered with a training Manager is unusable: a name taken twice or
    reserved, or members (a replacement included) that registered different entries."""


class CheckpointError(TorchnextError, ValueError):
    """A training checkpoint cannot be written or read: damaged, incomplete, or holding
    values that ``torch.load(weights_only=True)`` refuses.

    Attributes:
        path: the checkpoint (or directory) concerned; empty when not known.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_checkpoint_error, (type(self), str(self), self.path))


def _rebuild_checkpoint_error(
    cls: type[CheckpointError], message: str, path: str
) -> CheckpointError:
    return cls(message, path=path)


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No complete checkpoint where one was asked for (a path or a step)."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint does not fit the manager loading it (model, optimizer, registered
    entries or sampler differ); raised before anything is loaded."""


class LaunchEnvironmentError(TorchnextError, ValueError):
    """The process was not started the way ``from_env`` needs (``torchnext run``)."""


class AgentConflictError(TorchnextError, ValueError):
    """The agents of one job disagree: two claim the same node rank, or they were started
    with different job shapes (``--nnodes``, ``--nproc``)."""


class ReplicaLayoutError(TorchnextError, ValueError):
    """Replica groups (HSDP) are shaped wrong: a group size below 1, a world size not a
    multiple of it, groups of different sizes, or a model sharded differently in
    different groups (raised before any training step)."""


class ReplicaIncompleteError(StaleEpochError):
    """This process's replica group lost a process (or was left out as incomplete): the
    job goes on without the whole group; exit with ``EXIT_EVICTED`` so the launcher
    restarts the group."""


class OptimizerStepError(TorchnextError, RuntimeError):
    """The function that applies a committed training step raised (the member stops)."""


class ReplicaDivergenceError(TorchnextError, RuntimeError):
    """Replicas that must be identical are not: the step was not committed.

    Attributes:
        entries: the state entries whose fingerprints differ (``model``, ``optimizer``,
            ``sampler`` or a registered name).
        members: the members whose copy differs from the majority's.
        step: the committed step count the replicas started the failed step from.
    """

    def __init__(
        self,
        message: str,
        *,
        entries: tuple[str, ...] = (),
        members: tuple[str, ...] = (),
        step: int = -1,
    ) -> None:
        super().__init__(message)
        self.entries = entries
        self.members = members
        self.step = step

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_divergence, (str(self), self.entries, self.members, self.step))


def _rebuild_divergence(
    message: str, entries: tuple[str, ...], members: tuple[str, ...], step: int
) -> ReplicaDivergenceError:
    return ReplicaDivergenceError(message, entries=entries, members=members, step=step)


class WindowError(TorchnextError, ValueError):
    """Bad use of an RMA window: offsets, sizes, dtypes, lock state."""


class WindowRevokedError(CommRevokedError):
    """The RMA window's group was revoked or reconfigured; re-create the window."""


class FlightRecorderDumpError(TorchnextError, ValueError):
    """A flight-recorder dump file is truncated, corrupt or of an unknown version."""


class FlightRecorderExportError(TorchnextError, ValueError):
    """Dumps cannot be exported for ``torchfrtrace``: no dump, or a bad export folder."""


# --------------------------------------------------------------------------- testing


class WorkerFailedError(TorchnextError, RuntimeError):
    """A worker of the multi-process harness raised; ``remote_traceback`` holds its text."""

    def __init__(self, message: str, *, rank: int = -1, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


class HarnessTimeoutError(TorchnextError, TimeoutError):
    """The multi-process harness gave up waiting for workers within its bound."""


class HostNetworkError(TorchnextError, RuntimeError):
    """Test hosts (network namespaces on a bridge) cannot be made or driven here: not root,
    no ``ip`` command, no free test subnet, or an ``ip`` command that failed. The message
    names the command or resource and the fix."""


# --------------------------------------------------------------------------- linalg


class NotPositiveDefiniteError(TorchnextError, ValueError):
    """A matrix required to be (Hermitian) positive definite is not.

    Attributes:
        batch_index: index of the first offending matrix in the flattened batch.
    """

    def __init__(self, message: str, *, batch_index: int = 0) -> None:
        super().__init__(message)
        self.batch_index = batch_index


class ConvergenceError(TorchnextError, ArithmeticError):
    """An iterative solver did not converge and no fallback was allowed."""


class LinAlgInputError(TorchnextError, RuntimeError):
    """A linalg input holds NaN/inf where the function cannot propagate them.

    A ``RuntimeError`` like torch's ``LinAlgError``, so ``except RuntimeError`` code
    written against ``torch.linalg`` keeps working.

    Attributes:
        batch_index: index of the first offending matrix in the flattened batch.
    """

    def __init__(self, message: str, *, batch_index: int = 0) -> None:
        super().__init__(message)
        self.batch_index = batch_index


# --------------------------------------------------------------------------- control flow


class UnsupportedComplexOpError(TorchnextError, NotImplementedError):
    """An op has no real-arithmetic decomposition for complex compile support."""


class DynamicSpecError(TorchnextError, ValueError):
    """A dynamic-shape spec is malformed, stacked, or violated at run time."""


class ControlFlowError(TorchnextError, RuntimeError):
    """Bad arguments to ``switch``/``while_loop`` (RuntimeError, as torch 2.14 raises)."""


class CudaGraphCaptureError(ControlFlowError):
    """A ``while_loop`` cannot be captured in a CUDA graph here (device, carries, RNG...)."""


# --------------------------------------------------------------------------- gemm


class GemmInputError(TorchnextError, ValueError, RuntimeError):
    """A GEMM argument is malformed: shapes that do not contract, scales of the wrong shape or
    dtype for the recipe, offsets that decrease or exceed the rows, NaN scales, an epilogue
    operand that is neither a row, a column nor a full matrix. The message names the argument,
    the value and the expected one. Both a ``ValueError`` (as ``F.scaled_mm`` raises) and a
    ``RuntimeError`` (as ``mm`` and ``F.grouped_mm`` raise), so either ``except`` catches it."""


class GemmUnsupportedError(TorchnextError, NotImplementedError):
    """The arguments are well formed, but no route here runs them (a dtype pair, a recipe or a
    device no candidate supports). The message names what would run them."""


# --------------------------------------------------------------------------- upgrade


class UpgradeError(TorchnextError, RuntimeError):
    """The upgrade tool could not process a file or its configuration."""


# --------------------------------------------------------------------------- cli / bench


class BenchmarkNotFoundError(TorchnextError, LookupError):
    """``torchnext bench NAME`` names no benchmark script."""
