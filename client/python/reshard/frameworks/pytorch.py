"""reshard for PyTorch 2: the PTC, layout, publish and load of a job's state
read from its own objects (DTensors over a DeviceMesh, FSDP2, tensor
parallel, HSDP, pipeline stages, Stateful extras), with no partition rules
written by hand (docs/pytorch.md, "How reshard reads your state").

Item names are the keys torch.distributed.checkpoint gives the state
`{"model": model_sd, "optim": optim_sd, <name>: stateful.state_dict()}`
(nested keys joined with "."):
  - `model.<fqn>`              every tensor of get_state_dict's model state
  - `optim.state.<fqn>.<key>`  every optimizer state tensor
  - blobs: `optim.param_groups` (the groups' hyperparameters, replicated),
    `<name>` per Stateful extra (replicated; per rank when the object has
    `reshard_per_rank = True`), `rng` (per rank, regenerable).

The torch global rank is the reshard rank; the DeviceMesh is row-major over
dims in the order ("pp", "dp_replicate", "dp_shard", "cp", "tp") (any
subset; "dp" is one data-parallel dim; torchtitan's flattened "dp_shard_cp"
is accepted): RANK_ORDER_TP_DP_PP with dp = dp_replicate * dp_shard and, for
HSDP, ParallelConfig.dp_shard = dp_shard (docs/partitioning.md).

Placements -> partition (docs/partitioning.md):
  tp dim:  Shard(d) -> TP_SPLIT on axis d (refused when torch.chunk's sizes
           differ from the PTC's array_split sizes); Replicate -> TP_REPLICATED.
  dp dim:  Shard(d) / _StridedShard(d, sf=tp) -> DP_CHUNK on axis d of the
           tensor-parallel piece (FSDP2's torch.chunk sizes, uneven allowed);
           Replicate -> DP_REPLICATED. Over "dp_shard_cp": DP_OVER_DP_CP;
           over "dp"/"dp_shard" with cp > 1: DP_OVER_DP (replicated over cp).
  plain Shard(d) on dp and on tp (dp-first nesting) is refused.
Thread contract: none of this is thread-safe; describe() is a collective.
"""

import collections
import pickle
import random
import re
import struct
import warnings

import numpy as np

from reshard.core import _dtypes, layout
from reshard.core._proto import ptc_pb2

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
_DP_DIMS = ("dp", "dp_shard", "dp_shard_cp")
_KNOWN_DIMS = set(MESH_DIMS) | set(_DP_DIMS)
LAYER_PATTERN = r"(?:^|\.)layers\.(\d+)\."
_BLOB_HEADER = struct.Struct("<Q")

ItemInfo = collections.namedtuple("ItemInfo", "kind key placements")
ItemInfo.__doc__ = """An item of a Spec: kind "tensor" or "blob", its key path in the
DCP-shaped state dict (("model", fqn), ("optim", "state", fqn, key),
("optim", "param_groups"), (name,), ("rng",)), and for a DTensor its mesh
placements ((mesh dim name, placement text), ...); () otherwise."""


def _torch():
    import torch
    return torch


def _dtensor_type():
    from torch.distributed.tensor import DTensor
    return DTensor


# ------------------------------------------------------------------ AppState


class AppState:
    """A rank's training state: the model, its optimizer, Stateful extras
    ({name: obj with state_dict()/load_state_dict()}: LR scheduler, grad
    scaler, data loader, train step) and, with rng=True, the rank's
    torch/numpy/python RNG. state_dict()/load_state_dict() give and take the
    DCP-shaped dict {"model", "optim", <name>..., "rng"} (Stateful)."""

    def __init__(self, model, optimizer=None, stateful=None, rng=True):
        self.model = model
        self.optimizer = optimizer
        self.stateful = dict(stateful or {})
        self.rng = rng
        for name in self.stateful:
            if name in ("model", "optim", "rng") or not name or "." in name:
                raise ValueError(f"stateful extra {name!r}: the name is reserved or has a \".\"")

    def model_and_optim(self):
        """(model state, optimizer state or None) from get_state_dict: DTensors
        that share storage with the parameters and the optimizer's state
        (the optimizer's state is created first when it has none yet)."""
        from torch.distributed.checkpoint import state_dict as sd
        if self.optimizer is None:
            return sd.get_model_state_dict(self.model), None
        fresh = not self.optimizer.state
        out = sd.get_state_dict(self.model, self.optimizer)
        if fresh:
            # torch made the state by a zero-gradient step at lr 0
            # (_init_optim_state), which counted one step. Zeros with step 0
            # are what Adam's and AdamW's first step starts from, so with the
            # count set back the next real step is a fresh optimizer's.
            torch = _torch()
            for states in self.optimizer.state.values():
                step = states.get("step")
                if isinstance(step, torch.Tensor):
                    step.zero_()
        return out

    def state_dict(self):
        msd, osd = self.model_and_optim()
        out = {"model": msd}
        if osd is not None:
            out["optim"] = osd
        for name, obj in self.stateful.items():
            out[name] = obj.state_dict()
        if self.rng:
            out["rng"] = rng_state()
        return out

    def load_state_dict(self, state):
        from torch.distributed.checkpoint import state_dict as sd
        if self.optimizer is None:
            sd.set_model_state_dict(self.model, state["model"])
        else:
            sd.set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                              optim_state_dict=state["optim"])
        for name, obj in self.stateful.items():
            obj.load_state_dict(state[name])
        if self.rng and "rng" in state:
            set_rng_state(state["rng"])


