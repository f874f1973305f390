#!/usr/bin/env python3
"""The same-run race: reshard's reconfiguration against torch.distributed.checkpoint.

One state (a float32 MLP under FSDP2 + tensor parallel, Adam, an LR scheduler,
each rank's RNG: reshard.pytorch.AppState) moves from mesh A to mesh B twice in
one run, side by side:

  reshard: the ranks at A publish (reshard.pytorch.publish), the coordinator
           resizes the job to B through the agents, the ranks at B load in
           place (reshard.pytorch.load);
  DCP:     the ranks at A dcp.save the AppState's state dict to a directory on
           tmpfs (/dev/shm), the ranks at B dcp.load it (DCP's resharding
           load) and load_state_dict.

Everything at the product's defaults (a LocalCluster on this machine: real
PostgreSQL, coordinator, one agent per emulated host over UCX on loopback;
DCP's FileSystemWriter/Reader). Each phase runs in its own gloo processes, one
per rank; per rank it records wall seconds, CPU-seconds (user+sys) and peak RSS;
reshard's agents' and coordinator's CPU-seconds over its three phases are
counted too. The ranks at B of both sides must hold byte-identical tensors
(exit 1 otherwise). Prints one table (medians of --reps) and the ratios.

    .venv/bin/python bench/dcp_race/race.py [--hidden 1024] [--layers 8]
        [--from dp2,tp2] [--to dp1,tp4] [--reps 3] [--quick] [--json FILE]

Exit status: 0 done, 1 failed (an operation did not commit, a byte differs).
"""

import argparse
import hashlib
import json
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXIT_SKIP = 77


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8, help="Linear layers (even: col/row pairs)")
    p.add_argument("--from", dest="src", help="mesh A: dp<N>,tp<N> (dp2,tp2; --cluster: dp2,tp4)")
    p.add_argument("--to", dest="dst", help="mesh B: dp<N>,tp<N> (dp1,tp4; --cluster: dp4,tp2)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tmpfs", default="/dev/shm", help="where DCP writes (one machine)")
    p.add_argument("--cluster", action="store_true",
                   help="bench/cluster's emulated hosts (network namespaces, shaped links), DCP "
                        "on a shared file system served from the storage namespace (needs root)")
    p.add_argument("--hosts", type=int, default=4, help="--cluster: hosts of 2 ranks each")
    p.add_argument("--rate-gbit", type=float, default=2.0, help="--cluster: every link, each way")
    p.add_argument("--quick", action="store_true", help="smoke: --hidden 64 --layers 2 --reps 1")
    p.add_argument("--warm", action="store_true",
                   help="the ranks at B create their optimizer's state (get_state_dict on a "
                        "fresh optimizer: one Adam step) before the timed load, both sides")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    if a.quick and a.cluster:  # two hosts of two ranks: the fewest that cross a link
        a.hidden, a.layers, a.reps, a.hosts = 64, 2, 1, 2
        a.src, a.dst = a.src or "dp2,tp2", a.dst or "dp1,tp4"
    elif a.quick:  # two ranks on one host: the fewest processes
        a.hidden, a.layers, a.reps, a.src, a.dst = 64, 2, 1, "dp2,tp1", "dp1,tp2"
    a.src = a.src or ("dp2,tp4" if a.cluster else "dp2,tp2")
    a.dst = a.dst or ("dp4,tp2" if a.cluster else "dp1,tp4")
    a.src, a.dst = mesh_arg(p, a.src), mesh_arg(p, a.dst)
    if a.src[0] * a.src[1] != a.dst[0] * a.dst[1]:
        p.error(f"--from {a.src} and --to {a.dst}: the same number of ranks")
    if a.layers % 2 or a.layers < 2:
        p.error(f"--layers {a.layers}: an even number >= 2")
    if a.cluster and a.src[0] * a.src[1] > a.hosts * 2:
        p.error(f"--cluster: {a.src[0] * a.src[1]} ranks do not fit on --hosts {a.hosts} of 2")
    return a


