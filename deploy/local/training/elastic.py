"""Elastic training on a local reshard cluster, as a scheduler drives it:
used by the main job (deploy/local/main_job.py) and the training test
(tests/python/test_training.py).

One process per rank (elastic_rank.py, written against the loop API
reshard.elastic) trains the tiny GPT of tiny_gpt.py. The scenario, one job:

  0. tp 2 x dp 2 on 2 hosts, trains on while
  1. a STOP-FREE resize to tp 1 x dp 4 on 4 hosts is planned, its new ranks
     start and warm up (torch, process groups, model); they mark it
     prepared, the old ranks cut over at their next step boundary
     (publishing that step into the cut-over checkpoint), the transfer runs
     and the warm ranks load and go on;
  2. the 4-host layout trains `STEPS` steps and checkpoints; a host is lost
     (agent SIGKILLed, shared memory gone) and the coordinator's survivor
     policy recovers tp 1 x dp 3; cold-started ranks load;
  3. it trains `STEPS` steps and checkpoints; a STOP-THE-WORLD resize (a
     plain Resize, as before stop-free existed) to tp 2 x dp 1 on one host;
     cold-started ranks load and train `STEPS` steps.

random_scenario(hosts, seed) is the property test's: random dps, stop-free
resizes, and a host that fails while the job trains (recovered from the last
commit, the steps read since replayed).

The pause of each reconfiguration is measured from the end of the last step
on the old layout to the start of the first step on the new one (both
stamped by rank 0 with time.monotonic, one clock on one machine).
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tiny_gpt  # noqa: E402

SEED, N, BATCH, STEPS = 11, 21, 7, 3
MIN_STEP_S = 0.1  # a step's cadence (the tiny model computes one in a few ms)
MAX_STEPS = 400   # per phase: a cut-over that never comes fails the run


def dataset_state():
    from reshard import data
    return data.DatasetState(data.DatasetDescriptor("tiny-tokens", N, "gen:1000003"),
                             data.Order(seed=5, shuffle="full"), global_batch=BATCH)


def reference(steps):
    """The uninterrupted run: one process, tp 1, dp 1. (losses, final state)."""
    model = tiny_gpt.Model(tiny_gpt.init_global(SEED), 1, 0, None)
    state, losses = dataset_state(), []
    for _ in range(steps):
        loss, _ = tiny_gpt.train_step(model, state, 1, 0, None, SEED)
        losses.append(loss)
        state = state.advanced()
    return losses, model.shard()


def job_ptc():
    from reshard import megatron
    return megatron.build_ptc(tiny_gpt.init_global(SEED),
                              overrides=tiny_gpt.replicated_overrides(), per_rank_blobs=())


def scenario(hosts):
    """(how, layout) per phase; how is the reconfiguration that starts it."""
    from reshard import layout
    return [("register", layout.make_layout(2, 1, 2, hosts[:2], 2)),
            ("stop-free resize", layout.make_layout(1, 1, 4, hosts[:4], 1)),
            ("lose " + hosts[3], None),
            ("stop-the-world resize", layout.make_layout(2, 1, 1, hosts[2:3], 2))]


class Phase:
    """The ranks of one phase, as subprocesses; a thread per rank reads its
    output into `events` (rank, parsed line, or None at the end)."""

    def __init__(self, cluster, job, ptc, lay, work_dir, name, start, end, generation=0,
                 operation_id=""):
        import reshard
        self.procs, self.events = [], queue.Queue()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join(
                       p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
        coordinator = {"address": cluster.coordinator, "insecure": not cluster.tls}
        if cluster.tls:
            cert, key = cluster.pki.issue(cluster.ADMIN)
            coordinator.update(ca=cluster.pki.ca, cert=cert, key=key)
        for rank in range(lay.config.tp * lay.config.pp * lay.config.dp):
            cfg = {"rank": rank, "layout": reshard.to_dict(lay), "ptc": reshard.to_dict(ptc),
                   "store": os.path.join(work_dir, f"{name}.store"), "job_id": job.id,
                   "seed": SEED, "steps": STEPS, "max_steps": MAX_STEPS,
                   "min_step_s": MIN_STEP_S, "start": start, "end": end,
                   "generation": generation, "operation_id": operation_id,
                   "coordinator": coordinator, "worker_token": cluster.worker_token(job.id),
                   "sockets": {h: cluster.agents[h].worker_socket for h in cluster.host_ids},
                   "dataset_state": dataset_state().to_dict()}
            path = os.path.join(work_dir, f"{name}-rank{rank}.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "elastic_rank.py"), path],
                                 stdout=subprocess.PIPE, text=True, env=env)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(rank, p), daemon=True).start()
        self.losses, self.ids, self.first_t0, self.last_t1, self.cut = [], {}, None, None, None
        self.warm, self.ended = 0, 0

    def _read(self, rank, p):
        for line in p.stdout:
            line = line.strip()
            self.events.put((rank, "WARM" if line == "WARM" else json.loads(line)))
        self.events.put((rank, None))

    def pump(self, until, timeout=300):
        """Handles output until until(self) holds; raises when a rank fails
        or `timeout` seconds pass."""
        end = time.monotonic() + timeout
        while not until(self):
            try:
                rank, ev = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"phase not done after {timeout} s") from None
            if ev is None:
                self.ended += 1
                status = self.procs[rank].wait()
                if status != 0:
                    raise RuntimeError(f"rank {rank} exited with status {status}")
            elif ev == "WARM":
                self.warm += 1
            elif "cut" in ev:
                self.cut = ev
            else:
                if "loss" in ev:
                    self.losses.append(ev["loss"])
                    self.first_t0 = self.first_t0 or ev["t0"]
                    self.last_t1 = ev["t1"]
                if "ids" in ev:
                    self.ids.setdefault(ev["step"], []).extend(ev["ids"])

    def finished(self):
        return self.ended == len(self.procs)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def random_scenario(hosts, seed, changes=2):
    """The property test's scenario: tp 1 and a random dp on random hosts
    (one rank each), then `changes` stop-free resizes to another random dp
    and, at a random point where dp >= 2, a host that fails while the job
    trains (its agent SIGKILLed, the ranks killed)."""
    import random

    from reshard import layout
    rng = random.Random(seed)
    alive = list(hosts)
    fail_before = rng.randrange(changes)  # the failure comes before this change

    def pick(dp):
        return layout.make_layout(1, 1, dp, rng.sample(alive, dp), 1)

    def next_dp(prev, at_least):
        return rng.choice([d for d in range(at_least, len(alive) + 1) if d != prev])

    dp = next_dp(0, 2 if fail_before == 0 else 1)
    phases = [("register", pick(dp))]
    for k in range(changes):
        if k == fail_before:
            lost = rng.choice(layout.hosts_of(phases[-1][1]))
            alive.remove(lost)
            phases.append(("fail " + lost, None))
            dp -= 1  # one rank per host: the survivors
        dp = next_dp(dp, 2 if k + 1 == fail_before else 1)
        phases.append(("stop-free resize", pick(dp)))
    return phases


def _end_of(phases, i):
    """How phase i ends: cut over by a stop-free resize, killed by a
    failure, or its step budget and a checkpoint."""
    nxt = phases[i + 1][0] if i + 1 < len(phases) else ""
    return "cut" if nxt == "stop-free resize" or nxt.startswith("fail ") else "finish"


def run(cluster, client, name, work_dir, hosts=None, log=lambda *a: None, phases=None):
    """Registers a job and trains it through `phases` (default:
    scenario(hosts), hosts default the cluster's first four, all alive);
    returns a dict with losses, reference losses and final state, sample
    ids, the job, its PTC, the last layout and generation, the operations,
    and per reconfiguration its pause."""
    import reshard
    from reshard import layout
    ptc = job_ptc()
    phases = phases or scenario(hosts or cluster.host_ids)
    job = client.register_job({"name": name, "tenant": "training", "ptc": reshard.to_dict(ptc),
                               "layout": reshard.to_dict(phases[0][1])},
                              dataset_state=dataset_state())
    out = {"job": job, "ptc": ptc, "losses": [], "ids": [], "pauses": [], "committed": []}
    lay = phases[0][1]
    cur = Phase(cluster, job, ptc, lay, work_dir, "phase0", "seed", _end_of(phases, 0))
    live = [cur]
    try:
        log(f"training: phase 0 (register): tp {lay.config.tp} dp {lay.config.dp} on "
            f"{', '.join(layout.hosts_of(lay))}")
        for i, (how, lay) in enumerate(phases[1:], 1):
            end = _end_of(phases, i)
            if how == "stop-free resize":
                cur.pump(lambda ph: len(ph.losses) >= STEPS)
                t_request = time.monotonic()
                op = client.resize(job.id, lay, stop_free=True)
                op = _wait_state(client, op.id, reshard.coordinator_pb2.OPERATION_STATE_PLANNED)
                new = Phase(cluster, job, ptc, lay, work_dir, f"phase{i}", "join", end,
                            operation_id=op.id)
                live.append(new)
                # The old layout trains on while the new ranks warm up; it
                # cuts over by itself once they marked the operation prepared.
                cur.pump(lambda ph: ph.finished())
                new.pump(lambda ph: ph.losses)
                final = client.get_operation(op.id)
                out["pauses"].append(_pause(how, cur, new, final, t_request))
            else:
                t_request = time.monotonic()
                if how.startswith("fail "):
                    # A host fails while the job trains: the ranks there die
                    # with it and the rest stop (a peer is gone); the job
                    # resumes from its last commit, replaying the steps read
                    # since (they were never committed).
                    cur.pump(lambda ph: len(ph.losses) >= STEPS)
                    lost = how.split()[1]
                    cluster.lose_host(lost)
                    cur.kill()
                    t_request = time.monotonic()
                    cur.losses, cur.ids = [], {}
                else:
                    cur.pump(lambda ph: ph.finished())
                    client.wait(cur.cut["checkpoint"], timeout=120, raise_on_failure=True)
                    t_request = time.monotonic()
                if how.startswith("lose ") or how.startswith("fail "):
                    lost = how.split()[1]
                    if how.startswith("lose "):
                        cluster.lose_host(lost)  # agent SIGKILLed, its shared memory gone
                    # The survivors' layout may keep one copy (dp 1):
                    # accepted, the scenario trains on whatever is left.
                    final = client.wait(client.recover(job.id, [lost], accept_degraded=True).id,
                                        timeout=120, raise_on_failure=True)
                    lay = final.target_layout  # the coordinator's survivor policy
                else:
                    final = client.wait(client.resize(job.id, lay).id, timeout=120,
                                        raise_on_failure=True)
                new = Phase(cluster, job, ptc, lay, work_dir, f"phase{i}", "load", end,
                            generation=final.to_generation)
                live.append(new)
                new.pump(lambda ph: ph.losses)
                out["pauses"].append(_pause(how, cur, new, final, t_request))
            _collect(out, cur)
            committed = client.dataset_state(job.id).step
            if committed != len(out["losses"]):
                raise RuntimeError(f"phase {i}: committed step {committed}, trained "
                                   f"{len(out['losses'])}")
            out["pauses"][-1]["after_step"] = len(out["losses"])
            out["committed"].append({"generation": final.to_generation, "layout": lay,
                                     "operation": final})
            log(f"training: phase {i} ({how}): tp {lay.config.tp} dp {lay.config.dp} on "
                f"{', '.join(layout.hosts_of(lay))}, from step {len(out['losses'])}")
            cur = new
        cur.pump(lambda ph: ph.finished())
        last = client.wait(cur.cut["checkpoint"], timeout=120, raise_on_failure=True)
        _collect(out, cur)
    finally:
        for ph in live:
            ph.kill()
    out["want_losses"], out["want_final"] = reference(len(out["losses"]))
    out["layout"], out["generation"] = lay, last.to_generation
    return out


def _collect(out, phase):
    out["losses"] += phase.losses
    out["ids"] += [i for step in sorted(phase.ids) for i in phase.ids[step]]


def _wait_state(client, op_id, state, timeout=60):
    for op in client.watch_operation(op_id, timeout=timeout):
        if op.state == state:
            return op
    raise RuntimeError(f"operation {op_id} ended before {state}: {op.error}")


def _pause(how, old, new, op, t_request):
    """The pause (old's last step end -> new's first step start) and, for a
    stop-free operation, the coordinator's own figures."""
    p = {"how": how, "pause_s": new.first_t0 - old.last_t1,
         "reconfigure_s": new.first_t0 - t_request, "stop_free": bool(op.stop_free)}
    if op.stop_free:
        p.update(prepare_s=op.prepare_seconds, coordinator_pause_s=op.pause_seconds,
                 cut_step=old.cut["step"], precopied_bytes=op.bytes_precopied,
                 moved_again_bytes=op.bytes_total,
                 skipped_bytes=op.bytes_skipped_unchanged)
    return p