def rng_state():
    """This process's torch (CPU, and CUDA when available), numpy and python RNG states."""
    torch = _torch()
    out = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
           "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state):
    """Restores what rng_state() returned."""
    torch = _torch()
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------- live tensors


def _live_tensors(app):
    """[(item name, key path, tensor)] in state-dict order: the tensors that
    share storage with the model's parameters / buffers and the optimizer's
    state, and [(blob name, key path, python value, per_rank)]."""
    torch = _torch()
    msd, osd = app.model_and_optim()
    tensors, blobs = [], []
    for fqn, value in msd.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"model state \"{fqn}\": a {type(value).__name__}, not a tensor "
                             f"(give it to reshard as a Stateful extra)")
        tensors.append((f"model.{fqn}", ("model", fqn), value))
    if osd is not None:
        for fqn, states in osd["state"].items():
            for key, value in states.items():
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"optimizer state \"{fqn}\" key \"{key}\": a "
                                     f"{type(value).__name__}, not a tensor")
                tensors.append((f"optim.state.{fqn}.{key}", ("optim", "state", fqn, key), value))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]]
        blobs.append(("optim.param_groups", ("optim", "param_groups"), groups, False))
    for name, obj in app.stateful.items():
        blobs.append((name, (name,), obj.state_dict(), bool(getattr(obj, "reshard_per_rank",
                                                                      False))))
    if app.rng:
        blobs.append(("rng", ("rng",), rng_state(), True))
    return tensors, blobs


def _placement_text(p):
    name = type(p).__name__
    if name == "_StridedShard":
        return ("strided", int(p.dim), int(p.split_factor))
    if name == "Shard":
        return ("shard", int(p.dim))
    if name == "Replicate":
        return ("replicate",)
    return ("other", repr(p))


def _show(pl):
    if pl[0] == "strided":
        return f"_StridedShard(dim={pl[1]}, sf={pl[2]})"
    if pl[0] == "shard":
        return f"Shard({pl[1]})"
    if pl[0] == "replicate":
        return "Replicate()"
    return pl[1]


# ------------------------------------------------------------------ describe


class Spec:
    """What describe() derived, identical on every rank: `ptc`
    (reshard.v1.Ptc), `config` (ParallelConfig), `items` {item name:
    ItemInfo}, and `blob_capacity` {blob name: bytes}."""

    def __init__(self, ptc, config, items, blob_capacity):
        self.ptc = ptc
        self.config = config
        self.items = items
        self.blob_capacity = blob_capacity
        self._tensors = {t.name: t for t in ptc.tensors}
        self._blobs = {b.name: b for b in ptc.blobs}

    @property
    def world_size(self):
        return layout.world_size(self.config)

    def layout(self, hosts=None, devices_per_host=None, ranks=None):
        """A Layout of this config: `ranks` [(host, device)] per rank, or
        `hosts` x `devices_per_host` (default: one host "host-0" holding
        every rank). Warns (HostLossWarning) when the layout cannot survive
        the loss of any one host: some state has its only copy on one host
        (plain FSDP2 keeps one copy of each shard; docs/pytorch.md, "What
        survives a host loss")."""
        c = self.config
        if ranks is None and hosts is None:
            hosts, devices_per_host = ["host-0"], self.world_size
        lay = layout.make_layout(c.tp, c.pp, c.dp, hosts=hosts,
                                 devices_per_host=devices_per_host, ranks=ranks,
                                 stage_starts=list(c.stage_starts), cp=max(c.cp, 1),
                                 dp_shard=c.dp_shard)
        weak = host_whose_loss_loses_state(self.ptc, lay)
        if weak is not None:
            host, what = weak
            warnings.warn(
                f"layout {layout.hosts_of(lay)}: losing host \"{host}\" loses {what}, which no "
                "other host holds: this layout cannot survive the loss of any one host; keep "
                "HSDP replicas on other hosts (dp_replicate > 1 across hosts) or an external "
                "copy (docs/pytorch.md, \"What survives a host loss\")",
                HostLossWarning, stacklevel=2)
        return lay

    def holds(self, rank, name):
        """True when `rank`'s pipeline stage holds the tensor `name`."""
        t = self._tensors[name]
        pp_i = layout.rank_coords(self.config, rank).pp
        return pp_i in layout.stages_holding(self.config, self.ptc.num_layers,
                                             t.partition.pipeline)


class HostLossWarning(UserWarning):
    """A layout keeps some state on one host only (Spec.layout)."""


