"""Shared test helpers: small PTCs covering every partition kind, publishing a
layout's shards, comparing loaded shards with reshard.layout.shard, and a
worker's "device memory" on the fake device (reshard._device_ipc)."""

import contextlib
import json
import os
import subprocess
import sys
import time

import grpc
import numpy as np

import reshard
from reshard import layout
from reshard.v1 import ptc_pb2

VECTORS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def read_vectors(file_name):
    """A shared vectors file of tests/data, parsed (the C++ tests read the same)."""
    with open(os.path.join(VECTORS_DIR, file_name)) as f:
        return json.load(f)


def read_json_lines(path):
    """The complete JSON lines of `path` (a launcher's --events; a line still
    being written is left out); [] when there is no file yet."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def check_vectors_reproduce(generator, file_name, tmp_path):
    """tests/data/<generator>, run afresh into tmp_path, writes exactly the
    checked-in <file_name>: the file has no hand edits."""
    subprocess.run([sys.executable, os.path.join(VECTORS_DIR, generator), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    with open(os.path.join(VECTORS_DIR, file_name)) as f:
        assert (tmp_path / file_name).read_text() == f.read()


def tensor(name, dtype, shape, tp=None, axis=0, blocks=(), pipeline="PIPELINE_LAYER", layer=0,
           dp="DP_REPLICATED", dp_axis=0, allow_empty=False):
    part = {"tp": {"mode": "TP_SPLIT", "axis": axis, "blocks": list(blocks)} if tp
            else {"mode": "TP_REPLICATED"},
            "pipeline": {"mode": pipeline, "layer": layer},
            "dp": {"mode": dp, "axis": dp_axis},
            "allowEmpty": allow_empty}
    return {"name": name, "dtype": dtype, "shape": list(shape), "partition": part}


def every_kind_ptc():
    """A 5-layer PTC with every partition kind, uneven sizes, several dtypes."""
    t = [
        tensor("emb.word", "DTYPE_FLOAT16", [51, 12], tp=True, pipeline="PIPELINE_FIRST_STAGE"),
        tensor("emb.pos", "DTYPE_FLOAT32", [7, 12], pipeline="PIPELINE_FIRST_STAGE"),
        tensor("shared.tied", "DTYPE_BFLOAT16", [9, 6], tp=True, pipeline="PIPELINE_EVERY_STAGE"),
    ]
    for n in range(5):
        p = f"layers.{n}."
        t += [
            tensor(p + "norm", "DTYPE_FLOAT32", [12], layer=n),
            tensor(p + "qkv", "DTYPE_FLOAT16", [26, 12], tp=True, blocks=[14, 6, 6], layer=n),
            tensor(p + "proj", "DTYPE_BFLOAT16", [12, 13], tp=True, axis=1, layer=n),
            tensor(p + "fc1", "DTYPE_FLOAT16", [22, 12], tp=True, blocks=[11, 11], layer=n,
                   dp="DP_SPLIT", dp_axis=1),
            tensor(p + "fc2", "DTYPE_INT8", [12, 11], tp=True, axis=1, layer=n, dp="DP_SPLIT",
                   dp_axis=0),
            tensor(p + "fsdp3d", "DTYPE_INT32", [5, 3, 7], tp=True, axis=2, layer=n,
                   dp="DP_SPLIT", dp_axis=1, allow_empty=True),
            tensor(p + "opt.flat", "DTYPE_FLOAT32", [23, 5], tp=True, layer=n, dp="DP_FLAT"),
            tensor(p + "opt.flat_rep", "DTYPE_FLOAT64", [13], layer=n, dp="DP_FLAT",
                   allow_empty=True),
            tensor(p + "mask", "DTYPE_BOOL", [3, 5], layer=n),
        ]
    t += [
        tensor("final.norm", "DTYPE_FLOAT32", [12], pipeline="PIPELINE_LAST_STAGE"),
        tensor("head", "DTYPE_FLOAT16", [51, 12], tp=True, pipeline="PIPELINE_LAST_STAGE",
               dp="DP_FLAT"),
        tensor("counts", "DTYPE_INT64", [4, 3], tp=True, axis=1, pipeline="PIPELINE_LAST_STAGE",
               allow_empty=True),
    ]
    blobs = [{"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"},
             {"name": "rng_state", "sizeBytes": 40, "scope": "BLOB_PER_RANK"}]
    return reshard.as_message({"numLayers": 5, "tensors": t, "blobs": blobs}, ptc_pb2.Ptc)


def hsdp_ptc():
    """every_kind_ptc plus FSDP2-style Shard(0) tensors split over dp x cp and
    over dp only, and a flat optimizer state over dp only."""
    ptc = every_kind_ptc()
    for name, over in (("fsdp.w", "DP_OVER_DP_CP"), ("fsdp.m", "DP_OVER_DP")):
        ptc.tensors.append(reshard.as_message(
            {"name": name, "dtype": "DTYPE_FLOAT32", "shape": [10, 6], "partition": {
                "tp": {"mode": "TP_SPLIT", "axis": 1},
                "pipeline": {"mode": "PIPELINE_EVERY_STAGE"},
                "dp": {"mode": "DP_CHUNK", "axis": 0, "over": over}, "allowEmpty": True}},
            ptc_pb2.TensorSpec))
    ptc.tensors.append(reshard.as_message(
        {"name": "opt.dp", "dtype": "DTYPE_FLOAT64", "shape": [9], "partition": {
            "pipeline": {"mode": "PIPELINE_LAST_STAGE"},
            "dp": {"mode": "DP_FLAT", "over": "DP_OVER_DP"}, "allowEmpty": True}},
        ptc_pb2.TensorSpec))
    return ptc


def random_globals(ptc, world, seed=0):
    """Random global arrays (raw dtypes) for every tensor, and blob values
    (per-rank blobs: one value per rank of a world of `world`)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in ptc.tensors:
        dt = reshard._dtypes.numpy_dtype(t.dtype)
        n = int(np.prod(t.shape))
        if dt == np.bool_:
            out[t.name] = rng.integers(0, 2, n).astype(np.bool_).reshape(t.shape)
        else:
            out[t.name] = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt).reshape(
                t.shape)
    for b in ptc.blobs:
        if b.scope == ptc_pb2.BLOB_PER_RANK:
            out[b.name] = [rng.integers(0, 256, b.size_bytes, dtype=np.uint8).tobytes()
                           for _ in range(world)]
        else:
            out[b.name] = rng.integers(0, 256, b.size_bytes, dtype=np.uint8).tobytes()
    return out


class WorkerTokenInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Adds the worker token of each request's job_id (cluster.worker_token)
    to raw WorkerService stubs, as reshard.Worker does."""

    def __init__(self, cluster):
        self.cluster = cluster

    def intercept_unary_unary(self, continuation, details, request):
        metadata = list(details.metadata or [])
        metadata.append(("authorization", "Bearer " + self.cluster.worker_token(request.job_id)))
        details = details._replace(metadata=metadata)
        return continuation(details, request)


def worker_channel(cluster, host):
    """A channel to `host`'s worker socket whose calls carry their job's token."""
    channel = grpc.insecure_channel("unix:" + os.path.abspath(cluster.agents[host].worker_socket))
    return grpc.intercept_channel(channel, WorkerTokenInterceptor(cluster))


def wait_for(what, predicate, timeout=30.0):
    """Polls `predicate` until it returns a true value, which it returns;
    fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def register(client, cluster, name, ptc, lay, state_memory=ptc_pb2.STATE_MEMORY_UNSPECIFIED):
    spec = ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=ptc, layout=lay,
                           state_memory=state_memory)
    return client.register_job(spec)


def publish_all(cluster, job_id, ptc, lay, globals_, generation=1):
    """Publishes every rank of `lay` through the Worker of its host."""
    for host in layout.hosts_of(lay):
        with cluster.worker(host, job_id) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                w.publish(rank, generation, layout.shard(ptc, lay, rank, globals_))


