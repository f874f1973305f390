"""PTCs of PyTorch FSDP jobs, and copies between FSDP's buffers and reshard's
per-tensor items.

Two ways PyTorch shards a model over data parallel (docs/partitioning.md):
- per parameter (DTensor `Shard(0)`, FSDP2 / fully_shard): every parameter is
  cut on dim 0 with torch.chunk sizes (ceil(n / world) rows each, trailing
  ranks short or empty) -> DP_CHUNK on axis 0: `dtensor_ptc`;
- flat parameters (torch 1.13 FullyShardedDataParallel): each wrapped unit
  flattens its parameters (module.named_parameters() order, without those of
  nested wrapped units) into one FlatParameter, pads it to a multiple of the
  world size and keeps chunk `rank` of torch.chunk (flat_param.py
  `FlatParamHandle._get_shard`) -> one BucketGroup per unit with param_align
  1, one bucket, pad_multiple 1: `flat_param_ptc`. The optimizer state of a
  flat parameter (Adam's exp_avg, exp_avg_sq) has the flat parameter's local
  shape: one more group per state, with the same member order.

A worker of a flat-parameter job copies its local flat shards to reshard's
items with `items_from_flat_shard` and back with `flat_shard_from_items`
(padding zeroed).
"""

import collections

from reshard.core import _dtypes, buckets
from reshard.core._proto import ptc_pb2

ADAM_STATES = ("exp_avg", "exp_avg_sq")

ParamMeta = collections.namedtuple("ParamMeta", "name shape dtype")
ParamMeta.__doc__ = "A parameter's name (as in the full state dict), shape and dtype."


def _meta(name, value):
    if isinstance(value, ParamMeta):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return ParamMeta(name, [int(x) for x in value[0]], value[1])
    return ParamMeta(name, [int(x) for x in value.shape], str(value.dtype))


def _dtype(d):
    return d if isinstance(d, int) else _dtypes.dtype_enum(d)


def dtensor_ptc(params, optimizer_states=ADAM_STATES, step_blob=True):
    """PTC of a per-parameter sharded job (DTensor Shard(0), FSDP2): params is
    {name: tensor | (shape, dtype) | ParamMeta}; every parameter and its
    optimizer states (fp32, same placement) are DP_CHUNK on axis 0."""
    ptc = ptc_pb2.Ptc(num_layers=1)
    metas = [_meta(n, v) for n, v in params.items()]
    for prefix, dtype in [("", None)] + [(f"optimizer.{s}.", ptc_pb2.DTYPE_FLOAT32)
                                         for s in optimizer_states]:
        for m in metas:
            t = ptc.tensors.add(name=prefix + m.name, dtype=dtype or _dtype(m.dtype), shape=m.shape)
            p = t.partition
            p.tp.SetInParent()
            p.pipeline.mode = ptc_pb2.PIPELINE_EVERY_STAGE
            if m.shape:
                p.dp.mode = ptc_pb2.DP_CHUNK
                p.dp.axis = 0
            p.allow_empty = True
    if step_blob:
        ptc.blobs.add(name="optimizer.step", size_bytes=8, scope=ptc_pb2.BLOB_REPLICATED)
    return ptc


def units_of(module, wrapped=()):
    """[(unit name, [(param name, parameter)])] as torch 1.13 FSDP flattens
    them: one unit per module in `wrapped` (the modules an auto-wrap policy
    wraps; "" names the root, which is always a unit), each holding its
    parameters in named_parameters() order without those of nested wrapped
    modules; a parameter shared by several modules counts once, where first
    seen. Names are full state-dict names."""
    names = {m: n for n, m in module.named_modules()}
    units = [m for m in wrapped if m is not module]
    owner = {}  # parameter -> the innermost unit holding it
    for unit in [module] + units:
        depth = len(names[unit].split(".")) if names[unit] else 0
        for _, p in unit.named_parameters():
            if id(p) not in owner or owner[id(p)][0] < depth:
                owner[id(p)] = (depth, unit)
    owner = {k: u for k, (_, u) in owner.items()}
    out, seen = [], set()
    for unit in [module] + units:
        prefix = names[unit] + "." if names[unit] else ""
        params = []
        for name, p in unit.named_parameters():
            if owner[id(p)] is unit and id(p) not in seen:
                seen.add(id(p))
                params.append((prefix + name, p))
        if params:
            out.append((names[unit], params))
    return out


def unit_group(unit, state=None):
    """The BucketGroup name of a unit's flat parameter (or of its optimizer
    state `state`)."""
    base = f"fsdp.{unit or 'root'}"
    return f"{base}.{state}" if state else base


def flat_param_ptc(units, optimizer_states=ADAM_STATES, step_blob=True):
    """PTC of a torch 1.13 FSDP job (flat parameters). units:
    [(unit name, [(param name, tensor | (shape, dtype) | ParamMeta)])] in
    flattening order (units_of gives them). Parameters keep their name; the
    optimizer states are fp32 `optimizer.<state>.<name>` in groups of their
    own. Everything is held by every stage (FSDP jobs have pp 1)."""
    ptc = ptc_pb2.Ptc(num_layers=1)
    for prefix, state in [("", None)] + [(f"optimizer.{s}.", s) for s in optimizer_states]:
        for unit, params in units:
            group = unit_group(unit, state)
            ptc.buckets.add(name=group, param_align=1, bucket_elements=0, pad_multiple=1)
            for name, value in params:
                m = _meta(name, value)
                dtype = ptc_pb2.DTYPE_FLOAT32 if state else _dtype(m.dtype)
                t = ptc.tensors.add(name=prefix + m.name, dtype=dtype, shape=m.shape)
                t.partition.tp.SetInParent()
                t.partition.pipeline.mode = ptc_pb2.PIPELINE_EVERY_STAGE
                t.partition.dp.mode = ptc_pb2.DP_BUCKET
                t.partition.dp.bucket = group
    if step_blob:
        ptc.blobs.add(name="optimizer.step", size_bytes=8, scope=ptc_pb2.BLOB_REPLICATED)
    return ptc


def flat_buffer(ptc, layout, rank, unit, state=None):
    """The ChunkBuffer of a unit's flat parameter (or optimizer state) on
    `rank`: members at their offsets, one bucket padded to a multiple of the
    world size, the rank's shard = torch's local FlatParameter shard."""
    from reshard.core import layout as rlayout
    return buckets.chunk_buffer(ptc, rlayout._config(layout), rank, unit_group(unit, state))


def flat_shard_numel(ptc, layout, rank, unit):
    """Elements of the rank's local (padded) flat shard: ceil(N / world)."""
    return buckets.shard_size(flat_buffer(ptc, layout, rank, unit))


def items_from_flat_shard(ptc, layout, rank, unit, local_shard, state=None):
    """{tensor name: 1-D array}: the DP_BUCKET items of a unit's local flat
    shard (numpy or torch, FSDP's `flat_param` after sharding, or its
    optimizer state `state`)."""
    from reshard.core.layout import _as_numpy
    buf = flat_buffer(ptc, layout, rank, unit, state)
    return buckets.items_from_shard(buf, _as_numpy(local_shard))


def flat_shard_from_items(ptc, layout, rank, unit, items, dtype, state=None):
    """The unit's local flat shard (numpy, `dtype`) from DP_BUCKET items, the
    padding zero: what to copy into FSDP's flat_param (or optimizer state)."""
    buf = flat_buffer(ptc, layout, rank, unit, state)
    return buckets.shard_from_items(buf, items, dtype)