def host_whose_loss_loses_state(ptc, lay):
    """(host, what) for the first host of the layout `lay` whose loss alone
    loses state no other host holds (`what` names the first such tensor
    region or blob), or None when the layout survives the loss of any one
    host: every region of every tensor is held by ranks on at least two
    hosts, and no per-rank blob that cannot be regenerated is needed. The
    same rule as the coordinator's recovery check (docs/coordinator.md,
    "Recovery keeps the job's redundancy"), from the PTC and layout alone."""
    from reshard.frameworks.dcp import regions
    ptc = ptc if isinstance(ptc, ptc_pb2.Ptc) else ptc_pb2.Ptc.FromString(bytes(ptc))
    placed = layout.slots(lay)
    hosts = layout.hosts_of(lay)
    if len(hosts) == 1:
        return hosts[0], "every item"
    holders = []  # (item, region key, hosts holding it)
    for t in ptc.tensors:
        where = {}
        for r, (host, _) in enumerate(placed):
            pp_i = layout.rank_coords(lay.config, r).pp
            if pp_i not in layout.stages_holding(lay.config, ptc.num_layers,
                                                 t.partition.pipeline):
                continue
            for reg in regions(t, lay.config, r, ptc):
                where.setdefault((reg.offsets, reg.sizes), set()).add(host)
        holders.extend((t.name, key, held) for key, held in where.items())
    for host in hosts:
        for name, (offsets, sizes), held in holders:
            if held == {host}:
                return host, f"tensor \"{name}\" at offsets {list(offsets)} sizes {list(sizes)}"
        for b in ptc.blobs:
            if b.scope == ptc_pb2.BLOB_PER_RANK and not b.regenerable:
                return host, f"blob \"{b.name}\" (one value per rank)"
    return None


