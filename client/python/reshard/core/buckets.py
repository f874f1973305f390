"""The bucket layout of DP_BUCKET tensors (docs/partitioning.md, "Buckets").

Megatron's distributed optimizer and FSDP's flat parameters shard one
flattened, padded buffer of many tensors over the data-parallel group. For one
rank, each (bucket group, chunk) of its stage has such a buffer: its members
sit at aligned positions, the buffer is cut into buckets, each bucket padded
and split into equal shards, one per data-parallel index. A member's DP_BUCKET
item (what reshard moves) is the member's elements inside the rank's shards.

A worker uses the layout to copy between its framework's buffers and
reshard's per-tensor items:
- the full buffer (Megatron's param / grad buffer: `Member.start` is the
  member's offset in it): items_from_full, full_from_items;
- the shard buffer (the rank's shards of every bucket, concatenated in bucket
  order: FSDP's local flat parameter, Megatron's optimizer shard of a
  bucket): items_from_shard, shard_from_items.
Alignment gaps and bucket padding belong to no tensor; the *_from_items
functions zero them.
"""

import collections
import functools
import math

import numpy as np

from reshard.core._proto import as_message, ptc_pb2

Member = collections.namedtuple("Member", "name start numel")
Member.__doc__ = "A member of a chunk buffer: its aligned start and element count (its T)."

Bucket = collections.namedtuple("Bucket", "start size members")
Bucket.__doc__ = "A bucket: start and padded size in the chunk buffer, its member names."

ChunkBuffer = collections.namedtuple(
    "ChunkBuffer", "group chunk members buckets size group_size index")
ChunkBuffer.__doc__ = """One bucket group's buffer on one chunk, for one rank: members
(in layout order), buckets, total size, and the data-parallel group size and
the rank's index in it (which shard of each bucket it holds)."""


def _layout():
    from reshard.core import layout
    return layout


def _ptc(value):
    return value if isinstance(value, ptc_pb2.Ptc) else as_message(value, ptc_pb2.Ptc, "ptc")


def group_specs(ptc, name):
    """The BucketGroup named `name` and its member TensorSpecs, PTC order."""
    ptc = _ptc(ptc)
    group = next((b for b in ptc.buckets if b.name == name), None)
    if group is None:
        raise KeyError(f"no bucket group \"{name}\" in the PTC")
    members = [t for t in ptc.tensors
               if t.partition.dp.mode == ptc_pb2.DP_BUCKET and t.partition.dp.bucket == name]
    kinds = {t.partition.HasField("expert") for t in members}
    if len(kinds) > 1:
        raise ValueError(f"bucket group \"{name}\" mixes dense and expert tensors")
    return group, members


