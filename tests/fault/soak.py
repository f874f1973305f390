#!/usr/bin/env python3
"""A bounded soak of reshard on a real local cluster (tests/fault).

One small GPT-style job (fp16 weights, fp32 Adam state, a few MiB) on five
agents of two devices each. `--ops` random operations: resizes to a random
tp/pp/dp (tp, pp in 1/2/4, world <= 10) on random device slots, or migrations
of the current config onto other slots. Every `--kill-every` operations one
agent taking part is SIGKILLed while the operation transfers and restarted at
once with its shared-memory files kept (a crashed and restarted agent).

After each operation: it must be COMMITTED, ABORTED or FAILED within
`--final-within` seconds (else it is counted stuck and cancelled); a committed
generation is loaded on every rank and compared byte for byte with
reshard.layout's shards; after an abort the previous generation must be
current and intact, and the same target is retried (at most `--retries`
times). At the end: shard files and the agents' memory accounting must be
exactly the current generation's, and the cluster's processes one per part.

The agents' memory (issue 19): each agent's RSS is sampled after every
operation. Once an agent process has taken part in `--rss-warmup` operations
(counted from its start: a restarted agent warms up again) its RSS is its
warm mark; it must stay within `--rss-tolerance-mib` of that mark to the end
(flat after warm-up: its end is the lowest of its last RSS_END_SAMPLES samples
from the warm mark on, as one sample right after an operation still holds
heap the agent trims at most once a second; a leak raises all of them), and
after the job is deleted at the end it must be back
within the same tolerance of it, with every agent's worker cache empty
(reshard_agent_worker_cache_entries 0). The tolerance (16 MiB by default)
is above what an agent's RSS moves by without a leak on a loaded 2-core box
(malloc arenas of new task threads, UCX and gRPC buffers: a few MiB) and
below what the leak the check exists for grew by (the worker service's cache
of every generation: 30 MB over 1,200 operations, 70 MB over 60 checkpoints
of a 2,000-tensor PTC). A short run cannot see a slow leak within that
tolerance: tests/agent/e2e/worker_guard_e2e_test.cc measures the cache's
growth directly.

Prints operations committed / aborted / retried / stuck, every process's RSS
and every host's files and accounting before and after. Exit status 0 only
with 0 stuck operations, 0 mismatches, 0 leaks and no agent RSS growth.

    .venv/bin/python tests/fault/soak.py --build build --ops 60 --seed 1
"""

