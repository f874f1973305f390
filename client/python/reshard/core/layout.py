"""Layouts and the reference shard function, written from docs/partitioning.md.

`shard(ptc, layout, rank, global_tensors)` cuts global tensors into what one
rank holds, by the rules of docs/partitioning.md and nothing else (it shares
no code with the C++ planner), so comparing the bytes a real reshard produced
with `shard(...)` of the new layout checks the planner against the docs.

Placement and layout helpers (make_layout, ranks_on_host, ...)
build the Layout messages a scheduler or test sends. Functions accept the
reshard.v1 messages or their proto-JSON dicts.
"""

import collections

import numpy as np

from reshard.core import _dtypes
from reshard.core._proto import as_message, ptc_pb2

_ORDERS = {
    "tp_dp_pp": ptc_pb2.RANK_ORDER_TP_DP_PP,
    "tp_pp_dp": ptc_pb2.RANK_ORDER_TP_PP_DP,
}


# ----------------------------------------------------------------- splits


def split(n, k, i):
    """(start, size) of part i of numpy.array_split(range(n), k)."""
    if k <= 0 or not 0 <= i < k:
        raise ValueError(f"split({n}, {k}): part {i} out of range")
    q, r = divmod(n, k)
    return i * q + min(i, r), q + (1 if i < r else 0)


# ---------------------------------------------------------------- layouts


def make_layout(tp, pp, dp, hosts=None, devices_per_host=None, order="tp_dp_pp",
                stage_starts=None, ranks=None, cp=1, vpp=1, ep=1, expert_tp=0, dp_shard=0):
    """A reshard.v1.Layout.

    Placement: either `hosts` x `devices_per_host` (compact: rank r on
    hosts[r // devices_per_host], device r % devices_per_host; the product
    must equal the world size tp*cp*dp*pp), or `ranks`, one (host, device)
    per rank. order: "tp_dp_pp" (Megatron's default) or "tp_pp_dp" (or the
    enum). cp, vpp, ep, expert_tp: context parallelism, interleaved stages
    (stage_starts then lists pp*vpp chunk starts), expert parallelism and the
    expert tensor-parallel size (0: tp); they are left unset at their default.
    dp_shard: HSDP, data-parallel ranks per shard group (a divisor of dp; 0:
    dp, no replicas; docs/partitioning.md, "Data-parallel groups").
    """
    if dp_shard and (dp_shard < 0 or dp % dp_shard):
        raise ValueError(f"dp_shard {dp_shard} does not divide dp {dp}")
    world = tp * pp * dp * max(cp, 1)
    config = ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp,
                                    order=_ORDERS.get(order, order),
                                    stage_starts=list(stage_starts or ()))
    for field, value, default in (("cp", cp, 1), ("vpp", vpp, 1), ("ep", ep, 1),
                                  ("expert_tp", expert_tp, 0), ("dp_shard", dp_shard, 0)):
        if value != default:
            setattr(config, field, value)
    what = f"tp {tp} x cp {max(cp, 1)} x dp {dp} x pp {pp}" if cp > 1 else \
        f"tp {tp} x pp {pp} x dp {dp}"
    placement = ptc_pb2.Placement()
    if ranks is not None:
        if hosts is not None:
            raise ValueError("give either hosts x devices_per_host or ranks, not both")
        if len(ranks) != world:
            raise ValueError(f"{len(ranks)} rank slots for a world of {world} ({what})")
        for host, device in ranks:
            placement.ranks.add(host=host, device=device)
    else:
        if hosts is None or devices_per_host is None:
            raise ValueError("make_layout needs hosts and devices_per_host, or ranks")
        if len(hosts) * devices_per_host != world:
            raise ValueError(f"{len(hosts)} hosts x {devices_per_host} devices = "
                             f"{len(hosts) * devices_per_host} slots for a world of {world} "
                             f"({what})")
        placement.hosts.extend(hosts)
        placement.devices_per_host = devices_per_host
    return ptc_pb2.Layout(config=config, placement=placement)