def lay_out(group, sized_members, group_size):
    """Positions and buckets of members [(name, numel)] in layout order, by
    the algorithm of docs/partitioning.md: ([Member], [Bucket], size)."""
    a = max(group.param_align, 1)
    q = math.lcm(group_size, max(group.pad_multiple, 1))
    members, buckets = [], []
    pos = bucket_start = 0
    open_names = []

    def close(end):
        padded = -(-(end - bucket_start) // q) * q
        buckets.append(Bucket(bucket_start, padded, list(open_names)))
        open_names.clear()
        return bucket_start + padded

    for name, numel in sized_members:
        pos = -(-pos // a) * a
        members.append(Member(name, pos, numel))
        open_names.append(name)
        pos += numel
        if group.bucket_elements > 0 and pos - bucket_start >= group.bucket_elements:
            pos = bucket_start = close(pos)
    if open_names:
        pos = bucket_start = close(pos)
    return members, buckets, pos


@functools.lru_cache(maxsize=256)
def _rank_buffers(ptc_bytes, config_bytes, rank):
    ly = _layout()
    ptc = ptc_pb2.Ptc.FromString(ptc_bytes)
    config = ptc_pb2.ParallelConfig.FromString(config_bytes)
    stage = ly.rank_coords(config, rank).pp
    out = []
    for group in ptc.buckets:
        _, specs = group_specs(ptc, group.name)
        by_chunk = collections.defaultdict(list)
        for t in specs:
            pipe = t.partition.pipeline
            if stage in ly.stages_holding(config, ptc.num_layers, pipe):
                by_chunk[ly.chunk_holding(config, ptc.num_layers, pipe, stage)].append(t)
        for chunk in sorted(by_chunk):
            members = by_chunk[chunk][::-1] if group.reverse_order else by_chunk[chunk]
            pieces = [ly.piece(t, config, rank) for t in members]
            size, index = pieces[0].group, pieces[0].index
            sized = [(t.name, int(np.prod(p.shape, dtype=np.int64)))
                     for t, p in zip(members, pieces)]
            placed, buckets, total = lay_out(group, sized, size)
            out.append(ChunkBuffer(group.name, chunk, placed, buckets, total, size, index))
    return tuple(out)


def rank_buffers(ptc, config, rank):
    """Every ChunkBuffer of `rank` (bucket groups in PTC order, chunks
    ascending); groups with no member on the rank's stage are absent."""
    ptc = _ptc(ptc)
    c = _layout()._config(config)
    return list(_rank_buffers(ptc.SerializeToString(deterministic=True),
                              c.SerializeToString(deterministic=True), rank))


def chunk_buffer(ptc, config, rank, group, chunk=None):
    """The ChunkBuffer of bucket group `group` for `rank` (its only chunk, or
    the given one)."""
    found = [b for b in rank_buffers(ptc, config, rank)
             if b.group == group and (chunk is None or b.chunk == chunk)]
    if not found:
        raise KeyError(f"rank {rank} holds no buffer of bucket group \"{group}\""
                       + (f" on chunk {chunk}" if chunk is not None else ""))
    if len(found) > 1:
        raise ValueError(f"rank {rank} holds bucket group \"{group}\" on chunks "
                         f"{[b.chunk for b in found]}: name one")
    return found[0]


def shard_of(buf, bucket):
    """(start, end) chunk-buffer positions of the rank's shard of a bucket."""
    step = bucket.size // buf.group_size
    start = bucket.start + buf.index * step
    return start, start + step


def _bucket_of(buf, name):
    return next(b for b in buf.buckets if name in b.members)


def member_range(ptc, config, rank, name, buffers=None):
    """(lo, hi): the elements of tensor `name`'s T (row-major) that `rank`'s
    DP_BUCKET buffer holds (lo == hi: none). buffers: rank_buffers(...) of
    the rank, when already at hand."""
    ptc = _ptc(ptc)
    t = next((t for t in ptc.tensors if t.name == name), None)
    if t is None:
        raise KeyError(f"no tensor \"{name}\" in the PTC")
    group = t.partition.dp.bucket
    for buf in buffers if buffers is not None else rank_buffers(ptc, config, rank):
        if buf.group != group:
            continue
        for m in buf.members:
            if m.name == name:
                s, e = shard_of(buf, _bucket_of(buf, name))
                lo = min(max(s - m.start, 0), m.numel)
                hi = min(max(e - m.start, 0), m.numel)
                return lo, max(lo, hi)
    raise ValueError(f"tensor \"{name}\": rank {rank} holds no buffer of its bucket group "
                     f"\"{group}\" (is its stage a holder?)")


def shard_size(buf):
    """Elements of the rank's shard buffer: its shards of every bucket."""
    return sum(b.size // buf.group_size for b in buf.buckets)


def _shard_offsets(buf):
    """[(bucket, shard start in the chunk buffer, offset in the shard buffer)]."""
    out, off = [], 0
    for b in buf.buckets:
        start, end = shard_of(buf, b)
        out.append((b, start, off))
        off += end - start
    return out


def _member_spans(buf):
    """[(member name, start, end)], one per member of each bucket: where the
    member's part of this rank's shard lies in the shard buffer (end ==
    start where the rank holds none of it)."""
    out = []
    for b, start, off in _shard_offsets(buf):
        step = b.size // buf.group_size
        for m in buf.members:
            if m.name not in b.members:
                continue
            lo, hi = max(m.start, start), min(m.start + m.numel, start + step)
            out.append((m.name, off + lo - start, off + max(hi, lo) - start))
    return out


def items_from_shard(buf, shard_buffer):
    """{member name: 1-D array}: each member's DP_BUCKET item cut from the
    rank's shard buffer (FSDP's local flat parameter)."""
    flat = np.asarray(shard_buffer).reshape(-1)
    if flat.size != shard_size(buf):
        raise ValueError(f"bucket group \"{buf.group}\" chunk {buf.chunk}: shard buffer of "
                         f"{flat.size} elements, the layout gives {shard_size(buf)}")
    return {name: flat[lo:hi].copy() for name, lo, hi in _member_spans(buf)}


def shard_from_items(buf, items, dtype):
    """The rank's shard buffer assembled from DP_BUCKET items (missing or
    empty items and every gap are zero)."""
    out = np.zeros(shard_size(buf), dtype=dtype)
    for name, lo, hi in _member_spans(buf):
        if hi > lo and name in items:
            out[lo:hi] = np.asarray(items[name]).reshape(-1)
    return out


def items_from_full(buf, full_buffer):
    """{member name: 1-D array}: the rank's DP_BUCKET items cut from the full
    chunk buffer (Megatron's param or grad buffer of this chunk)."""
    flat = np.asarray(full_buffer).reshape(-1)
    out = {}
    for b in buf.buckets:
        start, end = shard_of(buf, b)
        for m in buf.members:
            if m.name in b.members:
                lo, hi = max(m.start, start), min(m.start + m.numel, end)
                out[m.name] = flat[lo:max(hi, lo)].copy()
    return out


def member_view(buf, full_buffer, name, shape):
    """The whole member `name` (its T, of `shape`) as a view of the full
    chunk buffer: what Megatron's param.data points at."""
    m = next(m for m in buf.members if m.name == name)
    return np.asarray(full_buffer).reshape(-1)[m.start:m.start + m.numel].reshape(shape)
