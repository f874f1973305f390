#!/usr/bin/env python3
"""Resizes with stress-ng beside them: reshard slows down under load and never
gives up.

One run, one local cluster (4 hosts over UCX on loopback, the coordinator's
production lease, tick and stall timers), one job whose state is published
once; then, phase by phase, the same resize back and forth between two layouts
(tp2 pp2 on half the hosts <-> tp4 dp2 on all of them), first on a quiet
machine, then beside stress-ng hogs at normal priority:
  - steady: CPU hogs at FACTOR x the cores, a 1 GiB memory hog (--vm) and
    thread churn (--pthread: threads made and ended all the time);
  - bursts: as many CPU hogs again that come for 2 s and go for 1 s.
While a phase runs, every host's state is polled: a host seen LOST was lost
falsely (nothing here kills an agent). Printed per phase: resizes committed
and aborted, median resize time, slowdown against the quiet phase, hosts
falsely LOST and the coordinator's lease-judgement suspensions.

    .venv/bin/python bench/load/load_bench.py --build build                 # 2.36 GB, 10 resizes per phase
    .venv/bin/python bench/load/load_bench.py --build build --quick          # ~75 MB, 2 per phase (CTest load_bench_quick)

Exit status: 0 every resize committed and no host was lost; 1 otherwise.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "cluster"))
sys.path.insert(0, os.path.join(ROOT, "deploy", "local"))

import cluster as local  # noqa: E402

# bench/cluster's parts, imported in main() once --build says where the
# Python SDK is.
parts = runner = bstate = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--size", choices=("full", "half", "quick"), default="full")
    p.add_argument("--resizes", type=int, default=10, help="resizes per phase")
    p.add_argument("--factors", default="2,8",
                   help="comma-separated CPU hog factors (x the cores), one loaded phase each")
    p.add_argument("--quick", action="store_true",
                   help="--size quick --resizes 2 --factors 2: the CI form")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.resizes, args.factors = "quick", 2, "2"
    args.factors = [int(f) for f in args.factors.split(",") if f]
    return args


class Stress:
    """stress-ng beside the product, at normal priority (module docstring)."""

    def __init__(self, factor, log):
        self.factor, self.log = factor, log
        self.procs, self.stop_bursts, self.bursts = [], threading.Event(), None

    def _spawn(self, args):
        return subprocess.Popen(local.child_argv(["stress-ng", "--quiet", *args]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def start(self):
        hogs = str(self.factor * (os.cpu_count() or 1))
        self.procs.append(self._spawn(["--cpu", hogs, "--vm", "1", "--vm-bytes", "1G",
                                       "--pthread", "1", "--pthread-max", "256"]))

        def bursts():
            while not self.stop_bursts.is_set():
                burst = self._spawn(["--cpu", hogs, "--timeout", "2"])
                burst.wait()
                self.stop_bursts.wait(1.0)

        self.bursts = threading.Thread(target=bursts, daemon=True)
        self.bursts.start()
        return self

    def stop(self):
        self.stop_bursts.set()
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
        if self.bursts:
            self.bursts.join(timeout=10)


class LostWatch:
    """Polls every host's state while a phase runs; any host not ALIVE was
    lost falsely (nothing here stops an agent)."""

    def __init__(self, client):
        self.client, self.lost, self.stop_event = client, set(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import reshard
        alive = reshard.HostState.Value("HOST_STATE_ALIVE")
        while not self.stop_event.wait(0.25):
            try:
                for h in self.client.list_hosts(timeout=30):
                    if h.state != alive:
                        self.lost.add(h.host_id)
            except Exception:  # noqa: B902 - a slow answer under load is no loss
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=60)


def suspensions(metrics_address):
    """reshard_coordinator_lease_judgement_suspended_total by reason."""
    out = {}
    try:
        text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read()
    except OSError:
        return out
    for line in text.decode().splitlines():
        if line.startswith("reshard_coordinator_lease_judgement_suspended_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = int(float(line.rsplit(" ", 1)[1]))
    return out


def main(argv=None):
    global parts, runner, bstate
    args = parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import parts  # noqa: F811
    import runner  # noqa: F811
    import state as bstate  # noqa: F811
    log = lambda m: print(m, flush=True)  # noqa: E731
    ptc = bstate.build_ptc(args.size)
    log(f"state {bstate.state_bytes(ptc) / 1e9:.2f} GB per replica; {args.resizes} resizes per "
        f"phase; phases: quiet, " + ", ".join(f"stress-ng at {f}x the cores" for f in args.factors))
    work = tempfile.mkdtemp(prefix="reshard-load-", dir="/dev/shm")
    # The coordinator's own defaults for the timers (lease 10 s, tick 200 ms,
    # stall 20 s): the product as it is deployed.
    c = local.LocalCluster(args.build, hosts=4, devices_per_host=runner.DEVICES_PER_HOST,
                           memory_limit_bytes=8 << 30, lease_ms=10000, tick_ms=200, log=log,
                           work_dir=os.path.join(work, "cluster"))
    hosts = client = None
    rows, failed = [], False
    try:
        c.start()
        client = c.client(timeout=120.0)
        with open(os.path.join(work, "ptc.bin"), "wb") as f:
            f.write(ptc.SerializeToString())
        hosts = parts.HostWorkers(c.host_ids, os.path.join(os.path.abspath(args.build), "python"),
                                  log_dir=work)
        case = runner.cases_for(4)[1]
        old, new = case.layouts(c.host_ids)
        per_host = {h: dict(host=h, socket=c.agents[h].worker_socket) for h in c.host_ids}
        hosts.all("case", per_host, ptc=os.path.join(work, "ptc.bin"),
                  old=old.SerializeToString().hex(), new=new.SerializeToString().hex())
        from reshard._proto import ptc_pb2
        import reshard
        committed = reshard.OperationState.Value("OPERATION_STATE_COMMITTED")
        job, token = client.register_job(ptc_pb2.JobSpec(name=f"load-{os.getpid()}", tenant="bench",
                                                          ptc=ptc, layout=old), with_token=True)
        hosts.all("generate")
        hosts.all("publish", job_id=job.id, worker_token=token, generation=job.generation)
        hosts.all("drop_old")
        layouts = [new, old]
        turn = 0
        for factor in [0] + args.factors:
            name = "quiet" if factor == 0 else f"stress-ng {factor}x cores"
            stress = Stress(factor, log).start() if factor else None
            before = suspensions(c.coordinator_metrics)
            times, aborted = [], []
            try:
                with LostWatch(client) as watch:
                    for i in range(args.resizes):
                        t0 = time.monotonic()
                        op = client.resize(job.id, layouts[turn % 2])
                        final = client.wait(op.id, timeout=1800)
                        took = time.monotonic() - t0
                        if final.state == committed:
                            turn += 1
                            times.append(took)
                        else:
                            aborted.append(final.error)
                        log(f"   {name}: resize {i + 1}: "
                            f"{reshard.OperationState.Name(final.state)} in {took:.1f} s"
                            + (f": {final.error}" if final.error else ""))
            finally:
                if stress:
                    stress.stop()
            after = suspensions(c.coordinator_metrics)
            susp = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            rows.append(dict(name=name, committed=len(times), aborted=len(aborted),
                             median=statistics.median(times) if times else float("nan"),
                             lost=sorted(watch.lost), suspended=susp))
            failed |= bool(aborted) or bool(watch.lost)
    finally:
        for step in (lambda: hosts and hosts.close(), lambda: client and client.close(), c.stop):
            try:
                step()
            except Exception as e:  # noqa: B902 - keep tearing down
                log(f"cleanup: {e}")
        subprocess.run(["rm", "-rf", work])
    quiet = rows[0]["median"] if rows else float("nan")
    log("\n| phase | committed | aborted | median resize s | slowdown | hosts falsely LOST | "
        "lease judgement suspended (passes) |")
    log("|---|---|---|---|---|---|---|")
    for r in rows:
        susp = ", ".join(f"{k} {v}" for k, v in sorted(r["suspended"].items()) if v) or "0"
        log(f"| {r['name']} | {r['committed']} | {r['aborted']} | {r['median']:.2f} | "
            f"{r['median'] / quiet:.2f}x | {len(r['lost'])}{' ' + str(r['lost']) if r['lost'] else ''}"
            f" | {susp} |")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