def check_generation(cluster, job_id, ptc, lay, globals_, generation, regenerated=()):
    """Loads every rank of `generation` and compares it with shard(...):
    returns a list of mismatch descriptions (empty when all bytes agree and
    the agents report exactly the (rank, item name)s of `regenerated` as
    regenerated)."""
    problems = []
    regenerated = {(int(r), str(n)) for r, n in regenerated}
    for host in layout.hosts_of(lay):
        with cluster.worker(host, job_id, ptc=ptc) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                got = w.load(rank, generation)
                want_regenerated = {n for r, n in regenerated if r == rank}
                if got.regenerated != want_regenerated:
                    problems.append(f"rank {rank}: regenerated {sorted(got.regenerated)}, "
                                    f"expected {sorted(want_regenerated)}")
                want = layout.shard(ptc, lay, rank, globals_)
                want = {k: v for k, v in want.items() if isinstance(v, bytes) or v.size}
                if set(got) != set(want):
                    problems.append(f"rank {rank}: items differ: {sorted(set(got) ^ set(want))}")
                for name in set(got) & set(want):
                    if not layout.same_bytes(got[name], want[name]):
                        problems.append(f"rank {rank} item {name}: bytes differ")
    return problems


# The worker-access suites (test_worker_access.py, test_worker_isolation.py):
# one host whose agent serves the workers of group WORKER_GID, and workers
# run as uid NOBODY.
WORKER_GID = 4242  # --worker-group takes a gid; it need not exist by name
NOBODY = 65534


@contextlib.contextmanager
def worker_group_cluster():
    """A LocalCluster of one host (host-0, two devices) whose agent serves
    the worker group WORKER_GID."""
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=2,
                      worker_group=WORKER_GID) as c:
        yield c


def publish_or_load(worker, op, seed=5):
    """Generation 1 of every rank of an every_kind_ptc job at tp 2 on host-0
    (values random_globals(seed)), through `worker`: op "publish" publishes
    each rank and yields {"sums": its checksums}; op "load" loads each and
    yields {"bad": [the items whose bytes differ]}."""
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 1, 1, ["host-0"], 2)
    g = random_globals(ptc, world=2, seed=seed)
    for rank, _ in layout.ranks_on_host(lay, "host-0"):
        want = layout.shard(ptc, lay, rank, g)
        if op == "publish":
            yield {"sums": worker.publish(rank, 1, want)}
            continue
        got = worker.load(rank, 1)
        yield {"bad": [k for k, v in want.items()
                       if (isinstance(v, bytes) or v.size) and not layout.same_bytes(got[k], v)]}


def worker_process(socket, job_id, act):
    """The body of a worker process these suites run as another user: calls
    act(w) with a reshard.Worker of job `job_id` (every_kind_ptc) on
    `socket`; a ReshardError prints its class name and exits with status 3
    (what the suites assert)."""
    try:
        with reshard.Worker(socket, job_id, ptc=every_kind_ptc()) as w:
            act(w)
    except reshard.errors.ReshardError as e:
        print(type(e).__name__)
        sys.exit(3)


def print_publish_or_load(worker, op, seed=5):
    """publish_or_load, one JSON line per rank on stdout."""
    for line in publish_or_load(worker, op, seed):
        print(json.dumps(line))


# ---- device-resident state on the fake device (tests of issue 23) ----

_DEVICE_ALIGN = 256  # a caching allocator's block alignment


def item_raws(ptc, want):
    """(names, raws): every item of the PTC in the buffer's order (tensors,
    then blobs) and the rank's raw bytes of each in `want` (b"" for an item
    it does not hold)."""
    names = [t.name for t in ptc.tensors] + [b.name for b in ptc.blobs]
    raws = [(want[n] if isinstance(want[n], bytes) else want[n].tobytes()) if n in want else b""
            for n in names]
    return names, raws


def fake_device_items(raws, device=0):
    """One fake device allocation of this process holding every item
    (256-byte aligned, as a caching allocator's block holds many tensors):
    (allocation, items for Worker.publish_device). Close the allocation."""
    from reshard import _device_ipc
    offsets, end = [], 0
    for r in raws:
        offsets.append(end)
        end += (len(r) + _DEVICE_ALIGN - 1) // _DEVICE_ALIGN * _DEVICE_ALIGN
    alloc = _device_ipc.FakeAllocation(end, device)
    items = []
    for r, off in zip(raws, offsets):
        alloc.view[off:off + len(r)] = r
        items.append((alloc.handle(), off, len(r)) if r else None)
    return alloc, items


