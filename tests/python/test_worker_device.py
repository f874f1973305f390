"""Device-resident state through CUDA IPC (issue 23, items 2-3, the worker's
side) against real agents: host-0's agent runs the fake device (two fake
GPUs: host memory behind the device API, agent/device/fake_device.h),
host-1's none. The worker's "device memory" is a fake device allocation of
this process (reshard._device_ipc.FakeAllocation, a memfd the agent opens
through /proc), so PublishDeviceShard and OpenDeviceGeneration move real
bytes between two processes as CUDA IPC does.

Published device state is copied on seal: overwriting the worker's memory
afterwards leaves the sealed generation as it was. Its checksums are the
XXH3-64 of the bytes, the ones the host path records for the same bytes,
and a CPU load (OpenGeneration) of the device-resident rank gets the same
values."""

import os

import numpy as np
import pytest
import xxhash

from helpers import (every_kind_ptc, fake_device_items, item_raws, random_globals, read_device,
                     register)
import reshard
from reshard import _device_ipc, layout
from reshard.v1 import coordinator_pb2 as OP, worker_pb2


@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                      agent_device={"host-0": "fake:2", "host-1": "none"}) as c:
        yield c


def _raw(value):
    return value if isinstance(value, bytes) else value.tobytes()


def _job(client, cluster, job_name, host="host-0", seed=3):
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 1, 1, [host], 2)
    g = random_globals(ptc, world=2, seed=seed)
    return ptc, lay, g, register(client, cluster, job_name, ptc, lay)


def test_device_publish_is_copied_on_seal_and_reads_back_byte_exact(cluster, client, job_name):
    ptc, lay, g, j = _job(client, cluster, job_name)
    want = layout.shard(ptc, lay, 0, g)
    names, raws = item_raws(ptc, want)
    alloc, items = fake_device_items(raws, device=1)
    try:
        with cluster.worker("host-0", j.id, ptc=ptc) as w:
            sums = w.publish_device(0, 1, items, device=1)
            assert sums == [xxhash.xxh3_64_intdigest(r) for r in raws]
            # The worker reuses its memory: the sealed generation is the agent's copy.
            alloc.view[:] = b"\xa5" * len(alloc.view)
            resp = w.open_device(0, 1)
            assert resp.device == 1
            assert list(resp.checksums) == sums
            assert [it.name for it in resp.items] == names
            assert read_device(resp) == raws
            # A CPU load of the device-resident rank: staged to host, same values.
            got = w.load(0, 1)
            held = {n: v for n, v in want.items() if isinstance(v, bytes) or v.size}
            assert set(got) == set(held)
            for name, value in held.items():
                assert _raw(got[name]) == _raw(value), name
            # Sealed (immutable): a second publish of the rank is refused.
            with pytest.raises(reshard.FailedPrecondition, match="sealed"):
                w.publish_device(0, 1, items, device=1)
            with pytest.raises(reshard.FailedPrecondition, match="device memory"):
                w.publish(0, 1, want)  # nor through the host path
    finally:
        alloc.close()

    # The host path records the same checksums for the same bytes.
    _, _, _, j2 = _job(client, cluster, job_name + "-host")
    with cluster.worker("host-0", j2.id, ptc=ptc) as w:
        host_sums = w.publish(0, 1, want)
    assert [host_sums[n] for n in names] == sums


def test_open_device_stages_a_host_published_rank(cluster, client, job_name):
    ptc, lay, g, j = _job(client, cluster, job_name, seed=5)
    want = layout.shard(ptc, lay, 1, g)
    names, raws = item_raws(ptc, want)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        host_sums = w.publish(1, 1, want)
        resp = w.open_device(1, 1)
        assert resp.device == 1  # rank 1 mod 2 fake devices
        assert list(resp.checksums) == [host_sums[n] for n in names]
        assert read_device(resp) == raws
        # Opening again hands out the same staged buffer.
        assert w.open_device(1, 1).checksums == resp.checksums


