"""reshard.dcp against the real torch.distributed.checkpoint (DCP), torch 2 on
CPU, gloo, one process per rank, and a real LocalCluster.

1. The regions reshard.dcp reads and writes are the reference shard function
   (layout.local_tensor) for every partition kind of every_kind_ptc (boxes,
   fused blocks, padding, DP_FLAT ranges) at several layouts.
2. A real FSDP2 + tensor-parallel job (mesh dp 2 x tp 2) trains two Adam steps
   and `dcp.save`s {model, optim, LR scheduler, a Stateful counter}; the
   checkpoint is imported into a job at layout B (tp 2 x dp 2 on two hosts:
   every rank's buffer equals the reference shard of the saved full tensors),
   the job is resized to C (dp 3 on three other hosts, through the agents),
   generation C is exported, and a fresh FSDP2 job at mesh D (dp 3, another
   init, another learning rate) `dcp.load`s it: every tensor, the param
   groups, the scheduler and the counter equal what mesh A saved, exactly.
3. The same checkpoint (saved from reshard.pytorch.AppState, RNG included)
   imported into a job that reshard.pytorch.describe() registered at dp 1 x
   tp 4: every rank's pytorch.load() gives back the saved state in place.
4. `python -m reshard.dcp import|export` with only the job's worker token.
5. Refusals: a checkpoint that lacks a tensor of the PTC, or holds it at
   another shape or dtype, is a ValueError naming the tensor.
"""

import os

import numpy as np
import pytest

from helpers import every_kind_ptc, random_globals, register
from torch_ranks import spawn
from reshard import dcp as rdcp
from reshard import layout
from reshard.v1 import coordinator_pb2

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

COMMITTED = coordinator_pb2.OPERATION_STATE_COMMITTED


# ------------------------------------------------------------------ geometry


@pytest.mark.parametrize("tp,pp,dp", [(2, 2, 1), (1, 1, 3), (3, 1, 2), (2, 1, 4), (4, 5, 1)])
def test_regions_are_the_reference_shard(tp, pp, dp):
    ptc = every_kind_ptc()
    world = tp * pp * dp
    lay = layout.make_layout(tp, pp, dp, ["h"], world)
    g = random_globals(ptc, world, seed=tp * 100 + dp)
    ints = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
    for r in range(world):
        want = layout.shard(ptc, lay, r, g)
        for t in ptc.tensors:
            if t.name not in want:
                continue
            full = torch.from_numpy(g[t.name].view(ints[g[t.name].dtype.itemsize]))
            buf = torch.zeros(layout.local_shape_of(t, lay.config, r, ptc), dtype=full.dtype)
            for reg in rdcp.regions(t, lay.config, r, ptc):
                src = full
                for axis, (o, n) in enumerate(zip(reg.offsets, reg.sizes)):
                    src = src.narrow(axis, o, n)
                rdcp.local_view(buf, reg).copy_(src)
            assert buf.numpy().tobytes() == np.ascontiguousarray(want[t.name]).tobytes(), \
                (r, t.name)


# ------------------------------------------------------------ process helpers




class Counter:
    """A Stateful extra: the train step."""

    def __init__(self, step=0):
        self.step = step

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def build(dims, seed, lr):
    """A two-layer MLP (float64) at a mesh of `dims` [(name, size)]: tensor
    parallel (colwise, rowwise) over "tp" when present, FSDP2 over "dp";
    Adam and a StepLR."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", tuple(s for _, s in dims),
                            mesh_dim_names=tuple(n for n, _ in dims))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(),  # 12: tp 2, 3, 4
                                torch.nn.Linear(12, 5)).double()
    if "tp" in mesh.mesh_dim_names:
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    return model, opt, sched


def full_state(model, opt, sched, counter):
    """What the test compares: every tensor of the flattened DCP state as a
    full numpy array (full_tensor() is a collective: every rank calls it),
    the param groups' hyperparameters, the scheduler and the counter."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor
    msd, osd = get_state_dict(model, opt)
    out = {}
    items = [(f"model.{k}", v) for k, v in msd.items()] + [
        (f"optim.state.{fqn}.{k}", v) for fqn, st in osd["state"].items() for k, v in st.items()]
    for name, t in items:
        t = t.full_tensor() if isinstance(t, DTensor) else t
        out[name] = t.detach().numpy().copy()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]]
    return {"tensors": out, "param_groups": groups, "params": [g["params"] for g in
                                                                 osd["param_groups"]],
            "sched": sched.state_dict(), "counter": counter.state_dict()}