def mesh_arg(p, text):
    dims = dict((d[:2], int(d[2:])) for d in text.split(","))
    if set(dims) != {"dp", "tp"}:
        p.error(f"{text!r}: expected dp<N>,tp<N>")
    return dims["dp"], dims["tp"]


# ------------------------------------------------------------------ rank side


def build_app(dp, tp, hidden, layers, seed):
    """The AppState of one rank at mesh (dp, tp): colwise/rowwise pairs over
    "tp", FSDP2 over "dp", Adam, StepLR."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    import torch.distributed.checkpoint.state_dict  # noqa: F401  (imported before any timing, both sides)
    from reshard import pytorch
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)])
    parallelize_module(model, mesh["tp"], {str(i): ColwiseParallel() if i % 2 == 0 else
                                           RowwiseParallel() for i in range(layers)})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    return pytorch.AppState(model, opt, {"sched": sched}), model, opt, sched


def train_step(model, opt, sched, hidden):
    import torch
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(3))
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def digest(app):
    """{item: sha256 of the rank's local bytes} of every tensor."""
    from torch.distributed.tensor import DTensor
    msd, osd = app.model_and_optim()
    items = [(f"model.{k}", v) for k, v in msd.items()] + [
        (f"optim.state.{f}.{k}", v) for f, st in osd["state"].items() for k, v in st.items()]
    out = {}
    for name, t in items:
        t = t.to_local() if isinstance(t, DTensor) else t
        out[name] = hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
    return out


class Meter:
    """Wall, CPU-seconds and peak RSS of this process over one phase, which
    starts when every rank is ready (a barrier) and ends, for the services'
    CPU-seconds (the pids in `services`, read by rank 0), when every rank is
    done."""

    def __init__(self, services=()):
        self.services = services
        self.service_cpu = 0.0

    def __enter__(self):
        import torch.distributed as dist
        dist.barrier()
        self.svc = sum(proc_cpu(p) for p in self.services) if dist.get_rank() == 0 else 0.0
        self.ru = resource.getrusage(resource.RUSAGE_SELF)
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist
        self.wall = time.perf_counter() - self.t
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu = (ru.ru_utime - self.ru.ru_utime) + (ru.ru_stime - self.ru.ru_stime)
        self.peak_mb = ru.ru_maxrss / 1024.0
        self.grew_mb = (ru.ru_maxrss - self.ru.ru_maxrss) / 1024.0
        if exc[0] is None:
            dist.barrier()
            if dist.get_rank() == 0:
                self.service_cpu = sum(proc_cpu(p) for p in self.services) - self.svc
        return False

    def result(self):
        return {"wall": self.wall, "cpu": self.cpu, "peak_mb": self.peak_mb,
                "grew_mb": self.grew_mb, "service_cpu": self.service_cpu}


def reshard_old(rank, world, cfg):
    import torch.distributed as dist
    import reshard
    from reshard import layout, pytorch
    from reshard.v1 import ptc_pb2
    dp, tp = cfg["src"]
    app, model, opt, sched = build_app(dp, tp, cfg["hidden"], cfg["layers"], seed=1)
    train_step(model, opt, sched, cfg["hidden"])
    spec = pytorch.describe(app)
    lay = spec.layout(hosts=cfg["hosts"], devices_per_host=cfg["dph"])
    ids = [None, None]
    if rank == 0:
        with reshard.Client(cfg["coordinator"],
                            credentials=reshard.tls_credentials(*cfg["tls"])) as c:
            job, token = c.register_job(ptc_pb2.JobSpec(
                name=cfg["name"], tenant="bench", ptc=spec.ptc, layout=lay), with_token=True)
        ids = [job.id, token]
    dist.broadcast_object_list(ids, src=0)
    host = layout.slots(lay)[rank][0]
    check_host(cfg, rank, host)
    with reshard.Worker(cfg["sockets"][host], ids[0], ptc=spec.ptc, worker_token=ids[1]) as w:
        with Meter(cfg["services"]) as m:
            pytorch.publish(w, app, spec, rank, 1)
    return {"job": ids[0], "token": ids[1], "m": m.result(), "digest": digest(app),
            "bytes": job_bytes(spec.ptc)}


def check_host(cfg, rank, host):
    """The rank runs where the driver started it (its host's namespace)."""
    if cfg["rank_hosts"][rank] != host:
        raise RuntimeError(f"rank {rank}: the layout places it on {host}, but it was started "
                           f"on {cfg['rank_hosts'][rank]}")


def job_bytes(ptc):
    from reshard import _dtypes
    import numpy as np
    return int(sum(int(np.prod(t.shape)) * _dtypes.element_bytes(t.dtype) for t in ptc.tensors))


def reshard_new(rank, world, cfg):
    import reshard
    from reshard import layout, pytorch
    from reshard.v1 import ptc_pb2
    dp, tp = cfg["dst"]
    app, model, opt, sched = build_app(dp, tp, cfg["hidden"], cfg["layers"], seed=7)
    ptc = ptc_pb2.Ptc.FromString(cfg["ptc"])
    lay = ptc_pb2.Layout.FromString(cfg["layout"])
    spec = pytorch.spec_from_ptc(ptc, lay)
    if cfg["warm"]:
        app.model_and_optim()  # the optimizer's state exists before the load
    host = layout.slots(lay)[rank][0]
    check_host(cfg, rank, host)
    with reshard.Worker(cfg["sockets"][host], cfg["job"], ptc=ptc,
                        worker_token=cfg["token"]) as w:
        with Meter(cfg["services"]) as m:
            pytorch.load(w, app, spec, rank, cfg["generation"])
    return {"m": m.result(), "digest": digest(app)}


def dcp_old(rank, world, cfg):
    import torch.distributed.checkpoint as dcp
    dp, tp = cfg["src"]
    app, model, opt, sched = build_app(dp, tp, cfg["hidden"], cfg["layers"], seed=1)
    train_step(model, opt, sched, cfg["hidden"])
    with Meter(cfg["services"]) as m:
        dcp.save(app.state_dict(), checkpoint_id=cfg["dirs"][cfg["rank_hosts"][rank]])
    return {"m": m.result(), "digest": digest(app)}


def dcp_new(rank, world, cfg):
    import torch.distributed.checkpoint as dcp
    dp, tp = cfg["dst"]
    app, model, opt, sched = build_app(dp, tp, cfg["hidden"], cfg["layers"], seed=7)
    if cfg["warm"]:
        app.model_and_optim()  # the optimizer's state exists before the load
    with Meter(cfg["services"]) as m:
        state = app.state_dict()
        dcp.load(state, checkpoint_id=cfg["dirs"][cfg["rank_hosts"][rank]])
        app.load_state_dict(state)
    return {"m": m.result(), "digest": digest(app)}


# ---------------------------------------------------------------- driver side


class LocalSite:
    """One machine: every rank on loopback, DCP on a local tmpfs (--tmpfs)."""

    fs_label = None

    def __init__(self, a, work):
        import cluster as local  # deploy/local/cluster.py
        self.a = a
        self.tmpfs = a.tmpfs
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        world = a.src[0] * a.src[1]
        self.cluster = local.LocalCluster(build_dir=a.build, hosts=-(-world // DEVICES_PER_HOST),
                                          devices_per_host=DEVICES_PER_HOST,
                                          memory_limit_bytes=memory_limit(a),
                                          work_dir=os.path.join(work, "cluster"))
        self.fs_label = a.tmpfs

    def start(self):
        self.cluster.start()

    def spawn(self, fn, out_dir, cfg, world, rank_hosts):
        import gloo_ranks
        return gloo_ranks.spawn(fn, out_dir, cfg, world=world)

    def dcp_dirs(self, name):
        """{host: the checkpoint directory as that host's ranks see it}, and
        the directory to remove afterwards (from the driver)."""
        ck = tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmpfs)
        return {h: ck for h in self.cluster.host_ids}, ck

    def fs_service_pids(self):
        return []

    def close(self):
        self.cluster.stop()


class ClusterSite:
    """bench/cluster's emulated hosts: one network namespace per host behind a
    link shaped to --rate-gbit each way, an agent in each, the coordinator
    and PostgreSQL in the root namespace; the ranks of a host in its
    namespace; DCP on a shared file system (SFTP over sshfs, shared_fs.py)
    served from the storage namespace behind the same kind of link."""

    def __init__(self, a, work):
        import netns
        import parts
        import shared_fs
        self.a = a
        tag = f"{netns.PREFIX}{os.getpid()}"
        netns.remove_stale(log)
        self.topology = netns.Topology(a.hosts, a.rate_gbit, log=log)
        self.storage = None
        self._shared_fs = shared_fs
        self._tag = tag
        self.cluster = parts.NamespacedCluster(a.build, self.topology,
                                               devices_per_host=DEVICES_PER_HOST,
                                               memory_limit_bytes=memory_limit(a),
                                               work_dir=os.path.join(work, "cluster"), log=log)
        self.fs_label = None

    def start(self):
        self.topology.start()
        size = 2 * state_bytes(self.a) + (256 << 20)
        self.storage = self._shared_fs.SftpStorage(self.topology, size, self._tag,
                                                    log=log).start()
        self.fs_label = (f"SFTP (sshfs) from the storage namespace, links "
                         f"{self.a.rate_gbit:g} Gbit/s each way")
        self.cluster.start()

    def spawn(self, fn, out_dir, cfg, world, rank_hosts):
        import gloo_ranks
        node = self.topology.host
        return gloo_ranks.spawn(fn, out_dir, cfg, world=world,
                                prefix=lambda r: node(rank_hosts[r]).exec_prefix(),
                                env=lambda r: {"GLOO_SOCKET_IFNAME": node(rank_hosts[r]).device})

    def dcp_dirs(self, name):
        os.makedirs(os.path.join(self.storage.export, name))
        return ({h: os.path.join(self.storage.mount_point(h), name)
                 for h in self.cluster.host_ids}, os.path.join(self.storage.export, name))

    def fs_service_pids(self):
        return self.storage.service_pids()

    def close(self):
        for step in (self.cluster.stop, lambda: self.storage and self.storage.close(),
                     self.topology.close):
            try:
                step()
            except Exception as e:  # noqa: B902 - keep tearing down
                log(f"cleanup: {e}")


DEVICES_PER_HOST = 2


def log(message):
    print(message, flush=True)


def state_bytes(a):
    """Weights and two Adam moments, float32."""
    return 3 * 4 * a.hidden * (a.hidden + 1) * a.layers


def memory_limit(a):
    return max(4 << 30, 8 * a.hidden * a.hidden * a.layers * 4)


def rank_hosts(lay):
    """The host of every rank of a layout, by rank."""
    from reshard import layout
    return [host for host, _ in layout.slots(lay)]


def proc_cpu(pid):
    """CPU-seconds (user+sys) a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_pids(cluster):
    """The agents' and the coordinator's pids (PostgreSQL's work is not counted)."""
    pids = [a.pid for a in cluster.agents.values() if a.pid]
    proc = getattr(cluster, "_coordinator_proc", None)
    pid = getattr(proc, "pid", None)
    return pids + ([pid] if pid else [])


def phase(results):
    ms = [r["m"] for r in results]
    return {"wall": max(m["wall"] for m in ms), "cpu": sum(m["cpu"] for m in ms),
            "cpu_rank_max": max(m["cpu"] for m in ms), "peak_mb": max(m["peak_mb"] for m in ms),
            "grew_mb": max(m["grew_mb"] for m in ms),
            "service_cpu": sum(m["service_cpu"] for m in ms)}


def one_rep(a, site, client, work, rep):
    from reshard import layout
    from reshard.v1 import coordinator_pb2
    cluster = site.cluster
    world = a.src[0] * a.src[1]
    hosts = cluster.host_ids
    dph = cluster.devices_per_host
    at_a = rank_hosts(layout.make_layout(a.src[1], 1, a.src[0], hosts, dph))
    at_b = rank_hosts(layout.make_layout(a.dst[1], 1, a.dst[0], hosts, dph))
    cfg = {"src": a.src, "dst": a.dst, "hidden": a.hidden, "layers": a.layers, "warm": a.warm,
           "hosts": hosts, "dph": dph, "coordinator": cluster.coordinator,
           "tls": (cluster.pki.ca, *cluster.pki.issue(cluster.ADMIN)),
           "sockets": {h: cluster.agents[h].worker_socket for h in hosts},
           "name": f"dcp-race-{os.getpid()}-{rep}"}
    rep_dir = os.path.join(work, f"rep{rep}")
    os.makedirs(rep_dir)
    out = {}

    # reshard: publish at A, resize A -> B, load at B
    pids = service_pids(cluster)
    cfg["services"] = pids
    old = site.spawn(reshard_old, rep_dir, cfg | {"rank_hosts": at_a}, world, at_a)
    job_id, token = old[0]["job"], old[0]["token"]
    target = layout.make_layout(a.dst[1], 1, a.dst[0], hosts, dph)
    cpu1 = sum(proc_cpu(p) for p in pids)
    t = time.perf_counter()
    op = client.wait(client.resize(job_id, target).id, timeout=600)
    resize_s = time.perf_counter() - t
    if op.state != coordinator_pb2.OPERATION_STATE_COMMITTED:
        raise SystemExit(f"resize of job {job_id}: {coordinator_pb2.OperationState.Name(op.state)}"
                         f" {op.error}")
    cpu2 = sum(proc_cpu(p) for p in pids)
    job = client.get_job(job_id, include_ptc=True)
    if rank_hosts(job.layout) != at_b:
        raise SystemExit(f"job {job_id}: layout B places ranks on {rank_hosts(job.layout)}, "
                         f"expected {at_b}")
    new = site.spawn(reshard_new, rep_dir, cfg | {"job": job_id, "token": token,
                                                 "ptc": job.ptc.SerializeToString(),
                                                 "layout": job.layout.SerializeToString(),
                                                 "generation": job.generation,
                                                 "rank_hosts": at_b}, world, at_b)
    client.delete_job(job_id)
    out["publish"] = phase(old)
    out["resize"] = {"wall": resize_s, "cpu": 0.0, "cpu_rank_max": 0.0, "peak_mb": 0.0,
                     "grew_mb": 0.0, "service_cpu": cpu2 - cpu1}
    out["load"] = phase(new)
    out["bytes"] = old[0]["bytes"]

    # DCP: save at A, resharding load at B, on the site's file system
    dirs, ck = site.dcp_dirs(cfg["name"])
    dcp_cfg = cfg | {"dirs": dirs, "services": site.fs_service_pids()}
    try:
        saved = site.spawn(dcp_old, rep_dir, dcp_cfg | {"rank_hosts": at_a}, world, at_a)
        loaded = site.spawn(dcp_new, rep_dir, dcp_cfg | {"rank_hosts": at_b}, world, at_b)
        out["dcp_bytes"] = sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck))
    finally:
        shutil.rmtree(ck, ignore_errors=True)
    out["save"] = phase(saved)
    out["dcp_load"] = phase(loaded)

    # the same state at A on both sides, the same state at B on both sides
    bad = [r for r in range(world) if old[r]["digest"] != saved[r]["digest"]]
    bad += [r for r in range(world) if new[r]["digest"] != loaded[r]["digest"]]
    if bad:
        raise SystemExit(f"ranks {sorted(set(bad))}: reshard and DCP hold different bytes")
    return out