import argparse
import collections
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# An agent's RSS at the end: the lowest of its last this many samples.
RSS_END_SAMPLES = 5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("RESHARD_BUILD_DIR",
                                                      os.path.join(HERE, "..", "..", "build")))
    ap.add_argument("--ops", type=int, default=60, help="operations to run (retries not counted)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=5)
    ap.add_argument("--kill-every", type=int, default=4,
                    help="SIGKILL + restart an agent during every N-th operation (0: never)")
    ap.add_argument("--retries", type=int, default=3, help="retries of an aborted operation")
    ap.add_argument("--final-within", type=float, default=60.0,
                    help="seconds an operation may take to become final before it counts as stuck")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="stop starting operations after this many seconds (0: no limit)")
    ap.add_argument("--rss-warmup", type=int, default=5,
                    help="operations an agent process takes part in before its RSS is its mark")
    ap.add_argument("--rss-tolerance-mib", type=float, default=16.0,
                    help="MiB an agent's RSS may grow past its warm mark (to the end, and "
                         "after the job is deleted)")
    args = ap.parse_args()
    os.environ["RESHARD_BUILD_DIR"] = os.path.abspath(args.build)
    sys.path.insert(0, HERE)
    import faultlib  # noqa: E402 (needs RESHARD_BUILD_DIR)
    import reshard  # noqa: E402
    from reshard import layout as rlayout  # noqa: E402
    from cluster import LocalCluster, install_signal_handlers  # noqa: E402

    install_signal_handlers()
    rng = random.Random(args.seed)
    dph = 2
    configs = [(tp, pp, dp) for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in range(1, 11)
               if tp * pp * dp <= args.hosts * dph]
    counts = dict(committed=0, aborted=0, failed=0, retried=0, stuck=0, kills=0, refused=0,
                  ucx_aborts=0)
    problems = []
    started = time.monotonic()

    with LocalCluster(args.build, hosts=args.hosts, devices_per_host=dph,
                      work_dir=os.environ.get("RESHARD_FAULT_WORK_DIR")) as cluster, \
            cluster.client(timeout=30.0, max_attempts=20, max_backoff=1.0) as client:
        slots_all = [(h, d) for h in cluster.host_ids for d in range(dph)]

        def random_layout(tp, pp, dp):
            ranks = rng.sample(slots_all, tp * pp * dp)
            return rlayout.make_layout(tp, pp, dp, ranks=ranks)

        job = faultlib.Job(cluster, client, f"soak-{args.seed}-{os.getpid()}", layers=4,
                           hidden=64, vocab=512, seq=64)
        job.register_and_publish(job.make_layout(2, 2, 1, cluster.host_ids[0:2]))
        print(f"soak: seed {args.seed}, {args.ops} operations on {args.hosts} agents x {dph} "
              f"devices, job {job.id} ({job.bytes / 2**20:.1f} MiB of state), an agent "
              f"SIGKILL + restart every {args.kill_every} operations", flush=True)

        def snapshot():
            rss = {name: (cluster.rss_bytes(pid), pid)
                   for name, pid in sorted(cluster.processes().items())}
            files = {h: cluster.shm_files(h) for h in cluster.host_ids}
            return rss, files, faultlib.accounting(cluster)

        faultlib.check_no_leaks(cluster, [job])
        census = faultlib.process_census(cluster)
        before = snapshot()
        # Agent RSS per process: {name: {pid: [operations seen, warm mark,
        # samples from the warm mark on (the last RSS_END_SAMPLES)]}}.
        agent_rss = {}

        def sample_agent_rss(op_hosts):
            for name, pid in cluster.processes().items():
                if not name.startswith("reshard-agent "):
                    continue
                rss = cluster.rss_bytes(pid)
                if rss is None:
                    continue
                seen = agent_rss.setdefault(name, {}).setdefault(
                    pid, [0, None, collections.deque(maxlen=RSS_END_SAMPLES)])
                if name.split(" ", 1)[1] in op_hosts:
                    seen[0] += 1
                if seen[1] is None and seen[0] >= args.rss_warmup:
                    seen[1] = rss
                if seen[1] is not None:
                    seen[2].append(rss)

        def run_one(i, target, migrate, kill):
            """One attempt; returns the final Operation or None if stuck."""
            gen, lay = job.current().generation, job.layout
            if migrate:
                op = client.migrate(job.id, target)
            else:
                op = client.resize(job.id, target)
            if kill:
                hosts = sorted(set(rlayout.hosts_of(lay)) | set(rlayout.hosts_of(target)))
                victim = rng.choice(hosts)
                n0 = faultlib.tasks_started(cluster, victim)
                if faultlib.wait_transferring(client, op.id) and rng.random() < 0.5:
                    faultlib.wait_task_started(cluster, victim, n0, timeout=5.0)
                cluster.restart_agent(victim, keep_shm=True)
                counts["kills"] += 1
                print(f"  op {i}: SIGKILLed and restarted {victim} (shm kept)", flush=True)
            try:
                final = job.wait_final(op.id, timeout=args.final_within)
            except faultlib.FaultCheckError as e:
                counts["stuck"] += 1
                problems.append(f"op {i}: stuck: {e}")
                print(f"  op {i}: STUCK: {e}", flush=True)
                try:
                    client.cancel_operation(op.id)
                    job.wait_final(op.id, timeout=args.final_within)
                except (reshard.ReshardError, faultlib.FaultCheckError) as e2:
                    raise SystemExit(f"soak: op {i} cannot even be cancelled: {e2}")
                return None
            if kill:
                # A peer the kill took down through a UCX 1.13 abort
                # (faultlib.UCX_PEER_DEATH_ABORTS) comes back as under a restart
                # policy; an agent dead of anything else ends the soak.
                counts["ucx_aborts"] += len(faultlib.restart_agents_ucx_aborted(cluster))
            job.check_outcome(final, gen, lay, target)
            return final

        i = 0
        while i < args.ops:
            if args.time_limit and time.monotonic() - started > args.time_limit:
                print(f"soak: time limit {args.time_limit:.0f} s reached after {i} operations")
                break
            cur = job.layout.config
            migrate = rng.random() < 0.3
            if migrate:
                target = random_layout(cur.tp, cur.pp, cur.dp)
            else:
                target = random_layout(*rng.choice(configs))
            kill = args.kill_every > 0 and i % args.kill_every == args.kill_every - 1
            desc = (f"{'migrate' if migrate else 'resize'} to tp{target.config.tp} "
                    f"pp{target.config.pp} dp{target.config.dp} on "
                    f"{len(rlayout.hosts_of(target))} hosts")
            op_hosts = set(rlayout.hosts_of(job.layout)) | set(rlayout.hosts_of(target))
            try:
                for attempt in range(args.retries + 1):
                    if attempt:
                        counts["retried"] += 1
                    final = run_one(i, target, migrate, kill and attempt == 0)
                    if final is None:
                        break
                    state = faultlib.op_state_name(final)
                    print(f"op {i}: {desc}: {state}"
                          + (f" ({final.error[:160]})" if final.error else ""), flush=True)
                    if final.state == faultlib.COMMITTED:
                        counts["committed"] += 1
                        break
                    counts["aborted" if final.state == faultlib.ABORTED else "failed"] += 1
                    if final.state == faultlib.FAILED:
                        break  # the planner refused: not retried
                else:
                    problems.append(f"op {i}: {desc}: not committed after {args.retries} retries")
            except faultlib.FaultCheckError as e:
                problems.append(f"op {i}: {desc}: {e}")
                print(f"op {i}: MISMATCH: {e}", flush=True)
                break
            except reshard.ReshardError as e:
                counts["refused"] += 1
                problems.append(f"op {i}: {desc}: refused: {e}")
                print(f"op {i}: refused: {e}", flush=True)
                j = job.current()
                if faultlib.job_state_name(j) != "JOB_STATE_ACTIVE":
                    problems.append(f"job {faultlib.job_state_name(j)} lost_hosts="
                                    f"{list(j.lost_hosts)}: stopping")
                    break
            sample_agent_rss(op_hosts)
            i += 1

        leak = None
        try:
            faultlib.check_no_leaks(cluster, [job])
            faultlib.check_processes(cluster, census)
        except faultlib.FaultCheckError as e:
            leak = str(e)
            problems.append(leak)
        after = snapshot()
        elapsed = time.monotonic() - started

        # The agents' RSS: flat after warm-up, and back near the warm mark once
        # the job is deleted (its buffers dropped, the worker cache emptied).
        tolerance = args.rss_tolerance_mib * 2**20
        rss_rows = []
        for name, pids in sorted(agent_rss.items()):
            pid_now = cluster.processes().get(name)
            seen = pids.get(pid_now)
            if seen is None or seen[1] is None:
                rss_rows.append([name, pid_now, None, None, None])
                continue
            end = min(seen[2])
            rss_rows.append([name, pid_now, seen[1], end, None])
            if end - seen[1] > tolerance:
                problems.append(f"{name} (pid {pid_now}): RSS grew from {seen[1] / 2**20:.1f} "
                                f"MiB after warm-up to {end / 2**20:.1f} MiB (the lowest of its "
                                f"last {len(seen[2])} samples; tolerance "
                                f"{args.rss_tolerance_mib:g} MiB)")
        try:
            client.delete_job(job.id)
            faultlib.check_no_leaks(cluster, [])

            def caches_empty():
                for h in cluster.host_ids:
                    m = cluster.metrics_of(h)
                    if m.get('reshard_agent_worker_cache_entries{kind="generation"}', 0) or \
                            m.get('reshard_agent_worker_cache_entries{kind="token"}', 0) or \
                            m.get("reshard_agent_worker_cache_bytes", 0):
                        return False
                return True
            faultlib.wait_until("every agent's worker cache is empty after DeleteJob",
                                caches_empty, faultlib.SETTLE_S)
        except (reshard.ReshardError, faultlib.FaultCheckError) as e:
            problems.append(f"after deleting job {job.id}: {e}")
        for row in rss_rows:
            name, pid_now, warm = row[0], row[1], row[2]
            if warm is None:
                continue
            row[4] = cluster.rss_bytes(pid_now)
            if row[4] is not None and row[4] - warm > tolerance:
                problems.append(f"{name} (pid {pid_now}): RSS {row[4] / 2**20:.1f} MiB after "
                                f"the job was deleted, {warm / 2**20:.1f} MiB after warm-up "
                                f"(tolerance {args.rss_tolerance_mib:g} MiB)")

        print("\n== soak summary")
        print(f"  operations: {i} run, committed {counts['committed']}, aborted "
              f"{counts['aborted']}, failed {counts['failed']}, retried {counts['retried']}, "
              f"stuck {counts['stuck']}, refused {counts['refused']}; agent kills "
              f"{counts['kills']} (peers restarted after a UCX abort: "
              f"{counts['ucx_aborts']}); {elapsed:.1f} s")
        print("  RSS (MiB)             before     after")
        for name in sorted(set(before[0]) | set(after[0])):
            (b, bpid), (a, apid) = before[0].get(name, (0, 0)), after[0].get(name, (0, 0))
            print(f"  {name:<20} {(b or 0) / 2**20:8.1f} {(a or 0) / 2**20:9.1f}"
                  + (f"   (restarted: pid {bpid} -> {apid})" if bpid != apid else ""))
        print(f"  agent RSS (MiB)       warm-up     end   deleted   (warm-up: after "
              f"{args.rss_warmup} of its operations; end: lowest of its last "
              f"{RSS_END_SAMPLES} samples)")

        def mib(v):
            return "n/a" if v is None else f"{v / 2**20:.1f}"
        for name, pid_now, warm, last, deleted in rss_rows:
            print(f"  {name:<20} {mib(warm):>8} {mib(last):>7} {mib(deleted):>9}   (pid {pid_now})")
        print("  shard files / accounting (used bytes, buffers, generations)")
        for h in cluster.host_ids:
            bf, af = before[1][h], after[1][h]
            print(f"  {h}: files {len(bf)} ({sum(bf.values())} B) -> {len(af)} "
                  f"({sum(af.values())} B); accounting {before[2][h]} -> {after[2][h]}")
        print(f"  leaks: {'none' if not leak else leak}")
        for p in problems:
            print(f"  PROBLEM: {p}")
        ok = not problems
        print(f"soak: {'PASS' if ok else 'FAIL'}")
        if not ok:
            print(cluster.logs(15))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
