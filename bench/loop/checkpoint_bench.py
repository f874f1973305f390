#!/usr/bin/env python3
"""What a periodic checkpoint costs the training step: reshard.elastic.Loop's
step end (Loop.boundary, which pytorch_loop's step_end is) on checkpoint steps
against ordinary ones.

A LocalCluster on this machine (real PostgreSQL, coordinator, one agent at the
coordinator's default timers) and one job of --ranks gloo ranks on one host,
one process each, holding --mb MB of float32 state (a replicated tensor "w"
and a blob "step"). Each step changes "w" in place and sleeps --step-ms (the
step's compute); the loop checkpoints every --every steps. Per rank, the wall
time of every step end is recorded; the table gives median / max over every
rank of checkpoint and ordinary step ends, and how many checkpoints
committed. Each rank loads the generation of every periodic checkpoint once
it is recorded committed and checks that it holds the state of its own step
(exit 1 if not, or if a checkpoint did not commit).

--compare REF runs the same job a second time with the reshard/core/elastic.py
of git revision REF (the rest of the package as built), and prints both side
by side: the loop as it was against the loop as it is.

    .venv/bin/python bench/loop/checkpoint_bench.py [--build build] [--steps 60]
        [--every 5] [--mb 1.2] [--ranks 2] [--step-ms 50] [--compare REF] [--quick]

Exit status: 0 done, 1 failed.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--mb", type=float, default=1.2, help="state per rank, MB (float32)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=50.0, help="each step's compute (a sleep)")
    p.add_argument("--compare", metavar="REF",
                   help="also run the loop of git revision REF (its reshard/core/elastic.py)")
    p.add_argument("--quick", action="store_true", help="smoke: --steps 12 --every 3")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # one rank's process
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.every = 12, 3
    return args


# ------------------------------------------------------------------ one rank

def run_rank(rank, cfg_path):
    """One rank: publish generation 1, train cfg["steps"] steps through a
    Loop, finish, then check every periodic checkpoint's generation."""
    import numpy as np
    import torch.distributed as dist

    import reshard
    from reshard import data, elastic

    with open(cfg_path) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank,
                            world_size=cfg["ranks"])
    client = reshard.Client(cfg["coordinator"], token=cfg["token"],
                            credentials=reshard.tls_credentials(cfg["ca"]))
    worker = reshard.Worker(cfg["socket"], cfg["job_id"], ptc=cfg["ptc"],
                            worker_token=cfg["token"])
    state = data.DatasetState.from_dict(cfg["dataset"])
    w = np.zeros(cfg["elements"], np.float32)

    def shard(step):
        return lambda: {"w": w, "step": np.array([step], np.int64).tobytes()}

    worker.publish(rank, 1, shard(0)())
    loop = elastic.Loop(client, cfg["job_id"], rank, worker, every_steps=cfg["every"])
    times = []  # (step, seconds of its step end)
    checked, wrong = 0, []
    for step in range(1, cfg["steps"] + 1):
        w += 1.0  # the step changes the state in place
        time.sleep(cfg["step_ms"] / 1000.0)
        state = state.advanced()
        t0 = time.perf_counter()
        cut = loop.boundary(state, shard(step))
        times.append((step, time.perf_counter() - t0))
        if cut is not None:
            raise SystemExit(f"rank {rank}: the loop was cut at step {step}: {cut}")
        if len(loop.checkpoints) > checked:
            # Just committed (the next one, if started, commits later): the
            # generation holds the state of its own step, not of a later one.
            checked = len(loop.checkpoints)
            ck_step, generation, _ = loop.checkpoints[-1]
            got = worker.load(rank, generation)
            if not (np.all(got["w"] == float(ck_step)) and
                    bytes(got["step"]) == np.array([ck_step], np.int64).tobytes()):
                wrong.append((ck_step, generation))
    final = loop.finish(state, shard(cfg["steps"]))
    with open(cfg["out"], "w") as f:
        json.dump({"times": times, "checkpoints": [list(c) for c in loop.checkpoints],
                   "folded": loop.folded, "final_generation": final.generation,
                   "wrong": wrong}, f)
    worker.close()
    client.close()
    dist.destroy_process_group()


# --------------------------------------------------------------- the driver

def package_at(ref, build, tmp):
    """A copy of the built package whose reshard/core/elastic.py is REF's."""
    dst = os.path.join(tmp, f"python-{ref}")
    shutil.copytree(os.path.join(build, "python"), dst)
    src = subprocess.run(["git", "-C", ROOT, "show", f"{ref}:client/python/reshard/core/elastic.py"],
                         check=True, capture_output=True).stdout
    with open(os.path.join(dst, "reshard", "core", "elastic.py"), "wb") as f:
        f.write(src)
    return dst


