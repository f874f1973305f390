"""How reshard speaks gRPC, written once for Python: status code names, the
retry table (which codes each kind of call retries, with which backoff and
jitter, how many attempts), and enum short names.

This module is the reference of the C++ common/rpc library (status.h,
retry.h, enum_name.h): tests/data/gen_rpc_vectors.py writes
tests/data/rpc_vectors.json from it, and tests/common/rpc_vectors_test.cc
(C++) and tests/python/test_rpc.py check every row against both, so a change
here that the C++ side does not make fails a test. Pure Python without
imports from the package, so the generator can load it alone (like data.py).

Codes are numbers (gRPC's, equal to absl's): grpc.StatusCode.X.value[0].
Durations are seconds here; the vectors hold integer microseconds.
"""

import math
import random

# ------------------------------------------------------------------ codes

CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
              "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
              "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
              "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
CODE_NUMBERS = {name: number for number, name in enumerate(CODE_NAMES)}

OK = 0
CANCELLED = 1
UNKNOWN = 2
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
ABORTED = 10
INTERNAL = 13
UNAVAILABLE = 14


def code_name(number):
    """"INVALID_ARGUMENT" for 3; "CODE_<n>" for a number outside 0..16."""
    if 0 <= number < len(CODE_NAMES):
        return CODE_NAMES[number]
    return f"CODE_{number}"


def wire_code(number):
    """The code a number sent on the wire stands for (reshard.v1.WorkerFdResponse.code):
    itself when it is a code, UNKNOWN otherwise (C++ rpc::FromWireCode)."""
    return number if 0 <= number < len(CODE_NAMES) else UNKNOWN


# The reshard.errors class of each code a caller acts on (errors._BY_CODE is
# built from it); every other code is the base class ReshardError.
EXCEPTION_FOR_CODE = {
    "INVALID_ARGUMENT": "InvalidArgument",
    "NOT_FOUND": "NotFound",
    "ALREADY_EXISTS": "AlreadyExists",
    "FAILED_PRECONDITION": "FailedPrecondition",
    "ABORTED": "Aborted",
    "UNAVAILABLE": "Unavailable",
    "DEADLINE_EXCEEDED": "DeadlineExceeded",
    "DATA_LOSS": "DataLoss",
    "RESOURCE_EXHAUSTED": "ResourceExhausted",
    "CANCELLED": "Cancelled",
    "INTERNAL": "Internal",
    "UNAUTHENTICATED": "Unauthenticated",
    "PERMISSION_DENIED": "PermissionDenied",
}


def exception_name(number):
    """The reshard.errors class name for a code number ("ReshardError" when none)."""
    return EXCEPTION_FOR_CODE.get(code_name(number), "ReshardError")


# -------------------------------------------------------------- the table

# Kinds of call (C++ rpc::CallKind).
CLIENT_CALL = "client_call"            # SDK / reshardctl unary call safe to repeat: reads,
#                                        keyed mutations, naturally idempotent ones
UNKEYED_MUTATION = "unkeyed_mutation"  # a mutation without a key: never repeated
AGENT_CALL = "agent_call"              # agent -> coordinator unary
STREAM_RECONNECT = "stream_reconnect"  # a watch reopened; the agent's poll; the launcher's follow
WORKER_PUBLISH = "worker_publish"      # worker -> agent PublishShard ("generation not open yet")
CALL_KINDS = (CLIENT_CALL, UNKEYED_MUTATION, AGENT_CALL, STREAM_RECONNECT, WORKER_PUBLISH)


def _policy(max_attempts, initial_backoff_s, max_backoff_s):
    return dict(max_attempts=max_attempts, initial_backoff_s=initial_backoff_s,
                max_backoff_s=max_backoff_s, multiplier=2.0, jitter=0.5)


# max_attempts: attempts per logical call, the first included; 0 = no limit
# of the table's own (the call site's deadline or limit bounds it).
POLICIES = {
    # 5 attempts within the caller's overall deadline (30 s by default);
    # each attempt's deadline is the time left.
    CLIENT_CALL: _policy(5, 0.1, 5.0),
    UNKEYED_MUTATION: _policy(1, 0.1, 5.0),
    # Each agent call site keeps its own limit (final report 30, GetTask 10
    # unless the coordinator is silent, the loops unbounded).
    AGENT_CALL: _policy(0, 0.1, 2.0),
    # 5 failures in a row for the SDK's watches; the agent's poll and the
    # launcher's follow are unbounded.
    STREAM_RECONNECT: _policy(5, 0.1, 5.0),
    # Bounded by the call's timeout (30 s); each attempt's deadline is the time left.
    WORKER_PUBLISH: _policy(0, 0.02, 0.5),
}

