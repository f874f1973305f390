#!/usr/bin/env python3
"""The workers of one emulated host, run inside that host's namespace.

Reads one JSON command per line on stdin and answers one JSON line on stdout
({"ok": true, "seconds": ..., ...} or {"ok": false, "error": ...}). Every
rank of the host runs in its own thread, as each rank's worker process would.
The driver (bench_cluster.py) times each phase from its own clock; "seconds"
here is this host's share, for diagnosis.

Commands: case, generate, publish, save, memcpy, drop_old, load, check_load,
generate_in_buffers, drop_buffers, central_prepare, central_load,
check_central, quit. Zero-copy (--unshaped): generate_in_buffers computes
the old ranks' state straight into Worker.buffers (untimed), publish with
"zero_copy" seals those buffers (no copy), load with "zero_copy" is
load(copy=False) with its default verification; check_load checks the
loaded arrays of both load modes.
"""

import http.client
import json
import os
import queue
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reshard  # noqa: E402
from reshard import _dtypes  # noqa: E402
from reshard._proto import ptc_pb2  # noqa: E402
from reshard import layout as rlayout  # noqa: E402
import state as bstate  # noqa: E402
import xxhash  # noqa: E402

READ_THREADS_PER_RANK = 4


def _hash(buf):
    """XXH3-64 of the bytes of a bytes-like or an array."""
    if isinstance(buf, np.ndarray):
        buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    return xxhash.xxh3_64_intdigest(buf)


def _parallel(fn, items):
    """fn(item) for every item, one thread each; returns the results in order."""
    with ThreadPoolExecutor(max(1, len(items))) as pool:
        return list(pool.map(fn, items))


