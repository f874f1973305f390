"""Errors raised by the SDK: one class per gRPC status code a caller acts on.

Every error carries `code` (a grpc.StatusCode), `message` (the server's text,
which names the thing and the value) and `method` (the RPC). Pick the handling
the way the codes mean it: InvalidArgument / FailedPrecondition never retry,
Aborted retry the whole operation, Unavailable retry the call (the Client does
that itself, up to max_attempts).
"""

import grpc

from reshard.core import _rpc


class ReshardError(Exception):
    """Base class of every error the reshard SDK raises for a failed call."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None, method=""):
        if code is not None:
            self.code = code
        self.message = message
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{self.code.name}: {message}")


class InvalidArgument(ReshardError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ReshardError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ReshardError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ReshardError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ReshardError):
    code = grpc.StatusCode.ABORTED


class Unavailable(ReshardError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ReshardError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(ReshardError):
    code = grpc.StatusCode.DATA_LOSS


class ResourceExhausted(ReshardError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Cancelled(ReshardError):
    code = grpc.StatusCode.CANCELLED


class Internal(ReshardError):
    code = grpc.StatusCode.INTERNAL


class Unauthenticated(ReshardError):
    """No identity: no client certificate and no (valid) bearer token."""
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ReshardError):
    """The identity's role or tenants do not allow the call."""
    code = grpc.StatusCode.PERMISSION_DENIED


class OperationFailed(ReshardError):
    """Client.wait(..., raise_on_failure=True): the operation ended ABORTED or
    FAILED. `operation` is the final Operation; `message` its error."""

    code = grpc.StatusCode.ABORTED

    def __init__(self, operation):
        from reshard.v1 import coordinator_pb2
        state = coordinator_pb2.OperationState.Name(operation.state)
        super().__init__(f"operation \"{operation.id}\" ended {state}: {operation.error}",
                         method="wait")
        self.operation = operation


class UnsafeBlob(InvalidArgument):
    """A blob a rank published that reshard refuses to unpickle (`reshard dcp
    export`): it names a global outside what a job's state legitimately holds
    (calling it could run any code), or it is not a well-formed pickle.
    `blob` is the blob's name, `global_name` the refused "module.name" (None
    when the pickle is malformed)."""

    def __init__(self, blob, why, global_name=None):
        super().__init__(f"blob \"{blob}\": not loaded: {why}")
        self.blob = blob
        self.global_name = global_name


# The class of each code a caller acts on, from the one table of
# reshard._rpc (EXCEPTION_FOR_CODE, shared with the C++ side through
# tests/data/rpc_vectors.json); every other code is ReshardError itself.
_BY_CODE = {getattr(grpc.StatusCode, code): globals()[cls]
            for code, cls in _rpc.EXCEPTION_FOR_CODE.items()}


def from_code(number, message, method=""):
    """The ReshardError subclass for a numeric gRPC status code (as the
    agent's descriptor socket answers it, reshard.v1.WorkerFdResponse); a
    number that is no code is UNKNOWN."""
    code = getattr(grpc.StatusCode, _rpc.code_name(_rpc.wire_code(number)))
    cls = _BY_CODE.get(code, ReshardError)
    if cls is ReshardError:
        return ReshardError(message, code=code, method=method)
    return cls(message, method=method)


def from_rpc_error(err, method=""):
    """The ReshardError subclass for a grpc.RpcError (ReshardError for other codes)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, ReshardError)
    if cls is ReshardError:
        return ReshardError(details or "", code=code, method=method)
    return cls(details or "", method=method)