def save_at(rank, world, dims, ckpt):
    """Mesh A: two training steps, then a real dcp.save of the DCP-shaped state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, opt, sched = build(dims, seed=1, lr=0.01)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        model(torch.randn(4, 8, generator=g, dtype=torch.float64)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    counter = Counter(2)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "sched": sched, "counter": counter},
             checkpoint_id=ckpt)
    return full_state(model, opt, sched, counter)


def load_at(rank, world, dims, ckpt):
    """Mesh D: another init and learning rate, then a real dcp.load (DCP's own
    resharding) and set_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model, opt, sched = build(dims, seed=9, lr=0.5)
    counter = Counter(0)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "sched": sched, "counter": counter}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return full_state(model, opt, sched, counter)


# ------------------------------------------------------------- round trip


def holds_reference(cluster, job_id, token, ptc, lay, ref):
    """Generation 1 of `job_id` at `lay` holds, rank by rank, the reference
    shard of what mesh A saved (tensors byte for byte, the blobs equal)."""
    want = {n: v.reshape(v.shape or (1,)) for n, v in ref["tensors"].items()}  # 0-d: [1]
    for host in layout.hosts_of(lay):
        with cluster.worker(host, job_id, ptc=ptc, worker_token=token) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                got = w.load(rank, 1)
                for t in ptc.tensors:
                    local = layout.local_tensor(t, lay.config, rank, want[t.name], ptc)
                    if local.size:
                        assert layout.same_bytes(got[t.name], local), (rank, t.name)
                assert rdcp.decode_blob("sched", got["sched"]) == ref["sched"]
                assert rdcp.decode_blob("counter", got["counter"]) == {"step": 2}
                assert rdcp.decode_blob("optim.param_groups", got["optim.param_groups"]) == \
                    ref["param_groups"]


def test_dcp_save_import_resize_export_dcp_load(cluster, client, job_name, tmp_path):
    ck_a, ck_d = str(tmp_path / "a"), str(tmp_path / "d")
    saved = spawn(save_at, tmp_path, [("dp", 2), ("tp", 2)], ck_a, world=4)
    ref = saved[0]
    assert all(s["tensors"].keys() == ref["tensors"].keys() for s in saved)

    # The job: a PTC from the checkpoint (tp splits of the two weights and
    # the first bias, FSDP2's dim-0 chunks over dp), layout B tp 2 x dp 2.
    ptc = rdcp.ptc_from_checkpoint(ck_a, tp_axes={"model.0.weight": 0, "model.0.bias": 0,
                                                  "model.2.weight": 1,
                                                  "optim.state.0.weight.exp_avg": 0})
    assert {b.name for b in ptc.blobs} == {"optim.param_groups", "sched", "counter"}
    lay_b = layout.make_layout(2, 1, 2, cluster.host_ids[:2], 2)
    job = register(client, cluster, job_name, ptc, lay_b)
    token = cluster.worker_token(job.id)
    socks = {h: cluster.agents[h].worker_socket for h in cluster.host_ids}
    result = rdcp.import_dcp(ck_a, job.id, ptc, lay_b, 1, socks, worker_token=token)
    assert sorted(result.ranks) == [0, 1, 2, 3] and result.missing == [] and \
        result.ignored == []

    # Generation 1 holds the reference shard of what mesh A saved.
    holds_reference(cluster, job.id, token, ptc, lay_b, ref)

    # Resize to C through the agents, export C, dcp.load at mesh D.
    lay_c = layout.make_layout(1, 1, 3, cluster.host_ids[1:4], 1)
    op = client.wait(client.resize(job.id, lay_c).id, timeout=120, raise_on_failure=True)
    assert op.state == COMMITTED
    md = rdcp.export_dcp(ck_d, job.id, ptc, lay_c, op.to_generation, socks, worker_token=token)
    # every region once: dp 3 chunks of a dim-0-sharded tensor, one of a scalar
    assert len(md.state_dict_metadata["model.0.weight"].chunks) == 3
    assert len(md.state_dict_metadata["optim.state.0.weight.step"].chunks) == 1
    # A complete DCP checkpoint: the metadata names each key's nested path
    # (planner_data), so torch's converter rebuilds the nested state dict
    # that dcp.save was given, and reshard imports its own export.
    assert tuple(md.planner_data["optim.state.0.weight.exp_avg"]) == \
        ("optim", "state", "0.weight", "exp_avg")
    assert tuple(md.planner_data["model.0.weight"]) == ("model", "0.weight")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(ck_d, str(tmp_path / "d.pt"))
    whole = torch.load(str(tmp_path / "d.pt"), weights_only=False)
    assert set(whole) == {"model", "optim", "sched", "counter"}, sorted(whole)
    for name, value in ref["tensors"].items():
        node = whole
        for part in md.planner_data[name]:
            node = node[part]
        assert node.numpy().tobytes() == value.tobytes(), name
    assert whole["sched"] == ref["sched"] and whole["counter"] == {"step": 2}
    again = register(client, cluster, job_name + "-again", ptc, lay_c)
    again_token = cluster.worker_token(again.id)
    result = rdcp.import_dcp(ck_d, again.id, ptc, lay_c, 1, socks, worker_token=again_token)
    assert sorted(result.ranks) == [0, 1, 2] and result.missing == [] and \
        result.ignored == []
    holds_reference(cluster, again.id, again_token, ptc, lay_c, ref)

    loaded = spawn(load_at, tmp_path, [("dp", 3)], ck_d, world=3)
    for got in loaded:
        assert got["tensors"].keys() == ref["tensors"].keys()
        for name, value in ref["tensors"].items():
            assert got["tensors"][name].dtype == value.dtype, name
            assert got["tensors"][name].tobytes() == value.tobytes(), name
        assert got["param_groups"] == ref["param_groups"]
        assert got["params"] == ref["params"]
        assert got["sched"] == ref["sched"]
        assert got["counter"] == {"step": 2}