def publish_fake_device(worker, rank, raws, device, generation=1):
    """Publishes `raws` through Worker.publish_device from a fake device
    allocation (closed afterwards: the agent copied on seal)."""
    alloc, items = fake_device_items(raws, device)
    try:
        return worker.publish_device(rank, generation, items, device=device)
    finally:
        alloc.close()


def read_device(resp):
    """The bytes of every item of an OpenDeviceGeneration reply, read
    through its IPC handle."""
    from reshard import _device_ipc
    opened = _device_ipc.backend_for(resp.ipc_handle).open(resp.ipc_handle, resp.device)
    try:
        return [opened.read(it.offset, it.bytes) for it in resp.items]
    finally:
        opened.close()


# The cross-host device route suites (test_device_comm_route.py,
# test_device_ipc_route.py): device-published state resized across hosts.

def resize_device_published(cluster, client, job_name, seed,
                            state_memory=ptc_pb2.STATE_MEMORY_DEVICE):
    """tp=2 on host-0 (a job of `state_memory`), published from its two fake
    devices, resized to a replica on host-1: (ptc, target, globals, the
    committed operation as GetOperation answers it)."""
    from reshard.v1 import coordinator_pb2
    ptc = every_kind_ptc()
    g = random_globals(ptc, world=2, seed=seed)
    source = layout.make_layout(2, 1, 1, ["host-0"], 2)
    target = layout.make_layout(2, 1, 2, ["host-0", "host-1"], 2)  # a replica on host-1
    job = register(client, cluster, job_name, ptc, source, state_memory=state_memory)
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        for rank in (0, 1):
            _, raws = item_raws(ptc, layout.shard(ptc, source, rank, g))
            publish_fake_device(w, rank, raws, device=rank)
    final = client.wait(client.resize(job.id, target).id, timeout=120)
    assert final.state == coordinator_pb2.OPERATION_STATE_COMMITTED, final.error
    return ptc, target, g, client.get_operation(final.id)


def host_routes(op):
    """{host: (route, route reason, state)} of an operation's hosts."""
    return {h.host_id: (h.route, h.route_reason, h.state) for h in op.hosts}


def check_device_generation(cluster, job_id, ptc, lay, globals_, generation):
    """Opens every rank of `generation` in device memory (OpenDeviceGeneration
    on its host) and asserts that its items' bytes equal shard(...), with
    their XXH3 checksums."""
    import xxhash
    for host in layout.hosts_of(lay):
        for rank, _ in layout.ranks_on_host(lay, host):
            raws = item_raws(ptc, layout.shard(ptc, lay, rank, globals_))[1]
            with cluster.worker(host, job_id, ptc=ptc) as w:
                resp = w.open_device(rank, generation)
            assert read_device(resp) == raws, (rank, host)
            assert list(resp.checksums) == [xxhash.xxh3_64_intdigest(r) for r in raws], (rank, host)


def loop_job_config(cluster, client, job_name, tmp_path, dataset_state):
    """Registers a one-tensor ("w", float64 [4]) job at two ranks on the
    cluster's first host with `dataset_state`, and writes the config the
    two-rank loop scripts of tests/python/torch2 read (torch2/loop_rank.py).
    Returns (job, path of the config JSON)."""
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        tensor("w", "DTYPE_FLOAT64", [4], pipeline="PIPELINE_EVERY_STAGE")]}, ptc_pb2.Ptc)
    host = cluster.host_ids[0]
    lay = layout.make_layout(1, 1, 2, [host], 2)
    job = client.register_job({"name": job_name, "tenant": "training",
                               "ptc": reshard.to_dict(ptc), "layout": reshard.to_dict(lay)},
                              dataset_state=dataset_state)
    cfg = {"store": str(tmp_path / "store"), "coordinator": cluster.coordinator,
           "token": cluster.worker_token(job.id), "ca": cluster.pki.ca,
           "socket": cluster.agents[host].worker_socket, "job_id": job.id,
           "ptc": reshard.to_dict(ptc), "dataset": dataset_state.to_dict()}
    path = str(tmp_path / "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return job, path
