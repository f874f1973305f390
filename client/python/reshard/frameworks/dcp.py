"""torch.distributed.checkpoint (DCP) interop: a DCP checkpoint directory <-> a job generation.

Item names are DCP's flattened keys (docs/pytorch.md "How reshard reads your
state"): a tensor item `model.<fqn>` or `optim.state.<fqn>.<key>` is the DCP
tensor of that key, a blob item (`optim.param_groups`, a Stateful extra) is
the DCP bytes entry of that key (DCP stores it torch.save'd; the blob holds it
as reshard.pytorch's length-prefixed pickle).

- import_dcp(path, ...): reads, for every rank of the job's layout on the
  given hosts, exactly the rank's region of each item out of the checkpoint
  (DCP's own resharding read: create_read_items_for_chunk_list against the
  checkpoint's chunks, through FileSystemReader) into a local buffer, and
  publishes it with reshard.Worker. No model code is needed and no full
  tensor is built: the regions come from the PTC and the layout (the same
  geometry as reshard.layout.local_tensor), so a checkpoint written at any
  mesh lands at any layout, and the tool runs once per host (or once for all
  hosts whose worker sockets it reaches).
- export_dcp(path, ...): loads every rank's buffer of a generation and writes
  a DCP checkpoint (FileSystemWriter, DCP's metadata) whose chunks are the
  distinct regions the ranks hold (a data-parallel replica's copy is written
  once), so real dcp.load reads it at any other mesh.
- ptc_from_checkpoint(path, ...): a PTC for a checkpoint when no job exists
  yet (every tensor sharded over data parallel on dim 0 as FSDP2 does, tp
  splits on request; every bytes entry a replicated blob with headroom).
- main(argv): `python -m reshard dcp import|export ...` (the launcher's
  __main__ dispatches the `dcp` sub-command here).

Regions a PTC expresses that are not boxes (DP_FLAT, DP_BUCKET: a flat range
of the rank's piece) are cut into row-major boxes, each still one DCP read.
"""

import argparse
import dataclasses
import io
import os
import pickle
import sys

import numpy as np

from reshard.core import layout as rlayout
from reshard.core._proto import as_message, ptc_pb2
# Blobs in reshard.pytorch's format (an 8-byte length, the pickle, zeros);
# export reads them with load_blob, which runs no code a blob names.
from reshard.frameworks._safe_blob import load_blob
from reshard.frameworks.pytorch import _BLOB_HEADER as _LEN, decode_blob, encode_blob  # noqa: F401


# ------------------------------------------------------------------ geometry

@dataclasses.dataclass(frozen=True)
class Region:
    """One box of a rank's local buffer: `local` the (start, size) per axis
    of the destination view (see local_view), `flat` the view's flat start
    and shape inside a 1-D local buffer (None when the buffer has the piece's
    shape), and the box's place in the global tensor."""
    flat: tuple | None
    local: tuple
    offsets: tuple
    sizes: tuple


def _runs(m):
    """[(local start, global start, length)] of maximal runs of a 1-D index
    map m (global = m[local], -1 padding) that step by one."""
    out = []
    n = len(m)
    i = 0
    while i < n:
        if m[i] < 0:
            i += 1
            continue
        j = i + 1
        while j < n and m[j] == m[j - 1] + 1:
            j += 1
        out.append((i, int(m[i]), j - i))
        i = j
    return out


def _flat_boxes(shape, lo, hi):
    """Boxes (offsets, sizes) covering the row-major elements [lo, hi) of a
    tensor of `shape`, in order, each contiguous in flat order."""
    if lo >= hi:
        return
    if not shape:
        yield (), ()
        return
    inner = int(np.prod(shape[1:], dtype=np.int64))
    r0, o0 = divmod(lo, inner)
    r1, o1 = divmod(hi, inner)
    if r0 == r1:
        for off, sz in _flat_boxes(shape[1:], o0, o1):
            yield (r0,) + off, (1,) + sz
        return
    if o0:
        for off, sz in _flat_boxes(shape[1:], o0, inner):
            yield (r0,) + off, (1,) + sz
        r0 += 1
    if r1 > r0:
        yield (r0,) + (0,) * (len(shape) - 1), (r1 - r0,) + tuple(shape[1:])
    if o1:
        for off, sz in _flat_boxes(shape[1:], 0, o1):
            yield (r1,) + off, (1,) + sz


