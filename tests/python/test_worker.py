"""reshard.Worker against real agents: publish / load round trips with numpy
and torch, copy semantics, checksums, and every error a worker can make."""

import grpc
import numpy as np
import pytest
import xxhash

from helpers import every_kind_ptc, random_globals, register
import reshard
from reshard import layout
from reshard.v1 import ptc_pb2, worker_pb2, worker_pb2_grpc


@pytest.fixture(scope="module")
def job(cluster, client):
    """every_kind_ptc on tp 2 x pp 2 x dp 1 over host-0, host-1 (2 devices each)."""
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 2, 1, cluster.host_ids[:2], 2)
    g = random_globals(ptc, world=4, seed=11)
    j = register(client, cluster, "worker-suite", ptc, lay)
    return j, ptc, lay, g


def worker(cluster, job_id, host="host-0", **kw):
    return cluster.worker(host, job_id, **kw)


def test_numpy_round_trip(cluster, job):
    j, ptc, lay, g = job
    sums = {}
    for host in cluster.host_ids[:2]:
        with worker(cluster, j.id, host) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                shard = layout.shard(ptc, lay, rank, g)
                sums[rank] = w.publish(rank, 1, shard)
                # checksums: XXH3-64 of each item's bytes; every PTC item reported
                items = {t.name for t in ptc.tensors} | {b.name for b in ptc.blobs}
                assert set(sums[rank]) == items
                for name, value in shard.items():
                    raw = value if isinstance(value, bytes) else value.tobytes()
                    assert sums[rank][name] == xxhash.xxh3_64_intdigest(raw), name
    dtypes = {t.name: reshard._dtypes.numpy_dtype(t.dtype) for t in ptc.tensors}
    for host in cluster.host_ids[:2]:
        with worker(cluster, j.id, host, ptc=ptc) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                got = w.load(rank, 1)
                want = layout.shard(ptc, lay, rank, g)
                want = {k: v for k, v in want.items() if isinstance(v, bytes) or v.size}
                assert set(got) == set(want)
                assert got.regenerated == frozenset()  # published by workers: all state
                for name, value in got.items():
                    if isinstance(value, bytes):
                        assert value == want[name]
                        continue
                    assert value.dtype == dtypes[name] and value.shape == want[name].shape
                    assert layout.same_bytes(value, want[name]), name
                    assert value.flags.writeable and value.flags.owndata  # copy=True


def test_elastic_results_carry_the_regenerated_names():
    from reshard import elastic
    from reshard.worker import LoadedShard
    shard = LoadedShard(rng_state=bytes(8), step=b"1")
    shard.regenerated = frozenset({"rng_state"})
    assert elastic.Joined(shard, None, 2, None).regenerated == {"rng_state"}
    assert elastic.Joined({"step": b"1"}, None, 2, None).regenerated == frozenset()


def test_load_without_copy_is_private(cluster, job):
    j, ptc, lay, g = job
    with worker(cluster, j.id, ptc=ptc) as w:
        view = w.load(0, 1, copy=False)
        arr = view["emb.pos"]
        assert not arr.flags.owndata and arr.flags.writeable
        before = arr.copy()
        arr[...] = 0  # copy-on-write: the agent's buffer is untouched
        again = w.load(0, 1)
        assert layout.same_bytes(again["emb.pos"], before)


def test_dtypes_from_coordinator_or_publish(cluster, client, job):
    j, ptc, lay, g = job
    with worker(cluster, j.id, coordinator=cluster.coordinator,
                **cluster.client_kwargs()) as w:  # dials over mutual TLS
        got = w.load(1, 1)
        assert got["layers.0.qkv"].dtype == np.float16
        assert got["layers.0.mask"].dtype == np.bool_
    with pytest.raises(ValueError, match="credentials"):  # no plaintext by accident
        worker(cluster, j.id, coordinator=cluster.coordinator)
    with pytest.raises(ValueError, match="insecure apply only"):
        worker(cluster, j.id, coordinator=client, insecure=True)
    # another Worker of this process knows what was published for the job
    with worker(cluster, j.id) as w:
        assert w.load(1, 1)["layers.0.opt.flat_rep"].dtype == np.float64
    # a process that published nothing for it must say where dtypes come from
    saved = reshard.worker._PUBLISHED_DTYPES.pop(j.id)
    try:
        with worker(cluster, j.id) as w:
            with pytest.raises(ValueError, match="pass ptc="):
                w.load(1, 1)
    finally:
        reshard.worker._PUBLISHED_DTYPES[j.id] = saved