def test_device_publish_errors(cluster, client, job_name):
    ptc, lay, g, j = _job(client, cluster, job_name, seed=7)
    names, raws = item_raws(ptc, layout.shard(ptc, lay, 0, g))
    alloc, items = fake_device_items(raws)
    try:
        with cluster.worker("host-0", j.id, ptc=ptc) as w:
            # An item whose size is not the layout's, named with both sizes.
            i = next(k for k, it in enumerate(items) if it is not None and it[2] > 64)
            short = list(items)
            short[i] = (items[i][0], items[i][1], items[i][2] - 1)
            with pytest.raises(reshard.InvalidArgument,
                               match=rf"\"{names[i]}\"\) has {raws[i].__len__() - 1} bytes.* "
                                     rf"{len(raws[i])}"):
                w.publish_device(0, 1, short)
            with pytest.raises(reshard.InvalidArgument, match="device items"):
                w.publish_device(0, 1, items[:-1])
            with pytest.raises(reshard.InvalidArgument, match="rank 2 out of range"):
                w.publish_device(2, 1, items)
            with pytest.raises(reshard.InvalidArgument, match="device 2 out of range"):
                w.publish_device(0, 1, items, device=2)
            # An item passing the end of the allocation its handle names:
            # refused by its size (the agent must not read the memory after
            # it), whatever the device API would allow.
            k = max(n for n, it in enumerate(items) if it is not None)
            past = list(items)
            past[k] = (items[k][0], alloc.nbytes - items[k][2] + 1, items[k][2])
            with pytest.raises(reshard.InvalidArgument,
                               match=rf"item {k}: offset {past[k][1]} \+ {items[k][2]} bytes "
                                     rf"passes the end of its IPC handle's allocation "
                                     rf"\({alloc.nbytes} bytes\)"):
                w.publish_device(0, 1, past)
            with pytest.raises(reshard.NotFound):
                w.open_device(0, 1)
            # A refused publish left nothing behind: the rank publishes now.
            assert w.publish_device(0, 1, items) == [xxhash.xxh3_64_intdigest(r) for r in raws]
        # Another job's token, as on the host path.
        _, _, _, other = _job(client, cluster, job_name + "-other")
        with cluster.worker("host-0", j.id, ptc=ptc,
                            worker_token=cluster.worker_token(other.id)) as w:
            with pytest.raises(reshard.PermissionDenied, match=j.id):
                w.publish_device(1, 1, items)
            with pytest.raises(reshard.PermissionDenied, match=j.id):
                w.open_device(0, 1)
    finally:
        alloc.close()


def test_a_handle_reads_only_the_callers_own_memfd(cluster, client, job_name, tmp_path):
    """The agent opens a fake handle's /proc/<pid>/fd/<fd> with its own
    (root) rights: a worker must not be able to name what another process
    holds open. Another process's descriptor of a root-only file, and this
    process's own descriptor of such a file, are both refused
    PERMISSION_DENIED, and nothing of the file reaches the rank: the rank
    publishes from real device memory afterwards. Before, the agent mapped
    and sealed the file's bytes."""
    import subprocess
    import sys
    ptc, lay, g, j = _job(client, cluster, job_name, seed=11)
    names, raws = item_raws(ptc, layout.shard(ptc, lay, 0, g))
    secret = tmp_path / "secret"
    secret.write_bytes(b"S" * (1 << 20))
    secret.chmod(0o600)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import os,sys; fd = os.open(sys.argv[1], os.O_RDWR); print(fd, flush=True); "
         "sys.stdin.read()", str(secret)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    own = os.open(secret, os.O_RDWR)
    alloc, items = fake_device_items(raws)
    try:
        held_fd = int(holder.stdout.readline())
        k = next(n for n, it in enumerate(items) if it is not None)

        def naming(pid, fd):
            forged = list(items)
            forged[k] = (f"fake-ipc {pid} {fd} 0 {1 << 20}".encode(), 0, items[k][2])
            return forged

        with cluster.worker("host-0", j.id, ptc=ptc) as w:
            with pytest.raises(reshard.PermissionDenied,
                               match=rf"item {k}: .*the handle names process {holder.pid} "
                                     rf"descriptor {held_fd}, but the caller is process "
                                     rf"{os.getpid()}"):
                w.publish_device(0, 1, naming(holder.pid, held_fd))
            with pytest.raises(reshard.PermissionDenied,
                               match=rf"item {k}: .*/proc/{os.getpid()}/fd/{own} is not a memfd"):
                w.publish_device(0, 1, naming(os.getpid(), own))
            # Nothing was sealed from the file: the rank is still unpublished
            # and publishes from the worker's device memory.
            with pytest.raises(reshard.NotFound):
                w.open_device(0, 1)
            assert w.publish_device(0, 1, items) == [xxhash.xxh3_64_intdigest(r) for r in raws]
    finally:
        alloc.close()
        os.close(own)
        holder.stdin.close()
        holder.wait(timeout=30)


def test_agent_without_device_refuses_device_calls(cluster, client, job_name):
    ptc, lay, g, j = _job(client, cluster, job_name, host="host-1", seed=9)
    names, raws = item_raws(ptc, layout.shard(ptc, lay, 0, g))
    alloc, items = fake_device_items(raws)
    try:
        with cluster.worker("host-1", j.id, ptc=ptc) as w:
            with pytest.raises(reshard.FailedPrecondition, match="--device"):
                w.publish_device(0, 1, items)
            w.publish(0, 1, layout.shard(ptc, lay, 0, g))
            with pytest.raises(reshard.FailedPrecondition, match="--device"):
                w.open_device(0, 1)
    finally:
        alloc.close()


