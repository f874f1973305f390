"""reshard: Python SDK of the reshard coordinator and agents.

- reshard.Client: the scheduler API (jobs, resize, migrate, recover, preview,
  operations, hosts) with deadlines and retries on UNAVAILABLE.
- reshard.Worker: a training worker publishes its rank's tensors to the agent
  of its host and loads a new generation's shards.
- reshard.layout: layouts and the reference "global tensors -> one rank's
  shard" function of docs/partitioning.md.
- reshard.data: the dataset state of docs/data.md: sample order, per-rank
  shares without divisibility requirements, an elastic sampler.
- reshard.megatron: PTC specs from Megatron-style state dicts; a synthetic GPT;
  gpt_ptc / t5_ptc: a Megatron-core model as Megatron holds it.
- reshard.fsdp: PTCs of PyTorch FSDP jobs (flat parameters, DTensor Shard(0)).
- reshard.buckets: the DP_BUCKET bucket layout of a rank's buffers.

The generated messages live in reshard.v1 (ptc_pb2, coordinator_pb2, ...).
"""

import os

# gRPC advances an idle channel's reconnect (TCP connect, TLS handshake) only
# from its backup poller, every 5 s by default; a client that retries
# UNAVAILABLE fails fast in between, so a TLS reconnect to a restarted
# coordinator took ~20 s. Poll every 100 ms unless the process chose.
os.environ.setdefault("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100")
# Without GRPC_VERBOSITY gRPC's core logs at absl's default level, INFO: every
# failed connection attempt (a TLS handshake with a plaintext endpoint) wrote
# its own line to the process's stderr, around the error the SDK raises. ERROR
# (gRPC's documented default) unless the process chose.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from reshard.core.errors import (  # noqa: F401
    Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition, Internal,
    InvalidArgument, NotFound, OperationFailed, PermissionDenied, ReshardError, ResourceExhausted,
    Unauthenticated, Unavailable)
from reshard.core._proto import as_message, to_dict  # noqa: F401
from reshard.v1 import agent_pb2, coordinator_pb2, plan_pb2, ptc_pb2  # noqa: F401
from reshard.core.client import (  # noqa: F401
    Client, TERMINAL_STATES, is_terminal, tls_credentials)
from reshard.core.worker import Worker, checksum  # noqa: F401
# The modules `import reshard` makes attributes of the package (reshard.data,
# reshard.client, ...), as before the sources were grouped by audience.
from reshard.core import (  # noqa: F401
    _dtypes, _proto, _rank_region, _rpc, buckets, client, data, errors, layout, worker)
from reshard.frameworks import fsdp, megatron, megatron_core  # noqa: F401

# Enum wrappers, e.g. reshard.OperationState.Name(op.state), reshard.DType.Value("DTYPE_BFLOAT16").
OperationState = coordinator_pb2.OperationState
OperationKind = coordinator_pb2.OperationKind
JobState = coordinator_pb2.JobState
HostState = agent_pb2.HostState
DType = ptc_pb2.DType

__version__ = "0.1.0"

__all__ = [
    "Client", "tls_credentials", "Worker", "data", "layout", "megatron", "checksum", "is_terminal", "TERMINAL_STATES",
    "buckets", "fsdp", "as_message", "to_dict", "agent_pb2", "coordinator_pb2", "plan_pb2", "ptc_pb2",
    "OperationState", "OperationKind", "JobState", "HostState", "DType",
    "ReshardError", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition",
    "Aborted", "Unavailable", "DeadlineExceeded", "DataLoss", "ResourceExhausted", "Cancelled",
    "Internal", "OperationFailed", "Unauthenticated", "PermissionDenied",
]
