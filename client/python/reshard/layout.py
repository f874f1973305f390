"""Layouts and the reference shard function, written from docs/partitioning.md.

`shard(ptc, layout, rank, global_tensors)` cuts global tensors into what one
rank holds, by the rules of docs/partitioning.md and nothing else (it shares
no code with the C++ planner), so comparing the bytes a real reshard produced
with `shard(...)` of the new layout checks the planner against the docs.

Placement and layout helpers (make_layout, ranks_on_host, ...)
build the Layout messages a scheduler or test sends. Functions accept the
reshard.v1 messages or their proto-JSON dicts.
"""

import numpy as np

from reshard import _dtypes
from reshard._proto import as_message, ptc_pb2

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
                stage_starts=None, ranks=None):
    """A reshard.v1.Layout.

    Placement: either `hosts` x `devices_per_host` (compact: rank r on
    hosts[r // devices_per_host], device r % devices_per_host; the product
    must equal tp*pp*dp), or `ranks`, one (host, device) per rank.
    order: "tp_dp_pp" (Megatron's default) or "tp_pp_dp" (or the enum).
    """
    world = tp * pp * dp
    config = ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp,
                                    order=_ORDERS.get(order, order),
                                    stage_starts=list(stage_starts or ()))
    placement = ptc_pb2.Placement()
    if ranks is not None:
        if hosts is not None:
            raise ValueError("give either hosts x devices_per_host or ranks, not both")
        if len(ranks) != world:
            raise ValueError(f"{len(ranks)} rank slots for a world of {world} (tp {tp} x pp {pp} "
                             f"x dp {dp})")
        for host, device in ranks:
            placement.ranks.add(host=host, device=device)
    else:
        if hosts is None or devices_per_host is None:
            raise ValueError("make_layout needs hosts and devices_per_host, or ranks")
        if len(hosts) * devices_per_host != world:
            raise ValueError(f"{len(hosts)} hosts x {devices_per_host} devices = "
                             f"{len(hosts) * devices_per_host} slots for a world of {world} "
                             f"(tp {tp} x pp {pp} x dp {dp})")
        placement.hosts.extend(hosts)
        placement.devices_per_host = devices_per_host
    return ptc_pb2.Layout(config=config, placement=placement)


def world_size(layout_or_config):
    """tp * pp * dp of a Layout or ParallelConfig."""
    c = _config(layout_or_config)
    return c.tp * c.pp * c.dp


def _config(value):
    if isinstance(value, ptc_pb2.ParallelConfig):
        return value
    if isinstance(value, ptc_pb2.Layout):
        return value.config
    if isinstance(value, dict) and "config" not in value and "placement" not in value:
        return as_message(value, ptc_pb2.ParallelConfig, "config")
    return as_message(value, ptc_pb2.Layout, "layout").config


def _dims(c):
    return max(c.tp, 1), max(c.pp, 1), max(c.dp, 1)


def coords(config, rank):
    """(tp_i, dp_i, pp_i) of a rank (docs/partitioning.md, "Ranks")."""
    c = _config(config)
    tp, pp, dp = _dims(c)
    if not 0 <= rank < tp * pp * dp:
        raise ValueError(f"rank {rank} out of range for world {tp * pp * dp}")
    tp_i, rest = rank % tp, rank // tp
    if c.order == ptc_pb2.RANK_ORDER_TP_PP_DP:
        pp_i, dp_i = rest % pp, rest // pp
    else:
        dp_i, pp_i = rest % dp, rest // dp
    return tp_i, dp_i, pp_i


def rank_of(config, tp_i, dp_i, pp_i):
    """The rank with coordinates (tp_i, dp_i, pp_i)."""
    c = _config(config)
    tp, pp, dp = _dims(c)
    if c.order == ptc_pb2.RANK_ORDER_TP_PP_DP:
        return tp_i + tp * (pp_i + pp * dp_i)
    return tp_i + tp * (dp_i + dp * pp_i)


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


def stage_starts(config, num_layers):
    """First layer of each stage: `stage_starts` or the even split."""
    c = _config(config)
    if len(c.stage_starts):
        return list(c.stage_starts)
    pp = max(c.pp, 1)
    return [split(num_layers, pp, s)[0] for s in range(pp)]


def stage_of_layer(config, num_layers, layer):
    """The pipeline stage owning `layer`."""
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} out of range for {num_layers} layers")
    starts = stage_starts(config, num_layers)
    stage = 0
    for s, first in enumerate(starts):
        if first <= layer:
            stage = s
    return stage


def stages_holding(config, num_layers, pipeline):
    """Stages that hold a tensor with this Pipeline rule, ascending."""
    c = _config(config)
    pp = max(c.pp, 1)
    mode = pipeline.mode
    if mode == ptc_pb2.PIPELINE_LAYER:
        return [stage_of_layer(c, num_layers, pipeline.layer)]
    if mode == ptc_pb2.PIPELINE_FIRST_STAGE:
        return [0]
    if mode == ptc_pb2.PIPELINE_LAST_STAGE:
        return [pp - 1]
    if mode == ptc_pb2.PIPELINE_EVERY_STAGE:
        return list(range(pp))
    raise ValueError(f"pipeline mode {mode} is unspecified")


