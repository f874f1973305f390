#!/usr/bin/python3
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


def main():
    parser = argparse.ArgumentParser(description="reshard main job on a local cluster")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="CMake build directory")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--keep-logs", action="store_true", help="print every process's log tail at the end")
    args = parser.parse_args()

    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    sys.path.insert(0, HERE)
    from cluster import LocalCluster, install_signal_handlers  # noqa: E402
    from job import TrainingJob  # noqa: E402

    install_signal_handlers()
    started = time.monotonic()
    try:
        with LocalCluster(args.build, hosts=5, devices_per_host=2, spare_bytes=256 << 20,
                          log=print) as cluster:
            job = TrainingJob(cluster, layers=args.layers, hidden=args.hidden, log=print)
            ok = job.run()
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