def run_job(cluster, client, args, pythonpath, tmp, name):
    import reshard
    from reshard import data, layout

    host = cluster.host_ids[0]
    elements = int(args.mb * 1e6 / 4)
    ptc = {"numLayers": 1, "tensors": [
        {"name": "w", "dtype": "DTYPE_FLOAT32", "shape": [elements], "partition": {
            "tp": {"mode": "TP_REPLICATED"}, "pipeline": {"mode": "PIPELINE_EVERY_STAGE"},
            "dp": {"mode": "DP_REPLICATED"}}}],
        "blobs": [{"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"}]}
    lay = layout.make_layout(1, 1, args.ranks, [host], args.ranks)
    dataset = data.DatasetState(data.DatasetDescriptor("bench", 10_000_000, "v1"),
                                data.Order(seed=1), global_batch=8)
    job = client.register_job({"name": f"loop-bench-{name}-{os.getpid()}", "tenant": "training",
                               "ptc": ptc, "layout": reshard.to_dict(lay)},
                              dataset_state=dataset)
    work = os.path.join(tmp, name)
    os.makedirs(work)
    outs = [os.path.join(work, f"rank{r}.json") for r in range(args.ranks)]
    procs = []
    for r in range(args.ranks):
        cfg = {"store": os.path.join(work, "store"), "ranks": args.ranks,
               "coordinator": cluster.coordinator, "token": cluster.worker_token(job.id),
               "ca": cluster.pki.ca, "socket": cluster.agents[host].worker_socket,
               "job_id": job.id, "ptc": ptc, "dataset": dataset.to_dict(),
               "elements": elements, "steps": args.steps, "every": args.every,
               "step_ms": args.step_ms, "out": outs[r]}
        path = os.path.join(work, f"cfg{r}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank",
                                       str(r), "--config", path], env=env))
    codes = [p.wait(timeout=600) for p in procs]
    if codes != [0] * args.ranks:
        raise SystemExit(f"{name}: ranks exited with {codes}")
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
    return results


def summary(results, every):
    ck = [t * 1e3 for r in results for s, t in r["times"] if s % every == 0]
    plain = [t * 1e3 for r in results for s, t in r["times"] if s % every]
    return {"checkpoint_median_ms": statistics.median(ck), "checkpoint_max_ms": max(ck),
            "plain_median_ms": statistics.median(plain), "plain_max_ms": max(plain),
            "committed": len(results[0]["checkpoints"]), "folded": len(results[0]["folded"]),
            "wrong": [w for r in results for w in r["wrong"]]}


def main(argv=None):
    args = parse_args(argv)
    if args.rank is not None:
        return run_rank(args.rank, args.config)
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    sys.path.insert(0, os.path.join(ROOT, "deploy", "local"))
    from cluster import LocalCluster

    tmp = tempfile.mkdtemp(prefix="reshard-loop-bench-")
    variants = [("now", os.path.join(build, "python"))]
    if args.compare:
        variants.insert(0, (args.compare, package_at(args.compare, build, tmp)))
    rows, failed = [], False
    try:
        with LocalCluster(build_dir=build, hosts=1, devices_per_host=args.ranks,
                          work_dir=os.path.join(tmp, "cluster")) as cluster:
            with cluster.client(timeout=60.0) as client:
                for i, (name, path) in enumerate(variants):
                    got = summary(run_job(cluster, client, args, path, tmp, f"v{i}"), args.every)
                    rows.append((name, got))
                    want = args.steps // args.every
                    if got["wrong"] or got["committed"] + got["folded"] != want:
                        print(f"{name}: FAILED: {got['committed']} of {want} checkpoints "
                              f"committed, wrong generations {got['wrong']}")
                        failed = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"step end (Loop.boundary), {args.ranks} ranks x {args.mb} MB, {args.steps} steps of "
          f"{args.step_ms:.0f} ms, a checkpoint every {args.every}:")
    print(f"{'loop':>12} | {'checkpoint median':>17} {'max':>8} | {'ordinary median':>15} "
          f"{'max':>8} | committed")
    for name, g in rows:
        print(f"{name:>12} | {g['checkpoint_median_ms']:14.1f} ms {g['checkpoint_max_ms']:5.1f} ms"
              f" | {g['plain_median_ms']:12.1f} ms {g['plain_max_ms']:5.1f} ms | "
              f"{g['committed']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
