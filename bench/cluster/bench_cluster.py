#!/usr/bin/env python3
"""Emulated-cluster benchmark: reshard against a central-storage baseline.

N hosts are network namespaces joined to a bridge by veth pairs, each link
shaped with tc tbf to --rate-gbit in both directions; one reshard-agent per
host namespace; PostgreSQL and the coordinator in the root namespace; nginx
(WebDAV PUT, ranged GET, tmpfs root) in a storage namespace behind the same
kind of link. Each case moves a GPT-style state from one layout to another
with reshard (publish, resize, load) and with central storage (old ranks save,
new ranks read the overlapping pieces), verifies every loaded byte, and
prints one table (medians of --reps). --unshaped runs the agents in the root
namespace on loopback and reports CPU cost and rates against ucx_perftest and
memcpy instead of the central baseline.

    scripts/bench_cluster.sh [--hosts 4] [--rate-gbit 2] [--cases 1,2,3,4] [--reps 3]
                             [--size full|half|quick] [--quick] [--unshaped] [--json FILE]
                             [--predict]

Exit status: 0 done, 1 failed (a transfer failed or a byte differs),
77 skipped (namespaces, tc or nginx missing here).
"""

import argparse
import json
import shutil
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXIT_SKIP = 77


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--hosts", type=int, default=4, choices=(4, 8))
    p.add_argument("--rate-gbit", type=float, default=2.0, help="link rate (2, 5, 10, ...)")
    p.add_argument("--cases", default="1,2,3,4", help="comma-separated: 1 transition, 2 dp, "
                   "3 tp, 4 pp")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--spare-bytes", type=int, default=None,
                   help="each agent's --spare-bytes (default: the agent's own default)")
    p.add_argument("--keep-dropped-ms", type=int, default=None,
                   help="each agent's --keep-dropped-ms (default: the agent's own default)")
    p.add_argument("--size", choices=("full", "half", "quick"), default="full")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: --size quick --reps 1 (all cases unless --cases)")
    p.add_argument("--unshaped", action="store_true",
                   help="agents in the root namespace on loopback: CPU and rate yardsticks")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--predict", action="store_true",
                   help="instead of the cases: the cost model's predictions against what a "
                   "sequence of migrations, resizes and a recovery take (4 hosts)")
    p.add_argument("--perf", metavar="DIR", help="profile the agents during each resize with "
                   "perf (DIR/case<N>-rep<R>.data) and print where their CPU went per GB written")
    a = p.parse_args(argv)
    if a.quick:
        a.size, a.reps = "quick", 1
    if a.predict and (a.unshaped or a.hosts != 4):
        p.error("--predict runs on 4 shaped hosts (no --unshaped, --hosts 4)")
    a.cases = [int(c) for c in a.cases.split(",")]
    if any(c not in (1, 2, 3, 4) for c in a.cases) or a.reps < 1 or a.rate_gbit <= 0:
        p.error("--cases takes 1..4, --reps >= 1, --rate-gbit > 0")
    if a.perf:
        if not shutil.which("perf"):
            p.error("--perf needs perf (Debian package linux-perf)")
        os.makedirs(a.perf, exist_ok=True)
        a.perf = os.path.abspath(a.perf)
    return a


def skip_reason(unshaped):
    import netns
    import central
    if unshaped:
        return None if shutil.which("ucx_perftest") else "ucx_perftest missing (ucx-utils)"
    why = netns.missing_capability()
    if why:
        return why
    if not central.nginx_binary():
        return "nginx missing (Debian package nginx-light; scripts/bootstrap.sh installs it)"
    return None


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    why = skip_reason(args.unshaped)
    if why:
        print(f"bench_cluster: SKIPPED: {why}", flush=True)
        return EXIT_SKIP
    from runner import Bench, BenchFailure
    import report

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGINT, stop)
    bench = Bench(args, log=lambda m: print(m, flush=True))
    try:
        bench.start()
        if args.predict:
            import predict_run
            rows = predict_run.run(bench)
            print(predict_run.table(rows, f"\n== bench/cluster --predict: 4 hosts, links "
                                          f"{args.rate_gbit:g} Gbit/s each way, size {args.size}"),
                  flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(rate_gbit=args.rate_gbit, size=args.size, predict=rows), f,
                              indent=1)
            return 0
        results = [bench.run_case(c) for c in args.cases]
    except (BenchFailure, RuntimeError) as e:
        print(f"bench_cluster: FAILED: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("bench_cluster: interrupted", flush=True)
        return 130
    finally:
        bench.close()
    title = (f"\n== bench/cluster: {args.hosts} hosts, "
             + ("unshaped (root namespace, loopback)" if args.unshaped
                else f"links {args.rate_gbit:g} Gbit/s each way") + f", size {args.size}")
    print(report.table(results, args.unshaped, title), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(hosts=args.hosts, rate_gbit=None if args.unshaped else args.rate_gbit,
                           size=args.size, reps=args.reps, cases=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
