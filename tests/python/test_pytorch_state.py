"""reshard.pytorch against real PyTorch 2 state: torch 2 on CPU, gloo, one
process per rank (torch.multiprocessing spawn), FSDP2 (fully_shard), tensor
parallel (parallelize_module), HSDP and a two-stage pipeline split by FQN.

1. describe() of every layout: for every rank and item, the reference shard
   function of docs/partitioning.md (layout.local_tensor of the PTC item, the
   config, the rank and the full tensor from DTensor.full_tensor(), taken on
   the test side only) equals that rank's to_local() exactly; the coordinator
   accepts each PTC and layout and plans from it.
2. publish -> a real agent -> resize dp 2 x tp 2 -> dp 1 x tp 4 on a real
   LocalCluster -> a new set of processes at the new mesh builds its model
   and optimizer, load()s in place, and every parameter and optimizer state
   equals the old run's full tensors bit for bit; the LR scheduler, a step
   counter, a per-rank data position and each rank's RNG come back.
3. refusals: an uneven tensor-parallel split and dp-first nesting raise
   ValueError naming the FQN, on every rank.
"""

import os

import numpy as np
import pytest

import reshard
from reshard import layout, pytorch
from reshard.v1 import coordinator_pb2, ptc_pb2
import torch_ranks

import torch
import torch.distributed as dist

COMMITTED = coordinator_pb2.OPERATION_STATE_COMMITTED


# ------------------------------------------------------------ process helpers


def spawn(fn, out_dir, *args, world=4):
    """fn(rank, world, *args) in `world` gloo processes; their results by rank."""
    return torch_ranks.spawn(fn, out_dir, *args, world=world)


def mlp(seed, sizes=(6, 10, 5), norm=False):
    """Linear, ReLU, Linear (and with norm a LayerNorm that tensor parallel
    leaves alone: FSDP2 shards it over the dp mesh only)."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(sizes[0], sizes[1]), torch.nn.ReLU(),
              torch.nn.Linear(sizes[1], sizes[2])]
    if norm:
        layers.append(torch.nn.LayerNorm(sizes[2]))
    return torch.nn.Sequential(*layers).double()


def fsdp_tp(mesh, model):
    """Colwise / rowwise tensor parallel over mesh["tp"], then FSDP2 over mesh["dp"]."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model


def train(model, opt, steps, d_in, seed=3, sched=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, d_in, generator=g, dtype=torch.float64)
        model(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()


def flat_tensors(app):
    """{item name: live tensor} in the item names of reshard.pytorch."""
    msd, osd = app.model_and_optim()
    out = {f"model.{k}": v for k, v in msd.items()}
    if osd is not None:
        for fqn, states in osd["state"].items():
            out |= {f"optim.state.{fqn}.{k}": v for k, v in states.items()}
    return out


def local_and_full(app):
    """{item: (to_local() as numpy, full tensor as numpy)}: full_tensor() is a
    collective of the tensor's mesh, so every rank of a stage calls it in order."""
    from torch.distributed.tensor import DTensor

    def raw(t):  # numpy has no bfloat16: its bits as int16
        t = t.detach()
        return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().copy()

    out = {}
    for name, t in flat_tensors(app).items():
        if isinstance(t, DTensor):
            out[name] = (raw(t.to_local()), raw(t.full_tensor()))
        else:
            out[name] = (raw(t), raw(t))
    return out


def spec_result(spec, app):
    return {"ptc": spec.ptc.SerializeToString(), "config": spec.config.SerializeToString(),
            "tensors": local_and_full(app),
            "placements": {n: i.placements for n, i in spec.items.items()}}


# --------------------------------------------------------------- describe()


class Stage(torch.nn.Module):
    """Stage `stage` of a two-stage pipeline: the full model's modules are
    built (same init on every stage), then those of the other stage dropped,
    as torchtitan splits a model by FQN: stage 0 holds embed, layers.0 and
    layers.1; stage 1 layers.2 and head."""

    def __init__(self, stage, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Linear(4, 6).double()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(6, 6).double()
                                           for i in range(3)})
        self.head = torch.nn.Linear(6, 3).double()
        keep = {"0", "1"} if stage == 0 else {"2"}
        for k in list(self.layers):
            if k not in keep:
                del self.layers[k]
        if stage == 0:
            del self.head
        else:
            del self.embed
        self.stage = stage

    def forward(self, x):
        if self.stage == 0:
            x = self.embed(x)
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        return x if self.stage == 0 else self.head(x)