ROWS = [("reshard publish", "publish"), ("reshard resize", "resize"), ("reshard load", "load"),
        ("DCP save", "save"), ("DCP load", "dcp_load")]


def median_reps(reps):
    out = {}
    for _, key in ROWS:
        out[key] = {f: statistics.median(r[key][f] for r in reps) for f in reps[0][key]}
    out["bytes"], out["dcp_bytes"] = reps[0]["bytes"], reps[0]["dcp_bytes"]
    return out


def report(a, m, fs_label):
    world = a.src[0] * a.src[1]
    where = (f"{a.hosts} emulated hosts of {DEVICES_PER_HOST} ranks, links {a.rate_gbit:g} Gbit/s "
             "each way" if a.cluster else "one machine")
    print(f"\nDCP race: {m['bytes'] / 2**20:.1f} MiB of tensors (DCP files "
          f"{m['dcp_bytes'] / 2**20:.1f} MiB), mesh dp{a.src[0]} x tp{a.src[1]} -> "
          f"dp{a.dst[0]} x tp{a.dst[1]}, {world} ranks, medians of {a.reps}; {where}; DCP on {fs_label}; "
          f"optimizer state at B {'created before' if a.warm else 'created inside'} the load\n")
    print(f"{'phase':<18}{'wall s':>9}{'rank CPU s':>12}{'max/rank':>10}{'svc CPU s':>11}"
          f"{'peak RSS MiB':>14}{'grew MiB':>10}")
    for label, key in ROWS:
        r = m[key]
        print(f"{label:<18}{r['wall']:>9.3f}{r['cpu']:>12.3f}{r['cpu_rank_max']:>10.3f}"
              f"{r['service_cpu']:>11.3f}{r['peak_mb']:>14.1f}{r['grew_mb']:>10.1f}")
    rs = sum(m[k]["wall"] for k in ("publish", "resize", "load"))
    ds = m["save"]["wall"] + m["dcp_load"]["wall"]
    rc = sum(m[k]["cpu"] + m[k]["service_cpu"] for k in ("publish", "resize", "load"))
    dc = sum(m[k]["cpu"] + m[k]["service_cpu"] for k in ("save", "dcp_load"))
    print(f"\nend to end: reshard {rs:.3f} s, DCP {ds:.3f} s -> DCP / reshard = {ds / rs:.2f}x")
    print(f"CPU-seconds (ranks + services): reshard {rc:.3f}, DCP {dc:.3f} -> "
          f"DCP / reshard = {dc / rc:.2f}x")
    print(f"save vs publish: {m['save']['wall'] / m['publish']['wall']:.2f}x; "
          f"DCP load vs resize + load: "
          f"{m['dcp_load']['wall'] / (m['resize']['wall'] + m['load']['wall']):.2f}x")
    return {"reshard_s": rs, "dcp_s": ds, "ratio": ds / rs, "reshard_cpu": rc, "dcp_cpu": dc}


def skip_reason(a):
    """None when the site can run here, else why not (exit 77)."""
    if not a.cluster:
        return None
    import netns
    import shared_fs
    return netns.missing_capability() or shared_fs.missing()


def main(argv=None):
    a = parse_args(argv)
    sys.path[:0] = [os.path.join(ROOT, "deploy", "local"), os.path.join(ROOT, "bench", "cluster"),
                    HERE]
    import reshard  # noqa: F401  (build/python on PYTHONPATH)
    why = skip_reason(a)
    if why:
        print(f"dcp_race: SKIPPED: {why}", flush=True)
        return EXIT_SKIP
    import netns
    work = tempfile.mkdtemp(prefix=f"{netns.PREFIX}{os.getpid()}-race-", dir="/dev/shm")
    site = None
    try:
        site = (ClusterSite if a.cluster else LocalSite)(a, work)
        site.start()
        with site.cluster.client(timeout=120.0) as client:
            reps = [one_rep(a, site, client, work, i) for i in range(a.reps)]
    finally:
        if site:
            site.close()
        shutil.rmtree(work, ignore_errors=True)
    m = median_reps(reps)
    summary = report(a, m, site.fs_label)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items()}, "median": m,
                       "reps": reps, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
