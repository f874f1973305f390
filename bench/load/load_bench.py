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
While a phase runs, the job's hosts' states are polled: one seen LOST was
lost falsely (nothing kills their agents). At the end of each phase, still
under its load, two spare hosts of the cluster (in no layout) fail for real:
one agent is SIGKILLed, one SIGSTOPped; the time until the coordinator
marks each LOST is measured against the bound (lease + one heartbeat period),
then both come back. Printed per phase: resizes committed and aborted, median
resize time, slowdown against the quiet phase, hosts falsely LOST, the
coordinator's lease-judgement suspensions and the two detection times.

With --main-job, each phase runs the main job (deploy/local/main_job.py:
resizes, a migration and a host loss, then PyTorch training through a
stop-free resize, a host loss and a stop-the-world resize) and prints its exit
status, steps verified and each pause side by side.

With --control-plane, the phases run bench/control_plane's
control_plane_bench instead (its defaults: 10,000 simulated hosts, 1,000
jobs, up to 20,000 watch streams; or the arguments given after
--control-plane-args), once quiet and once beside each load, and its
operations, agent call errors, hosts LOST, pickup and GetJob p99 are
printed side by side.

    .venv/bin/python bench/load/load_bench.py --build build                 # 2.36 GB, 10 resizes per phase
    .venv/bin/python bench/load/load_bench.py --build build --quick          # ~75 MB, 2 per phase (CTest load_bench_quick)
    .venv/bin/python bench/load/load_bench.py --build build --control-plane  # control_plane_bench quiet and loaded
    .venv/bin/python bench/load/load_bench.py --build build --main-job       # the main job quiet and loaded

Exit status: 0 when every resize (or control-plane run) committed, no live
host was lost and both failed hosts were found; 1 otherwise.
"""

import argparse
import os
import re
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

# The coordinator's default lease (heartbeats every third of it).
LEASE_MS = 10000

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
    p.add_argument("--control-plane", action="store_true",
                   help="run control_plane_bench in each phase instead of resizes")
    p.add_argument("--main-job", action="store_true",
                   help="run the main job (deploy/local/main_job.py) in each phase instead")
    p.add_argument("--control-plane-args", default="",
                   help="arguments for control_plane_bench (default: none, its defaults)")
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
    """Polls the states of `hosts` while a phase runs; any not ALIVE was lost
    falsely (nothing here stops their agents)."""

    def __init__(self, client, hosts):
        self.client, self.hosts = client, set(hosts)
        self.lost, self.stop_event = set(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import reshard
        alive = reshard.HostState.Value("HOST_STATE_ALIVE")
        while not self.stop_event.wait(0.25):
            try:
                for h in self.client.list_hosts(timeout=30):
                    if h.host_id in self.hosts and h.state != alive:
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


def host_states(client):
    import reshard
    return {h.host_id: reshard.HostState.Name(h.state) for h in client.list_hosts(timeout=30)}


def detect_failures(c, client, killed, stopped, log, deadline_s=120.0):
    """SIGKILLs the agent of `killed` and SIGSTOPs that of `stopped`; returns
    {host: seconds until the coordinator showed it LOST} (absent: not found
    within deadline_s), then brings both back and waits until they are ALIVE."""
    t0 = time.monotonic()
    c.kill_agent(killed)
    c.stop_agent(stopped)
    found = {}
    try:
        while len(found) < 2 and time.monotonic() - t0 < deadline_s:
            try:
                states = host_states(client)
            except Exception:  # noqa: B902 - a slow answer under load: ask again
                continue
            for h in (killed, stopped):
                if h not in found and states.get(h) == "HOST_STATE_LOST":
                    found[h] = time.monotonic() - t0
            time.sleep(0.1)
    finally:
        c.continue_agent(stopped)
        c.restart_agent(killed)
    back = time.monotonic() + deadline_s
    while time.monotonic() < back:
        try:
            states = host_states(client)
            if all(states.get(h) == "HOST_STATE_ALIVE" for h in (killed, stopped)):
                break
        except Exception:  # noqa: B902
            pass
        time.sleep(0.2)
    else:
        log(f"   {killed} and {stopped} not both ALIVE again within {deadline_s:.0f} s")
    return found


CP_PATTERNS = {
    "committed": r"; (\d+) operations committed",
    "op_errors": r"committed, (\d+) operation errors",
    "call_errors": r"; (\d+) agent call errors",
    "lost": r"; (-?\d+) hosts LOST",
}


def control_plane_run(build, extra, log):
    """One control_plane_bench run: its exit status, figures and table rows."""
    binary = os.path.join(build, "bench", "control_plane", "control_plane_bench")
    t0 = time.monotonic()
    proc = subprocess.run([binary, *extra.split()], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    out = proc.stdout
    fig = {k: (int(m.group(1)) if (m := re.search(p, out)) else None)
           for k, p in CP_PATTERNS.items()}
    fig["status"], fig["seconds"] = proc.returncode, time.monotonic() - t0
    # | streams | hosts | ... | pickup p50 / p99 ms (n, by heartbeat) | GetJob p99 ms (n) | ...
    fig["rows"] = []
    for line in out.splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) >= 13 and cells[0].isdigit():
            pickup = cells[9].split("/")[1].split("(")[0].strip() if "/" in cells[9] else "-"
            getjob = cells[10].split("(")[0].strip()
            fig["rows"].append((cells[0], pickup, getjob))
    log(out.rstrip())
    log(f"   control_plane_bench exited {proc.returncode} after {fig['seconds']:.0f} s")
    return fig


def under_each_load(args, log, what, run):
    """run() once quiet and once beside each load; its results (dicts with
    "status" and "seconds"), each with the phase's "name"."""
    rows = []
    for factor in [0] + args.factors:
        name = "quiet" if factor == 0 else f"stress-ng {factor}x cores"
        log(f"== {name}: {what}")
        stress = Stress(factor, log).start() if factor else None
        try:
            fig = run()
        finally:
            if stress:
                stress.stop()
        fig["name"] = name
        rows.append(fig)
    return rows