# ------------------------------------------------------------------ shards


def _tp_slabs(tensor, tp, tp_i):
    """[(global start, size)] along the tp axis (None: whole tensor) and the
    tp-local shape (docs: "Tensor parallel piece")."""
    shape = list(tensor.shape)
    t = tensor.partition.tp
    if t.mode != ptc_pb2.TP_SPLIT:
        return None, shape
    axis = t.axis
    blocks = list(t.blocks) or [shape[axis]]
    slabs, start = [], 0
    for b in blocks:
        p_start, p_size = split(b, tp, tp_i)
        slabs.append((start + p_start, p_size))
        start += b
    local = list(shape)
    local[axis] = sum(size for _, size in slabs)
    return slabs, local


def local_shape(tensor, config, tp_i, dp_i):
    """Shape of the local buffer of (tp_i, dp_i) for a TensorSpec: the
    tp-local tensor T, its DP_SPLIT slab, or [chunk] for DP_FLAT with dp > 1
    (with dp == 1 the flat buffer is T itself and keeps T's shape, as the
    agent reports it)."""
    c = _config(config)
    tp, _, dp = _dims(c)
    _, t_shape = _tp_slabs(tensor, tp, tp_i)
    d = tensor.partition.dp
    if d.mode == ptc_pb2.DP_FLAT and dp > 1:
        n = int(np.prod(t_shape, dtype=np.int64))
        return [-(-n // dp)]
    if d.mode == ptc_pb2.DP_SPLIT and dp > 1:
        out = list(t_shape)
        out[d.axis] = split(t_shape[d.axis], dp, dp_i)[1]
        return out
    return list(t_shape)


def tp_local(tensor, tp, tp_i, global_array):
    """The tp-local tensor T of tp index tp_i: the rank's slabs of every
    sub-block concatenated along the axis in block order."""
    slabs, _ = _tp_slabs(tensor, tp, tp_i)
    if slabs is None:
        return global_array
    axis = tensor.partition.tp.axis
    parts = [np.take(global_array, np.arange(s, s + n), axis=axis) for s, n in slabs]
    return np.concatenate(parts, axis=axis)


def shard_tensor(tensor, config, tp_i, dp_i, global_array):
    """The local buffer (as an array of local_shape) of (tp_i, dp_i) for one
    tensor, cut from its global array. Does not check pipeline ownership."""
    c = _config(config)
    tp, _, dp = _dims(c)
    arr = _check_global(tensor, global_array)
    t_arr = tp_local(tensor, tp, tp_i, arr)
    d = tensor.partition.dp
    if d.mode == ptc_pb2.DP_FLAT and dp > 1:
        flat = np.ascontiguousarray(t_arr).reshape(-1)
        n = flat.size
        chunk = -(-n // dp)
        out = np.zeros(chunk, dtype=flat.dtype)
        begin = min(n, dp_i * chunk)
        end = min(n, begin + chunk)
        out[:end - begin] = flat[begin:end]
        return out
    if d.mode == ptc_pb2.DP_SPLIT and dp > 1:
        start, size = split(t_arr.shape[d.axis], dp, dp_i)
        t_arr = np.take(t_arr, np.arange(start, start + size), axis=d.axis)
    return np.ascontiguousarray(t_arr)


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
            _, _, pp_i = coords(lay.config, rank)
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
    tp_i, dp_i, pp_i = coords(lay.config, rank)
    out = {}
    for t in ptc.tensors:
        if pp_i not in stages_holding(lay.config, ptc.num_layers, t.partition.pipeline):
            continue
        if t.name not in global_tensors:
            raise KeyError(f"tensor \"{t.name}\" missing from the global tensors")
        local = shard_tensor(t, lay.config, tp_i, dp_i, global_tensors[t.name])
        if local.size:
            out[t.name] = local
    for b in ptc.blobs:
        if b.name not in global_tensors:
            raise KeyError(f"blob \"{b.name}\" missing from the global tensors")
        out[b.name] = blob_value(b, rank, global_tensors[b.name])
    return out


def after_reshard(ptc, new_layout, global_tensors):
    """The global values after a reshard to `new_layout`: tensors and
    replicated blobs unchanged; each per-rank blob's sequence becomes the new
    world's values (new rank r took old value r mod old world), so that
    shard(ptc, new_layout, r, result) is what rank r now holds and a further
    reshard can be checked the same way."""
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    out = dict(global_tensors)
    world = world_size(new_layout)
    for b in ptc.blobs:
        if b.scope == ptc_pb2.BLOB_PER_RANK and b.name in out:
            out[b.name] = [blob_value(b, r, global_tensors[b.name]) for r in range(world)]
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
