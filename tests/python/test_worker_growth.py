"""A worker cannot take memory past its agent's limit by growing its own
buffer, nor leave a stray buffer on a host its rank is not placed on (issue
31, defect 3 and "Also"; docs/agent.md, "Generation lifecycle").

The descriptor a worker maps for PublishShard is writable and tmpfs files
take no seals, so a worker can ftruncate its buffer far past the planned size
and write into it. Before the fix the agent reported the planned bytes while
tmpfs held the grown file until DeleteJob (another tenant's publish then
failed ENOSPC), and SealShard said DATA_LOSS. Now every seal, every
descriptor and every new buffer measures the worker buffers' files: a grown
one is FAILED_PRECONDITION naming job, generation, rank, planned and actual
bytes, dropped and truncated to nothing at once (even while the worker keeps
it open), and the agent's used bytes are what its files hold.
"""

import mmap
import os

import numpy as np
import pytest

import reshard
from reshard import layout
from reshard.v1 import ptc_pb2, worker_pb2

MiB = 1 << 20
LIMIT = 64 * MiB  # every grown file below is past it


@pytest.fixture(scope="module")
def cluster():  # conftest's client fixture connects to this one
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=1,
                      memory_limit_bytes=LIMIT) as c:
        yield c


def small_ptc():
    """One float32 tensor of 5120 elements split over tp 2: 10240 bytes a rank."""
    t = {"name": "w", "dtype": "DTYPE_FLOAT32", "shape": [5120],
         "partition": {"tp": {"mode": "TP_SPLIT", "axis": 0}, "pipeline": {"mode": "PIPELINE_LAYER"},
                       "dp": {"mode": "DP_REPLICATED"}}}
    return reshard.as_message({"numLayers": 1, "tensors": [t]}, ptc_pb2.Ptc)


def register(client, name):
    """Rank 0 on host-0, rank 1 on host-1."""
    spec = ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=small_ptc(),
                           layout=layout.make_layout(2, 1, 1, ["host-0", "host-1"], 1))
    return client.register_job(spec)


def shard(rank):
    return {"w": np.arange(2560, dtype=np.float32) + rank}


def open_for_writing(w, job_id, rank=0):
    """PublishShard and the writable descriptor a worker maps."""
    resp = w._call("PublishShard", worker_pb2.PublishShardRequest(
        job_id=job_id, generation=1, rank=rank))
    assert resp.size == 10240
    return w._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_PUBLISH, 1, rank, resp.size,
                       "PublishShard")


def grow_and_fill(fd, size):
    """What a hostile worker does with its descriptor."""
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
        for at in range(0, size, MiB):
            m[at:at + MiB] = b"x" * MiB


def refusal(job_id, holds, human, size, allocated):
    return (f'rank buffer of job "{job_id}" generation 1 rank 0 holds {holds} bytes ({human}: '
            f"size {size}, allocated {allocated}), 10240 bytes (10.0 KiB) planned: a worker may "
            f"write its buffer but not grow it (ftruncate, fallocate or a write past its end); "
            f"the buffer was dropped and its memory freed: publish the rank again")


def files_of(cluster, host, job_id):
    return {n: s for n, s in cluster.shm_files(host).items() if f"-{job_id}-" in n}


def used_bytes(cluster, host):
    return int(cluster.metrics_of(host)["reshard_agent_shard_store_used_bytes"])


def real_bytes(cluster, host):
    """The sizes of the agent's buffer files (sidecars aside): a grown file
    counts what it grew to."""
    return sum(size for name, size in cluster.shm_files(host).items()
               if not name.endswith(".meta"))


def test_a_grown_buffer_is_refused_at_seal_and_its_memory_freed(cluster, client, job_name):
    job = register(client, job_name)
    with cluster.worker("host-0", job.id) as w:
        fd = open_for_writing(w, job.id)
        try:
            grow_and_fill(fd, 96 * MiB)
            with pytest.raises(reshard.FailedPrecondition) as e:
                w._call("SealShard", worker_pb2.SealShardRequest(
                    job_id=job.id, generation=1, rank=0))
            # Freed at once, while this worker still holds the descriptor.
            st = os.fstat(fd)
            assert (st.st_size, st.st_blocks) == (0, 0)
        finally:
            os.close(fd)
    assert e.value.message == refusal(job.id, 96 * MiB, "96.0 MiB", 96 * MiB, 96 * MiB)
    assert files_of(cluster, "host-0", job.id) == {}
    assert used_bytes(cluster, "host-0") == real_bytes(cluster, "host-0")
    # Another tenant's publish that fits is served, and the rank published
    # again starts afresh.
    other = register(client, job_name + "-b")
    with cluster.worker("host-0", other.id) as w:
        w.publish(0, 1, shard(0))
    with cluster.worker("host-0", job.id) as w:
        w.publish(0, 1, shard(0))
    assert used_bytes(cluster, "host-0") == real_bytes(cluster, "host-0")


def test_another_publish_frees_a_grown_buffer_first(cluster, client, job_name):
    job = register(client, job_name)
    with cluster.worker("host-0", job.id) as w:
        fd = open_for_writing(w, job.id)
        try:
            grow_and_fill(fd, 80 * MiB)
            # Another tenant publishes before this worker seals: the grown
            # file goes first, it does not take the other's room.
            other = register(client, job_name + "-b")
            with cluster.worker("host-0", other.id) as o:
                o.publish(0, 1, shard(0))
            st = os.fstat(fd)
            assert (st.st_size, st.st_blocks) == (0, 0)
        finally:
            os.close(fd)
        assert files_of(cluster, "host-0", job.id) == {}
        assert used_bytes(cluster, "host-0") == real_bytes(cluster, "host-0")
        with pytest.raises(reshard.FailedPrecondition) as e:
            w._call("SealShard", worker_pb2.SealShardRequest(job_id=job.id, generation=1, rank=0))
    assert e.value.message == refusal(job.id, 80 * MiB, "80.0 MiB", 80 * MiB, 80 * MiB)


def test_a_grown_buffer_gets_no_descriptor(cluster, client, job_name):
    job = register(client, job_name)
    with cluster.worker("host-0", job.id) as w:
        fd = open_for_writing(w, job.id)
        os.ftruncate(fd, 1 << 30)  # sparse: no page yet, but any write may take one
        os.close(fd)
        with pytest.raises(reshard.FailedPrecondition) as e:
            w._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_PUBLISH, 1, 0, 10240, "PublishShard")
    assert e.value.message == refusal(job.id, 1 << 30, "1.0 GiB", 1 << 30, 12288)
    assert files_of(cluster, "host-0", job.id) == {}


def test_a_rank_placed_elsewhere_is_not_published_here(cluster, client, job_name):
    job = register(client, job_name)
    with cluster.worker("host-0", job.id) as w:
        with pytest.raises(reshard.FailedPrecondition) as e:
            w.publish(1, 1, shard(1))
    assert e.value.message == (
        f'job "{job.id}" generation 1 rank 1 is placed on host "host-1" device 0, not on this '
        f"agent's host \"host-0\": a worker publishes a rank through the agent of the host that "
        f"its layout places it on")
    assert files_of(cluster, "host-0", job.id) == {}
    # Through the agent of its host it is published.
    with cluster.worker("host-1", job.id) as w:
        assert set(w.publish(1, 1, shard(1))) == {"w"}