def main_control_plane(args, log):
    rows = under_each_load(
        args, log, f"control_plane_bench {args.control_plane_args or '(defaults)'}",
        lambda: control_plane_run(os.path.abspath(args.build), args.control_plane_args, log))
    failed = any(r["status"] != 0 for r in rows)
    # The bench's windows are fixed: the load shows in how many operations
    # it ran in them, not in its run time.
    quiet_ops = rows[0]["committed"] or 0
    log("\n| phase | exit | operations committed | vs quiet | operation errors | agent call errors | "
        "hosts LOST | run s | pickup p99 ms by streams | GetJob p99 ms by streams |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pick = ", ".join(f"{s}: {p}" for s, p, _ in r["rows"]) or "-"
        get = ", ".join(f"{s}: {g}" for s, _, g in r["rows"]) or "-"
        ratio = f"{(r['committed'] or 0) / quiet_ops:.2f}x" if quiet_ops else "-"
        log(f"| {r['name']} | {r['status']} | {r['committed']} | {ratio} | {r['op_errors']} | "
            f"{r['call_errors']} | {r['lost']} | {r['seconds']:.0f} | {pick} | {get} |")
    return 1 if failed else 0


# The main job's pause lines ("    stop-free resize         0.42 s  (...").
PAUSE = re.compile(r"^\s+(stop-free resize|lose host-\d+|stop-the-world resize)\s+([0-9.]+) s")


def main_job_run(build, log):
    """One run of deploy/local/main_job.py (both parts): exit status, wall
    time, the steps verified and each reconfiguration's pause."""
    work = tempfile.mkdtemp(prefix="reshard-load-main-", dir="/dev/shm")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "local", "main_job.py"),
                               "--build", build, "--plot", os.path.join(work, "plot.png")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        subprocess.run(["rm", "-rf", work])
    out = proc.stdout
    fig = {"status": proc.returncode, "seconds": time.monotonic() - t0,
           "verified": len(re.findall(r"^\s+\S.*\s+ok$", out, re.M)),
           "pauses": {m.group(1): float(m.group(2))
                      for m in map(PAUSE.match, out.splitlines()) if m}}
    log(out.rstrip())
    log(f"   main_job.py exited {proc.returncode} after {fig['seconds']:.0f} s")
    return fig


