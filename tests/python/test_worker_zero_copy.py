"""Zero-copy publish (Worker.buffers: the state lives in the agent's rank
buffer, publish seals it in place) and zero-copy load (load(copy=False):
one mapping, verified in the pass that maps the pages) against real agents
(issue 22, items 1 and 2).

The in-place seal is observed through the agent's file: a seal that had to
take a private copy (the worker still held a writable view of the file)
renames a new file over the buffer's name, so the inode changes."""

import fcntl
import os
import stat

import numpy as np
import pytest
import xxhash

from helpers import check_generation, every_kind_ptc, random_globals, register, tensor
import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2 as OP, ptc_pb2, worker_pb2



def _path(w, rank, generation=1):
    """The rank buffer's file (PublishShard makes it if needed; idempotent)."""
    return w._call("PublishShard", worker_pb2.PublishShardRequest(
        job_id=w.job_id, generation=generation, rank=rank)).path


def _fill(bufs, want):
    """Writes the rank's values into the handed-out arrays (the worker
    computing its state in place)."""
    assert set(bufs) == set(want)
    for name, value in want.items():
        if isinstance(value, bytes):
            bufs[name][...] = np.frombuffer(value, dtype=np.uint8)
        else:
            np.copyto(bufs[name], value, casting="no")


def _held(ptc, lay, rank, g):
    want = layout.shard(ptc, lay, rank, g)
    return {k: v for k, v in want.items() if isinstance(v, bytes) or v.size}


def _raw(value):
    return value if isinstance(value, bytes) else value.tobytes()


def _every_kind_job(client, cluster, job_name, tp, seed):
    """every_kind_ptc at tp `tp` on host-0 (one rank per device): (ptc, layout,
    globals, job)."""
    ptc = every_kind_ptc()
    lay = layout.make_layout(tp, 1, 1, ["host-0"], tp)
    g = random_globals(ptc, world=tp, seed=seed)
    return ptc, lay, g, register(client, cluster, job_name, ptc, lay)


def _scribble(bufs):
    for a in bufs.values():
        a.view(np.uint8)[...] = 0xA5


def test_state_written_in_the_buffers_is_sealed_in_place_and_later_writes_stay_private(
        cluster, client, job_name):
    ptc, lay, g, j = _every_kind_job(client, cluster, job_name, 2, 21)
    want = _held(ptc, lay, 0, g)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        path = _path(w, 0)
        inode = os.stat(path).st_ino
        bufs = w.buffers(0, 1)
        assert all(a.flags.writeable and not a.flags.owndata for a in bufs.values())
        _fill(bufs, want)
        sums = w.publish(0, 1, dict(bufs))  # another dict, the same arrays
        after = os.stat(path)
        assert after.st_ino == inode, "sealed through a private copy, not in place"
        assert stat.S_IMODE(after.st_mode) == 0o400
        for name, value in want.items():
            assert sums[name] == xxhash.xxh3_64_intdigest(_raw(value)), name
        # The arrays keep their values and stay writable; what the worker
        # writes now never reaches the sealed buffer.
        for name, value in want.items():
            assert _raw(bufs[name]) == _raw(value), name
        _scribble(bufs)
        got = w.load(0, 1)
        assert set(got) == set(want)
        for name, value in want.items():
            assert _raw(got[name]) == _raw(value), name
        offsets = {it.name: it for it in w._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
            job_id=j.id, generation=1, rank=0)).items}
        with open(path, "rb") as f:
            for name, value in want.items():
                f.seek(offsets[name].offset)
                assert f.read(offsets[name].bytes) == _raw(value), name
        # The mapping lives as long as its arrays, and no longer.
        view = bufs["emb.pos"][1:]
        del bufs
        assert _mapped(path)
        del view
        assert not _mapped(path)


def _mapped(path):
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + path) for line in f)


def test_publish_refuses_buffers_of_another_rank_and_a_second_seal(cluster, client, job_name):
    ptc, lay, g, j = _every_kind_job(client, cluster, job_name, 2, 22)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        b0, b1 = w.buffers(0, 1), w.buffers(1, 1)
        _fill(b0, _held(ptc, lay, 0, g))
        again = w.buffers(0, 1)  # the same memory, not a second writable mapping
        assert again["emb.pos"].ctypes.data == b0["emb.pos"].ctypes.data
        del again
        with pytest.raises(ValueError, match=r'generation 1 rank 0 \(Worker.buffers\)'):
            w.publish(1, 1, b0)
        with pytest.raises(ValueError, match="generation 2 item"):
            w.publish(0, 2, b0)
        path0 = _path(w, 0)
        inode = os.stat(path0).st_ino
        w.publish(0, 1, b0)
        assert os.stat(path0).st_ino == inode
        with pytest.raises(reshard.FailedPrecondition, match="sealed already"):
            w.publish(0, 1, b0)
        with pytest.raises(reshard.FailedPrecondition, match="sealed"):
            w.buffers(0, 1)
        # Mixed: one item given as the worker's own memory is copied into
        # the buffer, the rest sealed where they are.
        want1 = _held(ptc, lay, 1, g)
        _fill(b1, want1)
        given = dict(b1)
        given["emb.pos"] = want1["emb.pos"].copy()
        b1["emb.pos"][...] = 0
        path = _path(w, 1)
        inode = os.stat(path).st_ino
        unsealed = w.publish(1, 1, given, seal=False)  # sealed later, as a snapshot is
        assert unsealed.seal()["emb.pos"] == xxhash.xxh3_64_intdigest(want1["emb.pos"].tobytes())
        assert os.stat(path).st_ino == inode
        got = w.load(1, 1)
        for name, value in want1.items():
            assert _raw(got[name]) == _raw(value), name


