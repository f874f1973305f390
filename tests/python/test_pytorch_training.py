"""Real PyTorch 2 training through reconfigurations (issue 20, item 4): the
quickstart of docs/pytorch.md (tests/python/torch2/train.py, a tiny float64
transformer under FSDP2 + tensor parallel, or HSDP) run by `reshard run`
launchers, one per emulated host of a real local cluster (PostgreSQL,
coordinator, agents), one process per rank, gloo on CPU. Every rank holds
only the job's worker token.

Each test: a stop-free dp change, a tp change stopped at a step boundary
(stop-the-world), a lost host (its agent SIGKILLed with its shared memory,
its launcher and ranks SIGKILLed) recovered onto the survivor. The
launchers keep warm rank processes (`reshard run --spares`, default): each
reconfiguration's new ranks run in processes that had torch imported before
it began, a survivor's rank process serves its next rank (same pid), and
each test prints its pause, part by part, against the targets
($RESHARD_TEST_SPARES=0 runs the same tests with cold starts, to compare;
the warm-process assertions then do not apply). Asserted:
every step's loss (each time it was trained, replays after the loss
included) equals an uninterrupted one-process run of the same model to a
relative 1e-9 (float64: only the order of the sums differs, dp
reduce-scatters and tp partial sums; measured ~1e-15), every sample of each
epoch read exactly once by the steps that count, the job's committed
dataset step and the final generation's model and Adam state equal the
reference's (loaded through the agents).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers
import reshard
from reshard import layout

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
TORCH2 = os.path.join(HERE, "torch2")
sys.path.insert(0, TORCH2)
import uninterrupted  # noqa: E402
import tiny_transformer as my  # noqa: E402

MIN_STEP_S = 0.3   # the first world's cadence (a real job's pace)
STEPS = 150        # the job's step budget (train.py's $STEPS): the first world
                   # still trains when the test reconfigures it, its spares warm
                   # and the stop-free operation's new ranks warm up
# `reshard run --spares`: unset = the launcher's default (warm rank
# processes); "0" = every rank a fresh interpreter (the cold-start figures).
SPARES = os.environ.get("RESHARD_TEST_SPARES")
WARM = SPARES != "0"


dataset = uninterrupted.dataset


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


@pytest.fixture(scope="module")
def job_ptc(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ptc") / "ptc.json")
    subprocess.run([sys.executable, os.path.join(TORCH2, "describe_job.py"), out], check=True,
                   env=_env(), cwd=TORCH2, timeout=120)
    with open(out) as f:
        return reshard.as_message(json.load(f), reshard.ptc_pb2.Ptc)


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run: one process, no parallelism. Per step its loss;
    its final model and Adam state as {item name: array}."""
    losses, model, opt = uninterrupted.run(STEPS)
    names = {p: n for n, p in model.named_parameters()}
    final = {f"model.{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}
    for p, st in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            final[f"optim.state.{names[p]}.{key}"] = st[key].detach().numpy().copy()
    return losses, final


def _env(**extra):
    import reshard as pkg
    root = os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__)))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, TORCH2,
                                                      os.environ.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def _free_port_range(n):
    """A first port of n consecutive ports that are free now, below the
    kernel's ephemeral range (where the OS's port-0 choices land)."""
    import random
    import socket
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - n)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} free consecutive ports in 20000-32000")