def world_size(layout_or_config):
    """tp * cp * dp * pp of a Layout or ParallelConfig."""
    d = _dims(_config(layout_or_config))
    return d.tp * d.cp * d.dp * d.pp


def _config(value):
    if isinstance(value, ptc_pb2.ParallelConfig):
        return value
    if isinstance(value, ptc_pb2.Layout):
        return value.config
    if isinstance(value, dict) and "config" not in value and "placement" not in value:
        return as_message(value, ptc_pb2.ParallelConfig, "config")
    return as_message(value, ptc_pb2.Layout, "layout").config


Dims = collections.namedtuple("Dims", "tp pp dp cp vpp ep etp")
Dims.__doc__ = "A ParallelConfig's sizes with the defaults applied (0 means 1; expert_tp 0: tp)."

Coords = collections.namedtuple("Coords", "tp cp dp pp")
Coords.__doc__ = "A rank's (tp_i, cp_i, dp_i, pp_i) (docs/partitioning.md, \"Ranks\")."


def _dims(c):
    tp = max(c.tp, 1)
    return Dims(tp, max(c.pp, 1), max(c.dp, 1), max(c.cp, 1), max(c.vpp, 1), max(c.ep, 1),
                c.expert_tp if c.expert_tp > 0 else tp)


def dims(config):
    """Dims(tp, pp, dp, cp, vpp, ep, etp) of a Layout or ParallelConfig."""
    return _dims(_config(config))


def rank_coords(config, rank):
    """Coords(tp, cp, dp, pp) of a rank (docs/partitioning.md, "Ranks")."""
    c = _config(config)
    d = _dims(c)
    world = d.tp * d.cp * d.dp * d.pp
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} out of range for world {world}")
    tp_i, rest = rank % d.tp, rank // d.tp
    cp_i, rest = rest % d.cp, rest // d.cp
    if c.order == ptc_pb2.RANK_ORDER_TP_PP_DP:
        pp_i, dp_i = rest % d.pp, rest // d.pp
    else:
        dp_i, pp_i = rest % d.dp, rest // d.dp
    return Coords(tp_i, cp_i, dp_i, pp_i)


def coords(config, rank):
    """(tp_i, dp_i, pp_i) of a rank; rank_coords also gives cp_i."""
    rc = rank_coords(config, rank)
    return rc.tp, rc.dp, rc.pp


def rank_of(config, tp_i, dp_i, pp_i, cp_i=0):
    """The rank with coordinates (tp_i, cp_i, dp_i, pp_i)."""
    c = _config(config)
    d = _dims(c)
    if c.order == ptc_pb2.RANK_ORDER_TP_PP_DP:
        return tp_i + d.tp * (cp_i + d.cp * (pp_i + d.pp * dp_i))
    return tp_i + d.tp * (cp_i + d.cp * (dp_i + d.dp * pp_i))


def dp_group(config, rank):
    """(G, g) of a rank's data-parallel group for dense tensors: G = dp * cp,
    g = cp_i + cp * dp_i (Megatron shards its optimizer over dp x cp)."""
    d = dims(config)
    rc = rank_coords(config, rank)
    return d.dp * d.cp, rc.cp + d.cp * rc.dp


def dp_shard_of(config):
    """ds of "Data-parallel groups": `dp_shard`, or dp when 0; ValueError
    unless it divides dp."""
    c = _config(config)
    d = _dims(c)
    ds = c.dp_shard or d.dp
    if ds < 1 or d.dp % ds:
        raise ValueError(f"dp_shard {c.dp_shard} does not divide dp {d.dp}")
    return ds


