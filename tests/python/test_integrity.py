"""A sealed generation is immutable and nothing a worker does to its files
crashes its agent (issue 9, defects 1 and 2), against real agents and a real
resize: the scenarios of the issue, caused for real."""

import mmap
import os
import threading

import grpc
import numpy as np
import pytest

from helpers import register, tensor, worker_channel
import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2 as OP, ptc_pb2, worker_pb2, worker_pb2_grpc

ROWS = 4096
COLS = 2048  # one fp32 tensor of 32 MiB, replicated


def big_ptc():
    return reshard.as_message(
        {"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT32", [ROWS, COLS])]}, ptc_pb2.Ptc)


def stub(cluster, host):
    channel = worker_channel(cluster, host)
    return channel, worker_pb2_grpc.WorkerServiceStub(channel)


def key(job_id, rank=0, generation=1):
    return dict(job_id=job_id, generation=generation, rank=rank)


def one_rank_job(client, cluster, name, host="host-0"):
    lay = layout.make_layout(1, 1, 1, [host], 1)
    return register(client, cluster, name, big_ptc(), lay)


def agent_alive(cluster, host):
    return cluster.agents[host].alive()


def test_republishing_a_sealed_rank_is_refused(cluster, client, job_name):
    job = one_rank_job(client, cluster, job_name)
    channel, w = stub(cluster, "host-0")
    with channel:
        w.PublishShard(worker_pb2.PublishShardRequest(**key(job.id)))
        w.SealShard(worker_pb2.SealShardRequest(**key(job.id)))
        with pytest.raises(grpc.RpcError) as e:
            w.PublishShard(worker_pb2.PublishShardRequest(**key(job.id)))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        for part in (job.id, "generation 1", "rank 0"):
            assert part in e.value.details()


def test_writes_through_a_mapping_held_across_seal_and_resize_never_tear(
        cluster, client, job_name):
    """The issue's torn generation: published all-A, then written as all-B in
    a loop (and re-published) while a resize reads it. Generation 2 must be
    all-A."""
    job = one_rank_job(client, cluster, job_name)
    channel, w = stub(cluster, "host-0")
    with channel:
        resp = w.PublishShard(worker_pb2.PublishShardRequest(**key(job.id)))
        fd = os.open(resp.path, os.O_RDWR)
        mm = mmap.mmap(fd, resp.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)
        item = resp.items[0]
        view = np.ndarray((item.bytes // 4,), dtype=np.float32, buffer=mm, offset=item.offset)
        view[:] = 1.0  # A
        w.SealShard(worker_pb2.SealShardRequest(**key(job.id)))
        stop = threading.Event()
        refused = []

        def scribble():
            value = 2.0  # B, and more
            while not stop.is_set():
                view[:] = value
                value += 1.0
                try:
                    w.PublishShard(worker_pb2.PublishShardRequest(**key(job.id)))
                except grpc.RpcError as err:
                    refused.append(err.code())

        t = threading.Thread(target=scribble)
        t.start()
        try:
            target = layout.make_layout(1, 1, 2, ["host-1", "host-2"], 1)
            op = client.resize(job.id, target)
            final = client.wait(op.id, timeout=120)
        finally:
            stop.set()
            t.join()
        del view
        mm.close()
    assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
    assert refused and set(refused) == {grpc.StatusCode.FAILED_PRECONDITION}
    for host, rank in (("host-1", 0), ("host-2", 1)):
        with cluster.worker(host, job.id, ptc=big_ptc()) as wk:
            got = wk.load(rank, 2)["w"]
            assert np.all(got == 1.0), f"rank {rank}: {np.unique(got)[:5]}"


def test_truncating_a_published_file_then_sealing_is_data_loss_not_a_crash(
        cluster, client, job_name):
    job = one_rank_job(client, cluster, job_name)
    channel, w = stub(cluster, "host-0")
    with channel:
        resp = w.PublishShard(worker_pb2.PublishShardRequest(**key(job.id)))
        os.truncate(resp.path, 0)
        with pytest.raises(grpc.RpcError) as e:
            w.SealShard(worker_pb2.SealShardRequest(**key(job.id)))
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        assert agent_alive(cluster, "host-0")
        # The agent goes on serving: another job on the same host publishes.
        other = one_rank_job(client, cluster, job_name + "-other")
        w.PublishShard(worker_pb2.PublishShardRequest(**key(other.id)))
        w.SealShard(worker_pb2.SealShardRequest(**key(other.id)))


def test_truncating_a_sealed_file_then_resizing_fails_the_operation_not_the_agent(
        cluster, client, job_name):
    job = one_rank_job(client, cluster, job_name)
    g = {"w": np.full((ROWS, COLS), 3.0, dtype=np.float32)}
    lay = layout.make_layout(1, 1, 1, ["host-0"], 1)
    with cluster.worker("host-0", job.id) as wk:
        wk.publish(0, 1, layout.shard(big_ptc(), lay, 0, g))
        path = wk._call("OpenGeneration", worker_pb2.OpenGenerationRequest(**key(job.id))).path
    os.truncate(path, 4096)  # root ignores the file's 0400 mode
    op = client.resize(job.id, layout.make_layout(1, 1, 1, ["host-1"], 1))
    final = client.wait(op.id, timeout=120)
    assert final.state == OP.OPERATION_STATE_ABORTED
    assert "DATA_LOSS" in final.error and "rank 0" in final.error, final.error
    assert agent_alive(cluster, "host-0") and agent_alive(cluster, "host-1")
    assert client.get_job(job.id).generation == 1