def describe_all(rank, world):
    """Every describe() scenario and refusal in one set of 4 processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    out = {}
    # FSDP2 + TP: dp 2 x tp 2
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = fsdp_tp(mesh, mlp(0, norm=True))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt, 1, 6)
    app = pytorch.AppState(model, opt, rng=False)
    out["fsdp_tp"] = spec_result(pytorch.describe(app), app)
    # HSDP: dp_replicate 2 x dp_shard 2
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    model = mlp(1, (6, 7, 5))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt, 1, 6)
    app = pytorch.AppState(model, opt, rng=False)
    out["hsdp"] = spec_result(pytorch.describe(app, mesh=mesh), app)
    # HSDP + TP: dp_replicate 2 x dp_shard 1 x tp 2 (a 3-D mesh)
    mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    model = mlp(6)
    from torch.distributed.tensor.parallel import RowwiseParallel
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt, 1, 6)
    app = pytorch.AppState(model, opt, rng=False)
    out["hsdp_tp"] = spec_result(pytorch.describe(app, mesh=mesh), app)
    # FSDP2 with uneven torch.chunk rows: 5 and 3 rows over 4 ranks
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    model = mlp(2, (3, 5, 3))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt, 1, 3)
    app = pytorch.AppState(model, opt, rng=False)
    out["uneven"] = spec_result(pytorch.describe(app), app)
    # two pipeline stages x FSDP2 dp 2
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage = mesh.get_coordinate()[0]
    model = Stage(stage, 3)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(model, opt, 1, 4 if stage == 0 else 6)
    app = pytorch.AppState(model, opt, rng=False)
    out["pipeline"] = spec_result(pytorch.describe(app, mesh=mesh), app)
    # context parallel: FSDP2 over the flattened dp_shard x cp (torchtitan's
    # dp_shard_cp) and a tensor sharded over dp_shard, replicated over cp
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "cp"))
    flat = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    model = torch.nn.Module()
    model.net = fully_shard(mlp(5, (3, 5, 3)), mesh=flat)
    model.rep = torch.nn.Parameter(distribute_tensor(
        torch.arange(15, dtype=torch.float64).reshape(5, 3), mesh, [Shard(0), Replicate()]))
    app = pytorch.AppState(model, rng=False)
    out["cp"] = spec_result(pytorch.describe(app), app)
    # refusals, raised on every rank
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    model = mlp(4, (3, 5, 3))
    parallelize_module(model, mesh, {"0": ColwiseParallel()})
    try:
        pytorch.describe(pytorch.AppState(model, rng=False))
        out["uneven_tp"] = None
    except ValueError as e:
        out["uneven_tp"] = str(e)
    # an error found on one rank only (rank 0's optimizer holds a state that
    # is not a tensor) is raised on every rank, after the all-gather
    model = mlp(8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, 1, 6)
    if rank == 0:
        opt.state[model[0].weight]["note"] = "not a tensor"
    try:
        pytorch.describe(pytorch.AppState(model, opt, rng=False))
        out["one_rank"] = None
    except ValueError as e:
        out["one_rank"] = str(e)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"))  # tp outermost
    holder = torch.nn.Module()
    holder.w = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 3), mesh,
                                                    [Replicate(), Shard(0)]))
    try:
        pytorch.describe(pytorch.AppState(holder, rng=False))
        out["order"] = None
    except ValueError as e:
        out["order"] = str(e)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    holder = torch.nn.Module()
    holder.qkv = torch.nn.Parameter(distribute_tensor(torch.zeros(8, 3), mesh,
                                                      [Shard(0), Shard(0)]))
    try:
        pytorch.describe(pytorch.AppState(holder, rng=False))
        out["dp_first"] = None
    except ValueError as e:
        out["dp_first"] = str(e)
    return out


@pytest.fixture(scope="module")
def described(tmp_path_factory):
    return spawn(describe_all, tmp_path_factory.mktemp("describe"))


def check_local_tensors(results):
    """Per rank: the PTC's local tensor of the full tensor == to_local()."""
    ptc = ptc_pb2.Ptc.FromString(results[0]["ptc"])
    config = ptc_pb2.ParallelConfig.FromString(results[0]["config"])
    by_name = {t.name: t for t in ptc.tensors}
    spec = pytorch.Spec(ptc, config, {}, {})
    for rank, res in enumerate(results):
        assert res["ptc"] == results[0]["ptc"] and res["config"] == results[0]["config"], rank
        held = {n for n in by_name if spec.holds(rank, n)}
        assert set(res["tensors"]) == held, rank
        for name, (local, full) in res["tensors"].items():
            t = by_name[name]
            if local.ndim == 0:  # a 0-d tensor (Adam's step) is an item of shape [1]
                assert list(t.shape) == [1], name
                full, local = full.reshape(1), local.reshape(1)
            want = layout.local_tensor(t, config, rank, full)
            assert want.shape == local.shape, (rank, name, want.shape, local.shape)
            assert want.tobytes() == local.tobytes(), (rank, name)
    return ptc, config