# ------------------------------------------- into a job that describe() made


def save_app_at(rank, world, dims, ckpt):
    """Mesh A, the state as reshard.pytorch.AppState gives it to DCP (model,
    optim, sched, counter and each rank's RNG)."""
    from reshard import pytorch
    model, opt, sched = build(dims, seed=1, lr=0.01)
    g = torch.Generator().manual_seed(3)
    model(torch.randn(4, 8, generator=g, dtype=torch.float64)).pow(2).sum().backward()
    opt.step()
    sched.step()
    counter = Counter(1)
    app = pytorch.AppState(model, opt, {"sched": sched, "counter": counter})
    dcp.save(app.state_dict(), checkpoint_id=ckpt)
    return full_state(model, opt, sched, counter)


def import_and_load_at(rank, world, dims, ckpt, cfg):
    """Mesh B: describe() the job's own state, register it (rank 0), import
    the checkpoint into generation 1 (rank 0, every host), then every rank
    reshard.pytorch.load()s in place."""
    import reshard
    from reshard import pytorch
    from reshard.v1 import ptc_pb2
    model, opt, sched = build(dims, seed=9, lr=0.5)
    counter = Counter(0)
    app = pytorch.AppState(model, opt, {"sched": sched, "counter": counter})
    spec = pytorch.describe(app)
    lay = spec.layout(hosts=cfg["hosts"], devices_per_host=2)
    ids = [None, None, None]
    if rank == 0:
        with reshard.Client(cfg["coordinator"],
                            credentials=reshard.tls_credentials(*cfg["tls"])) as c:
            job, token = c.register_job(ptc_pb2.JobSpec(
                name=cfg["name"], tenant="pytest", ptc=spec.ptc, layout=lay), with_token=True)
        result = rdcp.import_dcp(ckpt, job.id, spec.ptc, lay, 1, cfg["sockets"],
                                 worker_token=token)
        ids = [job.id, token, (result.missing, result.ignored)]
    dist.broadcast_object_list(ids, src=0)
    host = layout.slots(lay)[rank][0]
    with reshard.Worker(cfg["sockets"][host], ids[0], ptc=spec.ptc, worker_token=ids[1]) as w:
        regenerated = pytorch.load(w, app, spec, rank, 1)
    return full_state(model, opt, sched, counter) | {"regenerated": regenerated,
                                                      "import": ids[2]}


