"""--predict: the cost model against what operations take (docs/scheduler.md).

One job of the benchmark's state (--size) on 4 emulated hosts runs a
sequence of migrations, resizes and a recovery, each moving at least a GB
across hosts; for each, the prediction the coordinator planned it with
(Operation.prediction) against what it took (planned -> committed,
Operation.actual_seconds), and whether every rate the prediction used was
learned from an earlier operation (calibrated). The first operations of a
cluster are predicted from seeds (the agents' probes, the default link
rate); the rest from rates measured by the ones before. At the end every
byte of the final generation is loaded and checked.
"""

import json
import os
import shutil
import subprocess
import time

import reshard
from reshard import layout as rlayout
from reshard._proto import agent_pb2, ptc_pb2

import parts

GB = 1e9


def _layout(tp, pp, dp, hosts):
    return rlayout.make_layout(tp, pp, dp, hosts=hosts, devices_per_host=2)


def steps(h):
    """(what, kind, target, lost hosts) in order, on hosts h[0..3]."""
    a, b = [h[0], h[1]], [h[2], h[3]]
    return [
        ("migrate to h2,h3", "migrate", _layout(2, 2, 1, b), ()),
        ("migrate to h0,h1", "migrate", _layout(2, 2, 1, a), ()),
        ("migrate to h2,h3", "migrate", _layout(2, 2, 1, b), ()),
        ("migrate to h0,h1", "migrate", _layout(2, 2, 1, a), ()),
        ("resize dp 1 -> 2", "resize", _layout(2, 2, 2, a + b), ()),
        ("resize tp2 pp2 -> tp4 pp1", "resize", _layout(4, 1, 2, a + b), ()),
        ("resize tp4 pp1 -> tp2 pp2", "resize", _layout(2, 2, 2, a + b), ()),
        # h1 is lost (agent SIGKILLed, shared memory gone): stage 0 survives
        # on h0 (data-parallel replica 0), stage 1 on h2 and h3; the new
        # layout puts stage 0 on h2 and stage 1 on h0, so both cross.
        ("recover h1 lost, onto h2,h0", "recover", _layout(2, 2, 1, [h[2], h[0]]), (h[1],)),
    ]


def simulate(bench, ptc, old, new, lost, prediction, n):
    """The scale simulator's time for the same move (bench/scale,
    reshard_scale_sim --plane host-memory) on this cluster's topology: 4
    hosts of 2 devices, one NIC each at the shaped rate, the machine's cores
    shared by the 4 agents, and the per-byte costs the coordinator predicted
    this operation with (its learned CPU per byte and check rates, its
    overhead). Returns its total seconds, or None when the binary is not
    built."""
    binary = os.path.join(os.path.abspath(bench.args.build), "bench", "scale", "reshard_scale_sim")
    if not os.path.exists(binary):
        return None
    files = {}
    for name, msg in (("ptc", ptc), ("from", old), ("to", new)):
        files[name] = os.path.join(bench.work_dir, f"sim-{n}-{name}.bin")
        with open(files[name], "wb") as f:
            f.write(msg.SerializeToString())
    cores = (os.cpu_count() or 1) / 4
    cpu = [h.cpu_seconds / (h.bytes_in + h.bytes_out + h.bytes_local) for h in prediction.hosts
           if h.cpu_seconds > 0 and h.bytes_in + h.bytes_out + h.bytes_local > 0]
    checks = [h.bytes_new / (h.verify_seconds + h.seal_seconds) for h in prediction.hosts
              if h.verify_seconds + h.seal_seconds > 0 and h.bytes_new > 0]
    sets = [f"nic={bench.args.rate_gbit:g}Gb/s", f"agent_cores={cores:g}",
            f"overhead={prediction.overhead_seconds:.6f}s"]
    if cpu:
        per_gb = max(cpu) * 1e9
        sets += [f"cpu_per_byte={per_gb:.6f}s/GB", f"cpu_per_local_byte={per_gb:.6f}s/GB"]
    if checks:
        sets.append(f"hash={min(checks) / cores / 1e9:.6f}GB/s")
    argv = [binary, "--ptc", files["ptc"], "--from", files["from"], "--to", files["to"],
            "--topology", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "emulated.topo"), "--plane", "host-memory", "--json"]
    for x in lost:
        argv += ["--lost", x]
    for x in sets:
        argv += ["--set", x]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"reshard_scale_sim: {out.stderr.strip()}")
    return json.loads(out.stdout)["total_seconds"]