def modes(t):
    p = t.partition
    return (ptc_pb2.TpMode.Name(p.tp.mode), p.tp.axis, ptc_pb2.DpMode.Name(p.dp.mode), p.dp.axis)


def test_fsdp2_tp_local_tensors_are_the_ptcs(described):
    res = [r["fsdp_tp"] for r in described]
    ptc, config = check_local_tensors(res)
    assert (config.tp, config.dp, config.pp, config.dp_shard) == (2, 2, 1, 0)
    t = {t.name: t for t in ptc.tensors}
    assert modes(t["model.0.weight"]) == ("TP_SPLIT", 0, "DP_CHUNK", 0)
    assert modes(t["model.2.weight"]) == ("TP_SPLIT", 1, "DP_CHUNK", 0)
    assert modes(t["model.2.bias"]) == ("TP_REPLICATED", 0, "DP_CHUNK", 0)
    assert modes(t["model.3.weight"]) == ("TP_REPLICATED", 0, "DP_CHUNK", 0)
    assert res[0]["placements"]["model.3.weight"] == (("dp", "Shard(0)"),)
    assert modes(t["optim.state.0.weight.exp_avg"]) == ("TP_SPLIT", 0, "DP_CHUNK", 0)
    assert modes(t["optim.state.0.weight.step"])[::2] == ("TP_REPLICATED", "DP_REPLICATED")
    assert res[0]["placements"]["model.0.weight"] == (
        ("dp", "_StridedShard(dim=0, sf=2)"), ("tp", "Shard(0)"))
    assert [b.name for b in ptc.blobs] == ["optim.param_groups"]


def test_hsdp_local_tensors_are_the_ptcs(described):
    ptc, config = check_local_tensors([r["hsdp"] for r in described])
    assert (config.tp, config.dp, config.dp_shard) == (1, 4, 2)
    t = {t.name: t for t in ptc.tensors}
    assert modes(t["model.0.weight"]) == ("TP_REPLICATED", 0, "DP_CHUNK", 0)


def test_hsdp_with_tp_local_tensors_are_the_ptcs(described):
    res = [r["hsdp_tp"] for r in described]
    ptc, config = check_local_tensors(res)
    assert (config.tp, config.dp, config.dp_shard) == (2, 2, 1)
    t = {t.name: t for t in ptc.tensors}
    assert modes(t["model.0.weight"]) == ("TP_SPLIT", 0, "DP_CHUNK", 0)
    assert res[0]["placements"]["model.0.weight"][0] == ("dp_replicate", "Replicate()")


def test_uneven_fsdp2_rows_are_the_ptcs(described):
    res = [r["uneven"] for r in described]
    ptc, config = check_local_tensors(res)
    assert (config.tp, config.dp) == (1, 4)
    # 5 rows over 4 ranks: torch.chunk gives 2, 2, 1, 0
    assert [r["tensors"]["model.0.weight"][0].shape[0] for r in res] == [2, 2, 1, 0]


def test_pipeline_stages_from_fqns(described):
    ptc, config = check_local_tensors([r["pipeline"] for r in described])
    assert (config.pp, config.dp, list(config.stage_starts), ptc.num_layers) == (2, 2, [0, 2], 3)
    pipe = {t.name: (ptc_pb2.PipelineMode.Name(t.partition.pipeline.mode),
                     t.partition.pipeline.layer) for t in ptc.tensors}
    assert pipe["model.embed.weight"][0] == "PIPELINE_FIRST_STAGE"
    assert pipe["model.head.bias"][0] == "PIPELINE_LAST_STAGE"
    assert pipe["model.layers.1.weight"] == ("PIPELINE_LAYER", 1)
    assert pipe["optim.state.layers.2.weight.exp_avg_sq"] == ("PIPELINE_LAYER", 2)


