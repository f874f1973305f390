"""Bench: sets up the emulated cluster once and runs the cases on it.

start() removes stale objects of dead runs, then builds (in this order) the
namespaces, nginx, PostgreSQL + coordinator + agents, and the host workers;
close() tears all of it down in reverse and is idempotent, so an exception or
Ctrl-C anywhere leaves nothing behind.
"""

import os
import shutil
import tempfile
import time

import numpy as np

import reshard
from reshard import layout as rlayout
from reshard._proto import ptc_pb2

import central
import netns
import parts
import resize_profile
import report
import state as bstate
import yardsticks

DEVICES_PER_HOST = 2


class BenchFailure(RuntimeError):
    """A transfer failed, an operation did not commit, or a byte differs."""


class Case:
    """A transition between two layouts (tp, pp, dp, number of hosts)."""

    def __init__(self, name, old, new):
        self.name, self.old, self.new = name, old, new

    def layouts(self, host_ids):
        return tuple(rlayout.make_layout(tp, pp, dp, hosts=host_ids[:n],
                                         devices_per_host=DEVICES_PER_HOST)
                     for tp, pp, dp, n in (self.old, self.new))

    def text(self):
        f = lambda c: f"tp{c[0]} pp{c[1]} dp{c[2]} on {c[3]} hosts"  # noqa: E731
        return f"{f(self.old)} -> {f(self.new)}"


def cases_for(hosts):
    """The four cases on `hosts` hosts (4 or 8): every one starts from
    tp2 pp2 on half the hosts and grows onto all of them."""
    d, half = hosts // 4, hosts // 2
    start = (2, 2, d, half)
    return {1: Case("transition", start, (4, 1, 2 * d, hosts)),
            2: Case("dp-only", start, (2, 2, 2 * d, hosts)),
            3: Case("tp-only", start, (4, 2, d, hosts)),
            4: Case("pp-only", start, (2, 4, d, hosts))}