class Host:
    def __init__(self):
        self.old_views = {}
        self.new_views = {}
        self.shards = {}
        self.loaded = {}
        self.loaded_zero_copy = {}
        self.in_buffers = {}  # rank -> Worker.buffers holding its state
        self.buffers = {}
        self.expected = {}

    # ------------------------------------------------------------- setup
    def case(self, c):
        self.host = c["host"]
        self.socket = c["socket"]
        self.storage = c.get("storage")
        self.ptc = ptc_pb2.Ptc.FromString(open(c["ptc"], "rb").read())
        old = ptc_pb2.Layout.FromString(bytes.fromhex(c["old"]))
        new = ptc_pb2.Layout.FromString(bytes.fromhex(c["new"]))
        self.old_views = {r: bstate.RankView(self.ptc, old, r)
                          for r, _ in rlayout.ranks_on_host(old, self.host)}
        self.new_views = {r: bstate.RankView(self.ptc, new, r)
                          for r, _ in rlayout.ranks_on_host(new, self.host)}
        self.saves = {int(r): names for r, names in c.get("saves", {}).items()
                      if int(r) in self.old_views}
        self.read_dir = c.get("read_dir")
        # What every new rank must end up with: XXH3 of each item's bytes.
        self.expected = {r: self._expected(v) for r, v in self.new_views.items()}
        return {}

    @staticmethod
    def _expected(view):
        out = {}
        for t, _, idx in view.indices():
            out[t.name] = _hash(bstate.content(t.name, idx, _dtypes.element_bytes(t.dtype)))
        for name, value in bstate.BLOBS.items():
            out[name] = _hash(value)
        return out

    def generate(self, c):
        self.shards = {r: v.generate() for r, v in self.old_views.items()}
        return {"bytes": sum(_nbytes(d) for d in self.shards.values())}

    def drop_old(self, c):
        self.shards = {}
        return {}

    def generate_in_buffers(self, c):
        """Each old rank's state computed straight into the agent's rank
        buffer (Worker.buffers of job c["job_id"]), as a worker that keeps
        its state there from the start; untimed, like generate."""
        def one(r):
            with self._worker(c) as w:
                bufs = w.buffers(r, c["generation"])
            for name, value in self.old_views[r].generate().items():
                if isinstance(value, bytes):
                    bufs[name][...] = np.frombuffer(value, dtype=np.uint8)
                elif value.size:
                    np.copyto(bufs[name], value.view(bufs[name].dtype), casting="no")
            return bufs
        ranks = sorted(self.old_views)
        self.in_buffers = dict(zip(ranks, _parallel(one, ranks)))
        return {"bytes": sum(_nbytes(d) for d in self.in_buffers.values())}

    def drop_buffers(self, c):
        self.in_buffers = {}  # the last views go: unmapped
        return {}

    def _worker(self, c):
        return reshard.Worker(self.socket, c["job_id"], ptc=self.ptc, timeout=600,
                              worker_token=c["worker_token"])

    # ----------------------------------------------------------- reshard
    def publish(self, c):
        """Publishes every old rank: the copy path from generate's arrays,
        or (c["zero_copy"]) the seal of generate_in_buffers' buffers."""
        src = self.in_buffers if c.get("zero_copy") else self.shards

        def one(r):
            with self._worker(c) as w:
                w.publish(r, c["generation"], src[r])
        _parallel(one, sorted(src))
        return {"bytes": sum(_nbytes(d) for d in src.values())}

    def load(self, c):
        """Loads every new rank: copies (load()), or (c["zero_copy"]) views
        of a private mapping (load(copy=False), default verification)."""
        zero_copy = bool(c.get("zero_copy"))

        def one(r):
            with self._worker(c) as w:
                return w.load(r, c["generation"], copy=not zero_copy)
        ranks = sorted(self.new_views)
        loaded = dict(zip(ranks, _parallel(one, ranks)))
        if zero_copy:
            self.loaded_zero_copy = loaded
        else:
            self.loaded = loaded
        return {"bytes": sum(_nbytes(d) for d in loaded.values())}

    def check_load(self, c):
        """Checks every loaded byte of both load modes (whichever ran)."""
        try:
            n = sum(self._check(r, d, "reshard load") for r, d in self.loaded.items())
            n += sum(self._check(r, d, "reshard load(copy=False)")
                     for r, d in self.loaded_zero_copy.items())
            return {"bytes": n}
        finally:
            self.loaded = {}
            self.loaded_zero_copy = {}

    def _check(self, r, items, what):
        want = self.expected[r]
        if set(items) != set(want):
            raise ValueError(f"{what} rank {r}: items differ: {sorted(set(items) ^ set(want))[:4]}")
        n = 0
        for name, value in items.items():
            if _hash(value) != want[name]:
                raise ValueError(f"{what} rank {r} item \"{name}\": bytes differ from what was "
                                 "published")
            n += len(value) if isinstance(value, bytes) else value.nbytes
        return n

    def memcpy(self, c):
        """Copies the same bytes as publish (c["of"] == "old") or load
        ("new": the loaded arrays) into fresh arrays, one thread per rank."""
        src = self.shards if c["of"] == "old" else self.loaded
        arrays = {r: [a for a in d.values() if isinstance(a, np.ndarray)] for r, d in src.items()}
        t0 = time.monotonic()
        _parallel(lambda r: [np.copyto(np.empty_like(a), a) for a in arrays[r]], sorted(arrays))
        secs = time.monotonic() - t0
        return {"memcpy_seconds": secs, "bytes": sum(a.nbytes for v in arrays.values() for a in v)}

    # ----------------------------------------------------------- central
    def save(self, c):
        def one(r):
            items = self.shards[r]
            bufs = [memoryview(np.ascontiguousarray(items[n])).cast("B")
                    if isinstance(items[n], np.ndarray) else memoryview(items[n])
                    for n in self.saves[r]]
            conn = http.client.HTTPConnection(self.storage, timeout=600)
            try:
                conn.putrequest("PUT", f"/{c['prefix']}/rank{r}.bin")
                conn.putheader("Content-Length", str(sum(len(b) for b in bufs)))
                conn.endheaders()
                for b in bufs:
                    conn.send(b)
                resp = conn.getresponse()
                resp.read()
                if resp.status not in (200, 201, 204):
                    raise IOError(f"PUT rank{r}.bin: HTTP {resp.status}")
            finally:
                conn.close()
            return sum(len(b) for b in bufs)
        return {"bytes": sum(_parallel(one, sorted(self.saves)))}

    def central_prepare(self, c):
        """Allocates and touches every new rank's buffer (a training process
        has its parameters allocated before it loads) and its read plan."""
        self.plans = {}
        for r in self.new_views:
            with np.load(os.path.join(self.read_dir, f"rank{r}.npz")) as z:
                self.plans[r] = {k: z[k] for k in z.files}
            self.buffers[r] = np.zeros(int(self.plans[r]["size"]), dtype=np.uint8)
        return {}

    def central_load(self, c):
        work = queue.Queue()
        for r in sorted(self.new_views):
            for k in range(len(self.plans[r]["reads"])):
                work.put((r, k))
        threads = READ_THREADS_PER_RANK * max(1, len(self.new_views))
        errors = []
        _parallel(lambda _: self._reader(c["prefix"], work, errors),
                  list(range(threads)))
        if errors:
            raise errors[0]
        return {"bytes": int(sum(p["reads"][:, 2].sum() for p in self.plans.values()))}

    def _reader(self, prefix, work, errors):
        conn = http.client.HTTPConnection(self.storage, timeout=600)
        scratch = None
        try:
            while not errors:
                try:
                    r, k = work.get_nowait()
                except queue.Empty:
                    return
                plan, buf = self.plans[r], self.buffers[r]
                f, off, length = (int(x) for x in plan["reads"][k])
                lo, hi = int(plan["first"][k]), int(plan["first"][k + 1])
                pieces = plan["pieces"][lo:hi]
                direct = hi - lo == 1 and pieces[0][0] == 0 and pieces[0][2] == length
                if direct:
                    target = memoryview(buf)[int(pieces[0][1]):int(pieces[0][1]) + length]
                else:
                    if scratch is None or len(scratch) < length:
                        scratch = bytearray(max(length, 1 << 20))
                    target = memoryview(scratch)[:length]
                _get_range(conn, f"/{prefix}/rank{f}.bin", off, target)
                if not direct:
                    for src, dst, n in pieces.tolist():
                        buf[dst:dst + n] = np.frombuffer(scratch, np.uint8, n, src)
        except BaseException as e:  # noqa: B902 - reported to the driver
            errors.append(e)
        finally:
            conn.close()

    def check_central(self, c):
        try:
            total = 0
            for r, view in self.new_views.items():
                items, off, buf = {}, 0, self.buffers[r]
                for t, shape in view.tensors:
                    n = int(np.prod(shape)) * _dtypes.element_bytes(t.dtype)
                    items[t.name] = buf[off:off + n]
                    off += n
                for name, value in bstate.BLOBS.items():
                    items[name] = bytes(buf[off:off + len(value)])
                    off += len(value)
                total += self._check(r, items, "central load")
            return {"bytes": total}
        finally:
            self.buffers = {}
            self.plans = {}


def _get_range(conn, path, off, target):
    length = len(target)
    conn.putrequest("GET", path)
    conn.putheader("Range", f"bytes={off}-{off + length - 1}")
    conn.endheaders()
    resp = conn.getresponse()
    if resp.status != 206:
        body = resp.read(200)
        raise IOError(f"GET {path} bytes {off}+{length}: HTTP {resp.status} {body!r}")
    got = 0
    while got < length:
        n = resp.readinto(target[got:])
        if not n:
            raise IOError(f"GET {path} bytes {off}+{length}: short read ({got})")
        got += n
    if resp.read(1):
        raise IOError(f"GET {path}: more bytes than asked")


def _nbytes(d):
    return sum(v.nbytes if isinstance(v, np.ndarray) else len(v) for v in d.values())


def main():
    host = Host()
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the reply channel
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        t0 = time.monotonic()
        try:
            reply = getattr(host, cmd["op"])(cmd)
            reply.update(ok=True, seconds=time.monotonic() - t0)
        except Exception as e:  # noqa: B902 - reported to the driver
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "trace": traceback.format_exc()[-3000:]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
