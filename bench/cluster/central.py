"""The central-storage baseline: an nginx WebDAV server and the read plan.

StorageServer runs nginx inside the storage namespace with its document root
on a private tmpfs: PUT (dav_methods, create_full_put_path) to save, ranged
GET (sendfile) to load. Stopped and unmounted by stop(), idempotent.

plan_central(ptc, old, new) is what a resharding-on-load checkpointer does
(torch.distributed.checkpoint, Megatron's dist-checkpointing): every region
is saved once, by data-parallel replica 0 (a tensor replicated across tensor
parallelism by tp rank 0), one file per saving rank; every new rank reads the
byte ranges of the saved files that overlap what it holds. Ranges closer than
MERGE_GAP (64 KiB) are read as one request (a row-parallel split otherwise means one
request per row) and long ones are cut at MAX_READ (16 MiB), so the read count stays
small and the storage link, not the client, is what limits.
"""

import os
import shutil
import subprocess
import tempfile

import numpy as np

from reshard import _dtypes
from reshard import layout as rlayout
from reshard._proto import ptc_pb2

import netns
import state as bstate

MERGE_GAP = 64 << 10
MAX_READ = 16 << 20
_FILE_SHIFT = 40  # virtual offset = (old rank << 40) + offset in its file
PORT = 8080


class StorageError(RuntimeError):
    pass


def nginx_binary():
    for d in ("/usr/sbin", "/usr/bin", "/usr/local/sbin"):
        p = os.path.join(d, "nginx")
        if os.access(p, os.X_OK):
            return p
    return None