def regions(tensor, config, rank, ptc=None):
    """The Regions of `rank`'s local buffer of a TensorSpec (shape
    reshard.layout.local_shape_of): every element of the logical tensor the
    buffer holds, as boxes; padding positions are in none. Does not check
    pipeline ownership."""
    pc = rlayout.piece(tensor, config, rank)
    logical = [int(x) for x in tensor.shape]
    maps = []
    for axis, n in enumerate(pc.held):
        if axis in pc.select:
            idx = np.concatenate([np.arange(s, s + k) for s, k in pc.select[axis]] or
                                 [np.zeros(0, np.int64)])
        else:
            idx = np.arange(n)
        maps.append(np.where(idx < logical[axis], idx, -1).astype(np.int64))
    d = tensor.partition.dp
    flat = None
    if d.mode in (ptc_pb2.DP_SPLIT, ptc_pb2.DP_CHUNK):
        start, size = rlayout._dp_range(d.mode, len(maps[d.axis]), pc.group, pc.index)
        maps[d.axis] = maps[d.axis][start:start + size]
    elif d.mode == ptc_pb2.DP_FLAT and pc.group > 1:
        n = int(np.prod(pc.shape, dtype=np.int64))
        chunk = -(-n // pc.group)
        begin = min(n, pc.index * chunk)
        flat = (begin, min(n, begin + chunk))
    elif d.mode == ptc_pb2.DP_BUCKET:
        flat = rlayout._local_numel_range(tensor, config, rank, ptc)
    shape = [len(m) for m in maps]
    if flat is None:
        pieces = [(None, (0,) * len(shape), tuple(shape))]
    else:
        lo, hi = flat
        strides = [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]
        pieces = []
        for off, sz in _flat_boxes(shape, lo, hi):
            start = sum(o * s for o, s in zip(off, strides)) - lo
            pieces.append(((start, sz), off, sz))
    out = []
    for view, off, sz in pieces:
        per_axis = [_runs(m[o:o + s]) for m, o, s in zip(maps, off, sz)]
        for combo in _product(per_axis):
            out.append(Region(view, tuple((ls, n) for ls, _, n in combo),
                              tuple(gs for _, gs, _ in combo), tuple(n for _, _, n in combo)))
    return out


def _product(lists):
    if not lists:
        yield ()
        return
    for head in lists[0]:
        for rest in _product(lists[1:]):
            yield (head,) + rest


def local_view(buffer, region):
    """The view of a rank's local buffer (torch tensor) that `region` names."""
    t = buffer
    if region.flat is not None:
        start, shape = region.flat
        t = t.reshape(-1).narrow(0, start, int(np.prod(shape, dtype=np.int64))).view(shape)
    for axis, (s, n) in enumerate(region.local):
        t = t.narrow(axis, s, n)
    return t


# ---------------------------------------------------------------- job access

def _torch():
    import torch
    return torch


def _torch_dtype(dtype):
    from reshard.core import _dtypes
    torch = _torch()
    return getattr(torch, _dtypes._check(dtype)[2])


def _sockets(sockets, lay):
    """{host: worker socket} for every host of the layout `sockets` covers:
    a dict, a callable host -> path, or one path for every host."""
    hosts = rlayout.hosts_of(lay)
    if callable(sockets):
        return {h: sockets(h) for h in hosts}
    if isinstance(sockets, (str, os.PathLike)):
        return {h: os.fspath(sockets) for h in hosts}
    return {h: s for h, s in dict(sockets).items() if h in hosts}


def _reader(path):
    from torch.distributed.checkpoint import FileSystemReader
    return FileSystemReader(os.fspath(path))


def read_metadata(path):
    """The DCP Metadata of a checkpoint directory."""
    return _reader(path).read_metadata()


def _dist_args(process_group):
    """One process unless a group is given: a rank of a training job may
    import or export alone while the others wait (DCP would otherwise run
    its collectives on the default group)."""
    if process_group is None:
        return {"no_dist": True}
    return {"process_group": process_group}


def _dcp_call(fn, *args, **kwargs):
    """dcp.save / dcp.load without their warning that a single process is
    assumed (that is the point of no_dist here)."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return fn(*args, **kwargs)


# -------------------------------------------------------------------- import

def _load_planner_class():
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       ChunkStorageMetadata, MetadataIndex)
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import (_create_read_item_for_byteio,
                                                              create_read_items_for_chunk_list)
    torch = _torch()

    class RegionLoadPlanner(DefaultLoadPlanner):
        """Reads given boxes of given keys (and given bytes entries) out of
        a checkpoint into given torch views: DCP's resharding read, with the
        boxes a reshard layout needs instead of a DTensor's."""

        def __init__(self, boxes, blobs):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self.boxes = boxes  # {key: [(ChunkStorageMetadata, torch view)]}
            self.blobs = blobs  # keys of bytes entries to read
            self.loaded = {}

        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            self.state_dict = state_dict
            self.metadata = metadata
            self.is_coordinator = is_coordinator

        def create_local_plan(self):
            md = self.metadata.state_dict_metadata
            requests = []
            for key, boxes in self.boxes.items():
                requests += create_read_items_for_chunk_list(key, md[key], [c for c, _ in boxes])
            for key in self.blobs:
                if not isinstance(md[key], BytesStorageMetadata):
                    raise ValueError(f"DCP key \"{key}\": a tensor in the checkpoint, a blob in "
                                     "the job's PTC")
                requests.append(_create_read_item_for_byteio(MetadataIndex(key), 0,
                                                             MetadataIndex(key), 0, 0))
            return LoadPlan(requests)

        def create_global_plan(self, global_plan):
            return global_plan

        def load_bytes(self, read_item, value):
            value.seek(0)
            self.loaded[read_item.dest_index.fqn] = torch.load(value, weights_only=False)

        def resolve_tensor(self, read_item):
            _, view = self.boxes[read_item.dest_index.fqn][read_item.dest_index.index]
            for axis, (o, n) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
                view = view.narrow(axis, o, n)
            return view

        def commit_tensor(self, read_item, tensor):
            pass  # resolve_tensor gave a view of the local buffer: already in place

    return RegionLoadPlanner, ChunkStorageMetadata


@dataclasses.dataclass
class ImportResult:
    ranks: list        # the ranks published
    missing: list      # per-rank blobs the checkpoint lacked (published as "no state")
    ignored: list      # checkpoint keys the job's PTC does not name


def rank_state_from_dcp(path, ptc, lay, rank, metadata=None, process_group=None):
    """{item name: torch tensor (local shape) | bytes}: `rank`'s buffer of the
    job (PTC, layout) read from a DCP checkpoint directory, and the list of
    per-rank blobs the checkpoint lacks (each encoded as None)."""
    out, missing, _ = _read_ranks(path, ptc, lay, [rank], metadata, process_group)
    return out[rank], missing


def _nested_value(flat, paths, bpath):
    """The object at `bpath` of the nested dict that flat keys (paths from
    DCP's planner_data) unflatten to."""
    from torch.distributed.checkpoint._traverse import get_element, set_element
    root = {}
    for k in sorted(flat, key=lambda k: tuple(str(x).zfill(12) for x in paths.get(k, (k,)))):
        set_element(root, tuple(paths.get(k, (k,))), flat[k])
    return get_element(root, bpath)


def _read_ranks(path, ptc, lay, ranks, metadata=None, process_group=None):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    torch = _torch()
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    lay = as_message(lay, ptc_pb2.Layout, "layout")
    md = (metadata or read_metadata(path)).state_dict_metadata
    Planner, Chunk = _load_planner_class()
    boxes, states, missing = {}, {r: {} for r in ranks}, []
    for t in ptc.tensors:
        if t.name not in md:
            raise ValueError(f"tensor \"{t.name}\": not in the DCP checkpoint {os.fspath(path)}")
        m = md[t.name]
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"tensor \"{t.name}\": the checkpoint holds bytes under this key")
        # A 0-d tensor (an optimizer's `step`) is an item of shape [1]
        # (reshard.pytorch): read as the one element it is.
        scalar = len(m.size) == 0 and [int(x) for x in t.shape] == [1]
        if list(m.size) != [int(x) for x in t.shape] and not scalar:
            raise ValueError(f"tensor \"{t.name}\": shape {list(m.size)} in the checkpoint, the "
                             f"job's PTC says {list(t.shape)}")
        want = _torch_dtype(t.dtype)
        if m.properties.dtype != want:
            raise ValueError(f"tensor \"{t.name}\": dtype {m.properties.dtype} in the "
                             f"checkpoint, the job's PTC says {want}")
        for r in ranks:
            pp_i = rlayout.rank_coords(lay.config, r).pp
            if pp_i not in rlayout.stages_holding(lay.config, ptc.num_layers,
                                                  t.partition.pipeline):
                continue
            shape = rlayout.local_shape_of(t, lay.config, r, ptc)
            if not int(np.prod(shape, dtype=np.int64)):
                continue
            buf = torch.zeros(shape, dtype=want)
            states[r][t.name] = buf
            for reg in regions(t, lay.config, r, ptc):
                view = local_view(buf, reg)
                if scalar:
                    reg, view = Region(None, (), (), ()), view.reshape(())
                boxes.setdefault(t.name, []).append(
                    (Chunk(offsets=torch.Size(reg.offsets), sizes=torch.Size(reg.sizes)), view))
    # A blob is every checkpoint key under its key path (DCP flattens a
    # Stateful's dict, the param groups, the RNG dict into several keys;
    # planner_data maps each key to its path), rebuilt into one object.
    meta = metadata or read_metadata(path)
    paths = getattr(meta, "planner_data", None) or {}
    blob_keys, blob_tensors, members = [], {}, {}
    for b in ptc.blobs:
        bpath = _key_path(b.name)
        keys = [k for k in md if tuple(paths.get(k, (k,)))[:len(bpath)] == bpath]
        if not keys:
            if b.scope == ptc_pb2.BLOB_PER_RANK:
                missing.append(b.name)
                continue
            raise ValueError(f"blob \"{b.name}\": no key under {list(bpath)} in the DCP "
                             f"checkpoint {os.fspath(path)}")
        members[b.name] = keys
        for k in keys:
            m = md[k]
            if isinstance(m, TensorStorageMetadata):
                full = torch.empty(list(m.size), dtype=m.properties.dtype)
                boxes.setdefault(k, []).append(
                    (Chunk(offsets=torch.Size([0] * len(m.size)), sizes=torch.Size(m.size)), full))
                blob_tensors[k] = full
            else:
                blob_keys.append(k)
    planner = Planner(boxes, blob_keys)
    _dcp_call(dcp.load, {}, storage_reader=_reader(path), planner=planner, **_dist_args(process_group))
    for b in ptc.blobs:
        value = None
        if b.name in members:
            flat = {k: blob_tensors[k] if k in blob_tensors else planner.loaded[k]
                    for k in members[b.name]}
            value = _nested_value(flat, paths, _key_path(b.name))
            if b.name == "optim.param_groups":
                # reshard.pytorch keeps the hyperparameters; the parameter
                # names are the job's own
                value = [{k: v for k, v in g.items() if k != "params"} for g in value]
        data = encode_blob(b.name, value, b.size_bytes)
        for r in ranks:
            states[r][b.name] = data
    used = {t.name for t in ptc.tensors} | {k for ks in members.values() for k in ks}
    return states, missing, sorted(k for k in md if k not in used)


