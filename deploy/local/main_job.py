#!/usr/bin/env python3
"""The main job: a training-like job on a throwaway local reshard cluster.

Starts PostgreSQL, reshard-coordinator and five reshard-agents ("hosts") on
this machine (deploy/local/cluster.py), builds a small GPT-style model with
fp32 Adam state (numpy, or torch when it is installed), "trains" it for a few
steps, publishes every rank's shards through the agents' worker sockets, and
then drives the job through the reconfigurations a cluster scheduler makes:

  1. grow data parallelism onto two new hosts,
  2. change tensor and pipeline parallelism,
  3. migrate off one host onto a spare one,
  4. lose a host (SIGKILL, shared memory gone) and recover from the
     data-parallel replicas that survive elsewhere.

After each step every rank's new shards are loaded through the worker API and
compared byte for byte with the shards cut from the global tensors by
reshard.layout (an implementation of docs/partitioning.md independent of the
planner). A summary table shows each step's configuration, bytes copied within
hosts and across hosts, the lower bound on cross-host bytes, and the time.
Then (part two, with torch) a real tiny GPT trains across
reconfigurations of one job (deploy/local/training/elastic.py): a stop-free
resize prepared while it trains, a lost host recovered, and a stop-the-world
resize; it prints the loss next to an uninterrupted reference, the pause of
each reconfiguration (stop-free next to stop-the-world), and writes a PNG of
both loss curves (--plot; with matplotlib).
Everything started is stopped and removed at the end, on error and on Ctrl-C.
Exit status 0 only when every step committed and verified.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)


def train_elastic(cluster, plot_path):
    """Part two: a real PyTorch model trained across reconfigurations
    (deploy/local/training/elastic.py), one of them stop-free and one
    stop-the-world; prints the loss next to an uninterrupted reference run
    and the pause of each reconfiguration, and plots both curves."""
    import tempfile
    try:
        import torch  # noqa: F401
    except ImportError:
        print("\n== elastic training: skipped (torch is not installed; scripts/bootstrap.sh puts it in .venv)")
        return True
    sys.path.insert(0, os.path.join(HERE, "training"))
    import elastic
    import reshard
    elastic.STEPS = 8  # steps per phase after the first: a longer curve than the test's
    with cluster.client() as c:
        alive_ids = {h.host_id for h in c.list_hosts()
                     if h.state == reshard.agent_pb2.HOST_STATE_ALIVE}
    alive = [h for h in cluster.host_ids if h in alive_ids]
    print(f"\n== elastic training: tiny GPT (float64, tp/dp over gloo, Adam, dropout), "
          f"global batch {elastic.BATCH}, steps of at least {elastic.MIN_STEP_S} s; the first "
          f"layout trains on while a stop-free resize is prepared")
    with cluster.client() as client, tempfile.TemporaryDirectory() as work:
        out = elastic.run(cluster, client, "elastic-gpt", work, hosts=alive[:4], log=print)
    worst = 0.0
    starts = {p["after_step"]: p["how"] for p in out["pauses"]}
    print("  step  loss                 reference            rel. diff")
    for s, (a, b) in enumerate(zip(out["losses"], out["want_losses"]), 1):
        worst = max(worst, abs(a - b) / abs(b))
        if s - 1 in starts:
            print(f"  ---- {starts[s - 1]}")
        print(f"  {s:4d}  {a:.15f}  {b:.15f}  {abs(a - b) / abs(b):.1e}")
    print("  pause of each reconfiguration (end of the last step on the old layout -> start of "
          "the first on the new):")
    for p in out["pauses"]:
        line = f"    {p['how']:<22} {p['pause_s']:6.2f} s"
        if p["stop_free"]:
            line += (f"  (prepared in {p['prepare_s']:.2f} s while the old layout trained "
                     f"{p['cut_step'] - elastic.STEPS} more steps; agents pre-copied "
                     f"{p['precopied_bytes'] / 1024:.1f} KiB, moved "
                     f"{p['moved_again_bytes'] / 1024:.1f} KiB again at the cut-over; "
                     f"coordinator cut-over -> commit {p['coordinator_pause_s']:.2f} s)")
        else:
            line += "  (publish, reconfigure, start the new ranks cold, load)"
        print(line)
    by_how = {p["how"]: p["pause_s"] for p in out["pauses"]}
    if "stop-free resize" in by_how and "stop-the-world resize" in by_how:
        print(f"  same job, same run: stop-free resize paused {by_how['stop-free resize']:.2f} s, "
              f"stop-the-world resize {by_how['stop-the-world resize']:.2f} s")
    ids, n = out["ids"], elastic.N
    once = all(sorted(ids[e * n:(e + 1) * n]) == list(range(n)) for e in range(len(ids) // n))
    once = once and len(set(ids[len(ids) // n * n:])) == len(ids) % n
    ok = worst <= 1e-9 and once and len(out["losses"]) == len(out["want_losses"])
    print(f"  loss vs reference: worst relative difference {worst:.1e} (bound 1e-9); every "
          f"sample read exactly once per epoch: {'yes' if once else 'NO'}")
    print(f"  {plot(out, plot_path)}")
    return ok


def plot(out, path):
    """Writes the loss curves (and where each reconfiguration happened) to a
    PNG with matplotlib; says where, or why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot: skipped (matplotlib is not installed; scripts/bootstrap.sh puts it in .venv)"
    steps = range(1, len(out["losses"]) + 1)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(steps, out["want_losses"], color="0.6", linewidth=4, label="reference (one process)")
    ax.plot(steps, out["losses"], color="C0", linewidth=1.2, label="elastic (reshard)")
    for p in out["pauses"]:
        ax.axvline(p["after_step"] + 0.5, color="C3" if p["stop_free"] else "C1", linestyle="--")
        ax.text(p["after_step"] + 0.9, max(out["losses"]), f"{p['how']}: pause {p['pause_s']:.2f} s",
                rotation=90, fontsize=8, va="top", ha="left")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("tiny GPT across reconfigurations: elastic run vs uninterrupted reference")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def main():
    parser = argparse.ArgumentParser(description="reshard main job on a local cluster")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="CMake build directory")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--keep-logs", action="store_true", help="print every process's log tail at the end")
    parser.add_argument("--no-training", action="store_true",
                        help="skip the elastic training part (it needs torch)")
    parser.add_argument("--plot", default=None,
                        help="PNG of the training loss curves (default: <build>/elastic_training.png)")
    args = parser.parse_args()

    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    sys.path.insert(0, HERE)
    from cluster import LocalCluster, install_signal_handlers  # noqa: E402
    from job import TrainingJob  # noqa: E402

    install_signal_handlers()
    started = time.monotonic()
    try:
        with LocalCluster(args.build, hosts=5, devices_per_host=2, spare_bytes=256 << 20,
                          heartbeat_ms=200,
                          log=print) as cluster:
            job = TrainingJob(cluster, layers=args.layers, hidden=args.hidden, log=print)
            ok = job.run()
            if ok and not args.no_training:
                ok = train_elastic(cluster, args.plot or os.path.join(
                    os.path.abspath(args.build), "elastic_training.png"))
            if args.keep_logs:
                print(cluster.logs())
    except KeyboardInterrupt:
        print("\nmain job: interrupted; the cluster was stopped and removed", file=sys.stderr)
        return 130
    print(f"\nmain job: {'every step verified byte for byte' if ok else 'FAILED'} "
          f"({time.monotonic() - started:.1f} s, cluster stopped and removed)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