class Job:
    """A registered job and one `reshard run` launcher per host."""

    def __init__(self, cluster, client, name, ptc, lay, work, policy=None):
        self.cluster, self.client, self.work = cluster, client, work
        spec = {"name": name, "tenant": "training", "ptc": reshard.to_dict(ptc),
                "layout": reshard.to_dict(lay)}
        if policy is not None:
            spec["policy"] = policy  # an ElasticPolicy (docs/scheduler.md)
        self.job = client.register_job(spec, dataset_state=dataset())
        self.ptc = ptc
        self.log = os.path.join(work, "train.jsonl")
        self.launchers = {}
        base = _free_port_range(50)
        self.ports = f"{base}-{base + 49}"
        for host in cluster.host_ids:
            self.launch(host)

    def launch(self, host):
        env = _env(RESHARD_WORKER_TOKEN=self.cluster.worker_token(self.job.id),
                   TRAIN_LOG=self.log, STEPS=str(STEPS), CKPT_EVERY="3",
                   MIN_STEP_S=str(MIN_STEP_S))
        argv = [sys.executable, "-m", "reshard", "run", "--coordinator", self.cluster.coordinator,
                "--job", self.job.id, "--host", host,
                "--worker-socket", self.cluster.agents[host].worker_socket,
                "--rdzv-port-range", self.ports, "--rdzv-host-pattern", "127.0.0.1",
                "--log-dir", os.path.join(self.work, "logs"),
                "--events", os.path.join(self.work, f"events-{host}.jsonl"),
                "--retire-timeout", "60", "--recovery-timeout", "60"]
        argv += ["--spares", SPARES] if SPARES is not None else []
        argv += (["--tls-ca", self.cluster.pki.ca] if self.cluster.tls else ["--insecure"])
        argv += ["--", sys.executable, os.path.join(TORCH2, "train.py")]
        self.launchers[host] = subprocess.Popen(argv, env=env, cwd=TORCH2,
                                                start_new_session=True)

    def records(self):
        return helpers.read_json_lines(self.log)

    def wait(self, what, until, timeout=180):
        """Waits (deadline `timeout` s) until until(records) holds; a launcher
        that exits first fails the test with the rank logs' tails."""
        end = time.monotonic() + timeout
        while True:
            recs = self.records()
            if until(recs):
                return recs
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not after {timeout} s\n{self.tails()}")
            for host, p in self.launchers.items():
                if p.poll() not in (None, 0):
                    raise AssertionError(f"{what}: the launcher of {host} exited "
                                         f"{p.returncode}\n{self.tails()}")
            time.sleep(0.05)

    def tails(self):
        logs = os.path.join(self.work, "logs")
        out = []
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                out.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def events(self, host):
        """The launcher of `host`'s --events (JSON lines)."""
        return helpers.read_json_lines(os.path.join(self.work, f"events-{host}.jsonl"))

    def wait_spares(self, host, n):
        """Waits until `host` has n warm rank processes that never ran a
        rank (torch imported, waiting): the pool a reconfiguration draws on."""
        if WARM:
            self.wait(f"{n} warm rank processes on {host}",
                      lambda _: len(_idle_spares(self.events(host))) >= n, timeout=120)

    def kill_host(self, host):
        """The host is gone: its launcher and ranks SIGKILLed, its agent too."""
        p = self.launchers.pop(host)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        self.cluster.lose_host(host)

    def stop(self):
        for p in self.launchers.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.launchers.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _ended(recs, worlds=None):
    """The end records (one per rank that ended its loop)."""
    return [r for r in recs if "end" in r]


def _trained(recs, step):
    return any(r.get("step", 0) >= step for r in recs if "loss" in r)