def import_dcp(path, job_id, ptc, lay, generation, sockets, hosts=None, process_group=None,
               worker_token=None, timeout=60.0):
    """Publishes generation `generation` of job `job_id` (PTC, layout) from
    the DCP checkpoint at `path`: every rank on `hosts` (default: every host
    `sockets` reaches; sockets: {host: worker socket path}, a callable, or one
    path) reads its regions and is published through its host's Worker.
    Per-rank blobs the checkpoint lacks (the RNG: DCP saves none unless asked)
    are published as "no state" (None), for the worker to regenerate.
    Returns ImportResult."""
    from reshard.core.worker import Worker
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    lay = as_message(lay, ptc_pb2.Layout, "layout")
    socks = _sockets(sockets, lay)
    hosts = list(hosts) if hosts is not None else list(socks)
    for h in hosts:
        if h not in socks:
            raise ValueError(f"host \"{h}\": no worker socket given for it")
    metadata = read_metadata(path)
    ranks = [r for h in hosts for r, _ in rlayout.ranks_on_host(lay, h)]
    states, missing, ignored = _read_ranks(path, ptc, lay, ranks, metadata, process_group)
    for h in hosts:
        with Worker(socks[h], job_id, ptc=ptc, worker_token=worker_token, timeout=timeout) as w:
            for r, _ in rlayout.ranks_on_host(lay, h):
                w.publish(r, generation, states.pop(r))
    return ImportResult(ranks, missing, ignored)