def test_torch_round_trip(cluster, client):
    torch = pytest.importorskip("torch")
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        {"name": "w", "dtype": "DTYPE_BFLOAT16", "shape": [6, 4],
         "partition": {"tp": {"mode": "TP_SPLIT"}, "pipeline": {"mode": "PIPELINE_LAYER"}}},
        {"name": "m", "dtype": "DTYPE_FLOAT32", "shape": [10],
         "partition": {"pipeline": {"mode": "PIPELINE_LAYER"}, "dp": {"mode": "DP_FLAT"}}},
        {"name": "i", "dtype": "DTYPE_INT64", "shape": [3],
         "partition": {"pipeline": {"mode": "PIPELINE_EVERY_STAGE"}}},
    ], "blobs": [{"name": "step", "sizeBytes": 8}]}, ptc_pb2.Ptc)
    lay = layout.make_layout(2, 1, 2, cluster.host_ids[2:], 2)
    j = register(client, cluster, "torch-round-trip", ptc, lay)
    g = {"w": torch.randn(6, 4).to(torch.bfloat16), "m": torch.randn(10),
         "i": torch.arange(3), "step": torch.tensor([42], dtype=torch.int64).numpy().view(np.uint8)}
    with worker(cluster, j.id, "host-2") as w:
        for rank, _ in layout.ranks_on_host(lay, "host-2"):
            tp_i, dp_i, _ = layout.coords(lay.config, rank)
            local = {"w": torch.from_numpy(layout.shard_tensor(ptc.tensors[0], lay.config, tp_i,
                                                               dp_i, g["w"]).view(np.int16))
                     .view(torch.bfloat16),
                     "m": torch.from_numpy(layout.shard_tensor(ptc.tensors[1], lay.config, tp_i,
                                                               dp_i, g["m"].numpy())),
                     "i": g["i"], "step": g["step"]}
            w.publish(rank, 1, local)
            back = w.load(rank, 1, as_torch=True)
            assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], local["w"])
            assert back["m"].dtype == torch.float32 and torch.equal(back["m"], local["m"])
            assert torch.equal(back["i"], g["i"])
            assert back["step"] == (42).to_bytes(8, "little")
        # and through the PTC from the coordinator, zero-copy
        with worker(cluster, j.id, "host-2", coordinator=client) as w2:  # a Client
            back = w2.load(1, 1, as_torch=True, copy=False)
            assert back["w"].dtype == torch.bfloat16 and list(back["w"].shape) == [3, 4]


def test_publish_errors_name_the_tensor(cluster, client, job_name):
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 2, 1, cluster.host_ids[:2], 2)
    g = random_globals(ptc, world=4, seed=5)
    j = register(client, cluster, job_name, ptc, lay)
    good = layout.shard(ptc, lay, 0, g)
    with worker(cluster, j.id) as w:
        bad = dict(good, **{"layers.1.qkv": good["layers.1.qkv"][:-1]})
        with pytest.raises(ValueError, match=r'rank 0 item "layers.1.qkv": local shape \[12, 12\]'):
            w.publish(0, 1, bad)
        bad = dict(good, **{"emb.pos": good["emb.pos"].astype(np.float64)})
        with pytest.raises(ValueError, match=r'"emb.pos": dtype float64 has 8-byte'):
            w.publish(0, 1, bad)
        bad = dict(good)
        del bad["layers.0.fc1"]
        with pytest.raises(ValueError, match=r'"layers.0.fc1": missing'):
            w.publish(0, 1, bad)
        with pytest.raises(ValueError, match="'nonsense' not in the job's PTC"):
            w.publish(0, 1, dict(good, nonsense=np.zeros(3)))
        with pytest.raises(ValueError, match='"step": 7 bytes'):
            w.publish(0, 1, dict(good, step=b"1234567"))
        with pytest.raises(ValueError, match='"head".*does not hold'):  # last stage only
            w.publish(0, 1, dict(good, head=np.zeros(5, np.float16)))
        with pytest.raises(reshard.FailedPrecondition, match="generation"):
            w.publish(0, 2, good)  # generation 2 does not exist yet
        with pytest.raises(reshard.InvalidArgument, match="rank 9 out of range"):
            w.publish(9, 1, good)
        # blobs may come as uint8 arrays / bytearrays
        ok = dict(good, step=np.frombuffer(good["step"], np.uint8),
                  rng_state=bytearray(good["rng_state"]))
        w.publish(0, 1, ok)
        assert w.load(0, 1)["rng_state"] == good["rng_state"]