def test_context_parallel_over_dp_cp_and_dp_only(described):
    ptc, config = check_local_tensors([r["cp"] for r in described])
    assert (config.tp, config.cp, config.dp, config.dp_shard) == (1, 2, 2, 0)
    over = {t.name: ptc_pb2.DpOver.Name(t.partition.dp.over) for t in ptc.tensors}
    assert over["model.net.0.weight"] == "DP_OVER_DP_CP"
    assert over["model.rep"] == "DP_OVER_DP"


def test_refusals_name_the_fqn_on_every_rank(described):
    for r in described:
        assert r["uneven_tp"] is not None and "model.0.weight" in r["uneven_tp"], r["uneven_tp"]
        assert "[2, 2, 1, 0]" in r["uneven_tp"] and "[2, 1, 1, 1]" in r["uneven_tp"]
        assert r["dp_first"] is not None and "model.qkv" in r["dp_first"], r["dp_first"]
        assert "dp-first" in r["dp_first"]
        # a mesh whose dims are not in reshard's rank order
        assert r["order"] is not None and "('tp', 'dp')" in r["order"], r["order"]
        assert "rank order" in r["order"]
        assert r["one_rank"] is not None and "rank 0:" in r["one_rank"], r["one_rank"]
        assert '"0.weight" key "note"' in r["one_rank"]


def test_a_fresh_optimizers_state_is_a_fresh_start():
    """get_state_dict makes a fresh optimizer's state by a zero-gradient step
    that counts one step; reshard sets it back, so training after describe()
    or publish() equals training without reshard, bit for bit."""
    ref, mine = mlp(9), mlp(9)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    opt = torch.optim.AdamW(mine.parameters(), lr=0.1)
    app = pytorch.AppState(mine, opt, rng=False)
    flat = flat_tensors(app)
    assert float(flat["optim.state.0.weight.step"]) == 0.0
    assert not flat["optim.state.0.weight.exp_avg"].any()
    train(ref, ref_opt, 2, 6)
    train(mine, opt, 2, 6)
    for (name, a), b in zip(ref.state_dict().items(), mine.state_dict().values()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name


def test_build_skips_initial_weights_only_when_the_state_will_be_loaded():
    """pytorch_loop.build: a fresh job's first layout builds as make() does
    (its weights are the job's initial state); a rank whose state start()
    loads builds on the meta device and gets empty storage on `device`."""
    import types
    from reshard import pytorch_loop
    devices = []

    def make():
        devices.append(torch.empty(0).device.type)  # the default device make() ran under
        torch.manual_seed(3)
        return mlp(4)

    fresh = pytorch_loop.build(make, env=types.SimpleNamespace(fresh=True))
    torch.manual_seed(3)
    want = mlp(4)
    for (name, a), b in zip(want.state_dict().items(), fresh.state_dict().values()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name
    loaded = pytorch_loop.build(make, device="cpu",
                                env=types.SimpleNamespace(fresh=False, operation_id=""))
    assert devices == ["cpu", "meta"]
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    assert [p.shape for p in loaded.parameters()] == [p.shape for p in want.parameters()]
    # A stop-free operation's new rank steps on it in warm-up: zeros, not
    # whatever the storage held.
    joining = pytorch_loop.build(make, device="cpu",
                                 env=types.SimpleNamespace(fresh=False, operation_id="op-1"))
    assert devices == ["cpu", "meta", "meta"]
    assert all(not p.detach().any() for p in joining.parameters())


def test_mesh_dims_inverts_the_config():
    hsdp = ptc_pb2.ParallelConfig(tp=2, pp=2, dp=4, dp_shard=2)
    assert pytorch.mesh_dims(hsdp) == [("pp", 2), ("dp_replicate", 2), ("dp_shard", 2),
                                       ("tp", 2)]
    assert pytorch.mesh_dims(ptc_pb2.ParallelConfig(tp=4, pp=1, dp=1)) == [("dp", 1), ("tp", 4)]


def test_blob_over_capacity_names_it():
    with pytest.raises(ValueError, match=r'blob "sched": \d+ bytes pickled'):
        pytorch.encode_blob("sched", list(range(1000)), 64)
    assert pytorch.decode_blob("x", pytorch.encode_blob("x", {"a": 1}, 128)) == {"a": 1}


# ------------------------------------------------- publish, resize, load


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2) as c:
        yield c


class Counter:
    """A train-step counter (Stateful, replicated)."""

    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"step": self.n}

    def load_state_dict(self, state):
        self.n = state["step"]