def _cuda_available():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device (torch.cuda)")
def test_cuda_backend_handle_of_names_the_tensor_inside_its_block():
    import torch
    block = torch.arange(1024, dtype=torch.float32, device="cuda")
    t = block[256:512]
    handle, offset, release = _device_ipc.CudaBackend.handle_of(t)
    base_handle, base_offset, base_release = _device_ipc.CudaBackend.handle_of(block)
    release()
    base_release()
    assert len(handle) == 64 and handle == base_handle
    assert offset - base_offset == 256 * 4


def _device_used(cluster, host="host-0"):
    m = cluster.metrics_of(host)
    return sum(v for k, v in m.items() if k.startswith("reshard_agent_device_used_bytes{"))


def _pinned(cluster, host="host-0"):
    """(registrations so far, bytes registered now) of the agent's pinned
    host memory pool, as its metrics say."""
    m = cluster.metrics_of(host)
    return (m["reshard_agent_pinned_host_registrations_total"],
            m["reshard_agent_pinned_host_bytes"])


def test_resize_of_device_published_state_matches_the_host_path(cluster, client, job_name):
    """tp=2 -> dp=2 on host-0 of device-published ranks: the new generation
    is made on the devices (the placement rule: device sources, device
    destinations), and equals byte for byte both the expected reshard and
    the same resize of host-published state."""
    ptc, lay, g, j = _job(client, cluster, job_name, seed=11)
    _, _, _, twin = _job(client, cluster, job_name + "-host", seed=11)
    target = layout.make_layout(1, 1, 2, ["host-0"], 2)
    allocs = []
    try:
        with cluster.worker("host-0", j.id, ptc=ptc) as w, \
                cluster.worker("host-0", twin.id, ptc=ptc) as wt:
            for rank in (0, 1):
                want = layout.shard(ptc, lay, rank, g)
                _, raws = item_raws(ptc, want)
                alloc, items = fake_device_items(raws, device=rank)
                allocs.append(alloc)
                w.publish_device(rank, 1, items, device=rank)
                wt.publish(rank, 1, want)
            used = _device_used(cluster)
            # The seals so far staged through pinned host memory: 1 MiB
            # blocks (the buffers are small), registered once.
            registrations, pinned_bytes = _pinned(cluster)
            assert registrations > 0
            assert pinned_bytes == registrations * (1 << 20)
            for job in (j, twin):
                final = client.wait(client.resize(job.id, target).id, timeout=120)
                assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
            assert _device_used(cluster) > used  # generation 2 lives on the devices
            # The resize sealed new device buffers through the same blocks.
            assert _pinned(cluster) == (registrations, pinned_bytes)
            for rank in (0, 1):
                names, raws = item_raws(ptc, layout.shard(ptc, target, rank, g))
                resp = w.open_device(rank, 2)
                assert resp.device == rank  # the device of the same-numbered old rank
                assert read_device(resp) == raws
                assert list(resp.checksums) == [xxhash.xxh3_64_intdigest(r) for r in raws]
                host = wt._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
                    job_id=twin.id, generation=2, rank=rank))
                assert list(host.checksums) == list(resp.checksums)
                got = w.load(rank, 2)  # and a CPU load of it
                for name, raw in zip(names, raws):
                    if raw:
                        assert _raw(got[name]) == raw, name
    finally:
        for a in allocs:
            a.close()


def test_checkpoint_of_device_published_state_commits(cluster, client, job_name):
    """A checkpoint's workers publish generation 2 through CUDA IPC: the
    agent's checkpoint task takes the sealed device buffers as published
    ranks, the checkpoint commits, and generation 2 reads back as published."""
    ptc, lay, g, j = _job(client, cluster, job_name, seed=13)
    step7 = random_globals(ptc, world=2, seed=14)
    allocs = []
    try:
        with cluster.worker("host-0", j.id, ptc=ptc) as w:
            for rank in (0, 1):
                w.publish(rank, 1, layout.shard(ptc, lay, rank, g))
            op = client.checkpoint(j.id)
            for rank in (0, 1):
                _, raws = item_raws(ptc, layout.shard(ptc, lay, rank, step7))
                alloc, items = fake_device_items(raws, device=rank)
                allocs.append(alloc)
                w.publish_device(rank, op.to_generation, items, device=rank)
            final = client.wait(op.id, timeout=60)
            assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
            assert client.get_job(j.id).generation == 2
            for rank in (0, 1):
                _, raws = item_raws(ptc, layout.shard(ptc, lay, rank, step7))
                assert read_device(w.open_device(rank, 2)) == raws
    finally:
        for a in allocs:
            a.close()