def shard_group(config, rank, over=ptc_pb2.DP_OVER_DP_CP):
    """(S, s) of a rank for a dense tensor whose `partition.dp.over` is
    `over`: the shard group its data-parallel split runs over and the rank's
    index in it (docs/partitioning.md, "Data-parallel groups"). From the group
    (G, g), dp x cp (dp_group) or dp alone (DP_OVER_DP), S is dp_shard (times
    cp for DP_OVER_DP_CP) and s = g % S; the replica is g // S."""
    d = dims(config)
    ds = dp_shard_of(config)
    rc = rank_coords(config, rank)
    if over == ptc_pb2.DP_OVER_DP:
        group, index = d.dp, rc.dp
        size = ds
    elif over == ptc_pb2.DP_OVER_DP_CP:
        group, index = dp_group(config, rank)
        size = ds * d.cp
    else:
        raise ValueError(f"partition.dp.over {over} is not a known DpOver")
    assert group % size == 0
    return size, index % size


ExpertCoords = collections.namedtuple("ExpertCoords", "etp ep edp edp_size")
ExpertCoords.__doc__ = "A rank's expert coordinates (etp_i, ep_i, edp_i) and the edp group size."


def expert_coords(config, rank):
    """ExpertCoords of a rank: inside its stage, position l = tp_i + tp *
    (cp_i + cp * dp_i) is cut tp-ep-dp (Megatron's expert rank generator)."""
    d = dims(config)
    stage = d.tp * d.cp * d.dp
    if stage % (d.etp * d.ep):
        raise ValueError(f"tp {d.tp} x cp {d.cp} x dp {d.dp} = {stage} is not a multiple of "
                         f"expert_tp {d.etp} x ep {d.ep}")
    rc = rank_coords(config, rank)
    pos = rc.tp + d.tp * (rc.cp + d.cp * rc.dp)
    return ExpertCoords(pos % d.etp, (pos // d.etp) % d.ep, pos // (d.etp * d.ep),
                        stage // (d.etp * d.ep))


def slots(layout):
    """[(host, device)] for every rank, in rank order."""
    lay = as_message(layout, ptc_pb2.Layout, "layout")
    p = lay.placement
    if len(p.ranks):
        return [(s.host, s.device) for s in p.ranks]
    n = p.devices_per_host
    return [(p.hosts[r // n], r % n) for r in range(len(p.hosts) * n)]


def hosts_of(layout):
    """The distinct hosts a layout uses, in rank order."""
    out = []
    for host, _ in slots(layout):
        if host not in out:
            out.append(host)
    return out


def ranks_on_host(layout, host):
    """[(rank, device)] of the ranks placed on `host`."""
    return [(r, d) for r, (h, d) in enumerate(slots(layout)) if h == host]


def chunk_starts(config, num_layers):
    """First layer of each of the pp * vpp chunks (with vpp 1: of each
    stage): `stage_starts` or the even split (docs: "Stages")."""
    c = _config(config)
    d = _dims(c)
    n = d.pp * d.vpp
    if len(c.stage_starts):
        starts = list(c.stage_starts)
        if len(starts) != n or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"stage_starts {starts}: expected {n} strictly increasing entries "
                             f"starting at 0 (pp {d.pp} x vpp {d.vpp})")
        return starts
    return [split(num_layers, n, k)[0] for k in range(n)]


def stage_starts(config, num_layers):
    """First layer of each stage (with vpp > 1: of each chunk)."""
    return chunk_starts(config, num_layers)


def chunk_of_layer(config, num_layers, layer):
    """The chunk owning `layer` (chunk c is on stage c % pp)."""
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} out of range for {num_layers} layers")
    chunk = 0
    for k, first in enumerate(chunk_starts(config, num_layers)):
        if first <= layer:
            chunk = k
    return chunk


def stage_of_layer(config, num_layers, layer):
    """The pipeline stage owning `layer`."""
    return chunk_of_layer(config, num_layers, layer) % dims(config).pp


def stages_holding(config, num_layers, pipeline):
    """Stages that hold a tensor with this Pipeline rule, ascending."""
    c = _config(config)
    pp = _dims(c).pp
    mode = pipeline.mode
    if mode == ptc_pb2.PIPELINE_LAYER:
        return [stage_of_layer(c, num_layers, pipeline.layer)]
    if mode == ptc_pb2.PIPELINE_FIRST_STAGE:
        return [0]
    if mode == ptc_pb2.PIPELINE_LAST_STAGE:
        return [pp - 1]
    if mode == ptc_pb2.PIPELINE_EVERY_STAGE:
        return list(range(pp))
    if mode == ptc_pb2.PIPELINE_FIRST_AND_LAST_STAGE:
        return sorted({0, pp - 1})
    if mode == ptc_pb2.PIPELINE_LAYERS:
        if not len(pipeline.layers):
            raise ValueError("PIPELINE_LAYERS with no layers")
        return sorted({stage_of_layer(c, num_layers, n) for n in pipeline.layers})
    raise ValueError(f"pipeline mode {mode} is unspecified")


def chunk_holding(config, num_layers, pipeline, stage):
    """The chunk of a tensor held by `stage` (docs: "Stages", the chunk of a
    held tensor): the one whose bucket buffer it joins."""
    c = _config(config)
    d = _dims(c)
    last = d.pp * d.vpp - 1
    mode = pipeline.mode
    if stage not in stages_holding(c, num_layers, pipeline):
        raise ValueError(f"stage {stage} does not hold a tensor of pipeline mode {mode}")
    if mode == ptc_pb2.PIPELINE_LAYER:
        return chunk_of_layer(c, num_layers, pipeline.layer)
    if mode == ptc_pb2.PIPELINE_FIRST_STAGE:
        return 0
    if mode == ptc_pb2.PIPELINE_LAST_STAGE:
        return last
    if mode == ptc_pb2.PIPELINE_LAYERS:
        return min(k for k in (chunk_of_layer(c, num_layers, n) for n in pipeline.layers)
                   if k % d.pp == stage)
    if stage == 0:
        return 0
    if stage == d.pp - 1:
        return last
    return stage


# ------------------------------------------------------------------ shards


def held_shape(tensor, config):
    """The tensor's shape under `config`: its logical shape with the padded
    axis rounded up (docs: "Held shape"; Megatron's vocabulary padding)."""
    d = dims(config)
    shape = [int(x) for x in tensor.shape]
    p = tensor.partition
    if p.HasField("padding"):
        t = d.etp if p.HasField("expert") else d.tp
        m = max(p.padding.multiple, 1) * (t if p.padding.times_tp else 1)
        axis = p.padding.axis
        if not 0 <= axis < len(shape):
            raise ValueError(f"tensor \"{tensor.name}\": padding axis {axis} out of range for "
                             f"a rank-{len(shape)} tensor")
        shape[axis] = -(-shape[axis] // m) * m
    return shape


def tp_ranges(tensor, held, t, i):
    """[(start, size)] that tp index i of t takes on the tp axis, in block
    order, or None for TP_REPLICATED (docs: "Tensor parallel piece", with
    unit granularity and replication of blocks of fewer units than t; with
    granularity 0 the element-wise split, parts possibly empty)."""
    tpm = tensor.partition.tp
    if tpm.mode != ptc_pb2.TP_SPLIT:
        return None
    blocks = list(tpm.blocks) or [held[tpm.axis]]
    u = max(tpm.granularity, 1)
    out, start = [], 0
    for b in blocks:
        if b % u:
            raise ValueError(f"tensor \"{tensor.name}\": block {b} is not a multiple of "
                             f"granularity {u}")
        n = b // u
        if n >= t or tpm.granularity == 0:  # granularity 0: element-wise, never replicated
            q_start, q_size = split(n, t, i)
            out.append((start + u * q_start, u * q_size))
        elif t % n:
            raise ValueError(f"tensor \"{tensor.name}\": block of {n} units of {u} cannot be "
                             f"replicated over {t} tensor-parallel ranks ({t} % {n} != 0)")
        else:
            out.append((start + u * (i * n // t), u))
        start += b
    return out


Piece = collections.namedtuple("Piece", "held select shape group index")
Piece.__doc__ = """A rank's tensor-parallel piece T of a tensor: the held shape, the
slabs it takes {axis: [(start, size)]} (concatenated in order), T's shape,
and the data-parallel group size and index that cut T (for a dense tensor its
shard group, shard_group; for an expert tensor edp)."""


def piece(tensor, config, rank):
    """The Piece of `rank` for a TensorSpec (expert slab, tp slabs)."""
    d = dims(config)
    held = held_shape(tensor, config)
    p = tensor.partition
    select = {}
    if p.HasField("expert"):
        ec = expert_coords(config, rank)
        axis = p.expert.axis
        select[axis] = [split(held[axis], d.ep, ec.ep)]
        t, i, group, index = d.etp, ec.etp, ec.edp_size, ec.edp
    else:
        t, i = d.tp, rank_coords(config, rank).tp
        group, index = shard_group(config, rank, p.dp.over)
    ranges = tp_ranges(tensor, held, t, i)
    if ranges is not None:
        if p.tp.axis in select:
            raise ValueError(f"tensor \"{tensor.name}\": tp axis {p.tp.axis} is its expert axis")
        select[p.tp.axis] = ranges
    shape = list(held)
    for axis, slabs in select.items():
        shape[axis] = sum(n for _, n in slabs)
    return Piece(held, select, shape, group, index)


def _dp_range(mode, n, group, index):
    """(start, size) along an axis of extent n for DP_SPLIT / DP_CHUNK."""
    if mode == ptc_pb2.DP_CHUNK:
        c = -(-n // group)
        lo = min(index * c, n)
        return lo, min((index + 1) * c, n) - lo
    return split(n, group, index)


def _local_numel_range(tensor, config, rank, ptc, buffers=None):
    """(lo, hi): T's row-major elements in the rank's DP_BUCKET buffer."""
    if ptc is None:
        raise ValueError(f"tensor \"{tensor.name}\": DP_BUCKET needs the PTC (its bucket group)")
    from reshard.core import buckets
    return buckets.member_range(ptc, config, rank, tensor.name, buffers)


def local_shape_of(tensor, config, rank, ptc=None):
    """Shape of `rank`'s local buffer of a TensorSpec: T, its DP_SPLIT or
    DP_CHUNK slab, [chunk] for DP_FLAT with a group of more than one, or
    [elements] for DP_BUCKET (ptc needed). Does not check pipeline ownership."""
    pc = piece(tensor, config, rank)
    d = tensor.partition.dp
    if d.mode == ptc_pb2.DP_FLAT and pc.group > 1:
        n = int(np.prod(pc.shape, dtype=np.int64))
        return [-(-n // pc.group)]
    if d.mode == ptc_pb2.DP_BUCKET:
        lo, hi = _local_numel_range(tensor, config, rank, ptc)
        return [hi - lo]
    if d.mode in (ptc_pb2.DP_SPLIT, ptc_pb2.DP_CHUNK):
        out = list(pc.shape)
        out[d.axis] = _dp_range(d.mode, out[d.axis], pc.group, pc.index)[1]
        return out
    return list(pc.shape)


def local_tensor(tensor, config, rank, global_array, ptc=None, buffers=None):
    """The local buffer of `rank` for one tensor (an array of local_shape_of),
    cut from its global array of the logical shape: padding positions are
    zero. Does not check pipeline ownership. DP_BUCKET needs the PTC (and
    takes the rank's buckets.rank_buffers when given)."""
    arr = _check_global(tensor, global_array)
    pc = piece(tensor, config, rank)
    if pc.held != list(arr.shape):
        held = np.zeros(pc.held, dtype=arr.dtype)
        held[tuple(slice(0, n) for n in arr.shape)] = arr
        arr = held
    for axis, slabs in pc.select.items():
        idx = np.concatenate([np.arange(s, s + n) for s, n in slabs]) if slabs else []
        arr = np.take(arr, np.asarray(idx, dtype=np.int64), axis=axis)
    d = tensor.partition.dp
    if d.mode == ptc_pb2.DP_FLAT and pc.group > 1:
        flat = np.ascontiguousarray(arr).reshape(-1)
        n = flat.size
        chunk = -(-n // pc.group)
        out = np.zeros(chunk, dtype=flat.dtype)
        begin = min(n, pc.index * chunk)
        end = min(n, begin + chunk)
        out[:end - begin] = flat[begin:end]
        return out
    if d.mode == ptc_pb2.DP_BUCKET:
        lo, hi = _local_numel_range(tensor, config, rank, ptc, buffers)
        return np.ascontiguousarray(arr).reshape(-1)[lo:hi].copy()
    if d.mode in (ptc_pb2.DP_SPLIT, ptc_pb2.DP_CHUNK):
        start, size = _dp_range(d.mode, arr.shape[d.axis], pc.group, pc.index)
        arr = np.take(arr, np.arange(start, start + size), axis=d.axis)
    return np.ascontiguousarray(arr)


def _dense_rank(config, tp_i, dp_i):
    """A rank of stage 0 with these tp and dp indices (cp index 0)."""
    return rank_of(config, tp_i, dp_i, 0)


def local_shape(tensor, config, tp_i, dp_i):
    """local_shape_of for a dense tensor by (tp_i, dp_i) (cp index 0)."""
    return local_shape_of(tensor, config, _dense_rank(_config(config), tp_i, dp_i))


def tp_local(tensor, tp, tp_i, global_array):
    """The tp-local tensor T of tp index tp_i of a dense tensor without
    padding: the rank's slabs of every sub-block concatenated along the axis
    in block order."""
    shape = [int(x) for x in tensor.shape]
    ranges = tp_ranges(tensor, shape, tp, tp_i)
    if ranges is None:
        return global_array
    axis = tensor.partition.tp.axis
    parts = [np.take(global_array, np.arange(s, s + n), axis=axis) for s, n in ranges]
    return np.concatenate(parts, axis=axis)


def shard_tensor(tensor, config, tp_i, dp_i, global_array):
    """local_tensor for a dense tensor by (tp_i, dp_i) (cp index 0)."""
    c = _config(config)
    return local_tensor(tensor, c, _dense_rank(c, tp_i, dp_i), global_array)


def _check_global(tensor, array):
    arr = _as_numpy(array)
    if list(arr.shape) != list(tensor.shape):
        raise ValueError(f"tensor \"{tensor.name}\": global array has shape {list(arr.shape)}, "
                         f"the PTC says {list(tensor.shape)}")
    want = _dtypes.element_bytes(tensor.dtype)
    if arr.dtype.itemsize != want:
        raise ValueError(f"tensor \"{tensor.name}\": global array dtype {arr.dtype} has "
                         f"{arr.dtype.itemsize}-byte elements, the PTC's "
                         f"{ptc_pb2.DType.Name(tensor.dtype)} has {want}")
    return arr


def _as_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
            return t.numpy().view(np.uint16)
        return t.numpy()
    return np.asarray(value)


def holds(ptc, layout, rank, tensor_name):
    """True when `rank` holds (some stage-wise share of) the named tensor."""
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    lay = as_message(layout, ptc_pb2.Layout, "layout")
    for t in ptc.tensors:
        if t.name == tensor_name:
            pp_i = rank_coords(lay.config, rank).pp
            return pp_i in stages_holding(lay.config, ptc.num_layers, t.partition.pipeline)
    raise KeyError(f"no tensor \"{tensor_name}\" in the PTC")


def blob_value(blob, rank, value):
    """A blob's bytes on `rank`: a replicated blob's value is bytes-like; a
    per-rank blob's global value is the sequence of every old rank's bytes,
    and rank r takes value r mod len(sequence)."""
    if blob.scope == ptc_pb2.BLOB_PER_RANK:
        if isinstance(value, (bytes, bytearray, memoryview, np.ndarray)):
            raise ValueError(f"blob \"{blob.name}\" is per rank: give a sequence with one value "
                             "per (old) rank")
        value = value[rank % len(value)]
    data = bytes(value) if not isinstance(value, np.ndarray) else value.tobytes()
    if len(data) != blob.size_bytes:
        raise ValueError(f"blob \"{blob.name}\": {len(data)} bytes, the PTC says "
                         f"{blob.size_bytes}")
    return data


def shard(ptc, layout, rank, global_tensors):
    """What `rank` of `layout` holds: {name: array} for every tensor its
    pipeline stage holds (local_shape, raw dtype of the global array), and
    {name: bytes} for every blob (see blob_value). Tensors of other stages,
    and tensors of which the rank's buffer has no element (allow_empty), are
    left out, as Worker.load leaves them out. Every tensor and blob of the
    PTC must be in global_tensors."""
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    lay = as_message(layout, ptc_pb2.Layout, "layout")
    pp_i = rank_coords(lay.config, rank).pp
    out = {}
    buffers = None
    if len(ptc.buckets):
        from reshard.core import buckets
        buffers = buckets.rank_buffers(ptc, lay.config, rank)
    for t in ptc.tensors:
        if pp_i not in stages_holding(lay.config, ptc.num_layers, t.partition.pipeline):
            continue
        if t.name not in global_tensors:
            raise KeyError(f"tensor \"{t.name}\" missing from the global tensors")
        local = local_tensor(t, lay.config, rank, global_tensors[t.name], ptc, buffers)
        if local.size:
            out[t.name] = local
    for b in ptc.blobs:
        if b.name not in global_tensors:
            raise KeyError(f"blob \"{b.name}\" missing from the global tensors")
        out[b.name] = blob_value(b, rank, global_tensors[b.name])
    return out


def after_reshard(ptc, new_layout, global_tensors, regenerate=()):
    """The global values after a reshard to `new_layout`: tensors and
    replicated blobs unchanged; each per-rank blob's sequence becomes the new
    world's values (new rank r took old value r mod old world), so that
    shard(ptc, new_layout, r, result) is what rank r now holds and a further
    reshard can be checked the same way. regenerate: (rank, blob name) pairs
    of TransferPlan.regenerate (regenerable blobs that had no surviving
    holder): their new value is zeros until the worker regenerates it."""
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    out = dict(global_tensors)
    world = world_size(new_layout)
    zeroed = {(int(r), str(n)) for r, n in regenerate}
    for b in ptc.blobs:
        if b.scope == ptc_pb2.BLOB_PER_RANK and b.name in out:
            out[b.name] = [bytes(b.size_bytes) if (r, b.name) in zeroed
                           else blob_value(b, r, global_tensors[b.name]) for r in range(world)]
    return out


def shard_all(ptc, layout, global_tensors):
    """{rank: shard(ptc, layout, rank, global_tensors)} for every rank."""
    return {r: shard(ptc, layout, r, global_tensors) for r in range(world_size(layout))}


def same_bytes(a, b):
    """True when two arrays (numpy or torch) or bytes-likes have the same
    shape and identical bytes (NaN-safe, unlike array_equal)."""
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray,
                                                                        memoryview)):
        return bytes(_raw(a)) == bytes(_raw(b))
    a, b = _as_numpy(a), _as_numpy(b)
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _raw(x):
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    return np.ascontiguousarray(_as_numpy(x)).tobytes()