def mesh_dims(config):
    """[(mesh dim name, size)] for init_device_mesh of a ParallelConfig (the
    inverse of describe's rule): ("pp", pp) when pp > 1, ("dp_replicate",
    R), ("dp_shard", S) for HSDP (dp_shard set below dp) else ("dp", dp),
    ("cp", cp) when cp > 1, ("tp", tp)."""
    d = layout.dims(config)
    c = config.config if isinstance(config, ptc_pb2.Layout) else config
    out = []
    if d.pp > 1:
        out.append(("pp", d.pp))
    if c.dp_shard and c.dp_shard < d.dp:
        out += [("dp_replicate", d.dp // c.dp_shard), ("dp_shard", c.dp_shard)]
    else:
        out.append(("dp", d.dp))
    if d.cp > 1:
        out.append(("cp", d.cp))
    out.append(("tp", d.tp))
    return out


def _rank_meta(app, mesh, rank):
    """This rank's metadata for describe's all-gather (plain python)."""
    DTensor = _dtensor_type()
    tensors, blobs = _live_tensors(app)
    meshes, mesh_index, items, errors = [], {}, [], []
    dims = {}
    if mesh is not None:
        dims.update(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
    for name, key, t in tensors:
        try:
            dtype = _dtypes.dtype_enum(str(t.dtype))
        except ValueError as e:
            errors.append(f"\"{name}\": {e}")
            continue
        # A 0-d tensor (an optimizer's `step`) is an item of shape [1]: the
        # agents' items have at least one axis.
        entry = {"name": name, "key": key, "shape": [int(x) for x in t.shape] or [1],
                 "dtype": dtype,
                 "local": None, "mesh": None, "placements": ()}
        if isinstance(t, DTensor):
            m = t.device_mesh
            names = tuple(m.mesh_dim_names or ())
            if len(names) != m.ndim:
                errors.append(f"\"{name}\": its DeviceMesh has no mesh_dim_names (reshard reads "
                              f"the dims by name: {', '.join(MESH_DIMS)})")
                continue
            sig = (names, tuple(m.mesh.flatten().tolist()), tuple(m.mesh.shape))
            if sig not in mesh_index:
                mesh_index[sig] = len(meshes)
                meshes.append(sig)
            entry["mesh"] = mesh_index[sig]
            entry["placements"] = tuple(_placement_text(p) for p in t.placements)
            entry["local"] = [int(x) for x in t.to_local().shape]
        items.append(entry)
    blob_meta = [{"name": n, "key": k, "size": len(pickle.dumps(v)), "per_rank": per_rank,
                  "value": pickle.dumps(v) if n == "optim.param_groups" else None}
                 for n, k, v, per_rank in blobs]
    return {"rank": rank, "items": items, "blobs": blob_meta, "meshes": meshes,
            "mesh_dims": dims, "errors": errors}


def describe(app, mesh=None, group=None, layer_pattern=LAYER_PATTERN, blob_headroom=2.0):
    """The Spec of the job that `app` is one rank of. COLLECTIVE over `group`
    (default: the default process group, every rank of the job): every rank
    calls it, all-gathers its items' metadata (FQN, global shape, dtype,
    placements, mesh, pipeline stage) and builds the same Spec.

    mesh: the job's world DeviceMesh (named dims, see the module doc); by
    default the dims are read from the DTensors' meshes (pp: what is left of
    the world). layer_pattern: a regex whose group 1 is the layer index of a
    tensor's FQN (torchtitan / Megatron `layers.<i>.`). blob_headroom: each
    blob's capacity is this many times its largest pickled size (plus 256
    bytes). Raises ValueError (on every rank) naming the FQN and placement
    for what the PTC cannot express."""
    import torch.distributed as dist
    rank = dist.get_rank()
    world = dist.get_world_size(group)
    if world != dist.get_world_size():
        raise ValueError(f"describe: the group has {world} ranks, the job's world "
                         f"{dist.get_world_size()} (the torch global rank is the reshard rank)")
    try:
        mine = _rank_meta(app, mesh, rank)
    except Exception as e:  # noqa: BLE001: every rank raises it, after the all-gather
        mine = {"rank": rank, "items": [], "blobs": [], "meshes": [], "mesh_dims": {},
                "errors": [f"{type(e).__name__}: {e}"]}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    return _build(sorted(gathered, key=lambda m: m["rank"]), world, layer_pattern, blob_headroom)


def _build(metas, world, layer_pattern, blob_headroom):
    errors = [f"rank {m['rank']}: {e}" for m in metas for e in m["errors"]]
    if errors:
        raise ValueError("describe: " + "; ".join(errors))
    config = _config(metas, world)
    _check_rank_order(metas, config)
    tensors = collections.OrderedDict()  # name -> (entry, mesh names, [ranks])
    for m in metas:
        for e in m["items"]:
            names = m["meshes"][e["mesh"]][0] if e["mesh"] is not None else ()
            sig = (e["shape"], e["dtype"], e["placements"], names)
            if e["name"] not in tensors:
                tensors[e["name"]] = (e, names, sig, [m["rank"]])
                continue
            first, _, first_sig, ranks = tensors[e["name"]]
            if sig != first_sig:
                raise ValueError(f"tensor \"{e['name']}\": rank {ranks[0]} has shape "
                                 f"{first['shape']} {first_sig[2]} over {first_sig[3]}, rank "
                                 f"{m['rank']} has {e['shape']} {e['placements']} over {names}")
            ranks.append(m["rank"])
    d = layout.dims(config)
    stages = {name: sorted({layout.rank_coords(config, r).pp for r in ranks})
              for name, (_, _, _, ranks) in tensors.items()}
    pattern = re.compile(layer_pattern)
    layer_of = {}
    for name in tensors:
        found = pattern.search(name.split(".", 1)[1] if name.startswith("model.") else
                               name[len("optim.state."):])
        if found:
            layer_of[name] = int(found.group(1))
    num_layers = max(layer_of.values(), default=-1) + 1
    starts = _stage_starts(d.pp, stages, layer_of, num_layers)
    if starts:
        config.stage_starts.extend(starts)
    ptc = ptc_pb2.Ptc(num_layers=max(num_layers, 1))
    items = collections.OrderedDict()
    for name, (e, names, _, _) in tensors.items():
        t = ptc.tensors.add(name=name, dtype=e["dtype"], shape=e["shape"])
        _partition(t, e, names, config)
        _pipeline(t.partition.pipeline, name, stages[name], layer_of.get(name), d.pp)
        items[name] = ItemInfo("tensor", tuple(e["key"]),
                               tuple((n, _show(p)) for n, p in zip(names, e["placements"])))
    capacity = {}
    blob_names = [b["name"] for b in metas[0]["blobs"]]
    for m in metas:
        if [b["name"] for b in m["blobs"]] != blob_names:
            raise ValueError(f"blobs: rank 0 has {blob_names}, rank {m['rank']} "
                             f"{[b['name'] for b in m['blobs']]} (every rank needs the same "
                             f"Stateful extras)")
    for i, bname in enumerate(blob_names):
        entries = [m["blobs"][i] for m in metas]
        if bname == "optim.param_groups":
            values = {e["value"] for e in entries}
            if len(values) > 1:
                raise ValueError("blob \"optim.param_groups\": the optimizer's hyperparameters "
                                 "differ between ranks (a replicated blob needs one value)")
        largest = max(e["size"] for e in entries)
        cap = -(-int(largest * blob_headroom + 256 + _BLOB_HEADER.size) // 64) * 64
        capacity[bname] = cap
        scope = ptc_pb2.BLOB_PER_RANK if entries[0]["per_rank"] else ptc_pb2.BLOB_REPLICATED
        b = ptc.blobs.add(name=bname, size_bytes=cap, scope=scope)
        if bname == "rng":
            b.regenerable = True
        items[bname] = ItemInfo("blob", tuple(entries[0]["key"]), ())
    return Spec(ptc, config, dict(items), capacity)


def _config(metas, world):
    dims = {}
    for m in metas:
        sources = [(n, s) for sig in m["meshes"] for n, s in zip(sig[0], sig[2])]
        for n, s in list(m["mesh_dims"].items()) + sources:
            if n not in _KNOWN_DIMS:
                raise ValueError(f"DeviceMesh dim \"{n}\" (size {s}) is none of reshard's "
                                 f"{', '.join(MESH_DIMS + ('dp', 'dp_shard_cp'))}")
            if dims.setdefault(n, int(s)) != int(s):
                raise ValueError(f"DeviceMesh dim \"{n}\": size {dims[n]} on one mesh, "
                                 f"{s} on another")
    tp, cp, rep = dims.get("tp", 1), dims.get("cp", 1), dims.get("dp_replicate", 1)
    if "dp_shard" in dims:
        shard = dims["dp_shard"]
    elif "dp_shard_cp" in dims:
        if dims["dp_shard_cp"] % cp:
            raise ValueError(f"DeviceMesh dim \"dp_shard_cp\" {dims['dp_shard_cp']} is not a "
                             f"multiple of cp {cp}")
        shard = dims["dp_shard_cp"] // cp
    elif "dp" in dims:
        if dims["dp"] % rep:
            raise ValueError(f"DeviceMesh dim \"dp\" {dims['dp']} is not a multiple of "
                             f"dp_replicate {rep}")
        shard = dims["dp"] // rep
    else:
        shard = 1
    dp = rep * shard
    if "dp_shard_cp" in dims and dims["dp_shard_cp"] != shard * cp:
        raise ValueError(f"DeviceMesh dim \"dp_shard_cp\" {dims['dp_shard_cp']} != dp_shard "
                         f"{shard} x cp {cp}")
    if "dp" in dims and dims["dp"] != dp:
        raise ValueError(f"DeviceMesh dim \"dp\" {dims['dp']} != dp_replicate {rep} x "
                         f"dp_shard {shard}")
    inner = tp * cp * dp
    pp = dims.get("pp") or (world // inner if world % inner == 0 else 0)
    if pp * inner != world:
        raise ValueError(f"world size {world} is not pp x dp x cp x tp = {pp} x {dp} x {cp} x "
                         f"{tp} of the DeviceMesh dims {dims}")
    config = ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp, order=ptc_pb2.RANK_ORDER_TP_DP_PP)
    if cp > 1:
        config.cp = cp
    if rep > 1:
        config.dp_shard = shard
    return config


def _coord_values(config, rank):
    """Every mesh dim's index of `rank` under `config`."""
    d = layout.dims(config)
    rc = layout.rank_coords(config, rank)
    shard = config.dp_shard or d.dp
    return {"pp": rc.pp, "dp_replicate": rc.dp // shard, "dp_shard": rc.dp % shard,
            "dp": rc.dp, "cp": rc.cp, "tp": rc.tp, "dp_shard_cp": (rc.dp % shard) * d.cp + rc.cp}


def _rank_from(config, v, changed):
    d = layout.dims(config)
    shard = config.dp_shard or d.dp
    cp_i, tp_i, pp_i = v["cp"], v["tp"], v["pp"]
    if "dp" in changed:
        dp_i = v["dp"]
    elif "dp_shard_cp" in changed:
        dp_i = v["dp_replicate"] * shard + v["dp_shard_cp"] // d.cp
        cp_i = v["dp_shard_cp"] % d.cp
    else:
        dp_i = v["dp_replicate"] * shard + v["dp_shard"]
    return layout.rank_of(config, tp_i, dp_i, pp_i, cp_i)


def _check_rank_order(metas, config):
    """Each DTensor mesh's global ranks are where reshard's rank order puts
    them. A mesh is shared by its ranks, which agree on the dims it does not
    span: each distinct mesh is checked once, from one of its ranks."""
    seen = set()
    for m in metas:
        mine = _coord_values(config, m["rank"])
        for names, flat, shape in m["meshes"]:
            if (names, flat, shape) in seen:
                continue
            seen.add((names, flat, shape))
            table = np.asarray(flat).reshape(shape)
            for idx in np.ndindex(*shape):
                v = dict(mine)
                v.update(zip(names, idx))
                want = _rank_from(config, v, set(names))
                if int(table[idx]) != want:
                    raise ValueError(
                        f"DeviceMesh {names} of shape {list(shape)} on rank {m['rank']}: "
                        f"position {list(idx)} is rank {int(table[idx])}, reshard's rank order "
                        f"(row-major over {', '.join(MESH_DIMS)}) puts rank {want} there")


def _partition(t, e, names, config):
    """The tensor's tp and dp partition from its placements."""
    d = layout.dims(config)
    p = t.partition
    p.tp.SetInParent()
    p.dp.SetInParent()
    where = f"tensor \"{t.name}\" (shape {list(e['shape'])}, placements " \
            f"{tuple(_show(x) for x in e['placements'])} over mesh dims {names})"
    tp_axis, dp = None, None  # dp: (axis, strided split factor or 0, mesh dim, size)
    for n, pl in zip(names, e["placements"]):
        kind = pl[0]
        if kind == "other":
            raise ValueError(f"{where}: placement {pl[1]} on mesh dim \"{n}\" has no PTC form "
                             f"(only Shard, _StridedShard and Replicate)")
        if kind == "replicate":
            continue
        if n == "tp":
            if kind == "strided":
                raise ValueError(f"{where}: {_show(pl)} on the tp dim has no PTC form")
            tp_axis = pl[1]
        elif n in _DP_DIMS:
            dp = (pl[1], pl[2] if kind == "strided" else 0, n)
        else:
            raise ValueError(f"{where}: {_show(pl)} on mesh dim \"{n}\": reshard shards only "
                             f"over tp and dp ({', '.join(_DP_DIMS)})")
    if tp_axis is not None and d.tp > 1:
        n = e["shape"][tp_axis]
        chunk = -(-n // d.tp)
        torch_sizes = [max(0, min(chunk, n - i * chunk)) for i in range(d.tp)]
        ptc_sizes = [layout.split(n, d.tp, i)[1] for i in range(d.tp)]
        if torch_sizes != ptc_sizes:
            raise ValueError(f"{where}: tp dim Shard({tp_axis}) of {n} over tp {d.tp} gives "
                             f"torch.chunk sizes {torch_sizes}, the PTC's TP_SPLIT "
                             f"(array_split) {ptc_sizes}: make dim {tp_axis} divisible by tp")
    if tp_axis is not None:
        p.tp.mode = ptc_pb2.TP_SPLIT
        p.tp.axis = tp_axis
    else:
        p.tp.mode = ptc_pb2.TP_REPLICATED
    if dp is None:
        p.dp.mode = ptc_pb2.DP_REPLICATED
        return
    axis, sf, dim = dp
    if sf:
        if tp_axis != axis or sf != d.tp:
            raise ValueError(f"{where}: _StridedShard(dim={axis}, sf={sf}) on \"{dim}\" is "
                             f"reshard's tp-first nesting only with Shard({axis}) on a tp dim "
                             f"of size {sf} (tp is {d.tp}, tp shards dim {tp_axis})")
    elif tp_axis == axis and d.tp > 1 and _dp_dim_size(config, dim) > 1:
        raise ValueError(f"{where}: Shard({axis}) on \"{dim}\" and Shard({axis}) on \"tp\" "
                         f"nest data parallel outside tensor parallel (dp-first); the PTC "
                         f"splits tp first, then dp inside the tp piece (FSDP2 + TP gives "
                         f"_StridedShard on dp)")
    p.dp.mode = ptc_pb2.DP_CHUNK
    p.dp.axis = axis
    p.allow_empty = True
    if d.cp > 1:
        p.dp.over = ptc_pb2.DP_OVER_DP_CP if dim == "dp_shard_cp" else ptc_pb2.DP_OVER_DP
    if dim == "dp" and config.dp_shard and config.dp_shard < d.dp:
        raise ValueError(f"{where}: sharded over all of \"dp\" while the job's HSDP mesh "
                         f"shards over dp_shard {config.dp_shard}")


def _dp_dim_size(config, dim):
    """The size of a data-parallel mesh dim under `config`."""
    d = layout.dims(config)
    shard = config.dp_shard or d.dp
    return {"dp": d.dp, "dp_shard": shard, "dp_shard_cp": shard * d.cp}[dim]


def _stage_starts(pp, stages, layer_of, num_layers):
    """stage_starts from the layers each stage holds ([] when pp is 1)."""
    if pp <= 1:
        return []
    owner = {}
    for name, layer in layer_of.items():
        s = stages[name]
        if len(s) != 1:
            raise ValueError(f"tensor \"{name}\" of layer {layer} is held by stages {s} (a "
                             f"layer belongs to one stage)")
        if owner.setdefault(layer, s[0]) != s[0]:
            raise ValueError(f"layer {layer}: held by stage {owner[layer]} and stage {s[0]} "
                             f"(\"{name}\")")
    missing = [i for i in range(num_layers) if i not in owner]
    if missing:
        raise ValueError(f"layers {missing} of {num_layers} are held by no stage")
    starts = []
    for s in range(pp):
        mine = [i for i in range(num_layers) if owner[i] == s]
        if not mine or mine != list(range(mine[0], mine[-1] + 1)) or \
                (starts and mine[0] <= starts[-1]):
            raise ValueError(f"stage {s} holds layers {mine}: each stage must hold a non-empty, "
                             f"contiguous range of layers after the previous stage's")
        starts.append(mine[0])
    if starts[0] != 0:
        raise ValueError(f"stage 0 holds layers from {starts[0]}, not from layer 0")
    return starts


def _pipeline(pipe, name, stages, layer, pp):
    if layer is not None:
        pipe.mode = ptc_pb2.PIPELINE_LAYER
        pipe.layer = layer
        return
    if stages == list(range(pp)):
        pipe.mode = ptc_pb2.PIPELINE_EVERY_STAGE
    elif stages == [0]:
        pipe.mode = ptc_pb2.PIPELINE_FIRST_STAGE
    elif stages == [pp - 1]:
        pipe.mode = ptc_pb2.PIPELINE_LAST_STAGE
    elif stages == [0, pp - 1]:
        pipe.mode = ptc_pb2.PIPELINE_FIRST_AND_LAST_STAGE
    else:
        raise ValueError(f"tensor \"{name}\" outside the layers is held by stages {stages} of "
                         f"{pp}: the PTC has first, last, first-and-last or every stage")


# ------------------------------------------------------- publish and load


def encode_blob(name, value, capacity):
    """The `capacity` bytes of blob `name` holding `value`: an 8-byte
    little-endian length, the pickle, zeros (the format of every blob
    reshard.pytorch and reshard.dcp write). ValueError when it does not fit."""
    data = pickle.dumps(value)
    if _BLOB_HEADER.size + len(data) > capacity:
        raise ValueError(f"blob \"{name}\": {len(data)} bytes pickled (+{_BLOB_HEADER.size} "
                         f"header), its capacity in the PTC is {capacity} (chosen at describe(); "
                         f"describe again with a larger blob_headroom)")
    return _BLOB_HEADER.pack(len(data)) + data + bytes(capacity - _BLOB_HEADER.size - len(data))


def decode_blob(name, raw):
    """The object blob `name`'s bytes hold (encode_blob's inverse)."""
    raw = bytes(raw)
    (n,) = _BLOB_HEADER.unpack_from(raw)
    if _BLOB_HEADER.size + n > len(raw):
        raise ValueError(f"blob \"{name}\": its header says {n} bytes, the blob holds "
                         f"{len(raw) - _BLOB_HEADER.size}")
    return pickle.loads(raw[_BLOB_HEADER.size:_BLOB_HEADER.size + n])


def _local(t):
    return t.to_local() if isinstance(t, _dtensor_type()) else t


def local_items(app, spec, rank):
    """{item name: local tensor view | blob bytes} of `rank`: each DTensor's
    to_local() (never a full tensor), plain tensors as they are, blobs
    encoded to their capacity. Tensors of other pipeline stages are left out.
    ValueError naming the item when a local shape is not the PTC's."""
    tensors, blobs = _live_tensors(app)
    out = {}
    for name, _, t in tensors:
        if name not in spec._tensors:
            raise ValueError(f"tensor \"{name}\" is not in the Spec (describe() again after "
                             f"changing the model or optimizer)")
        local = _local(t)
        if local.dim() == 0:
            local = local.reshape(1)  # a view: the item of a 0-d tensor has shape [1]
        want = layout.local_shape_of(spec._tensors[name], spec.config, rank, spec.ptc)
        if list(local.shape) != want:
            raise ValueError(f"rank {rank} tensor \"{name}\": local shape {list(local.shape)}, "
                             f"the PTC gives {want}")
        out[name] = local
    for name, _, value, _ in blobs:
        out[name] = encode_blob(name, value, spec.blob_capacity[name])
    return out


def publish(worker, app, spec, rank, generation):
    """Publishes `rank`'s local tensors and blobs of `generation` through
    `worker` (a reshard.Worker of the job); returns {item: checksum}."""
    return worker.publish(rank, generation, local_items(app, spec, rank))


def load(worker, app, spec, rank, generation, target=None):
    """Loads `rank`'s buffer of `generation` into `app` in place: each
    DTensor's local tensor (and each optimizer state tensor) is copied into,
    so FSDP2's and the optimizer's storage stay the same objects; then the
    optimizer's hyperparameters, load_state_dict of every Stateful extra and
    the RNG (unless regenerated). Returns the frozenset of regenerated item
    names (their bytes were zeros: no surviving holder). `target`:
    prepare_load()'s answer for this app, taken before the generation
    existed (None: prepared now)."""
    torch = _torch()
    # Views of the agent's file (copy=False): each tensor is copied once,
    # straight from shared memory into the local tensor; the dtypes are the
    # Spec's. State on a GPU comes through the pinned mapping (device=: one
    # host-to-device copy each, then a device-local copy_).
    tensors, blobs = target if target is not None else prepare_load(app, spec)
    cuda = next((_local(t).device for _, _, t in tensors if _local(t).is_cuda), None)
    got = worker.load(rank, generation, as_torch=True, copy=False, ptc=spec.ptc, device=cuda)
    regenerated = set(got.regenerated)
    with torch.no_grad():
        for name, _, t in tensors:
            local = _local(t)
            src = got.get(name)
            if src is None:
                if local.numel() and spec.holds(rank, name):
                    raise ValueError(f"rank {rank} tensor \"{name}\": generation {generation} "
                                     f"has no bytes of it, the local tensor has {local.numel()} "
                                     f"elements")
                continue
            if src.numel() != local.numel() or (local.dim() and list(src.shape) !=
                                                   list(local.shape)):
                raise ValueError(f"rank {rank} tensor \"{name}\": generation {generation} "
                                 f"holds shape {list(src.shape)}, the local tensor is "
                                 f"{list(local.shape)} (this mesh's torch.chunk split differs "
                                 f"from the PTC's)")
            local.copy_(src.reshape(local.shape))
    for name, key, _, _ in blobs:
        if name in got.regenerated:
            continue
        value = decode_blob(name, got[name])
        if name == "optim.param_groups":
            groups = app.optimizer.param_groups
            if len(value) != len(groups):
                raise ValueError(f"blob \"optim.param_groups\": {len(value)} groups, the "
                                 f"optimizer has {len(groups)}")
            for group, hyper in zip(groups, value):
                group.update(hyper)
        elif name == "rng":
            if value is None:  # a checkpoint imported without one (reshard.dcp)
                regenerated.add(name)
            else:
                set_rng_state(value)
        else:
            app.stateful[name].load_state_dict(value)
    return frozenset(regenerated)


def prepare_load(app, spec):
    """Makes `app` ready for load() before the generation to load exists (a
    rank waiting for a stop-free cut-over calls it then, so that the pause
    does not pay it): a fresh optimizer gets the state the PTC names, as
    zeros (DTensors of its parameters' placements), for load() to copy into;
    returns load()'s `target`, the live tensors it copies into. It stays
    valid while nothing steps the model or optimizer."""
    if app.optimizer is not None and not app.optimizer.state:
        _fresh_optimizer_state(app, spec)
    return _live_tensors(app)


def _fresh_optimizer_state(app, spec):
    """Gives a fresh optimizer (no state yet) the state the PTC names, as
    zeros, so that the load copies into it: for each parameter, every
    `optim.state.<fqn>.<key>` item of the parameter's shape and dtype becomes
    zeros_like(parameter) (a DTensor of its placements) and every 0-d item (the
    PTC records it as [1]) a 0-d tensor of the item's dtype (Adam's `step`): what the
    optimizer's first step would create. Without this, get_state_dict makes
    the state by a zero-gradient step over the whole model (torch's
    _init_optim_state), the bulk of a new rank's load. Creates nothing, and
    leaves it to get_state_dict, when any item fits neither form or the
    optimizer keeps its state on a device (fused / capturable). The new
    optimizer must keep the keys the job's did (an Adam made with amsgrad at
    B and without it at A lacks max_exp_avg_sq: its first step raises a
    KeyError), as with any load of another optimizer's state."""
    torch = _torch()
    opt = app.optimizer
    if any(g.get("fused") or g.get("capturable") for g in opt.param_groups):
        return
    keys = collections.defaultdict(list)   # fqn -> [(key, PTC tensor)]
    for t in spec.ptc.tensors:
        if t.name.startswith("optim.state."):
            fqn, _, key = t.name[len("optim.state."):].rpartition(".")
            keys[fqn].append((key, t))
    fqn_of = _parameter_fqns(app.model)
    if fqn_of is None:
        return
    state = {}
    for group in opt.param_groups:
        for param in group["params"]:
            entry = {}
            for key, t in keys.get(fqn_of.get(id(param)), ()):
                shape, dtype = list(t.shape), _dtypes.torch_dtype(t.dtype)
                if list(param.shape) in ([], [1]):
                    return   # a 0-d item (the PTC writes [1]) and the parameter look alike
                if shape == list(param.shape) and dtype == param.dtype:
                    entry[key] = torch.zeros_like(param, memory_format=torch.preserve_format)
                elif shape in ([], [1]):
                    entry[key] = torch.zeros((), dtype=dtype)
                else:
                    return
            if entry:
                state[param] = entry
    for param, entry in state.items():
        opt.state[param] = entry


def _parameter_fqns(model):
    """{id(parameter): its FQN as get_state_dict names it}, or None when a
    parameter has not exactly one (torch's own rule, _get_fqns: without the
    prefixes of DDP, torch.compile and activation-checkpoint wrappers)."""
    from torch.distributed.checkpoint import state_dict as sd
    out = {}
    for name, param in model.named_parameters():
        fqns = sd._get_fqns(model, name)
        if len(fqns) != 1:
            return None
        out[id(param)] = next(iter(fqns))
    return out


def spec_from_ptc(ptc, config):
    """The Spec of a job's stored PTC (Client.get_job(job_id,
    include_ptc=True).ptc) at `config` (a ParallelConfig or Layout): what a
    rank started at a new layout loads with, so that the blob capacities and
    item order are the job's, not those of a fresh describe()."""
    from reshard.core._proto import as_message
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    if isinstance(config, ptc_pb2.Layout):
        config = config.config
    items = collections.OrderedDict()
    for t in ptc.tensors:
        if t.name.startswith("model."):
            key = ("model", t.name[len("model."):])
        elif t.name.startswith("optim.state."):
            fqn, _, k = t.name[len("optim.state."):].rpartition(".")
            key = ("optim", "state", fqn, k)
        else:
            key = tuple(t.name.split("."))
        items[t.name] = ItemInfo("tensor", key, ())
    for b in ptc.blobs:
        items[b.name] = ItemInfo("blob", tuple(b.name.split(".")), ())
    return Spec(ptc, config, dict(items), {b.name: b.size_bytes for b in ptc.blobs})