class StorageServer:
    """nginx with WebDAV PUT and ranged GET in `node`'s namespace, root on tmpfs."""

    def __init__(self, node, size_bytes, tag):
        self.node = node
        self.size_bytes = size_bytes
        self.url_host = f"{node.address}:{PORT}"
        self.dir = tempfile.mkdtemp(prefix=f"{tag}-storage-")
        self.root = os.path.join(self.dir, "root")
        self._mounted = False
        self._proc = None

    def start(self, timeout=30.0):
        os.makedirs(self.root)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs",
                            self.root], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise StorageError(f"mount tmpfs on {self.root}: {r.stdout.decode().strip()}")
        self._mounted = True
        os.makedirs(os.path.join(self.root, ".tmp"))
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(self._config())
        self._log = open(os.path.join(self.dir, "nginx.out"), "wb")
        self._proc = subprocess.Popen(
            self.node.exec_prefix() + [nginx_binary(), "-p", self.dir, "-c", conf,
                                       "-g", "daemon off;"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self._wait_ready(timeout)
        return self

    def _config(self):
        return f"""
worker_processes 2;
user root root;
error_log {self.dir}/error.log warn;
pid {self.dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  keepalive_timeout 600s;
  client_max_body_size 0;
  client_body_buffer_size 1m;
  client_body_temp_path {self.root}/.tmp;
  server {{
    listen {self.node.address}:{PORT} reuseport;
    root {self.root};
    location / {{
      dav_methods PUT DELETE;
      create_full_put_path on;
      dav_access user:rw group:r all:r;
    }}
  }}
}}
"""

    def _wait_ready(self, timeout):
        """Waits until nginx accepts a connection (it prints nothing when ready)."""
        try:
            self.node.wait_accepting(PORT, self._proc, timeout, "nginx")
        except netns.NetnsError as e:
            raise StorageError(f"{e}: {self.error_log()}") from None

    def error_log(self):
        try:
            with open(os.path.join(self.dir, "error.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def clear(self, prefix):
        """Removes everything saved under /prefix."""
        shutil.rmtree(os.path.join(self.root, prefix), ignore_errors=True)

    def used_bytes(self):
        st = os.statvfs(self.root)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def stop(self):
        """Stops nginx and unmounts its tmpfs. Idempotent."""
        if self._proc and self._proc.poll() is None:
            os.killpg(self._proc.pid, 15)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait()
        self._proc = None
        if self._mounted:
            subprocess.run(["umount", self.root], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            self._mounted = False
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ planning


def _saves(old, r, view, t):
    """Whether old rank r writes tensor t to storage: dp replica 0, and tp
    rank 0 for a tensor replicated across tensor parallelism."""
    if view.dp_i != 0:
        return False
    if t.partition.tp.mode != ptc_pb2.TP_SPLIT and view.tp_i != 0:
        return False
    if t.partition.pipeline.mode == ptc_pb2.PIPELINE_EVERY_STAGE:
        _, _, pp_i = rlayout.coords(old.config, r)
        return pp_i == 0
    return True


def plan_central(ptc, old, new):
    """Returns (saves, reads, stats).

    saves: {old rank: [item names in file order]}; blobs by rank 0.
    reads: {new rank: dict(reads=int64[K,3] (old rank, offset, length),
            pieces=int64[M,3] (offset in the read, offset in the rank's
            buffer, bytes), first=int64[K+1] (pieces of read k:
            first[k]:first[k+1]), size=buffer bytes)}.
    stats: bytes saved, bytes needed by the new ranks, bytes read.
    """
    old_views = {r: bstate.RankView(ptc, old, r) for r in range(rlayout.world_size(old))}
    new_views = {r: bstate.RankView(ptc, new, r) for r in range(rlayout.world_size(new))}
    saves = {r: [] for r in old_views}
    file_off = {r: 0 for r in old_views}
    where = {}  # tensor name -> [(old rank, offset in file)]
    for r, v in old_views.items():
        for t, shape in v.tensors:
            if _saves(old, r, v, t):
                saves[r].append(t.name)
                where.setdefault(t.name, []).append((r, file_off[r]))
                file_off[r] += int(np.prod(shape)) * _dtypes.element_bytes(t.dtype)
    blob_off = {}
    for b in ptc.blobs:
        saves[0].append(b.name)
        blob_off[b.name] = file_off[0]
        file_off[0] += b.size_bytes
    runs = {r: [] for r in new_views}  # (virtual start, bytes, dst offset) arrays
    dst_off, sizes = _buffer_offsets(new_views)
    groups = {}  # a weight and its optimizer states share shape and partition
    for t in ptc.tensors:
        groups.setdefault((tuple(t.shape), t.partition.SerializeToString()), []).append(t)
    for tensors in groups.values():
        elem = _element_runs(old, tensors[0], old_views, new_views, where)
        for t in tensors:
            _tensor_runs(t, elem, where.get(t.name, []), dst_off, runs)
    for b in ptc.blobs:
        v = (0 << _FILE_SHIFT) + blob_off[b.name]
        for r in new_views:
            runs[r].append(np.array([[v, b.size_bytes, dst_off[r][b.name]]], dtype=np.int64))
    reads = {r: _merge(np.concatenate(runs[r]), sizes[r]) for r in new_views}
    stats = dict(bytes_saved=sum(file_off.values()),
                 bytes_needed=sum(sizes.values()),
                 bytes_read=sum(int(x["reads"][:, 2].sum()) for x in reads.values()))
    return {r: names for r, names in saves.items() if names}, reads, stats


def _buffer_offsets(views):
    """{rank: {item: offset}} and {rank: size} of each rank's load buffer:
    its tensors in PTC order, then the blobs (what host_proc.py allocates)."""
    offsets, sizes = {}, {}
    for r, v in views.items():
        off, offsets[r] = 0, {}
        for t, shape in v.tensors:
            offsets[r][t.name] = off
            off += int(np.prod(shape)) * _dtypes.element_bytes(t.dtype)
        for name, value in bstate.BLOBS.items():
            offsets[r][name] = off
            off += len(value)
        sizes[r] = off
    return offsets, sizes


def _element_runs(old, t, old_views, new_views, where):
    """For tensors shaped and partitioned like t: {new rank: int64[K,4]
    (old rank, element in its local buffer, element in the new local
    buffer, elements)}, one row per run contiguous on both sides."""
    n = int(np.prod(t.shape, dtype=np.int64))
    src_rank = np.full(n, -1, dtype=np.int64)
    src_pos = np.zeros(n, dtype=np.int64)
    for r, _ in where.get(t.name, []):
        v = old_views[r]
        idx = bstate.local_indices(t, old.config, v.tp_i, v.dp_i)
        pos = np.nonzero(idx >= 0)[0]
        src_rank[idx[pos]] = r
        src_pos[idx[pos]] = pos
    out = {}
    for r, v in new_views.items():
        if not any(x.name == t.name for x, _ in v.tensors):
            continue
        idx = bstate.local_indices(t, v.config, v.tp_i, v.dp_i)
        pos = np.nonzero(idx >= 0)[0]
        sr, sp = src_rank[idx[pos]], src_pos[idx[pos]]
        if (sr < 0).any():
            raise AssertionError(f"tensor \"{t.name}\": new rank {r} needs bytes nobody saved")
        brk = np.nonzero((np.diff(sr) != 0) | (np.diff(sp) != 1) | (np.diff(pos) != 1))[0] + 1
        starts = np.concatenate(([0], brk))
        ends = np.concatenate((brk, [len(pos)]))
        out[r] = np.stack([sr[starts], sp[starts], pos[starts], ends - starts], axis=1)
    return out


def _tensor_runs(t, elem, saved_at, dst_off, runs):
    """Byte runs (virtual start, bytes, dst offset) of tensor t for every new rank."""
    esize = _dtypes.element_bytes(t.dtype)
    base = np.zeros(1 + max([r for r, _ in saved_at], default=0), dtype=np.int64)
    for r, off in saved_at:
        base[r] = off
    for r, e in elem.items():
        v = (e[:, 0] << _FILE_SHIFT) + base[e[:, 0]] + e[:, 1] * esize
        runs[r].append(np.stack([v, e[:, 3] * esize, dst_off[r][t.name] + e[:, 2] * esize],
                                axis=1))


def _merge(runs, size):
    """Runs (virtual start, bytes, dst) -> reads and pieces (see plan_central)."""
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    reads, pieces, first = [], [], []
    cur = None  # [file, start, end]
    for v, nbytes, dst in runs.tolist():
        f, off = v >> _FILE_SHIFT, v & ((1 << _FILE_SHIFT) - 1)
        while nbytes:
            chunk = min(nbytes, MAX_READ)
            if (cur is None or f != cur[0] or off > cur[2] + MERGE_GAP
                    or off + chunk - cur[1] > MAX_READ):
                cur = [f, off, off + chunk]
                reads.append(cur)
                first.append(len(pieces))
            cur[2] = max(cur[2], off + chunk)
            pieces.append((off - cur[1], dst, chunk))
            off += chunk
            dst += chunk
            nbytes -= chunk
    first.append(len(pieces))
    return dict(reads=np.array([(f, s, e - s) for f, s, e in reads], dtype=np.int64).reshape(-1, 3),
                pieces=np.array(pieces, dtype=np.int64).reshape(-1, 3),
                first=np.array(first, dtype=np.int64), size=size)