_RETRIED = {
    CLIENT_CALL: frozenset((UNAVAILABLE,)),
    UNKEYED_MUTATION: frozenset(),
    # The agent's calls are never refused for capacity: these mean the
    # coordinator is unreachable, slow, or shedding load.
    AGENT_CALL: frozenset((UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)),
    # DEADLINE_EXCEEDED: the stream's own deadline, reopened; RESOURCE_EXHAUSTED:
    # a refused watch waits for a slot (is_watch_refusal), not counted.
    STREAM_RECONNECT: frozenset((UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)),
    WORKER_PUBLISH: frozenset((UNAVAILABLE,)),
}


def policy(kind, **overrides):
    """A copy of the kind's row of POLICIES with `overrides` (the same keys)."""
    out = dict(POLICIES[kind])
    for key, value in overrides.items():
        if key not in out:
            raise KeyError(f"policy: no field \"{key}\" (fields: {', '.join(sorted(out))})")
        out[key] = value
    return out


def retryable(kind, code):
    """Whether a call of `kind` that failed with code number `code` is tried
    again. Codes the table does not list are the server's answer."""
    if kind not in _RETRIED:
        raise KeyError(f"call kind \"{kind}\" (kinds: {', '.join(CALL_KINDS)})")
    return code in _RETRIED[kind]


def is_watch_refusal(code):
    """RESOURCE_EXHAUSTED on a watch: its slots are taken; wait for one, uncounted."""
    return code == RESOURCE_EXHAUSTED


def is_silence(code):
    """UNAVAILABLE or DEADLINE_EXCEEDED: the other side did not answer."""
    return code in (UNAVAILABLE, DEADLINE_EXCEEDED)


def _row(kind_or_policy):
    return POLICIES[kind_or_policy] if isinstance(kind_or_policy, str) else kind_or_policy


def _micros(seconds):
    return int(round(seconds * 1e6))


def base_backoff_us(kind_or_policy, attempt):
    """The un-jittered wait after failed attempt `attempt` (1-based), in
    integer microseconds: min(max, initial * multiplier**(attempt-1))."""
    if attempt < 1:
        raise ValueError(f"attempt {attempt} must be >= 1")
    p = _row(kind_or_policy)
    cap = _micros(p["max_backoff_s"])
    grown = _micros(p["initial_backoff_s"]) * float(p["multiplier"]) ** (attempt - 1)
    return cap if grown >= cap else int(grown)


def backoff_at_us(kind_or_policy, attempt, u):
    """The jittered wait for a draw u in [0, 1), integer microseconds:
    floor(base * (1 - jitter * u)). Never above the base (so never above
    max_backoff), never below base * (1 - jitter): waits spread out below
    the cap instead of piling up on it."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u {u} must be in [0, 1)")
    p = _row(kind_or_policy)
    return int(math.floor(base_backoff_us(p, attempt) * (1.0 - float(p["jitter"]) * u)))


def base_backoff(kind_or_policy, attempt):
    """base_backoff_us in seconds."""
    return base_backoff_us(kind_or_policy, attempt) / 1e6


def backoff_at(kind_or_policy, attempt, u):
    """backoff_at_us in seconds."""
    return backoff_at_us(kind_or_policy, attempt, u) / 1e6


def backoff(kind_or_policy, attempt, rng=random):
    """The wait after failed attempt `attempt`, seconds, u drawn from `rng`."""
    return backoff_at(kind_or_policy, attempt, rng.random())


# ------------------------------------------------------------- enum names

def _upper_snake(name):
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out.append("_")
        out.append(ch.upper())
    return "".join(out)


def enum_prefix(enum):
    """UPPER_SNAKE of the enum's type name and "_" ("OperationState" ->
    "OPERATION_STATE_"), or "" when some value does not start with it (then
    full names are kept: TpMode's TP_SPLIT)."""
    desc = getattr(enum, "DESCRIPTOR", enum)
    prefix = _upper_snake(desc.name) + "_"
    if all(v.name.startswith(prefix) for v in desc.values):
        return prefix
    return ""


def short_name(enum, value, lower=False):
    """A value's name without its enum's prefix: short_name(OperationState,
    4) == "COMMITTED"; lower=True: "committed" (metric labels). A value the
    enum lacks: "UNKNOWN_<n>" ("unknown_<n>"). `enum` is a generated enum
    (coordinator_pb2.OperationState) or its EnumDescriptor."""
    desc = getattr(enum, "DESCRIPTOR", enum)
    v = desc.values_by_number.get(value)
    name = f"UNKNOWN_{value}" if v is None else v.name[len(enum_prefix(desc)):]
    return name.lower() if lower else name