def main_main_job(args, log):
    rows = under_each_load(args, log, "deploy/local/main_job.py",
                           lambda: main_job_run(os.path.abspath(args.build), log))
    failed = any(r["status"] != 0 for r in rows)
    quiet = rows[0]
    log("\n| phase | exit | steps verified | run s | slowdown | stop-free pause s | "
        "host-loss pause s | stop-the-world pause s |")
    log("|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["pauses"]
        lost = next((v for k, v in p.items() if k.startswith("lose host")), None)
        cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        log(f"| {r['name']} | {r['status']} | {r['verified']} | {r['seconds']:.0f} | "
            f"{r['seconds'] / quiet['seconds']:.2f}x | {cell(p.get('stop-free resize'))} | "
            f"{cell(lost)} | {cell(p.get('stop-the-world resize'))} |")
    return 1 if failed else 0


def main(argv=None):
    global parts, runner, bstate
    args = parse_args(argv)
    log = lambda m: print(m, flush=True)  # noqa: E731
    if args.control_plane:
        return main_control_plane(args, log)
    if args.main_job:
        return main_main_job(args, log)
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import parts  # noqa: F811
    import runner  # noqa: F811
    import state as bstate  # noqa: F811
    ptc = bstate.build_ptc(args.size)
    log(f"state {bstate.state_bytes(ptc) / 1e9:.2f} GB per replica; {args.resizes} resizes per "
        f"phase; phases: quiet, " + ", ".join(f"stress-ng at {f}x the cores" for f in args.factors))
    work = tempfile.mkdtemp(prefix="reshard-load-", dir="/dev/shm")
    # The coordinator's own defaults for the timers (lease 10 s, tick 200 ms,
    # stall 20 s): the product as it is deployed.
    # Hosts 0-3 hold the job; 4 and 5 are spares that fail for real.
    c = local.LocalCluster(args.build, hosts=6, devices_per_host=runner.DEVICES_PER_HOST,
                           memory_limit_bytes=8 << 30, lease_ms=LEASE_MS, tick_ms=200, log=log,
                           work_dir=os.path.join(work, "cluster"))
    hosts = client = None
    rows, failed = [], False
    try:
        c.start()
        client = c.client(timeout=120.0)
        with open(os.path.join(work, "ptc.bin"), "wb") as f:
            f.write(ptc.SerializeToString())
        job_hosts, spares = c.host_ids[:4], c.host_ids[4:]
        hosts = parts.HostWorkers(job_hosts, os.path.join(os.path.abspath(args.build), "python"),
                                  log_dir=work)
        case = runner.cases_for(4)[1]
        old, new = case.layouts(job_hosts)
        per_host = {h: dict(host=h, socket=c.agents[h].worker_socket) for h in job_hosts}
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
                with LostWatch(client, job_hosts) as watch:
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
                found = detect_failures(c, client, spares[0], spares[1], log)
                log(f"   {name}: SIGKILLed agent LOST after "
                    + (f"{found[spares[0]]:.1f} s" if spares[0] in found else "NOT FOUND")
                    + ", SIGSTOPped agent LOST after "
                    + (f"{found[spares[1]]:.1f} s" if spares[1] in found else "NOT FOUND"))
            finally:
                if stress:
                    stress.stop()
            after = suspensions(c.coordinator_metrics)
            susp = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            rows.append(dict(name=name, committed=len(times), aborted=len(aborted),
                             median=statistics.median(times) if times else float("nan"),
                             lost=sorted(watch.lost), suspended=susp,
                             killed=found.get(spares[0]), stopped=found.get(spares[1])))
            failed |= bool(aborted) or bool(watch.lost) or len(found) < 2
    finally:
        for step in (lambda: hosts and hosts.close(), lambda: client and client.close(), c.stop):
            try:
                step()
            except Exception as e:  # noqa: B902 - keep tearing down
                log(f"cleanup: {e}")
        subprocess.run(["rm", "-rf", work])
    quiet = rows[0]["median"] if rows else float("nan")
    bound = (LEASE_MS + LEASE_MS / 3) / 1000
    log("\n| phase | committed | aborted | median resize s | slowdown | hosts falsely LOST | "
        f"lease judgement suspended (passes) | SIGKILLed agent LOST after s | SIGSTOPped agent "
        f"LOST after s (bound: lease + heartbeat = {bound:.1f}) |")
    log("|---|---|---|---|---|---|---|---|---|")
    seconds = lambda v: "not found" if v is None else f"{v:.1f}"  # noqa: E731
    for r in rows:
        susp = ", ".join(f"{k} {v}" for k, v in sorted(r["suspended"].items()) if v) or "0"
        log(f"| {r['name']} | {r['committed']} | {r['aborted']} | {r['median']:.2f} | "
            f"{r['median'] / quiet:.2f}x | {len(r['lost'])}{' ' + str(r['lost']) if r['lost'] else ''}"
            f" | {susp} | {seconds(r['killed'])} | {seconds(r['stopped'])} |")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