# -------------------------------------------------------------------- export

def _key_path(name):
    """The nested state-dict path of a flattened item name (DCP planner_data),
    after reshard.pytorch's naming: model.<fqn>, optim.state.<fqn>.<key>,
    optim.param_groups, <stateful name>."""
    if name.startswith("model."):
        return ("model", name[len("model."):])
    if name.startswith("optim.state."):
        fqn, _, key = name[len("optim.state."):].rpartition(".")
        return ("optim", "state", fqn, key)
    if name.startswith("optim."):
        return ("optim", name[len("optim."):])
    return (name,)


def _save_planner_class():
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import (SavePlan, TensorWriteData, WriteItem,
                                                      WriteItemType)
    torch = _torch()

    class RegionSavePlanner(DefaultSavePlanner):
        """Writes given boxes of given keys (views of loaded rank buffers)
        and given objects as DCP's bytes entries."""

        def __init__(self, chunks, objects, key_paths):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            # The keys are flat already (set_up_planner and create_local_plan
            # are this class's own); what the flag still does is merge the
            # plans' planner_data (each key's nested path) into the Metadata,
            # which DefaultSavePlanner does only for a flattening planner.
            # Without it planner_data is None, and DCP readers that rebuild
            # the nested state dict (dcp_to_torch_save, import_dcp) cannot.
            self.flatten_state_dict = True
            self.chunks = chunks    # {key: (global size, [(offsets, sizes, view)])}
            self.objects = objects  # {key: object}
            self.key_paths = key_paths

        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            self.state_dict = state_dict
            self.is_coordinator = is_coordinator

        def create_local_plan(self):
            items = []
            for key, (size, boxes) in self.chunks.items():
                for offsets, sizes, view in boxes:
                    items.append(WriteItem(
                        index=MetadataIndex(key, torch.Size(offsets)), type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(offsets=torch.Size(offsets),
                                                       sizes=torch.Size(sizes)),
                            properties=TensorProperties.create_from_tensor(view),
                            size=torch.Size(size))))
            for key in self.objects:
                items.append(WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO))
            self.plan = SavePlan(items, planner_data=self.key_paths)
            return self.plan

        def _dedup_save_plans(self, all_plans):
            return all_plans  # each process writes distinct chunks already

        def resolve_data(self, write_item):
            key = write_item.index.fqn
            if write_item.type == WriteItemType.BYTE_IO:
                out = io.BytesIO()
                torch.save(self.objects[key], out)
                out.seek(0)
                return out
            offsets = tuple(write_item.index.offset)
            for o, _, view in self.chunks[key][1]:
                if tuple(o) == offsets:
                    return view
            raise KeyError(f"DCP key \"{key}\": no chunk at {list(offsets)}")

    return RegionSavePlanner


