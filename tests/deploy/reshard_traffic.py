"""Drives a running reshard cluster through one real operation, so that every
metric family of the coordinator and the agents has series to scrape.

What it does (with the generated stubs under <build>/python):
  1. registers a one-tensor job (tp=pp=dp=1) on the first host;
  2. publishes rank 0 through that host's agent (worker socket), fills its
     buffer with a byte pattern and seals it;
  3. resizes to dp=2 over the first two hosts and waits for COMMITTED
     (a cross-host transfer: the second agent receives the tensor);
  4. resizes onto a host that has no agent, which the coordinator ABORTS
     (an operation that did not commit, for reshard_coordinator_operations_total).
"""

import mmap
import os
import time
import uuid

import grpc
from reshard.v1 import coordinator_pb2, coordinator_pb2_grpc, ptc_pb2
from reshard.v1 import worker_pb2, worker_pb2_grpc

TENSOR_ELEMENTS = 64 * 1024  # float32: 256 KiB
TERMINAL = {
    coordinator_pb2.OPERATION_STATE_COMMITTED,
    coordinator_pb2.OPERATION_STATE_ABORTED,
    coordinator_pb2.OPERATION_STATE_FAILED,
}


def _placement(hosts):
    return ptc_pb2.Placement(hosts=list(hosts), devices_per_host=1)


def _wait_operation(stub, operation_id, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        op = stub.GetOperation(coordinator_pb2.GetOperationRequest(operation_id=operation_id),
                               timeout=10)
        if op.state in TERMINAL:
            return op
        if time.monotonic() > deadline:
            raise AssertionError(f"operation {operation_id} still "
                                 f"{coordinator_pb2.OperationState.Name(op.state)} after "
                                 f"{timeout_s} s")
        time.sleep(0.1)


def run(coordinator, worker_sockets, host_ids):
    """coordinator: "HOST:PORT"; worker_sockets[i] is host_ids[i]'s agent
    socket path. Returns (committed resize, aborted resize) operations."""
    assert len(host_ids) >= 2, "needs two hosts"
    channel = grpc.insecure_channel(coordinator)
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)

    tensor = ptc_pb2.TensorSpec(name="layers.0.weight", dtype=ptc_pb2.DTYPE_FLOAT32,
                                shape=[TENSOR_ELEMENTS])
    tensor.partition.pipeline.mode = ptc_pb2.PIPELINE_EVERY_STAGE
    spec = ptc_pb2.JobSpec(name=f"deploy-test-{uuid.uuid4().hex[:8]}", tenant="deploy-test")
    spec.ptc.num_layers = 1
    spec.ptc.tensors.append(tensor)
    spec.layout.config.tp = 1
    spec.layout.config.pp = 1
    spec.layout.config.dp = 1
    spec.layout.placement.CopyFrom(_placement(host_ids[:1]))
    registered = stub.RegisterJob(coordinator_pb2.RegisterJobRequest(spec=spec), timeout=10)
    job = registered.job
    # The job's workers present its worker token to their agent.
    token_md = (("authorization", "Bearer " + registered.worker_token),)

    with grpc.insecure_channel("unix:" + worker_sockets[0]) as wch:
        worker = worker_pb2_grpc.WorkerServiceStub(wch)
        pub = worker.PublishShard(
            worker_pb2.PublishShardRequest(job_id=job.id, generation=1, rank=0), timeout=10,
            metadata=token_md)
        fd = os.open(pub.path, os.O_RDWR)
        try:
            with mmap.mmap(fd, pub.size) as m:
                item = pub.items[0]
                m[item.offset:item.offset + item.bytes] = bytes(
                    (i * 7) % 251 for i in range(item.bytes))
        finally:
            os.close(fd)
        worker.SealShard(worker_pb2.SealShardRequest(job_id=job.id, generation=1, rank=0),
                         timeout=10, metadata=token_md)

    grow = coordinator_pb2.ResizeRequest(job_id=job.id, expected_generation=1,
                                         placement=_placement(host_ids[:2]))
    grow.config.tp, grow.config.pp, grow.config.dp = 1, 1, 2
    committed = _wait_operation(stub, stub.Resize(grow, timeout=10).id)
    assert committed.state == coordinator_pb2.OPERATION_STATE_COMMITTED, committed

    ghost = coordinator_pb2.ResizeRequest(job_id=job.id, expected_generation=2,
                                          placement=_placement(["no-such-host"]))
    ghost.config.tp, ghost.config.pp, ghost.config.dp = 1, 1, 1
    aborted = _wait_operation(stub, stub.Resize(ghost, timeout=10).id)
    assert aborted.state in (coordinator_pb2.OPERATION_STATE_ABORTED,
                             coordinator_pb2.OPERATION_STATE_FAILED), aborted
    channel.close()
    return committed, aborted