def test_import_into_a_described_job_then_load_in_place(cluster, client, job_name, tmp_path):
    ck = str(tmp_path / "a")
    ref = spawn(save_app_at, tmp_path, [("dp", 2), ("tp", 2)], ck, world=4)[0]
    hosts = cluster.host_ids[:2]
    cfg = {"hosts": hosts, "coordinator": cluster.coordinator, "name": job_name,
           "tls": (cluster.pki.ca, *cluster.pki.issue(cluster.ADMIN)),
           "sockets": {h: cluster.agents[h].worker_socket for h in hosts}}
    got = spawn(import_and_load_at, tmp_path, [("dp", 1), ("tp", 4)], ck, cfg, world=4)
    assert got[0]["import"] == ([], [])  # the RNG came from the checkpoint; no key unused
    for g in got:
        assert g["regenerated"] == frozenset()
        assert g["tensors"].keys() == ref["tensors"].keys()
        for name, value in ref["tensors"].items():
            assert g["tensors"][name].tobytes() == value.tobytes(), name
        assert g["param_groups"] == ref["param_groups"]
        assert g["sched"] == ref["sched"]
        assert g["counter"] == {"step": 1}


# ------------------------------------------------------------------- CLI


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cli_imports_and_exports_with_only_the_worker_token(cluster, client, job_name, tmp_path):
    """`python -m reshard.dcp import|export`: the job's worker token (env),
    the coordinator's CA, the host's worker socket; nothing else."""
    import subprocess
    import sys
    from reshard.v1 import ptc_pb2
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)},
             "counter": {"step": 4}}
    dcp.save(state, checkpoint_id=str(tmp_path / "a"), no_dist=True)
    ptc = rdcp.ptc_from_checkpoint(tmp_path / "a")
    host = cluster.host_ids[0]
    lay = layout.make_layout(1, 1, 2, [host], 2)
    job, token = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                                      layout=lay), with_token=True)
    env = dict(os.environ, RESHARD_WORKER_TOKEN=token)
    common = ["--coordinator", cluster.coordinator, "--ca", cluster.pki.ca, "--job", job.id,
              "--socket", f"{host}={cluster.agents[host].worker_socket}"]
    # Both entry points: the package's `reshard dcp ...` and reshard.dcp's own.
    for entry, args in ((["reshard", "dcp"], ["import", str(tmp_path / "a")]),
                        (["reshard.dcp"], ["export", str(tmp_path / "b")])):
        r = subprocess.run([sys.executable, "-m", *entry, *args, *common], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    out = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(3)}, "counter": {"step": 0}}
    dcp.load(out, checkpoint_id=str(tmp_path / "b"), no_dist=True)
    assert out["model"]["w"].tolist() == state["model"]["w"].tolist()
    assert out["model"]["b"].tolist() == [1.0, 1.0, 1.0]
    assert out["counter"] == {"step": 4}


# ---------------------------------------------------------------- refusals


def save_plain(path, tensors):
    dcp.save({"model": tensors}, checkpoint_id=str(path), no_dist=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_checkpoint_that_does_not_match_the_ptc_is_refused(tmp_path):
    good = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(3)}
    save_plain(tmp_path / "good", good)
    ptc = rdcp.ptc_from_checkpoint(tmp_path / "good")
    lay = layout.make_layout(1, 1, 2, ["h"], 2)
    state, missing = rdcp.rank_state_from_dcp(tmp_path / "good", ptc, lay, 1)
    assert state["model.w"].tolist() == [[8.0, 9.0, 10.0, 11.0]] and missing == []

    save_plain(tmp_path / "short", {"w": good["w"]})
    with pytest.raises(ValueError, match='tensor "model.b": not in the DCP checkpoint'):
        rdcp.rank_state_from_dcp(tmp_path / "short", ptc, lay, 0)
    save_plain(tmp_path / "shape", {"w": torch.zeros(4, 4), "b": good["b"]})
    with pytest.raises(ValueError, match=r'tensor "model.w": shape \[4, 4\] in the checkpoint, '
                                         r'the job\'s PTC says \[3, 4\]'):
        rdcp.rank_state_from_dcp(tmp_path / "shape", ptc, lay, 0)
    save_plain(tmp_path / "dtype", {"w": good["w"].double(), "b": good["b"]})
    with pytest.raises(ValueError, match='tensor "model.w": dtype torch.float64 in the '
                                         'checkpoint, the job\'s PTC says torch.float32'):
        rdcp.rank_state_from_dcp(tmp_path / "dtype", ptc, lay, 0)