def test_load_errors_and_corruption(cluster, client, job_name):
    ptc = every_kind_ptc()
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    g = random_globals(ptc, world=1, seed=6)
    j = register(client, cluster, job_name, ptc, lay)
    with worker(cluster, j.id, ptc=ptc) as w:
        with pytest.raises(reshard.NotFound):
            w.load(0, 1)  # nothing published yet
        # a buffer created but not sealed
        stub = worker_pb2_grpc.WorkerServiceStub(w._channel)
        resp = stub.PublishShard(worker_pb2.PublishShardRequest(job_id=j.id, generation=1, rank=0),
                                 metadata=w._metadata)
        with pytest.raises(reshard.FailedPrecondition, match="not sealed"):
            w.load(0, 1)
        # the agent refuses a seal whose expected checksums differ
        with pytest.raises(reshard.DataLoss):
            try:
                stub.SealShard(worker_pb2.SealShardRequest(
                    job_id=j.id, generation=1, rank=0,
                    expected_checksums=[1] * len(resp.items)), metadata=w._metadata)
            except grpc.RpcError as e:
                raise reshard.errors.from_rpc_error(e, "SealShard")
        w.publish(0, 1, layout.shard(ptc, lay, 0, g))
        assert layout.same_bytes(w.load(0, 1)["head"], layout.shard(ptc, lay, 0, g)["head"])
        # corrupt one byte of the sealed buffer: load's verification notices
        item = next(it for it in resp.items if it.name == "layers.2.fc1")
        with open(resp.path, "r+b") as f:
            f.seek(item.offset + 3)
            b = f.read(1)
            f.seek(item.offset + 3)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(reshard.DataLoss, match='"layers.2.fc1"'):
            w.load(0, 1)
        assert "layers.2.fc1" in w.load(0, 1, verify=False)


def test_strided_sources_are_written_as_their_values(cluster, client, job_name):
    torch = pytest.importorskip("torch")
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        {"name": "a", "dtype": "DTYPE_FLOAT32", "shape": [5, 3],
         "partition": {"pipeline": {"mode": "PIPELINE_LAYER"}}},
        {"name": "b", "dtype": "DTYPE_BFLOAT16", "shape": [4, 6],
         "partition": {"pipeline": {"mode": "PIPELINE_LAYER"}}},
    ]}, ptc_pb2.Ptc)
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    j = register(client, cluster, job_name, ptc, lay)
    a = np.arange(15, dtype=np.float32).reshape(3, 5).T  # not contiguous
    b = torch.randn(6, 4).to(torch.bfloat16).t()           # not contiguous
    assert not a.flags.c_contiguous and not b.is_contiguous()
    with worker(cluster, j.id) as w:
        w.publish(0, 1, {"a": a, "b": b})
        got = w.load(0, 1, as_torch=True)
    assert torch.equal(got["a"], torch.from_numpy(np.ascontiguousarray(a)))
    assert torch.equal(got["b"], b.contiguous())


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("hash_first", [False, True])
def test_copy_blocks_copies_and_hashes_the_file_bytes_whatever_the_block(monkeypatch, block,
                                                                           hash_first):
    from reshard import worker as worker_mod
    monkeypatch.setattr(worker_mod, "_BLOCK_BYTES", block)
    rng = np.random.default_rng(3)
    strided = rng.integers(0, 1 << 30, size=(9, 10), dtype=np.int32)[:, ::2]  # not contiguous
    file = bytearray(8 + strided.nbytes)
    on_file = np.ndarray(strided.shape, dtype=strided.dtype, buffer=file, offset=8)
    h = xxhash.xxh3_64()
    if hash_first:  # load: the file is the source
        np.copyto(on_file, strided)
        out = np.empty_like(strided)
        worker_mod._copy_blocks(out, on_file, file, 8, h, hash_first=True)
    else:  # publish: the file is the destination
        out = on_file
        worker_mod._copy_blocks(on_file, strided, file, 8, h, hash_first=False)
    assert np.array_equal(out, strided)
    assert h.intdigest() == xxhash.xxh3_64_intdigest(bytes(file[8:]))
    scalar = bytearray(4)
    h0 = xxhash.xxh3_64()
    worker_mod._copy_blocks(np.ndarray((), np.int32, buffer=scalar), np.int32(5), scalar, 0, h0,
                            hash_first=False)
    assert h0.intdigest() == xxhash.xxh3_64_intdigest(bytes(scalar)) and scalar != bytearray(4)