class RankPosition(Counter):
    """A data position that differs per rank (Stateful, per rank)."""

    reshard_per_rank = True


SIZES = (8, 12, 5)  # divisible by tp 2 and 4; 5 rows over dp 2: 3 + 2


def app_at(rank, dp, tp, seed, lr):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = mlp(seed, SIZES)
    model.register_buffer("scale", torch.full((6,), 0.5 + seed, dtype=torch.bfloat16))
    model = fsdp_tp(mesh, model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    extras = {"sched": sched, "counter": Counter(), "position": RankPosition(100 * rank)}
    return pytorch.AppState(model, opt, extras), model, opt


def probe_loss(model):
    x = torch.randn(3, SIZES[0], generator=torch.Generator().manual_seed(11),
                    dtype=torch.float64)
    with torch.no_grad():
        return float(model(x).pow(2).sum())


def old_run(rank, world, cfg):
    app, model, opt = app_at(rank, 2, 2, seed=1, lr=0.05)
    train(model, opt, 2, SIZES[0], sched=app.stateful["sched"])
    app.stateful["counter"].n = 2
    app.stateful["position"].n += 7
    torch.manual_seed(1000 + rank)  # every rank's RNG differs
    torch.rand(3)
    spec = pytorch.describe(app)
    lay = spec.layout(hosts=cfg["hosts"], devices_per_host=2)
    ids = [None, None]
    if rank == 0:
        with reshard.Client(cfg["coordinator"],
                            credentials=reshard.tls_credentials(*cfg["tls"])) as c:
            job, token = c.register_job(ptc_pb2.JobSpec(
                name=cfg["name"], tenant="pytest", ptc=spec.ptc, layout=lay), with_token=True)
        ids = [job.id, token]
    dist.broadcast_object_list(ids, src=0)
    host = layout.slots(lay)[rank][0]
    with reshard.Worker(cfg["sockets"][host], ids[0], ptc=spec.ptc, worker_token=ids[1]) as w:
        pytorch.publish(w, app, spec, rank, 1)
    return {"job": ids[0], "token": ids[1], "full": local_and_full(app),
            "extras": {n: o.state_dict() for n, o in app.stateful.items()},
            "rng": torch.get_rng_state().numpy().tobytes(), "loss": probe_loss(model),
            "lr": opt.param_groups[0]["lr"]}


def new_run(rank, world, cfg):
    app, model, opt = app_at(rank, 1, 4, seed=7, lr=0.5)
    torch.manual_seed(5)
    fresh = pytorch.describe(app)  # the same PTC tensors at the new mesh
    lay = layout.make_layout(4, 1, 1, cfg["hosts"], 2)
    ptc = ptc_pb2.Ptc.FromString(cfg["ptc"])
    spec = pytorch.spec_from_ptc(ptc, lay)
    live = flat_tensors(app)
    before = {n: pytorch._local(t).data_ptr() for n, t in live.items()}
    host = layout.slots(lay)[rank][0]
    # A Worker told no PTC, in a process that published nothing: the dtypes
    # come from the Spec that pytorch.load passes to Worker.load.
    with reshard.Worker(cfg["sockets"][host], cfg["job"], worker_token=cfg["token"]) as w:
        regenerated = pytorch.load(w, app, spec, rank, 2)
    after = {n: pytorch._local(t).data_ptr() for n, t in flat_tensors(app).items()}
    params = {f"model.{n}": pytorch._local(p).data_ptr() for n, p in model.named_parameters()}
    return {"full": local_and_full(app), "regenerated": regenerated,
            "extras": {n: o.state_dict() for n, o in app.stateful.items()},
            "rng": torch.get_rng_state().numpy().tobytes(), "loss": probe_loss(model),
            "lr": opt.param_groups[0]["lr"], "in_place": before == after and all(
                before[n] == ptr for n, ptr in params.items()),
            "fresh_tensors": [t.SerializeToString() for t in fresh.ptc.tensors]}


def fresh_run(rank, world, cfg):
    """Two apps at the new mesh load the same generation: `fresh` into an
    optimizer that has no state yet, with torch's zero-gradient step
    (_init_optim_state) made to fail, so reshard must create the state from
    the PTC; `made` after describe() made it torch's way. Both then train one
    step on the same data."""
    from torch.distributed.checkpoint import state_dict as sd
    lay = layout.make_layout(4, 1, 1, cfg["hosts"], 2)
    spec = pytorch.spec_from_ptc(ptc_pb2.Ptc.FromString(cfg["ptc"]), lay)
    host = layout.slots(lay)[rank][0]
    made, made_model, made_opt = app_at(rank, 1, 4, seed=7, lr=0.5)
    pytorch.describe(made)
    fresh, fresh_model, fresh_opt = app_at(rank, 1, 4, seed=7, lr=0.5)
    assert not fresh_opt.state

    def refuse(optim):  # torch's function returns at once when the state exists
        if not optim.state:
            raise AssertionError("torch's zero-gradient step would run")
    torch_init, sd._init_optim_state = sd._init_optim_state, refuse
    with reshard.Worker(cfg["sockets"][host], cfg["job"], worker_token=cfg["token"]) as w:
        try:
            pytorch.load(w, fresh, spec, rank, 2)
        finally:
            sd._init_optim_state = torch_init
        pytorch.load(w, made, spec, rank, 2)
    loaded = local_and_full(fresh)
    train(made_model, made_opt, 1, SIZES[0], sched=made.stateful["sched"])
    train(fresh_model, fresh_opt, 1, SIZES[0], sched=fresh.stateful["sched"])
    return {"loaded": loaded, "trained": local_and_full(fresh), "made": local_and_full(made)}


def test_publish_resize_load_in_place(cluster, client, job_name, tmp_path):
    hosts = cluster.host_ids[:2]
    cfg = {"hosts": hosts, "coordinator": cluster.coordinator, "name": job_name,
           "tls": (cluster.pki.ca, *cluster.pki.issue(cluster.ADMIN)),
           "sockets": {h: cluster.agents[h].worker_socket for h in hosts}}
    old = spawn(old_run, tmp_path / "old", cfg)
    job_id = old[0]["job"]
    op = client.resize(job_id, layout.make_layout(4, 1, 1, hosts, 2))
    final = client.wait(op.id, timeout=120)
    assert final.state == COMMITTED, final.error
    job = client.get_job(job_id, include_ptc=True)
    assert job.generation == 2
    new = spawn(new_run, tmp_path / "new", cfg | {"job": job_id, "token": old[0]["token"],
                                                 "ptc": job.ptc.SerializeToString()})
    assert new[0]["fresh_tensors"] == [t.SerializeToString() for t in job.ptc.tensors]
    names = {t.name for t in job.ptc.tensors}
    for rank in range(4):
        got, want = new[rank], old[rank]
        assert set(got["full"]) == names == set(want["full"])
        assert "model.scale" in names  # a bfloat16 buffer, replicated
        for name in names:
            assert got["full"][name][1].tobytes() == want["full"][name][1].tobytes(), name
        assert got["in_place"], rank
        assert got["regenerated"] == frozenset()
        assert got["extras"] == want["extras"], rank
        assert got["extras"]["position"] == {"step": 100 * rank + 7}
        assert got["rng"] == want["rng"], rank
        assert got["lr"] == want["lr"] == 0.05 * 0.25
        # FSDP2 computes from the loaded storage: the same loss at tp 4 (sums in another order)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-12)
    # A fresh optimizer's state comes from the PTC (torch's zero-gradient step
    # never runs): the same bytes loaded, and the next step equals that of
    # the state torch made.
    fresh = spawn(fresh_run, tmp_path / "fresh", cfg | {"job": job_id, "token": old[0]["token"],
                                                       "ptc": job.ptc.SerializeToString()})
    for rank in range(4):
        for name in names:
            assert fresh[rank]["loaded"][name][1].tobytes() == \
                old[rank]["full"][name][1].tobytes(), (rank, name)
            assert fresh[rank]["trained"][name][1].tobytes() == \
                fresh[rank]["made"][name][1].tobytes(), (rank, name)
        assert fresh[rank]["trained"]["optim.state.0.weight.step"][1].tobytes() != \
            fresh[rank]["loaded"]["optim.state.0.weight.step"][1].tobytes()


TARGETS = {  # another layout of each described job, on 2 hosts x 2 devices
    "fsdp_tp": dict(tp=1, pp=1, dp=4), "hsdp": dict(tp=1, pp=1, dp=4, dp_shard=1),
    "hsdp_tp": dict(tp=1, pp=1, dp=4, dp_shard=2),
    "uneven": dict(tp=2, pp=1, dp=2), "pipeline": dict(tp=1, pp=1, dp=4),
    "cp": dict(tp=1, pp=1, dp=4)}


def test_described_ptcs_plan_on_the_coordinator(described, cluster, client, job_name):
    """The coordinator accepts every described PTC at its layout and plans a
    reshard of it (PreviewPlan: planner and checks) to another layout."""
    hosts = cluster.host_ids[:2]
    for scenario, target in TARGETS.items():
        ptc = ptc_pb2.Ptc.FromString(described[0][scenario]["ptc"])
        config = ptc_pb2.ParallelConfig.FromString(described[0][scenario]["config"])
        lay = pytorch.Spec(ptc, config, {}, {}).layout(hosts=hosts, devices_per_host=2)
        job = client.register_job(ptc_pb2.JobSpec(name=f"{job_name}-{scenario}", tenant="pytest",
                                                   ptc=ptc, layout=lay))
        stats = client.preview_plan(job.id, layout.make_layout(hosts=hosts, devices_per_host=2,
                                                               **target))
        assert stats.bytes_local + stats.bytes_cross_host > 0, scenario
        assert stats.bytes_cross_host == stats.lower_bound_cross_host, scenario


def test_a_one_rank_job_keeps_its_tp_and_dp_splits(tmp_path):
    """At dp 1 x tp 1 FSDP2 + TP writes plain (Shard(0), Shard(0)), not
    _StridedShard: with dims of size 1 the nesting is moot, so it is the
    PTC's tp split and dp chunk, as at any larger layout (a job may be
    described in a one-rank world)."""
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        model = fsdp_tp(mesh, mlp(10))
        spec = pytorch.describe(pytorch.AppState(model, rng=False), mesh=mesh)
    finally:
        dist.destroy_process_group()
    t = {t.name: t for t in spec.ptc.tensors}
    assert spec.items["model.0.weight"].placements == (("dp", "Shard(0)"), ("tp", "Shard(0)"))
    assert modes(t["model.0.weight"]) == ("TP_SPLIT", 0, "DP_CHUNK", 0)
    assert modes(t["model.2.weight"]) == ("TP_SPLIT", 1, "DP_CHUNK", 0)


def test_a_layout_that_cannot_survive_a_host_loss_warns(described):
    """Spec.layout warns (HostLossWarning) when some state has its only copy
    on one host: FSDP2 + TP (one copy of each shard) on two hosts, and any
    layout on one host. HSDP with one replica per host does not warn."""
    import warnings

    def spec(scenario):
        return pytorch.Spec(ptc_pb2.Ptc.FromString(described[0][scenario]["ptc"]),
                            ptc_pb2.ParallelConfig.FromString(described[0][scenario]["config"]),
                            {}, {})

    hint = ("which no other host holds: this layout cannot survive the loss of any one host; "
            "keep HSDP replicas on other hosts (dp_replicate > 1 across hosts) or an external "
            "copy (docs/pytorch.md, \"What survives a host loss\")")
    with pytest.warns(pytorch.HostLossWarning) as fsdp:
        spec("fsdp_tp").layout(hosts=["h0", "h1"], devices_per_host=2)
    assert [str(w.message) for w in fsdp] == [
        f"layout ['h0', 'h1']: losing host \"h0\" loses tensor \"model.0.weight\" at offsets "
        f"[0, 0] sizes [3, 6], {hint}"]
    with pytest.warns(pytorch.HostLossWarning) as one_host:
        spec("hsdp").layout()
    assert [str(w.message) for w in one_host] == [
        f"layout ['host-0']: losing host \"host-0\" loses every item, {hint}"]
    # dp_replicate 2 x dp_shard 2: replica 0 on h0, replica 1 on h1.
    with warnings.catch_warnings():
        warnings.simplefilter("error", pytorch.HostLossWarning)
        lay = spec("hsdp").layout(hosts=["h0", "h1"], devices_per_host=2)
    assert (lay.config.dp, lay.config.dp_shard) == (4, 2)
    assert pytorch.host_whose_loss_loses_state(spec("hsdp").ptc, lay) is None