def run(bench):
    """Runs the sequence on `bench` (started); returns the table's rows."""
    client, cluster = bench.client, bench.cluster
    h = cluster.host_ids
    plan = steps(h)
    start = _layout(2, 2, 1, [h[0], h[1]])
    final = plan[-1][2]
    spec = ptc_pb2.JobSpec(name=f"bench-predict-{os.getpid()}", tenant="bench", ptc=bench.ptc,
                           layout=start)
    job, token = client.register_job(spec, with_token=True)
    per_host = {x: dict(host=x, socket=cluster.agents[x].worker_socket) for x in h}
    common = dict(ptc=os.path.join(bench.work_dir, "ptc.bin"),
                  old=start.SerializeToString().hex(), new=final.SerializeToString().hex())
    rows = []
    try:
        bench.hosts.all("case", per_host, **common)
        bench.hosts.all("generate")
        bench.hosts.all("publish", job_id=job.id, worker_token=token, generation=job.generation)
        bench.hosts.all("drop_old")
        for what, kind, target, lost in plan:
            current = client.get_job(job.id)
            if kind == "migrate":
                op = client.migrate(job.id, target)
            elif kind == "resize":
                op = client.resize(job.id, target)
            else:
                for x in lost:
                    cluster.lose_host(x)
                _wait_lost(client, lost)
                # Two hosts at dp 1 cannot survive another loss: accepted.
                op = client.recover(job.id, list(lost), layout=target,
                                    expected_generation=current.generation, accept_degraded=True)
            done = client.wait(op.id, timeout=900)
            if done.state != reshard.OperationState.Value("OPERATION_STATE_COMMITTED"):
                raise RuntimeError(f"{what}: {reshard.OperationState.Name(done.state)}: "
                                   f"{done.error}")
            shown = client.get_operation(op.id)
            p = shown.prediction
            simulated = simulate(bench, bench.ptc, current.layout, done.target_layout, lost, p,
                                 len(rows))
            rows.append(dict(what=what, kind=kind, cross_gb=shown.stats.bytes_cross_host / GB,
                             predicted_s=p.seconds, actual_s=shown.actual_seconds,
                             bound_s=p.bound_seconds, critical=p.critical_host,
                             calibrated=p.calibrated, simulated_s=simulated))
            bench.log(f"   {what}: {rows[-1]['cross_gb']:.2f} GB cross-host, predicted "
                      f"{p.seconds:.2f} s ({'calibrated' if p.calibrated else 'seeded'}), "
                      f"took {shown.actual_seconds:.2f} s")
        # Every byte of the final generation, as the new ranks load it (the
        # lost host's worker process has no rank of it).
        gen = client.get_job(job.id).generation
        bench.hosts.all("load", job_id=job.id, worker_token=token, generation=gen)
        checked = sum(r["bytes"] for r in bench.hosts.all("check_load").values())
        bench.log(f"   verified {checked / GB:.2f} GB of the final generation")
    except parts.HostError as e:
        raise RuntimeError(str(e)) from None
    finally:
        # The coordinator logs each host's phase timings against the
        # prediction ("task took"); kept for reading after the run.
        kept = os.path.join(os.getcwd(), "bench-predict-coordinator.log")
        try:
            shutil.copyfile(os.path.join(cluster.work_dir, "coordinator.log"), kept)
            bench.log(f"   coordinator log kept in {kept}")
        except OSError as e:
            bench.log(f"   coordinator log not kept: {e}")
    return rows


def _wait_lost(client, hosts, timeout=120.0):
    deadline = time.monotonic() + timeout
    lost = agent_pb2.HOST_STATE_LOST
    while True:
        states = {x.host_id: x.state for x in client.list_hosts()}
        if all(states.get(x) == lost for x in hosts):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"hosts {list(hosts)} not LOST after {timeout} s: {states}")
        time.sleep(0.2)  # poll interval of the lease check


def table(rows, title):
    head = ["operation", "cross GB", "predicted s", "actual s", "actual/pred", "bound s",
            "rates", "simulated s", "actual/sim"]

    def sim(r):
        s = r.get("simulated_s")
        return ([f"{s:.2f}", f"{r['actual_s'] / s:.2f}x"] if s else ["-", "-"])
    body = [[r["what"], f"{r['cross_gb']:.2f}", f"{r['predicted_s']:.2f}", f"{r['actual_s']:.2f}",
             f"{r['actual_s'] / r['predicted_s']:.2f}x" if r["predicted_s"] > 0 else "-",
             f"{r['bound_s']:.2f}", "learned" if r["calibrated"] else "seeds"] + sim(r)
            for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = [title, "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                     for i, (c, w) in enumerate(zip(head, widths)))]
    for row in body:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths))))
    learned = [r["actual_s"] / r["predicted_s"] for r in rows
               if r["calibrated"] and r["predicted_s"] > 0 and r["cross_gb"] >= 1]
    if learned:
        within = sum(1 for x in learned if 0.75 <= x <= 1.25)
        lines.append(f"  learned rates, >= 1 GB: {within} of {len(learned)} within +-25% "
                     f"(actual/predicted {min(learned):.2f}x .. {max(learned):.2f}x)")
    simulated = [r["actual_s"] / r["simulated_s"] for r in rows
                 if r["calibrated"] and r.get("simulated_s") and r["cross_gb"] >= 1]
    if simulated:
        within = sum(1 for x in simulated if 0.75 <= x <= 1.25)
        lines.append(f"  scale simulator, learned costs, >= 1 GB: {within} of {len(simulated)} "
                     f"within +-25% (actual/simulated {min(simulated):.2f}x .. "
                     f"{max(simulated):.2f}x)")
    return "\n".join(lines)