def _with_params(groups, ptc, param_names):
    if param_names is None:
        if len(groups) != 1:
            raise ValueError(f"blob \"optim.param_groups\": {len(groups)} groups; give "
                             "param_names=[[fqn, ...] per group] (the PTC does not say which "
                             "parameter is in which group)")
        fqns = []
        for t in ptc.tensors:
            if t.name.startswith("optim.state."):
                fqn = t.name[len("optim.state."):].rpartition(".")[0]
                if fqn not in fqns:
                    fqns.append(fqn)
        param_names = [fqns]
    if len(param_names) != len(groups):
        raise ValueError(f"param_names: {len(param_names)} groups, the blob "
                         f"\"optim.param_groups\" has {len(groups)}")
    return [dict(g, params=list(p)) for g, p in zip(groups, param_names)]


def export_dcp(path, job_id, ptc, lay, generation, sockets, hosts=None, process_group=None,
               worker_token=None, timeout=60.0, per_rank_blobs=True, param_names=None,
               scalars=None):
    """Writes generation `generation` of job `job_id` (PTC, layout) as a DCP
    checkpoint directory at `path`: every rank on `hosts` (default all that
    `sockets` reaches) is loaded through its host's Worker; each distinct
    region is written once (by the lowest rank holding it); replicated blobs
    are written once as DCP bytes entries (the object, torch.save'd as DCP
    does, flattened as DCP flattens them); per-rank blobs (the RNG) as rank
    0's value, as a DCP save of every rank's value under one key keeps one
    (per_rank_blobs=False leaves them out). Blobs are unpickled without
    running code they name (reshard._safe_blob): one holding anything but
    containers, numbers, strings, torch tensors and numpy arrays is refused
    with reshard.errors.UnsafeBlob naming it, and nothing is written. The
    param groups get back their "params" (parameter FQNs), which
    reshard.pytorch does not keep: with one group every FQN of the optimizer
    state in PTC order, else param_names [[fqn, ...] per group]. scalars: the items of shape [1] written as 0-d
    tensors (default: every optimizer state `step`, 0-d in torch; a 0-d
    tensor is an item of shape [1] in reshard.pytorch). With a
    process_group (one process per group of hosts), dcp.save gathers the
    plans; each process passes its own hosts. Returns the DCP Metadata.

    An export that would miss state is refused with a ValueError before
    anything is written: no host of the layout with a worker socket, a
    region of a tensor that no loaded rank holds (its ranks' hosts have no
    socket; a replica on a reached host is enough), or nothing to write
    (0 keys). With a process_group each process checks its own hosts only."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from reshard.core.worker import Worker
    ptc = as_message(ptc, ptc_pb2.Ptc, "ptc")
    lay = as_message(lay, ptc_pb2.Layout, "layout")
    socks = _sockets(sockets, lay)
    hosts = list(hosts) if hosts is not None else list(socks)
    layout_hosts = rlayout.hosts_of(lay)
    if not hosts:
        given = sorted(sockets) if isinstance(sockets, dict) else []
        raise ValueError(
            f"export of job {job_id} generation {generation}: no host of its layout has a "
            f"worker socket (the layout's hosts: {', '.join(layout_hosts)}; sockets given for: "
            f"{', '.join(given) or 'none'}): the checkpoint would hold 0 keys")
    loaded = {}
    for h in hosts:
        if h not in socks:
            raise ValueError(f"host \"{h}\": no worker socket given for it")
        with Worker(socks[h], job_id, ptc=ptc, worker_token=worker_token, timeout=timeout) as w:
            for r, _ in rlayout.ranks_on_host(lay, h):
                loaded[r] = w.load(r, generation, as_torch=True)
    # Each region is written by the lowest rank that holds it (every process
    # computes the same owner from the PTC and layout alone); in one process,
    # by the lowest loaded rank that holds it, and one no loaded rank holds
    # refuses the export.
    world = rlayout.world_size(lay)
    if scalars is None:
        scalars = {t.name for t in ptc.tensors if list(t.shape) == [1] and
                   t.name.startswith("optim.state.") and t.name.endswith(".step")}
    chunks, key_paths, missed = {}, {}, {}
    for t in ptc.tensors:
        owner = {}
        for r in range(world):
            pp_i = rlayout.rank_coords(lay.config, r).pp
            if pp_i not in rlayout.stages_holding(lay.config, ptc.num_layers,
                                                  t.partition.pipeline):
                continue
            for reg in regions(t, lay.config, r, ptc):
                key = (reg.offsets, reg.sizes)
                if key not in owner or (process_group is None and r in loaded and
                                        owner[key][0] not in loaded):
                    owner[key] = (r, reg)
        if process_group is None:
            lost = [r for r, _ in owner.values() if r not in loaded]
            if lost:
                missed[t.name] = (len(lost), len(owner))
        scalar = t.name in scalars
        boxes = []
        for (offsets, sizes), (r, reg) in sorted(owner.items()):
            if r in loaded:
                view = local_view(loaded[r][t.name], reg)
                if scalar:
                    offsets, sizes, view = (), (), view.reshape(())
                boxes.append((offsets, sizes, view))
        chunks[t.name] = ([] if scalar else [int(x) for x in t.shape], boxes)
        key_paths[t.name] = _key_path(t.name)
    # Blobs as DCP flattens them (a dict's keys, a list's indices): the
    # keys a dcp.load of the same objects asks for. Written once (rank 0's
    # value; per-rank blobs too, as a DCP save of every rank's RNG keeps one).
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint._traverse import set_element
    torch = _torch()
    nested = {}
    src = 0 if 0 in loaded else (min(loaded) if loaded and process_group is None else None)
    for b in ptc.blobs if src is not None else ():
        if b.name in loaded[src].regenerated or (b.scope == ptc_pb2.BLOB_PER_RANK and
                                                 not per_rank_blobs):
            continue
        # Published by a rank: loaded without calling what it names
        # (UnsafeBlob), before anything is written.
        value = load_blob(b.name, loaded[src][b.name])
        if value is None:
            continue
        if b.name == "optim.param_groups":
            value = _with_params(value, ptc, param_names)
        set_element(nested, _key_path(b.name), value)
    flat, mapping = flatten_state_dict(nested)
    objects = {}
    for k, v in flat.items():
        key_paths[k] = tuple(mapping[k])
        if isinstance(v, torch.Tensor):
            chunks[k] = (list(v.shape), [((0,) * v.dim(), tuple(v.shape), v)])
        else:
            objects[k] = v
    if missed:
        unreached = sorted(set(range(world)) - set(loaded))
        placed = rlayout.slots(lay)
        where = sorted({placed[r][0] for r in unreached})
        first = next(iter(missed))
        raise ValueError(
            f"export of job {job_id} generation {generation} would miss state: {len(missed)} "
            f"of {len(ptc.tensors)} tensors have regions that only ranks without a worker "
            f"socket hold (e.g. \"{first}\": {missed[first][0]} of {missed[first][1]} regions); "
            f"ranks {','.join(map(str, unreached))} on hosts {', '.join(where)} were not "
            f"reached: give a worker socket for those hosts")
    keys = sum(1 for _, boxes in chunks.values() if boxes) + len(objects)
    if keys == 0 and process_group is None:
        raise ValueError(f"export of job {job_id} generation {generation}: nothing to write "
                         f"(0 keys from ranks {sorted(loaded)} on hosts {', '.join(hosts)})")
    Planner = _save_planner_class()
    os.makedirs(os.fspath(path), exist_ok=True)
    return _dcp_call(dcp.save, {}, storage_writer=FileSystemWriter(os.fspath(path)),
                    planner=Planner(chunks, objects, key_paths), **_dist_args(process_group))


# ----------------------------------------------------------- PTC from DCP

def _blob_of(path):
    """The blob item a non-tensor DCP key path belongs to (None: a tensor item)."""
    if path[0] == "model" or tuple(path[:2]) == ("optim", "state"):
        return None
    if path[0] == "optim" and len(path) > 1:
        return f"optim.{path[1]}"
    return str(path[0])


def ptc_from_checkpoint(path, tp_axes=None, blob_headroom=2.0, per_rank=("rng",)):
    """A PTC for the checkpoint at `path` (for a job registered from it, with
    reshard.pytorch's item names): every model and optimizer-state tensor of
    rank >= 1 sharded over data parallel on dim 0 with torch.chunk sizes
    (FSDP2's Shard(0)), split over tp on axis tp_axes[name] when given,
    scalars replicated; everything else one blob per top-level key
    (`optim.param_groups`, each Stateful, `rng`), capacity blob_headroom x
    its pickled size (+256), BLOB_PER_RANK for names in per_rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from reshard.core import _dtypes
    torch = _torch()
    tp_axes = dict(tp_axes or {})
    meta = read_metadata(path)
    md = meta.state_dict_metadata
    paths = getattr(meta, "planner_data", None) or {}
    ptc = ptc_pb2.Ptc(num_layers=1)
    blob_members = {}
    for key in md:
        kp = tuple(paths.get(key, (key,)))
        blob = _blob_of(kp)
        if blob is not None:
            blob_members.setdefault(blob, []).append(key)
            continue
        m = md[key]
        t = ptc.tensors.add(name=key, dtype=_dtypes.dtype_enum(str(m.properties.dtype)
                                                              .replace("torch.", "")),
                            shape=list(m.size) or [1])  # 0-d: [1], as reshard.pytorch
        p = t.partition
        if key in tp_axes:
            p.tp.mode = ptc_pb2.TP_SPLIT
            p.tp.axis = tp_axes[key]
        else:
            p.tp.SetInParent()
        p.pipeline.mode = ptc_pb2.PIPELINE_EVERY_STAGE
        if len(m.size):
            p.dp.mode = ptc_pb2.DP_CHUNK
            p.dp.axis = 0
        p.allow_empty = True
    if blob_members:
        Planner, Chunk = _load_planner_class()
        boxes, tensors, byte_keys = {}, {}, []
        for keys in blob_members.values():
            for k in keys:
                m = md[k]
                if isinstance(m, TensorStorageMetadata):
                    full = torch.empty(list(m.size), dtype=m.properties.dtype)
                    boxes[k] = [(Chunk(offsets=torch.Size([0] * len(m.size)),
                                       sizes=torch.Size(m.size)), full)]
                    tensors[k] = full
                else:
                    byte_keys.append(k)
        planner = Planner(boxes, byte_keys)
        _dcp_call(dcp.load, {}, storage_reader=_reader(path), planner=planner, no_dist=True)
        for blob, keys in blob_members.items():
            flat = {k: tensors[k] if k in tensors else planner.loaded[k] for k in keys}
            value = _nested_value(flat, paths, _key_path(blob))
            if blob == "optim.param_groups":
                value = [{k: v for k, v in g.items() if k != "params"} for g in value]
            n = _LEN.size + len(pickle.dumps(value))
            cap = -(-int(n * blob_headroom + 256) // 64) * 64
            ptc.blobs.add(name=blob, size_bytes=cap,
                          scope=(ptc_pb2.BLOB_PER_RANK if blob in per_rank
                                 else ptc_pb2.BLOB_REPLICATED))
    return ptc


# --------------------------------------------------------------------- CLI

def main(argv=None):
    """`python -m reshard dcp import|export`: between a DCP directory and a
    job's generation, over the worker sockets of this machine's agents.

      dcp import DIR --coordinator ADDR --job ID [--generation G]
                     --socket HOST=PATH ... [--hosts H,...]
      dcp export DIR (same flags)

    Credentials: $RESHARD_WORKER_TOKEN (the job's worker token) for the
    agents and the coordinator (GetJob of the job), --insecure or --ca FILE
    for the coordinator's channel. A failure (an error the coordinator or an
    agent answers, a blob export refuses to load, a checkpoint that does not
    fit the job) is one line on stderr and exit status 1."""
    ap = argparse.ArgumentParser(prog="reshard dcp")
    ap.add_argument("direction", choices=["import", "export"])
    ap.add_argument("dir")
    ap.add_argument("--coordinator", default=os.environ.get("RESHARD_COORDINATOR"))
    ap.add_argument("--job", default=os.environ.get("RESHARD_JOB_ID"), required=False)
    ap.add_argument("--generation", type=int, default=None,
                    help="default: the job's current generation")
    ap.add_argument("--socket", action="append", default=[], metavar="HOST=PATH")
    ap.add_argument("--hosts", default=None, help="comma-separated; default every --socket host")
    ap.add_argument("--ca", default=os.environ.get("RESHARD_TLS_CA"))
    ap.add_argument("--insecure", action="store_true")
    args = ap.parse_args(argv)
    if not args.coordinator or not args.job:
        ap.error("--coordinator and --job are required (or RESHARD_COORDINATOR, "
                 "RESHARD_JOB_ID)")
    token = os.environ.get("RESHARD_WORKER_TOKEN")
    from reshard.core.client import Client, tls_credentials
    kwargs = {"token": token} if token else {}
    if args.insecure:
        kwargs["insecure"] = True
    elif args.ca:
        kwargs["credentials"] = tls_credentials(args.ca)
    socks = {}
    for s in args.socket:
        host, sep, p = s.partition("=")
        if not sep:
            ap.error(f"--socket {s!r}: expected HOST=PATH")
        socks[host] = p
    from reshard.core.errors import ReshardError
    try:
        with Client(args.coordinator, **kwargs) as c:
            job = c.get_job(args.job, include_ptc=True)
        gen = args.generation if args.generation is not None else job.generation
        hosts = args.hosts.split(",") if args.hosts else None
        fn = import_dcp if args.direction == "import" else export_dcp
        result = fn(args.dir, args.job, job.ptc, job.layout, gen, socks, hosts=hosts,
                    worker_token=token)
    except (ReshardError, ValueError, OSError) as e:
        # One line naming what failed (an UnsafeBlob names the blob).
        print(f"reshard dcp {args.direction}: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if args.direction == "import":
        print(f"imported {args.dir} into job {args.job} generation {gen}: ranks "
              f"{result.ranks}; regenerate {result.missing}; ignored keys {result.ignored}")
    else:
        print(f"exported job {args.job} generation {gen} to {args.dir}: "
              f"{len(result.state_dict_metadata)} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