class Bench:
    def __init__(self, args, log):
        self.args = args
        self.log = log
        self.rate_bytes = None if args.unshaped else args.rate_gbit * 1e9 / 8
        self.ptc = bstate.build_ptc(args.size)
        self.state_bytes = bstate.state_bytes(self.ptc)
        self.topology = self.storage = self.cluster = self.hosts = self.client = None
        self.work_dir = None
        self.ucx_bw = None

    # ------------------------------------------------------------ set-up
    def start(self):
        tag = f"{netns.PREFIX}{os.getpid()}"
        self.work_dir = tempfile.mkdtemp(prefix=f"{tag}-work-", dir="/dev/shm")
        cluster_args = dict(devices_per_host=DEVICES_PER_HOST, memory_limit_bytes=8 << 30,
                            spare_bytes=self.args.spare_bytes,
                            keep_dropped_ms=self.args.keep_dropped_ms, log=self.log, work_dir=os.path.join(self.work_dir, "cluster"))
        if self.args.unshaped:
            netns.remove_stale_directories(self.log)  # dead runs' agents' shared memory
            self.cluster = parts.local.LocalCluster(self.args.build, hosts=self.args.hosts,
                                                    **cluster_args)
        else:
            netns.remove_stale(self.log)
            self._start_network(tag)
            self.cluster = parts.NamespacedCluster(self.args.build, self.topology,
                                                   **cluster_args)
        if self.args.unshaped:
            # Before the agents start: their spare pools fill in the
            # background at first, and would share the CPU with it.
            self.ucx_bw = yardsticks.ucx_tag_bandwidth()
            self.log(f"ucx_perftest tag_bw (lo, tcp, 64 MiB messages): "
                     f"{self.ucx_bw / 1e9:.2f} GB/s")
        self.cluster.start()
        self.client = self.cluster.client(timeout=120.0)
        with open(os.path.join(self.work_dir, "ptc.bin"), "wb") as f:
            f.write(self.ptc.SerializeToString())
        self.hosts = parts.HostWorkers(self.cluster.host_ids,
                                       os.path.join(os.path.abspath(self.args.build), "python"),
                                       self.topology, log_dir=self.work_dir)

    def _start_network(self, tag):
        self.topology = netns.Topology(self.args.hosts, self.args.rate_gbit, log=self.log).start()
        # Holds one saved replica; 25% and 64 MiB of slack for nginx's temp files.
        size = int(self.state_bytes * 1.25) + (64 << 20)
        self.storage = central.StorageServer(self.topology.nodes["storage"], size, tag).start()
        self.log(f"storage: nginx on {self.storage.url_host} (tmpfs {size >> 20} MiB)")

    def close(self):
        """Stops and removes everything start() made. Idempotent."""
        for step in (lambda: self.hosts and self.hosts.close(),
                     lambda: self.client and self.client.close(),
                     lambda: self.cluster and self.cluster.stop(),
                     lambda: self.storage and self.storage.stop(),
                     lambda: self.topology and self.topology.close(),
                     lambda: self.work_dir and shutil.rmtree(self.work_dir, ignore_errors=True)):
            try:
                step()
            except Exception as e:  # noqa: B902 - keep tearing down
                self.log(f"cleanup: {e}")

    # ------------------------------------------------------------- a case
    def run_case(self, number):
        case = cases_for(self.args.hosts)[number]
        old, new = case.layouts(self.cluster.host_ids)
        self.log(f"\n== case {number} {case.name}: {case.text()}")
        static = dict(state_bytes=self.state_bytes)
        per_host = {h: dict(host=h, socket=self.cluster.agents[h].worker_socket)
                    for h in self.cluster.host_ids}
        common = dict(ptc=os.path.join(self.work_dir, "ptc.bin"),
                      old=old.SerializeToString().hex(), new=new.SerializeToString().hex())
        if self.storage:
            static.update(self._plan_central(number, old, new, common))
        t0 = time.monotonic()
        self.hosts.all("case", per_host, **common)
        self.log(f"   workers ready ({time.monotonic() - t0:.1f} s to compute expected checksums)")
        reps = [self._rep(case, number, rep, old, new, static) for rep in range(self.args.reps)]
        return report.summarize(case, reps, static, self.rate_bytes, self.args.unshaped)

    def _plan_central(self, number, old, new, common):
        t0 = time.monotonic()
        saves, reads, stats = central.plan_central(self.ptc, old, new)
        read_dir = os.path.join(self.work_dir, f"case{number}-reads")
        os.makedirs(read_dir, exist_ok=True)
        for r, plan in reads.items():
            np.savez(os.path.join(read_dir, f"rank{r}.npz"), **plan)
        common.update(saves={str(r): names for r, names in saves.items()}, read_dir=read_dir,
                      storage=self.storage.url_host)
        self.log(f"   central plan: {stats['bytes_saved'] / 1e9:.2f} GB saved, "
                 f"{stats['bytes_needed'] / 1e9:.2f} GB needed, {stats['bytes_read'] / 1e9:.2f} GB "
                 f"read in {sum(len(p['reads']) for p in reads.values())} ranged GETs "
                 f"({time.monotonic() - t0:.1f} s to plan)")
        return dict(central_saved=stats["bytes_saved"], central_needed=stats["bytes_needed"],
                    central_read=stats["bytes_read"])

    # -------------------------------------------------------------- a rep
    def _rep(self, case, number, rep, old, new, static):
        spec = ptc_pb2.JobSpec(name=f"bench-{number}-{rep}-{os.getpid()}", tenant="bench",
                               ptc=self.ptc, layout=old)
        job, token = self.client.register_job(spec, with_token=True)
        times = {}
        try:
            self.hosts.all("generate")
            times["publish_s"], r = self._timed("publish", job_id=job.id, worker_token=token,
                                                generation=job.generation)
            times["publish_bytes"] = sum(x["bytes"] for x in r.values())
            if self.args.unshaped:
                times["publish_memcpy_s"] = self._memcpy("old")
            prefix = f"case{number}-rep{rep}"
            if self.storage:
                times["save_s"], _ = self._timed("save", prefix=prefix)
            self.hosts.all("drop_old")  # before the new generations take memory
            self._publish_zero_copy(number, rep, old, times)
            if self.storage:
                self._central_load(times, prefix)
            if rep == 0:
                static.update(self._preview(job.id, new))
            perf_path = (os.path.join(self.args.perf, f"case{number}-rep{rep + 1}.data")
                         if self.args.perf else None)
            final = self._resize(job.id, new, times, perf_path)
            if perf_path:
                for line in resize_profile.summary(perf_path, times["agent_cpu_s"],
                                            static["bytes_written"] / 1e9):
                    self.log(line)
            times["load_s"], r = self._timed("load", job_id=job.id, worker_token=token,
                                             generation=final.to_generation)
            times["load_bytes"] = sum(x["bytes"] for x in r.values())
            if self.args.unshaped:
                times["load_memcpy_s"] = self._memcpy("new")
                times["ucx_tag_bw"] = self.ucx_bw
            times["load_zc_s"], r = self._timed("load", job_id=job.id, worker_token=token,
                                                generation=final.to_generation, zero_copy=True)
            times["load_zc_bytes"] = sum(x["bytes"] for x in r.values())
            checked = sum(x["bytes"] for x in self.hosts.all("check_load").values())
        except parts.HostError as e:
            raise BenchFailure(str(e)) from None
        finally:
            self._delete(job.id)
        self.log(f"   rep {rep + 1}: " + ", ".join(
            f"{k[:-2]} {v:.2f} s" for k, v in times.items() if k.endswith("_s"))
            + f"; verified {checked / 1e9:.2f} GB loaded from reshard")
        return times

    def _publish_zero_copy(self, number, rep, old, times):
        """Zero-copy publish of the same state under a job of its own (same
        layout): old ranks compute it straight into Worker.buffers
        (untimed), the timed publish is the seal. The job is deleted and its
        memory released before the resize."""
        spec = ptc_pb2.JobSpec(name=f"bench-{number}-{rep}-zc-{os.getpid()}", tenant="bench",
                               ptc=self.ptc, layout=old)
        job, token = self.client.register_job(spec, with_token=True)
        try:
            self.hosts.all("generate_in_buffers", job_id=job.id, worker_token=token,
                           generation=job.generation)
            times["publish_zc_s"], r = self._timed("publish", job_id=job.id, worker_token=token,
                                                   generation=job.generation, zero_copy=True)
            times["publish_zc_bytes"] = sum(x["bytes"] for x in r.values())
        finally:
            self.hosts.all("drop_buffers")
            self._delete(job.id)

    def _timed(self, op, **kwargs):
        t0 = time.monotonic()
        replies = self.hosts.all(op, **kwargs)
        return time.monotonic() - t0, replies

    def _memcpy(self, of):
        """The slowest host's memcpy of the same bytes, one thread per rank."""
        return max(r["memcpy_seconds"] for r in self.hosts.all("memcpy", of=of).values())

    def _central_load(self, times, prefix):
        self.hosts.all("central_prepare")
        times["central_load_s"], _ = self._timed("central_load", prefix=prefix)
        self.hosts.all("check_central")
        self.storage.clear(prefix)

    def _preview(self, job_id, new):
        stats = self.client.preview_plan(job_id, new)
        hosts = {h.host: {"in": h.bytes_in, "out": h.bytes_out, "local": h.bytes_local}
                 for h in stats.hosts}
        return dict(hosts=hosts, bytes_cross_host=stats.bytes_cross_host,
                    lower_bound_cross_host=stats.lower_bound_cross_host,
                    bytes_written=stats.bytes_local + stats.bytes_cross_host)

    def _resize(self, job_id, new, times, perf_path=None):
        """`perf_path`: profile the agents during the resize into it (--perf)."""
        pids = [a.pid for a in self.cluster.agents.values()]
        perf = resize_profile.ResizeProfile(perf_path, pids, self.log) if perf_path else None
        try:
            if perf:
                perf.enable()
            cpu0 = sum(yardsticks.cpu_seconds(p) for p in pids)
            t0 = time.monotonic()
            op = self.client.resize(job_id, new)
            final = self.client.wait(op.id, timeout=900)
            times["resize_s"] = time.monotonic() - t0
            times["agent_cpu_s"] = sum(yardsticks.cpu_seconds(p) for p in pids) - cpu0
        finally:
            if perf:
                perf.stop()
        if final.state != reshard.OperationState.Value("OPERATION_STATE_COMMITTED"):
            raise BenchFailure(f"resize {op.id} ended {reshard.OperationState.Name(final.state)}: "
                               f"{final.error}")
        # The coordinator's cost model (docs/scheduler.md): what it predicted
        # when it planned the resize, and what it took (planned -> committed).
        shown = self.client.get_operation(op.id)
        times["predicted_s"] = shown.prediction.seconds
        times["op_actual_s"] = shown.actual_seconds
        times["calibrated"] = int(shown.prediction.calibrated)
        return final

    def _delete(self, job_id, timeout=120.0):
        """Deletes the job and waits until every agent has released its
        rank buffers (the next repetition needs the memory). Spare files
        stay: an agent keeps them within its memory limit and frees them
        when a new buffer needs the room (docs/agent.md, "Shard store")."""
        try:
            self.client.delete_job(job_id)
        except reshard.ReshardError as e:
            self.log(f"   delete job {job_id}: {e}")
            return
        deadline = time.monotonic() + timeout

        def held(h):
            return [f for f in self.cluster.shm_files(h) if f"-{job_id}-" in f]
        while any(held(h) for h in self.cluster.host_ids):
            if time.monotonic() > deadline:
                raise BenchFailure(f"agents still hold {self._shm_bytes() / 1e9:.2f} GB "
                                   f"{timeout} s after deleting job {job_id}")
            time.sleep(0.1)  # poll interval of the release check

    def _shm_bytes(self):
        return sum(sum(self.cluster.shm_files(h).values()) for h in self.cluster.host_ids)