def _check(job, reference, final_layout):
    """Losses, exactly-once samples, the committed step, the final state."""
    want_losses, want_final = reference
    recs = job.records()
    steps = [r for r in recs if "loss" in r]
    assert max(r["step"] for r in steps) == STEPS
    worst = 0.0
    for r in steps:
        want = want_losses[r["step"] - 1]
        worst = max(worst, abs(r["loss"] - want) / abs(want))
        np.testing.assert_allclose(r["loss"], want, rtol=1e-9, atol=0,
                                   err_msg=f"step {r['step']} (world {r['world_key']})")
    print(f"{len(steps)} step records, worst relative loss difference {worst:.1e}")
    # The steps that count: for each step, the world that trained it last.
    last_world = {}
    for r in steps:
        last_world[r["step"]] = r["world_key"]
    ids = []
    for s in range(1, STEPS + 1):
        by_dp = {}
        for r in steps:
            if r["step"] == s and r["world_key"] == last_world[s]:
                by_dp.setdefault(r["dp_rank"], r["ids"])
        ids += [i for d in sorted(by_dp) for i in by_dp[d]]
    assert len(ids) == STEPS * my.GLOBAL_BATCH
    n = my.NUM_SAMPLES
    for e in range(len(ids) // n):
        assert sorted(ids[e * n:(e + 1) * n]) == list(range(n)), f"epoch {e}"
    committed = job.client.dataset_state(job.job.id)
    assert committed.step == STEPS and committed.cursor == STEPS * my.GLOBAL_BATCH
    got_job = job.client.get_job(job.job.id)
    assert (got_job.layout.config.tp, got_job.layout.config.dp) == (
        final_layout.config.tp, final_layout.config.dp)
    for host in layout.hosts_of(got_job.layout):
        with job.cluster.worker(host, job.job.id, ptc=job.ptc) as w:
            for rank, _ in layout.ranks_on_host(got_job.layout, host):
                got = w.load(rank, got_job.generation)
                checked = 0
                for t in job.ptc.tensors:
                    if t.name.endswith(".step"):  # Adam's step count, every parameter's
                        assert float(np.asarray(got[t.name]).reshape(-1)[0]) == STEPS, t.name
                        continue
                    want = layout.local_tensor(t, got_job.layout.config, rank,
                                               want_final[t.name])
                    if want.size:
                        np.testing.assert_allclose(got[t.name], want, rtol=1e-9, atol=1e-13,
                                                   err_msg=f"rank {rank} {t.name}")
                        checked += 1
                assert checked
    return recs


def _exits(events_path, world):
    """The launcher's "exit" events of a world's ranks (its --events file)."""
    if not os.path.exists(events_path):
        return []
    with open(events_path) as f:
        return [e for e in (json.loads(line) for line in f if line.endswith("\n"))
                if e["event"] == "exit" and e["world"] == world]


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _idle_spares(events):
    """Pids of the rank processes that said ready and never got a rank, still alive."""
    ready = {e["pid"] for e in events if e["event"] == "spare_ready"}
    used = {e["pid"] for e in events if e["event"] == "assign"}
    ended = {e["pid"] for e in events if e["event"] in ("spare_end", "spare_exit")}
    return ready - used - ended


def _world_named(events, name):
    """The launcher's "world" event of the world `name` ("g1"), or of the one
    whose name starts with `name` when it ends with "-" ("op-")."""
    got = [e for e in events if e["event"] == "world" and
           (e["world"].startswith(name) if name.endswith("-") else e["world"] == name)]
    assert len(got) == 1, [e["world"] for e in events if e["event"] == "world"]
    return got[0]


def _assigns(events, world):
    """{rank: (pid, warm, served)} of a world's ranks run in rank processes."""
    return {e["rank"]: (e["pid"], e["warm"], e["served"]) for e in events
            if e["event"] == "assign" and e["world"] == world}


def _step_done(recs, key):
    """{step: time its last rank reported it} of the world `key`."""
    out = {}
    for r in recs:
        if "loss" in r and r["world_key"] == key:
            out[r["step"]] = max(out.get(r["step"], 0.0), r["t"])
    return out


def _pause_table(what, target, recs, old_key, new_key, parts):
    """Prints the pause of a reconfiguration: the old layout's last step
    (its last rank's report) -> the new one's first, the parts in between
    (`parts`: [(name, time)], and the new ranks' phases), and the new
    layout's first steps against its steady step (the median of the rest)."""
    old, new = _step_done(recs, old_key), _step_done(recs, new_key)
    last_old = old[max(old)]
    if not new:
        print(f"PAUSE {what}: none, the new layout trained no step (the old one reached "
              f"step {max(old)}, the last, first)")
        return
    steps = sorted(new)
    done = [new[s] for s in steps]
    gaps = [b - a for a, b in zip(done, done[1:])]
    steady = sorted(gaps[2:])[len(gaps[2:]) // 2] if len(gaps) > 2 else float("nan")
    first = f"x{gaps[0] / steady:.1f}" if gaps and steady == steady else "n/a"
    # The new ranks' own parts, the slowest rank's: tiny_transformer's phase
    # records (process group and mesh ready, parallelized, the first step
    # began) and pytorch_loop's Run.phases (their end records).
    names = {"build": "mesh ready", "optimizer": "parallelized", "first step": "stepping"}
    phases = {}
    for r in recs:
        if r.get("world_key") == new_key and r.get("phase") in names:
            phases[names[r["phase"]]] = max(phases.get(names[r["phase"]], 0.0), r["t"])
        if r.get("world_key") == new_key and "phases" in r:
            for name, t in r["phases"]:
                phases[name] = max(phases.get(name, 0.0), t)
    marks = sorted([("last old step", last_old)] + parts +
                   [(n, t) for n, t in phases.items() if t > last_old] +
                   [("first new step", done[0])], key=lambda m: m[1])
    split = "  ".join(f"{b[0]} +{b[1] - a[1]:.2f}" for a, b in zip(marks, marks[1:]))
    print(f"PAUSE {what} ({'warm' if WARM else 'cold'} starts): {done[0] - last_old:.2f} s "
          f"(target {target}); {split}; next steps "
          f"{', '.join(f'{g:.2f}' for g in gaps[:2])} s, steady {steady:.2f} s "
          f"({first})")


def _run(cluster, client, name, ptc, tmp_path, first):
    return Job(cluster, client, name, ptc, first, str(tmp_path))


def test_stop_free_dp_change_fsdp2_tp(cluster, client, job_name, job_ptc, reference, tmp_path):
    """dp 2 x tp 2 on two hosts (FSDP2 + TP) -> stop-free dp 1 x tp 2 on one."""
    hosts = cluster.host_ids
    first = layout.make_layout(2, 1, 2, hosts[:2], 2)
    second = layout.make_layout(2, 1, 1, hosts[:1], 2)
    job = _run(cluster, client, job_name, job_ptc, tmp_path, first)
    try:
        job.wait("the first world trains 4 steps", lambda r: _trained(r, 4))
        job.wait_spares(hosts[0], 2)
        spares = _idle_spares(job.events(hosts[0]))
        op = client.resize(job.job.id, second, stop_free=True)
        job.wait("every rank ended", lambda r: len(_ended(r)) == 4 + 2)
        final = client.wait(op.id, timeout=60, raise_on_failure=True)
        assert final.stop_free and final.cutover_operation_id
        recs = _check(job, reference, second)
        job.wait("the old ranks retired", lambda _: all(
            any(e["event"] == "retired" and e["world"] == "g1" for e in job.events(h))
            for h in hosts))
        events = {h: job.events(h) for h in hosts}
        old_pids = {h: set(_world_named(events[h], "g1")["pids"].values()) for h in hosts}
    finally:
        job.stop()
    if WARM:
        # The new layout's ranks ran in processes warm before the resize.
        new = _world_named(events[hosts[0]], "op-")
        got = _assigns(events[hosts[0]], new["world"])
        assert sorted(got) == [0, 1] and {p for p, _, _ in got.values()} <= spares, (got, spares)
        assert all(warm and served == 0 for _, warm, served in got.values()), got
        # The old ranks' processes went back to their hosts' pools (status 0,
        # idle): the pool, trimmed as they came back, ended spares that never
        # ran a rank, not them (at the job's end, when the new layout's ranks
        # come back, the pool keeps those, the most recently used).
        for h in hosts:
            retired = [i for i, e in enumerate(events[h])
                       if e["event"] == "retired" and e["world"] == "g1"]
            ended = [e for e in events[h][:retired[0]] if e["event"] in (
                "spare_end", "spare_exit") and e["pid"] in old_pids[h]]
            assert ended == [], (h, ended)
            assert sorted(e["code"] for e in events[h] if e["event"] == "exit" and
                          e["world"] == "g1") == [0, 0]
    # How long the old ranks stayed after their loop ended (their end record
    # -> the launcher's exit event): an interpreter's shutdown when cold.
    loop_end = {int(r["rank"]): r["t"] for r in _ended(recs) if r["world_key"] == "0/"}
    stay = [e["t"] - loop_end[e["rank"]] for h in hosts for e in events[h]
            if e["event"] == "exit" and e["world"] == "g1"]
    print(f"PAUSE stop-free: the old ranks left {min(stay):.2f}-{max(stay):.2f} s after their "
          f"loop ended")
    last_old = max(r["t"] for r in recs if "loss" in r and r["world_key"] == "0/")
    prepared = max(t for e in _ended(recs) if e["started"] == "joined"
                   for n, t in e["phases"] if n == "prepared")
    if prepared > last_old:
        # The old layout ran out of steps before the new one was ready: its
        # last step's commit folded into the cut-over, and what follows it
        # is the wait for the prepare, not a pause.
        print(f"PAUSE stop-free: not measured, the old layout trained its last step "
              f"{prepared - last_old:.2f} s before the new ranks were prepared")
    else:
        _pause_table("stop-free", "<= 0.5 s, first new steps <= 2x steady", recs, "0/",
                     f"{final.to_generation}/{op.id}",
                     [("commit seen by the launcher", min(
                         e["t"] for e in events[hosts[0]] if e["event"] == "committed"))])
    ends = _ended(recs)
    assert sorted(e["started"] for e in ends) == ["fresh"] * 4 + ["joined"] * 2
    # The new ranks warmed up (train.py's warm_up: one step) before they
    # said they were ready for the cut-over.
    for e in ends:
        if e["started"] == "joined":
            assert [n for n, _ in e["phases"]] == [
                "warmed up", "prepared", "committed", "loaded", "started"], e
    # The old world trained on while the new one warmed up, and cut over at
    # a step boundary (at the latest its last step: its final checkpoint
    # then folds into the cut-over).
    cut = [r for r in recs if "loss" in r and r["world"] == 4]
    assert 4 < max(r["step"] for r in cut) <= STEPS
    print(f"stop-free cut-over after step {max(r['step'] for r in cut)}; prepared in "
          f"{final.prepare_seconds:.1f} s, paused {final.pause_seconds:.2f} s")


def test_tp_change_stop_the_world(cluster, client, job_name, job_ptc, reference, tmp_path):
    """tp 2 x dp 1 on one host -> a stop-the-world resize to tp 1 x dp 2 on
    two hosts, stopped at the next step boundary."""
    hosts = cluster.host_ids
    first = layout.make_layout(2, 1, 1, hosts[:1], 2)
    second = layout.make_layout(1, 1, 2, hosts[:2], 1)
    job = _run(cluster, client, job_name, job_ptc, tmp_path, first)
    try:
        job.wait("the first world trains 4 steps", lambda r: _trained(r, 4))
        job.wait_spares(hosts[1], 1)
        spares = _idle_spares(job.events(hosts[1]))
        op = client.resize(job.job.id, second, at_step_boundary=True)
        final = client.wait(op.id, timeout=120, raise_on_failure=True)
        job.wait("the job trained its steps", lambda r: len(
            [e for e in _ended(r) if e["started"] == "loaded"]) == 2)
        recs = _check(job, reference, second)
        events = {h: job.events(h) for h in hosts}
    finally:
        job.stop()
    old = _world_named(events[hosts[0]], "g1")
    new = {h: _world_named(events[h], f"g{final.to_generation}") for h in hosts}
    if WARM:
        # host 0's new rank runs in one of the old ranks' processes (which
        # ended at the boundary before the commit), host 1's in its spare.
        reused = _assigns(events[hosts[0]], new[hosts[0]]["world"])
        assert list(reused) == [0] and reused[0][0] in old["pids"].values(), (reused, old)
        assert reused[0][1:] == (True, 1), reused
        spare = _assigns(events[hosts[1]], new[hosts[1]]["world"])
        assert list(spare) == [1] and spare[1] == (min(spares), True, 0), (spare, spares)
    exits = [e["t"] for e in events[hosts[0]] if e["event"] == "exit" and e["world"] == "g1"]
    _pause_table("stop-the-world", "<= 2 s", recs, "0/", f"{final.to_generation}/",
                 [("old ranks ended", max(exits)),
                  ("new ranks started", min(new[h]["t"] for h in hosts))])
    # The first world stopped at a step boundary with a final checkpoint
    # folded into the resize, which moved that step: no step trained twice.
    assert final.at_step_boundary
    assert final.step_boundary == reshard.coordinator_pb2.STEP_BOUNDARY_REACHED
    first_world = [e for e in _ended(recs) if e["started"] == "fresh"]
    assert len(first_world) == 2 and all("stopped=True" in e["end"] for e in first_world)
    # Before the stop it took a periodic asynchronous checkpoint every 3 steps.
    stop = int(re.search(r"step=(\d+)", first_world[0]["end"]).group(1))
    assert [c[0] for c in first_world[0]["checkpoints"]] == list(range(3, stop, 3)), stop
    trained = [(r["rank"], r["world_key"], r["step"]) for r in recs if "loss" in r]
    assert len(trained) == len(set(trained)) == 2 * STEPS


def test_lost_host_hsdp(cluster, client, job_name, job_ptc, reference, tmp_path):
    """HSDP (dp_replicate 2 x dp_shard 2, a replica per host) -> host 1 lost
    (agent, launcher and ranks SIGKILLed) -> the coordinator's survivor
    policy on host 0; the steps since the last commit are trained again."""
    hosts = cluster.host_ids
    first = layout.make_layout(1, 1, 4, hosts[:2], 2, dp_shard=2)
    job = _run(cluster, client, job_name, job_ptc, tmp_path, first)
    try:
        job.wait("the first world trains 7 steps", lambda r: _trained(r, 7))
        job.wait_spares(hosts[0], 2)
        job.kill_host(hosts[1])
        # The survivors learn of it by themselves: their next collective
        # fails (PeerLost, exit 75), before any recovery is asked for.
        events = os.path.join(job.work, f"events-{hosts[0]}.jsonl")
        job.wait("the survivors end", lambda _: len(_exits(events, "g1")) == 2, timeout=60)
        asked = time.time()
        # One replica survives: the recovery to plain FSDP on host 0 is accepted.
        op = client.recover(job.job.id, [hosts[1]], accept_degraded=True)
        final = client.wait(op.id, timeout=120, raise_on_failure=True)
        job.wait("the job trained its steps", lambda r: len(
            [e for e in _ended(r) if e["started"] == "loaded"]) == final.target_layout.config.dp)
        recs = _check(job, reference, final.target_layout)
        survivors = job.events(hosts[0])
    finally:
        job.stop()
    old = _world_named(survivors, "g1")
    new = _world_named(survivors, f"g{final.to_generation}")
    # The survivors' collectives failed: reshard.elastic.PeerLost, which
    # pytorch_loop turns into exit status 75 (the launcher's EXIT_PEER_LOST).
    exits = _exits(os.path.join(job.work, f"events-{hosts[0]}.jsonl"), "g1")
    assert sorted((e["rank"], e["code"]) for e in exits) == [(0, 75), (1, 75)], exits
    if WARM:
        # A survivor's process (PeerLost, status 75) comes back to the pool
        # only when the rank's process groups are freed with it; FSDP's
        # leave them held, so it ends instead, its log saying so, and its
        # peers see the connections close at once (both exited 75 above,
        # none terminated after --grace). The new layout's ranks are served
        # warm: by a survivor's process that came back, else by a spare.
        got = _assigns(survivors, new["world"])
        back = {e["pid"] for e in survivors if e["event"] == "rank_host_idle" and
                e["world"] == "g1" and e["t"] <= new["t"]}
        assert back <= set(old["pids"].values()), (back, old)
        for rank, pid in old["pids"].items():
            if pid not in back:
                with open(os.path.join(job.work, "logs", f"g1-rank{rank}.log")) as f:
                    assert "process groups and stores are still referenced" in f.read(), rank
        served = {p: n for p, _, n in got.values()}
        assert back <= set(served) and all(served[p] == 1 for p in back), (got, back, old)
        assert all(warm for _, warm, _ in got.values()), got
        assert all(n == 0 for p, n in served.items() if p not in back), (got, back)
    exits = [e["t"] for e in survivors if e["event"] == "exit" and e["world"] == "g1"]
    _pause_table("host loss", "<= 3 s", recs, "0/", f"{final.to_generation}/",
                 [("survivors ended (PeerLost)", max(exits)), ("recover asked (test)", asked),
                  ("new ranks started", new["t"])])
    assert hosts[1] not in layout.hosts_of(final.target_layout)
    replayed = len([r for r in recs if "loss" in r]) - sum(
        1 for r in recs if "loss" in r and r["world_key"].startswith(f"{final.to_generation}/"))
    print(f"first world trained {replayed // 4} steps; recovered from generation "
          f"{final.from_generation}")


def test_quickstart_is_the_tested_script():
    """docs/pytorch.md's Quickstart shows train.py byte for byte, and it has
    at most 40 lines of reshard code."""
    with open(os.path.join(TORCH2, "train.py")) as f:
        script = f.read()
    with open(os.path.join(HERE, "..", "..", "docs", "pytorch.md")) as f:
        page = f.read()
    quick = page[page.index("## Quickstart"):page.index("\n## ", page.index("## Quickstart") + 3)]
    block = quick[quick.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    assert block == script
    assert len([ln for ln in script.splitlines() if "# reshard" in ln]) <= 40


def test_every_failure_on_every_rank(cluster, client, job_name, tmp_path):
    """A checkpoint refused on rank 0 (InvalidArgument) and a publish refused on rank 1 raise the
    same error on both ranks; a dead peer is PeerLost, not gloo's text."""
    from helpers import loop_job_config
    job, cfg_path = loop_job_config(cluster, client, job_name, tmp_path, dataset())
    outs = [str(tmp_path / f"out{r}.json") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(TORCH2, "loop_faults.py"), str(r),
                               cfg_path, outs[r]], env=_env())
             for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [75, 0]
    got = []
    for path in outs:
        with open(path) as f:
            got.append(json.load(f))
    for r in range(2):
        refused, publish = got[r]["refused"], got[r]["publish"]
        assert refused["type"] == "InvalidArgument", refused
        assert refused["message"] == "Checkpoint: INVALID_ARGUMENT: rank 0: step: 0 must be >= 1"
        assert publish["message"].startswith("INTERNAL: rank 1: ValueError: rank 1 item \"w\""), \
            publish
    assert got[0]["refused"] == got[1]["refused"] and got[0]["publish"] == got[1]["publish"]
    peer = got[0]["peer"]
    assert peer["type"] == "PeerLost" and peer["code"] == "UNAVAILABLE", peer
    assert peer["message"].startswith("UNAVAILABLE: rank 0 of job ") and "is gone" in peer["message"]