def test_a_resize_reads_the_sealed_bytes_not_the_writes_after_publish(cluster, client, job_name):
    ptc, lay, g, j = _every_kind_job(client, cluster, job_name, 2, 23)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        bufs = {r: w.buffers(r, 1) for r in (0, 1)}
        for r in (0, 1):
            _fill(bufs[r], _held(ptc, lay, r, g))
            w.publish(r, 1, bufs[r])
            _scribble(bufs[r])  # training on, after the seal
        target = layout.make_layout(1, 1, 2, ["host-1", "host-2"], 1)
        final = client.wait(client.resize(j.id, target).id, timeout=120)
        assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
        assert check_generation(cluster, j.id, ptc, target, g, 2) == []


def test_a_torch_parameter_in_the_buffers_trains_after_publish(cluster, client, job_name):
    torch = pytest.importorskip("torch")
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        tensor("w", "DTYPE_FLOAT32", [4, 3]), tensor("b", "DTYPE_BFLOAT16", [3])]}, ptc_pb2.Ptc)
    lay = layout.make_layout(1, 1, 1, ["host-0"], 1)
    j = register(client, cluster, job_name, ptc, lay)
    gen = torch.Generator().manual_seed(5)
    init_w = torch.randn(4, 3, generator=gen)
    init_b = torch.randn(3, generator=gen).to(torch.bfloat16)
    x = torch.randn(2, 4, generator=gen)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        path = _path(w, 0)
        inode = os.stat(path).st_ino
        bufs = w.buffers(0, 1, as_torch=True)
        assert bufs["b"].dtype == torch.bfloat16
        wp, bp = torch.nn.Parameter(bufs["w"]), torch.nn.Parameter(bufs["b"])
        with torch.no_grad():
            wp.copy_(init_w)
            bp.copy_(init_b)
        addr = wp.data_ptr()
        w.publish(0, 1, {"w": wp, "b": bp})
        assert os.stat(path).st_ino == inode
        # The same step on plain tensors: the result must be bitwise equal.
        ref_w = torch.nn.Parameter(init_w.clone())
        ref_b = torch.nn.Parameter(init_b.clone())
        for params in ((wp, bp), (ref_w, ref_b)):
            opt = torch.optim.SGD(params, lr=0.25)
            loss = (x @ params[0] + params[1].float()).square().sum()
            loss.backward()
            opt.step()
        assert wp.data_ptr() == addr
        assert torch.equal(wp.detach(), ref_w.detach()) and torch.equal(bp.detach(), ref_b.detach())
        assert not torch.equal(wp.detach(), init_w)
        got = w.load(0, 1, as_torch=True)
        assert torch.equal(got["w"], init_w) and torch.equal(got["b"], init_b)


def test_zero_copy_load_verifies_in_its_one_pass(cluster, client, job_name):
    ptc, lay, g, j = _every_kind_job(client, cluster, job_name, 1, 24)
    want = _held(ptc, lay, 0, g)
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        w.publish(0, 1, layout.shard(ptc, lay, 0, g))
        got = w.load(0, 1, copy=False)
        for name, value in want.items():
            assert _raw(got[name]) == _raw(value), name
        item = next(it for it in w._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
            job_id=j.id, generation=1, rank=0)).items if it.name == "layers.3.qkv")
        with open(_path_sealed(w, 0), "r+b") as f:  # root ignores the 0400 mode
            f.seek(item.offset + 5)
            b = f.read(1)
            f.seek(item.offset + 5)
            f.write(bytes([b[0] ^ 0x10]))
        with pytest.raises(reshard.DataLoss, match='"layers.3.qkv"'):
            w.load(0, 1, copy=False)
        assert "layers.3.qkv" in w.load(0, 1, copy=False, verify=False)


def _path_sealed(w, rank, generation=1):
    return w._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
        job_id=w.job_id, generation=generation, rank=rank)).path


def test_the_read_only_descriptor_of_a_published_buffer_is_read_only_and_refused_once_sealed(
        cluster, client, job_name):
    ptc = reshard.as_message({"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT32", [64])]},
                             ptc_pb2.Ptc)
    j = register(client, cluster, job_name, ptc, layout.make_layout(1, 1, 1, ["host-0"], 1))
    access = worker_pb2.WorkerFdRequest.ACCESS_PUBLISHED_READ
    with cluster.worker("host-0", j.id, ptc=ptc) as w:
        with pytest.raises(reshard.NotFound, match="call PublishShard first"):
            w._shard_fd(access, 1, 0, 0, "test")
        bufs = w.buffers(0, 1)
        size = w._call("PublishShard", worker_pb2.PublishShardRequest(
            job_id=j.id, generation=1, rank=0)).size
        fd = w._shard_fd(access, 1, 0, size, "test")
        try:
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        finally:
            os.close(fd)
        bufs["w"][...] = np.arange(64, dtype=np.float32)
        w.publish(0, 1, bufs)
        with pytest.raises(reshard.FailedPrecondition, match="is sealed"):
            w._shard_fd(access, 1, 0, size, "test")