# ------------------------------------- blobs a rank published run no code


class _Opens:
    """A pickle that creates `path` when loaded (its REDUCE calls open)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class _StorageOpens:
    """A pickle that hands torch.storage._load_from_bytes (which torch itself
    calls with weights_only=False) a pickle that creates `path`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import pickle
        return (torch.storage._load_from_bytes, (pickle.dumps(_Opens(self.path)),))


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and
                a.requires_grad == b.requires_grad and torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return (type(a) is type(b) and list(a) == list(b) and
                all(_same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_blobs_load_without_running_code(tmp_path):
    import collections
    from reshard import errors, pytorch
    from reshard._safe_blob import load_blob
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    legit = {"rng": pytorch.rng_state(),
             "optim.param_groups": [{k: v for k, v in g.items() if k != "params"}
                                    for g in opt.state_dict()["param_groups"]],
             "sched": sched.state_dict(), "counter": {"step": 3},
             "other": collections.OrderedDict(a=[np.float32(1.5), np.int64(7), None, {1, 2},
                                                 b"x", 2 + 3j, torch.bfloat16,
                                                 torch.Size([2, 3]), torch.device("cpu"),
                                                 torch.nn.Parameter(torch.ones(2)),
                                                 torch.arange(6.0)[2:5]])}
    for name, value in legit.items():
        got = load_blob(name, pytorch.encode_blob(name, value, 1 << 16))
        assert _same(value, got), name

    marker = tmp_path / "created"
    for evil, refused in ((_Opens(marker), "io.open"),
                          ({"ok": 1, "bad": [_Opens(marker)]}, "io.open"),
                          (Counter(4), f"{Counter.__module__}.Counter")):
        with pytest.raises(errors.UnsafeBlob) as e:
            load_blob("counter", pytorch.encode_blob("counter", evil, 4096))
        assert (e.value.blob, e.value.global_name, e.value.code.name) == (
            "counter", refused, "INVALID_ARGUMENT")
        assert str(e.value).startswith(f'INVALID_ARGUMENT: blob "counter": not loaded: it names '
                                       f'{refused}, which reshard does not call'), str(e.value)
    # A tensor storage's bytes are loaded with weights_only=True: refused too.
    with pytest.raises(errors.UnsafeBlob, match=r'blob "rng": not loaded: not a pickle of '
                                                r'containers.*UnpicklingError'):
        load_blob("rng", pytorch.encode_blob("rng", _StorageOpens(marker), 4096))
    with pytest.raises(errors.UnsafeBlob, match=r'blob "rng": not loaded: its header says 4096 '
                                                r'bytes, the blob holds 8'):
        load_blob("rng", (4096).to_bytes(8, "little") + bytes(8))
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_export_refuses_a_blob_that_would_run_code(cluster, client, job_name, tmp_path):
    """A rank publishes a blob whose pickle would create a file when loaded:
    export_dcp and `reshard dcp export` refuse it naming the blob, write no
    checkpoint, and the file is never created."""
    import subprocess
    import sys
    from reshard import errors, pytorch
    from reshard.v1 import ptc_pb2
    dcp.save({"model": {"w": torch.arange(4.0)}, "counter": {"step": 4}},
             checkpoint_id=str(tmp_path / "a"), no_dist=True)
    ptc = rdcp.ptc_from_checkpoint(tmp_path / "a")
    host = cluster.host_ids[0]
    lay = layout.make_layout(1, 1, 1, [host], 1)
    job, token = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                                      layout=lay), with_token=True)
    marker = tmp_path / "created"
    (blob,) = [b for b in ptc.blobs if b.name == "counter"]
    with cluster.worker(host, job.id, ptc=ptc, worker_token=token) as w:
        w.publish(0, 1, {"model.w": np.arange(4, dtype=np.float32),
                         "counter": pytorch.encode_blob("counter", _Opens(marker),
                                                        blob.size_bytes)})
    socks = {host: cluster.agents[host].worker_socket}
    with pytest.raises(errors.UnsafeBlob, match='blob "counter": not loaded: it names io.open'):
        rdcp.export_dcp(tmp_path / "b", job.id, ptc, lay, 1, socks, worker_token=token)
    assert not marker.exists() and not (tmp_path / "b").exists()

    r = subprocess.run([sys.executable, "-m", "reshard", "dcp", "export", str(tmp_path / "c"),
                        "--coordinator", cluster.coordinator, "--ca", cluster.pki.ca,
                        "--job", job.id, "--socket", f"{host}={socks[host]}"],
                       env=dict(os.environ, RESHARD_WORKER_TOKEN=token), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        'reshard dcp export: INVALID_ARGUMENT: blob "counter": not loaded: it names io.open, '
        'which reshard does not call (it loads only containers, numbers, strings, torch '
        'tensors, dtypes and devices, numpy arrays and scalars)'], r.stderr
    assert not marker.exists() and not (tmp_path / "c").exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_export_refuses_to_miss_state(cluster, client, job_name, tmp_path):
    """An export that would miss state is refused before anything is
    written, by export_dcp (ValueError) and `reshard dcp export` (one line,
    exit 1): a rank's region without a reachable worker socket (host-1's
    rank holds the last row of w), or no socket for any host of the layout
    (0 keys). Before, both printed "exported" and exited 0."""
    import subprocess
    import sys
    from reshard.v1 import ptc_pb2
    dcp.save({"model": {"w": torch.arange(12.0).reshape(3, 4)}, "counter": {"step": 4}},
             checkpoint_id=str(tmp_path / "a"), no_dist=True)
    ptc = rdcp.ptc_from_checkpoint(tmp_path / "a")
    h0, h1 = cluster.host_ids[:2]
    lay = layout.make_layout(1, 1, 2, [h0, h1], 1)
    job, token = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                                      layout=lay), with_token=True)
    socks = {h: cluster.agents[h].worker_socket for h in (h0, h1)}
    rdcp.import_dcp(tmp_path / "a", job.id, ptc, lay, 1, socks, worker_token=token)
    missing = (f"export of job {job.id} generation 1 would miss state: 1 of 1 tensors have "
               f"regions that only ranks without a worker socket hold (e.g. \"model.w\": 1 of 2 "
               f"regions); ranks 1 on hosts {h1} were not reached: give a worker socket for "
               f"those hosts")
    with pytest.raises(ValueError) as refused:
        rdcp.export_dcp(tmp_path / "b", job.id, ptc, lay, 1, {h0: socks[h0]},
                        worker_token=token)
    assert str(refused.value) == missing
    assert not (tmp_path / "b").exists()

    def cli(out, *sockets):
        return subprocess.run(
            [sys.executable, "-m", "reshard", "dcp", "export", str(tmp_path / out),
             "--coordinator", cluster.coordinator, "--ca", cluster.pki.ca, "--job", job.id,
             *[a for s in sockets for a in ("--socket", s)]],
            env=dict(os.environ, RESHARD_WORKER_TOKEN=token), capture_output=True, text=True,
            timeout=120)

    r = cli("c", f"{h0}={socks[h0]}")
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (
        1, "", [f"reshard dcp export: {missing}"]), r.stderr
    r = cli("d", f"host-gone={socks[h0]}")
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (1, "", [
        f"reshard dcp export: export of job {job.id} generation 1: no host of its layout has a "
        f"worker socket (the layout's hosts: {h0}, {h1}; sockets given for: host-gone): the "
        f"checkpoint would hold 0 keys"]), r.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()
    # Both hosts reached: exported, and the line says how many keys.
    r = cli("e", f"{h0}={socks[h0]}", f"{h1}={socks[h1]}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(": 2 keys"), r.stdout
    out = {"model": {"w": torch.zeros(3, 4)}, "counter": {"step": 0}}
    dcp.load(out, checkpoint_id=str(tmp_path / "e"), no_dist=True)
    assert out["model"]["w"].tolist() == torch.arange(12.0).reshape(3, 4).tolist()
    assert out["counter"] == {"step": 4}
