"""The launcher `reshard run` (reshard.launch; docs/pytorch.md, "The
launcher") on a real local cluster (PostgreSQL, coordinator, agents as
emulated hosts), one launcher per host as a real subprocess (`python -m
reshard run`), each starting real rank processes (launch_scripts/
loop_rank.py: numpy state in reshard.elastic's Loop, gloo over env://).

- The launchers start exactly the layout's ranks with torchrun's and
  reshard's environment (every value asserted); a host outside the layout
  starts none.
- A stop-free resize: the target layout's ranks start in warm-up on their
  hosts (RESHARD_OPERATION_ID, another MASTER_PORT), the old ranks cut over
  and end by themselves, the launchers retire them, the new ranks load the
  cut-over step exactly.
- A stop-the-world resize: the running ranks are stopped, the new layout's
  ranks start cold at the committed generation and load it exactly.
- A rank SIGKILLed: its launcher reports it to the coordinator
  (ReportRankFailure) within seconds;
  the launcher with a short --recovery-timeout exits 1; the other follows
  the recovery the scheduler makes; SIGTERM to a launcher stops its ranks;
  deleting the job ends the launchers with 0.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

import reshard
from reshard import launch, layout

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "launch_scripts", "loop_rank.py")
sys.path.insert(0, os.path.join(HERE, "launch_scripts"))
import loop_rank  # noqa: E402

pytest.importorskip("torch")
TENANT = "launch"


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=3, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


def _free_port_range(n=64):
    """n consecutive ports below the ephemeral range that nobody listens on."""
    for _ in range(50):
        lo = random.randrange(20000, 32000 - n)
        socks = []
        try:
            for p in range(lo, lo + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return lo, lo + n - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class Launchers:
    """One `python -m reshard run` per host, and what their ranks record."""

    def __init__(self, cluster, client, job, tmp_path, recovery_timeout=None):
        self.cluster, self.client, self.job = cluster, client, job
        self.out = tmp_path / "ranks"
        self.out.mkdir(exist_ok=True)
        self.tmp = tmp_path
        self.port_range = _free_port_range()
        # The launchers and their ranks hold the job's worker token only.
        self.worker_token = cluster.worker_token(job.id)
        token_file = tmp_path / "token"
        token_file.write_text(self.worker_token)
        self.token_file = str(token_file)
        self.procs, self.recovery_timeout = {}, dict(recovery_timeout or {})
        self.exited = set()

    def start(self, host):
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", LAUNCH_TEST_OUT=str(self.out),
                   PYTHONPATH=os.pathsep.join(p for p in (package_root,
                                                          os.environ.get("PYTHONPATH")) if p))
        argv = [sys.executable, "-m", "reshard", "run", "--coordinator", self.cluster.coordinator,
                "--job", self.job.id, "--host", host,
                "--worker-socket", self.cluster.agents[host].worker_socket,
                "--token-file", self.token_file, "--tls-ca", self.cluster.pki.ca,
                "--rdzv-port-range", f"{self.port_range[0]}-{self.port_range[1]}",
                "--retire-timeout", "30", "--grace", "5",
                "--recovery-timeout", str(self.recovery_timeout.get(host, 60)),
                "--events", str(self.tmp / f"events-{host}.jsonl"),
                "--log-dir", str(self.tmp / f"logs-{host}")]
        for h in self.cluster.host_ids:
            argv += ["--rdzv-host", f"{h}={'localhost' if h == 'host-0' else '127.0.0.1'}"]
        argv += ["--", sys.executable, SCRIPT]
        self.procs[host] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)

    def records(self):
        out = []
        for name in os.listdir(self.out):
            if name.endswith(".json"):
                with open(self.out / name) as f:
                    out.append(json.load(f))
        return out

    def record(self, pid):
        with open(self.out / f"{pid}.json") as f:
            return json.load(f)

    def events(self, host):
        path = self.tmp / f"events-{host}.jsonl"
        if not path.exists():
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def wait(self, what, pred, timeout=90):
        """Waits until pred() is true (returns its value); fails when a
        launcher exits meanwhile (one in `exited` is expected to)."""
        end = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            for host, p in self.procs.items():
                if p.poll() is not None and host not in self.exited:
                    raise AssertionError(f"launcher {host} exited {p.returncode} waiting for "
                                         f"{what}")
            if time.monotonic() > end:
                seen = [(r["env"]["RANK"], r.get("loaded")) for r in self.records()]
                raise AssertionError(f"no {what} within {timeout} s; ranks seen {seen}")
            time.sleep(0.1)

    def ranks_of(self, pred, n):
        """The records of `n` ranks matching pred once they all loaded,
        by rank."""
        def ready():
            rs = [r for r in self.records() if pred(r)]
            return rs if len(rs) == n and all("loaded" in r for r in rs) else None
        return {int(r["env"]["RANK"]): r for r in self.wait(f"{n} ranks loaded", ready)}

    def close(self):
        """stop(), then deletes the job unless the test did."""
        self.stop()
        try:
            self.client.delete_job(self.job.id)
        except reshard.ReshardError:
            pass

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _register(client, name, lay):
    return client.register_job({"name": name, "tenant": TENANT,
                                "ptc": reshard.to_dict(loop_rank.job_ptc()),
                                "layout": reshard.to_dict(lay)},
                               dataset_state=loop_rank.dataset_state())


def _expected_env(L, lay, rank, local, local_world, master_addr, generation, epoch,
                  operation_id=None):
    host, device = layout.slots(lay)[rank]
    return {"RANK": str(rank), "WORLD_SIZE": str(layout.world_size(lay)),
            "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(launch.rendezvous_port(epoch, L.port_range)),
            "RESHARD_COORDINATOR": L.cluster.coordinator, "RESHARD_JOB_ID": L.job.id,
            "RESHARD_WORKER_TOKEN": L.worker_token,
            "RESHARD_WORKER_SOCKET": L.cluster.agents[host].worker_socket,
            "RESHARD_GENERATION": str(generation), "RESHARD_OPERATION_ID": operation_id,
            "RESHARD_LAYOUT": json.dumps(reshard.to_dict(lay), sort_keys=True),
            "RESHARD_TLS_CA": L.cluster.pki.ca, "RESHARD_DEVICE": str(device)}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().split(") ")[1][0] != "Z"


def test_launchers_follow_stop_free_and_stop_the_world(cluster, client, job_name, tmp_path):
    lay1 = layout.make_layout(1, 1, 3, ranks=[("host-0", 0), ("host-0", 1), ("host-1", 0)])
    job = _register(client, job_name, lay1)
    L = Launchers(cluster, client, job, tmp_path)
    try:
        for h in cluster.host_ids:
            L.start(h)
        # 1. The registered layout: ranks 0, 1 on host-0, rank 2 on host-1,
        # fresh (generation 0: they publish generation 1); host-2 none.
        first = L.ranks_of(lambda r: r["env"]["RESHARD_GENERATION"] == "0", 3)
        for rank, (local, lw) in {0: (0, 2), 1: (1, 2), 2: (0, 1)}.items():
            assert first[rank]["env"] == _expected_env(L, lay1, rank, local, lw, "localhost", 0,
                                                       0)  # the registered layout: epoch 0
            assert first[rank]["loaded"] == {"step": 0, "w": list(range(8)), "dataset_step": 0}
        assert [e for e in L.events("host-2") if e["event"] == "world"][0]["ranks"] == []

        # 2. Stop-free resize to dp 2 on host-1 (device 1) and host-2.
        lay2 = layout.make_layout(1, 1, 2, ranks=[("host-1", 1), ("host-2", 0)])
        op = client.resize(job.id, lay2, stop_free=True)
        warm = L.ranks_of(lambda r: r["env"]["RESHARD_OPERATION_ID"] == op.id, 2)
        planned = client.get_operation(op.id)
        for rank in (0, 1):
            assert warm[rank]["env"] == _expected_env(
                L, lay2, rank, 0, 1, "127.0.0.1", warm[rank]["env"]["RESHARD_GENERATION"],
                1, op.id)  # the running world's epoch (0) + 1
        assert warm[0]["env"]["MASTER_PORT"] != first[0]["env"]["MASTER_PORT"]
        final = client.wait(op.id, timeout=120, raise_on_failure=True)
        # The old ranks cut over at one step and ended by themselves (exit 0).
        ended = L.wait("the old ranks' cut", lambda: [
            d for d in (L.record(r["pid"]) for r in first.values()) if "cut" in d] if all(
            "cut" in L.record(r["pid"]) for r in first.values()) else None)
        cut_steps = {d["cut"]["step"] for d in ended}
        assert len(cut_steps) == 1, cut_steps
        cut_step = cut_steps.pop()
        assert {d["cut"]["operation"] for d in ended} == {op.id}
        for rank in (0, 1):
            assert warm[rank]["loaded"] == {"step": cut_step,
                                            "w": [float(i + cut_step) for i in range(8)],
                                            "dataset_step": cut_step}
        for host, ranks in (("host-0", {0, 1}), ("host-1", {2})):
            retired = L.wait(f"{host} retires g1", lambda: [
                e for e in L.events(host) if e["event"] == "retired" and e["world"] == "g1"])
            assert retired[0]["status"] == {str(r): 0 for r in ranks}
            assert not [e for e in L.events(host) if e["event"] in ("failed", "terminate")]
        assert final.stop_free
        assert client.get_job(job.id).layout_epoch == 1

        # 3. Stop-the-world at the next step boundary, to dp 2 on host-0 and
        # host-2 (device 1): the running ranks publish their last step and
        # end by themselves; the new ranks start cold at the committed
        # generation and load that step.
        lay3 = layout.make_layout(1, 1, 2, ranks=[("host-0", 0), ("host-2", 1)])
        gen3 = client.wait(client.resize(job.id, lay3, at_step_boundary=True).id, timeout=120,
                           raise_on_failure=True).to_generation
        cold = L.ranks_of(lambda r: r["env"]["RESHARD_GENERATION"] == str(gen3), 2)
        stop_steps = {L.record(r["pid"])["cut"]["step"] for r in warm.values()}
        assert len(stop_steps) == 1, stop_steps
        stop_step = stop_steps.pop()
        assert stop_step > cut_step
        for rank in (0, 1):
            assert cold[rank]["env"] == _expected_env(L, lay3, rank, 0, 1, "localhost", gen3,
                                                      2)
            assert cold[rank]["loaded"] == {"step": stop_step,
                                            "w": [float(i + stop_step) for i in range(8)],
                                            "dataset_step": stop_step}
        for host, rank in (("host-1", 0), ("host-2", 1)):
            retired = L.wait(f"{host} retires the stop-free world", lambda: [
                e for e in L.events(host) if e["event"] == "retired" and
                e["world"] == f"op-{op.id}"])
            assert retired[0]["status"] == {str(rank): 0}
            assert not [e for e in L.events(host) if e["event"] == "terminate"]

        # 4. A plain stop-the-world resize to dp 1 on host-1: the running
        # ranks (past the committed step) are stopped, the new one loads
        # generation gen3's step.
        lay4 = layout.make_layout(1, 1, 1, ranks=[("host-1", 0)])
        gen4 = client.wait(client.resize(job.id, lay4).id, timeout=120,
                           raise_on_failure=True).to_generation
        last = L.ranks_of(lambda r: r["env"]["RESHARD_GENERATION"] == str(gen4), 1)
        assert last[0]["env"] == _expected_env(L, lay4, 0, 0, 1, "127.0.0.1", gen4,
                                               3)
        assert last[0]["loaded"] == {"step": stop_step,
                                     "w": [float(i + stop_step) for i in range(8)],
                                     "dataset_step": stop_step}
        for host, rank in (("host-0", 0), ("host-2", 1)):
            term = L.wait(f"{host} stops g{gen3}", lambda: [
                e for e in L.events(host) if e["event"] == "terminate"])
            assert (term[0]["world"], term[0]["ranks"]) == (f"g{gen3}", [rank])
        for r in cold.values():
            L.wait("stopped rank gone", lambda: not _alive(r["pid"]))

        # 5. The job deleted: every launcher stops its ranks and exits 0.
        client.delete_job(job.id)
        for host, p in L.procs.items():
            assert p.wait(60) == launch.EXIT_OK, host
        assert not _alive(last[0]["pid"])
    finally:
        L.stop()


def test_killed_rank_is_reported_and_recovered(cluster, client, job_name, tmp_path):
    lay = layout.make_layout(1, 1, 2, ranks=[("host-0", 0), ("host-1", 0)])
    job = _register(client, job_name, lay)
    L = Launchers(cluster, client, job, tmp_path,
                  recovery_timeout={"host-0": 120, "host-1": 3})
    try:
        L.start("host-0")
        L.start("host-1")
        ranks = L.ranks_of(lambda r: True, 2)
        victim = ranks[1]["pid"]
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        failed = L.wait("failure event", lambda: [e for e in L.events("host-1")
                                                  if e["event"] == "reported"], timeout=30)
        assert (failed[0]["rank"], failed[0]["world"], failed[0]["reported"]) == (1, "g1", True)
        assert failed[0]["t"] - t_kill < 5.0
        # Rank 0 died of its peer's death (PeerLost: it exits
        # EXIT_PEER_LOST): a casualty, not reported.
        casualty = L.wait("casualty", lambda: [e for e in L.events("host-0")
                                               if e["event"] in ("casualty", "reported")])
        assert (casualty[0]["event"], casualty[0]["rank"], casualty[0]["of"]) == (
            "casualty", 0, [])
        assert [(e["rank"], e["code"]) for e in L.events("host-0") if e["event"] == "failed"] == \
            [(0, launch.EXIT_PEER_LOST)]
        # The coordinator's record: rank 1 of generation 1, with the reason.
        recorded = client.get_job(job.id).failed_ranks
        assert [(f.rank, f.generation, f.reason) for f in recorded] == [
            (1, 1, "rank 1 (g1) killed by signal SIGKILL")]
        # host-1 gets no recovery within its 3 s: it exits 1.
        assert L.procs["host-1"].wait(60) == launch.EXIT_RANK_FAILED
        L.exited.add("host-1")
        stop = [e for e in L.events("host-1") if e["event"] == "stop"]
        assert stop[-1]["code"] == launch.EXIT_RANK_FAILED
        # The scheduler recovers from the lost rank; host-0's launcher
        # (rank 0 died with its peer, or still runs) follows it.
        # host-1's launcher is gone: the job shrinks onto host-0 (one copy
        # left, accepted; docs/coordinator.md, "Recovery keeps the job's
        # redundancy").
        op = client.wait(client.recover(job.id, lost_ranks=[1], accept_degraded=True).id,
                         timeout=120, raise_on_failure=True)
        target = op.target_layout
        assert layout.slots(target) == [("host-0", 0)]
        again = L.ranks_of(lambda r: r["env"]["RESHARD_GENERATION"] == str(op.to_generation), 1)
        assert again[0]["env"] == _expected_env(L, target, 0, 0, 1, "127.0.0.1", op.to_generation,
                                                1)  # the recovery's epoch
        assert again[0]["loaded"] == {"step": 0, "w": [float(i) for i in range(8)],
                                      "dataset_step": 0}
        assert [e["event"] for e in L.events("host-0")].count("recovered") == 1
        assert not _alive(ranks[0]["pid"])
        # SIGTERM to the launcher: forwarded to its rank, exit 128 + 15.
        L.procs["host-0"].send_signal(signal.SIGTERM)
        assert L.procs["host-0"].wait(60) == 128 + signal.SIGTERM
        assert not _alive(again[0]["pid"])
        term = [e for e in L.events("host-0") if e["event"] == "terminate"]
        assert term[-1]["ranks"] == [0] and term[-1]["world"] == f"g{op.to_generation}"
    finally:
        L.close()


def test_killed_warm_up_rank_is_not_reported_as_a_rank_of_the_job(cluster, client, job_name,
                                                                  tmp_path):
    """A warm-up rank SIGKILLed for real: its number is one of the operation's
    target layout, not of the job's current world, and ReportRankFailure
    names ranks of the current generation only, so reporting it would mark
    a healthy rank dead (here rank 1 of the current world). The launcher
    does not; the old world trains on and the scheduler cancels the
    operation."""
    lay1 = layout.make_layout(1, 1, 2, ranks=[("host-0", 0), ("host-0", 1)])
    job = _register(client, job_name, lay1)
    L = Launchers(cluster, client, job, tmp_path)
    try:
        L.start("host-0")
        L.start("host-1")
        old = L.ranks_of(lambda r: True, 2)
        # Rank 0 of the target is on host-2, whose launcher is not started:
        # rank 1 waits in the rendezvous, still warming up, when it is killed.
        lay2 = layout.make_layout(1, 1, 2, ranks=[("host-2", 0), ("host-1", 0)])
        op = client.resize(job.id, lay2, stop_free=True)
        warm = L.wait("the warm-up rank", lambda: [
            r for r in L.records() if r["env"]["RESHARD_OPERATION_ID"] == op.id])
        assert (len(warm), warm[0]["env"]["RANK"]) == (1, "1")
        os.kill(warm[0]["pid"], signal.SIGKILL)
        failed = L.wait("the failure", lambda: [e for e in L.events("host-1")
                                                if e["event"] == "failed"])
        assert [(e["world"], e["rank"], e["code"]) for e in failed] == [
            (f"op-{op.id}", 1, -signal.SIGKILL)]
        assert not [e for e in L.events("host-1") if e["event"] in ("reported", "casualty")]
        assert client.get_job(job.id).failed_ranks == []
        assert client.cancel_operation(op.id).state == reshard.OperationState.Value(
            "OPERATION_STATE_ABORTED")
        job_now = client.get_job(job.id)
        assert (job_now.generation, job_now.layout, list(job_now.failed_ranks)) == (
            1, lay1, [])
        assert all(_alive(r["pid"]) and "cut" not in L.record(r["pid"]) for r in old.values())
        assert not [e for e in L.events("host-0") if e["event"] in ("terminate", "failed")]
    finally:
        L.close()


def test_rank_env_names_what_is_missing():
    with pytest.raises(launch.LaunchError, match=r"\$RESHARD_LAYOUT"):
        launch.rank_env({})
    lay = layout.make_layout(1, 1, 1, ranks=[("h", 3)])
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "a", "MASTER_PORT": "x", "RESHARD_COORDINATOR": "c:1",
           "RESHARD_JOB_ID": "j", "RESHARD_WORKER_SOCKET": "/s", "RESHARD_GENERATION": "4",
           "RESHARD_LAYOUT": json.dumps(reshard.to_dict(lay)), "RESHARD_DEVICE": "3"}
    with pytest.raises(launch.LaunchError, match=r"\$MASTER_PORT 'x'"):
        launch.rank_env(env)
    env["MASTER_PORT"] = "29501"
    e = launch.rank_env(env)
    assert (e.rank, e.master_port, e.generation, e.device, e.operation_id, e.fresh,
            e.warm_up) == (0, 29501, 4, 3, "", False, False)
    assert e.layout == lay


def test_rank_env_reads_what_the_launcher_writes():
    from reshard import _launch_env
    lay = layout.make_layout(1, 1, 2, ranks=[("h", 3), ("h", 5)])
    base = {"PATH": "/bin", "RESHARD_OPERATION_ID": "stale", "RESHARD_TLS_CA": "/old.pem"}
    env = _launch_env.rank_environment(
        base, rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="10.0.0.5",
        master_port=29507, coordinator="c:1", job_id="j", worker_token="wt-j.x",
        worker_socket="/s", generation=0, layout_json=json.dumps(reshard.to_dict(lay)),
        device=5, operation_id="op-9")
    assert (env["PATH"], env["OMP_NUM_THREADS"], "RESHARD_TLS_CA" in env) == ("/bin", "1", False)
    e = launch.rank_env(env)
    assert e == launch.RankEnv(
        rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="10.0.0.5",
        master_port=29507, coordinator="c:1", job_id="j", worker_token="wt-j.x",
        worker_socket="/s", generation=0, operation_id="op-9", layout=lay, tls_ca="",
        device=5)
    assert (e.warm_up, e.fresh) == (True, False)
    again = launch.rank_env(_launch_env.rank_environment(
        base, rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="a",
        master_port=1, coordinator="c:1", job_id="j", worker_token="", worker_socket="/s",
        generation=3, layout_json="{}", device=0, tls_ca="/ca.pem"))
    assert (again.operation_id, again.tls_ca, again.generation) == ("", "/ca.pem", 3)
    assert "OMP_NUM_THREADS" not in base


def test_world_ports_differ_for_overlapping_worlds():
    # Worlds alive at once have consecutive layout epochs (the running one
    # and a stop-free operation's new one), however many checkpoints the
    # running one lived through.
    for rng in ((29500, 30499), (40000, 40001), (40000, 40002)):
        for e in range(3000):
            assert launch.rendezvous_port(e, rng) != launch.rendezvous_port(e + 1, rng)
    assert launch.rendezvous_port(7, (29500, 30499)) == 29507
    assert launch.rendezvous_port(1007, (29500, 30499)) == 29507
    with pytest.raises(launch.LaunchError, match="29600-29500"):
        launch.parse_port_range("29600-29500")


def test_cli_refuses_bad_arguments(tmp_path):
    base = ["run", "--coordinator", "127.0.0.1:1", "--job", "j", "--host", "h",
            "--worker-socket", "/nonexistent"]
    assert launch.main(base + ["--insecure"]) == launch.EXIT_USAGE  # no command
    assert launch.main(base + ["--", "true"]) == launch.EXIT_USAGE  # neither TLS nor --insecure
    assert launch.main(base + ["--insecure", "--rdzv-host", "nohost", "--", "true"]) == \
        launch.EXIT_USAGE
    assert launch.main(base + ["--insecure", "--token-file", str(tmp_path / "none"), "--",
                               "true"]) == launch.EXIT_USAGE
    assert launch.main(["walk"]) == launch.EXIT_USAGE


def test_console_script_and_module_entry_points():
    import tomllib
    with open(os.path.join(HERE, "..", "..", "client", "python", "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"] == {"reshard": "reshard.launcher.launch:main"}
    r = subprocess.run([sys.executable, "-m", "reshard", "run", "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    r = subprocess.run([sys.executable, "-m", "reshard", "walk"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert r.returncode == launch.EXIT_USAGE, r.stdout


# ---- the launcher's reactions, driven directly (no cluster): rank processes
# are real (sh + sleep), the coordinator's answers are given.

class _Given:
    """The coordinator's answers a Launcher asks for, as given by a test."""

    def __init__(self):
        self.operations, self.reports, self.epoch = {}, [], 0

    def get_job(self, job_id):
        return _pb.Job(id=job_id, layout_epoch=self.epoch)

    def get_operation(self, op_id):
        return self.operations[op_id]

    def watch_operation(self, op_id):
        return iter(())  # the test hands updates to on_op itself

    def report_rank_failure(self, job_id, rank, reason):
        self.reports.append((rank, reason))

    def list_hosts(self):
        return [reshard.agent_pb2.Host(host_id="h0", address="10.0.0.5:7001"),
                reshard.agent_pb2.Host(host_id="h1", address="[fd00::7]:7001")]


_pb = reshard.coordinator_pb2
# Warm-up ranks exit 7 when $FAIL_WARM_UP is set; every other rank sleeps.
_RANK_CMD = ["sh", "-c", 'if [ -n "$RESHARD_OPERATION_ID" ] && [ -n "$FAIL_WARM_UP" ]; then '
             'exit 7; fi; exec sleep 120']


def _launcher(tmp_path, given):
    return launch.Launcher(given, "job-1", "h0", "/run/worker.sock", _RANK_CMD, "coord:1",
                           worker_token="wt-x", grace=1.0, recovery_timeout=30.0,
                           events_path=str(tmp_path / "events.jsonl"), log=lambda msg: None)


def _events(tmp_path):
    with open(tmp_path / "events.jsonl") as f:
        return [json.loads(line) for line in f]


def _job(generation, lay, active="", epoch=0):
    return _pb.Job(id="job-1", state=_pb.JOB_STATE_ACTIVE, generation=generation, layout=lay,
                   active_operation_id=active, layout_epoch=epoch)


def _begin(L, given, op, generation, lay):
    """The coordinator starts `op`: GetOperation answers it and the job at
    `generation` / `lay` names it active."""
    given.operations[op.id] = op
    L.on_job(_job(generation, lay, active=op.id))


def _with_state(op, state):
    """`op`'s update as WatchOperation sends it when it reaches `state`."""
    out = _pb.Operation()
    out.CopyFrom(op)
    out.state = state
    return out


def _commit(L, given, op):
    """The stop-the-world `op` commits: GetOperation answers it COMMITTED and
    the job moves to its generation and layout (seen before the operation's
    own update)."""
    given.operations[op.id] = _with_state(op, _pb.OPERATION_STATE_COMMITTED)
    L.on_job(_job(op.to_generation, op.target_layout))


def _pump(L, until, timeout=20.0):
    end = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < end, "timed out"
        L.step(timeout=0.1)


def test_aborted_stop_free_operation_stops_its_warm_up_ranks_only(tmp_path):
    given, lay1 = _Given(), layout.make_layout(1, 1, 2, ranks=[("h0", 0), ("h0", 1)])
    L = _launcher(tmp_path, given)
    try:
        L.on_job(_job(1, lay1))
        old = L.current
        assert sorted(old.procs) == [0, 1] and L.warming is None
        op = _pb.Operation(id="op-1", job_id="job-1", kind=_pb.OPERATION_KIND_RESIZE,
                           state=_pb.OPERATION_STATE_PLANNED, stop_free=True, to_generation=2,
                           prepared_from_generation=1, from_generation=1,
                           target_layout=layout.make_layout(1, 1, 1, ranks=[("h0", 1)]))
        _begin(L, given, op, 1, lay1)
        warm = L.warming
        assert (warm.name, sorted(warm.procs)) == ("op-op-1", [0])
        L.on_op(_with_state(op, _pb.OPERATION_STATE_ABORTED))
        _pump(L, lambda: not warm.alive())
        assert L.warming is None and L.current is old and old.alive() == [0, 1]
        kinds = [(e["event"], e.get("world")) for e in _events(tmp_path)]
        assert ("abandoned", "op-op-1") in kinds and ("terminate", "op-op-1") in kinds
        assert ("terminate", "g1") not in kinds and given.reports == []
    finally:
        L.stop_all()


def test_a_job_update_older_than_a_promoted_operation_changes_nothing(tmp_path):
    """The stop-free operation commits on its own stream first (its world
    trains); then the job's stream, which lags, delivers an older generation
    (a checkpoint of the old layout): the launcher starts nothing for it,
    and the job's own update of the operation's generation changes nothing."""
    given, lay1 = _Given(), layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    lay2 = layout.make_layout(1, 1, 1, ranks=[("h0", 1)])
    L = _launcher(tmp_path, given)
    try:
        L.on_job(_job(1, lay1))
        op = _pb.Operation(id="op-7", job_id="job-1", kind=_pb.OPERATION_KIND_RESIZE,
                           state=_pb.OPERATION_STATE_PLANNED, stop_free=True, to_generation=3,
                           prepared_from_generation=1, from_generation=1, target_layout=lay2)
        _begin(L, given, op, 1, lay1)
        warm = L.warming
        L.on_op(_with_state(op, _pb.OPERATION_STATE_COMMITTED))
        assert L.current is warm and L.layout == lay2
        L.on_job(_job(2, lay1))  # late: a checkpoint before the commit
        assert L.current is warm and L.layout == lay2
        L.on_job(_job(3, lay2, epoch=1))
        assert L.current is warm
        assert [e["world"] for e in _events(tmp_path) if e["event"] == "world"] == [
            "g1", "op-op-7"]
    finally:
        L.stop_all()


def test_failed_warm_up_rank_is_not_reported_and_the_old_layout_trains_on(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_WARM_UP", "1")
    given, lay1 = _Given(), layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    L = _launcher(tmp_path, given)
    try:
        L.on_job(_job(1, lay1))
        op = _pb.Operation(id="op-2", job_id="job-1", kind=_pb.OPERATION_KIND_RESIZE,
                           state=_pb.OPERATION_STATE_PLANNED, stop_free=True, to_generation=2,
                           prepared_from_generation=1,
                           target_layout=layout.make_layout(1, 1, 2, ranks=[("h0", 1),
                                                                            ("h1", 0)]))
        _begin(L, given, op, 1, lay1)
        _pump(L, lambda: any(e["event"] == "failed" for e in _events(tmp_path)))
        failed = [e for e in _events(tmp_path) if e["event"] == "failed"]
        assert [(e["world"], e["rank"], e["code"]) for e in failed] == [("op-op-2", 0, 7)]
        # Rank 0 of that world is on h0: MASTER_ADDR from its listed agent address.
        started = [e for e in _events(tmp_path) if e["event"] == "world"]
        assert started[-1]["master_addr"] == "10.0.0.5"
        assert given.reports == [] and L.failure is None and L.warming is None
        assert L.current.alive() == [0]
    finally:
        L.stop_all()


@pytest.mark.parametrize("at_boundary", [True, False])
def test_stop_the_world_commit_stops_the_old_ranks(tmp_path, at_boundary):
    given, lay1 = _Given(), layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    L = _launcher(tmp_path, given)
    try:
        L.on_job(_job(2, lay1))
        old = L.current
        assert (old.name, old.generation, old.alive()) == ("g2", 2, [0])
        op = _pb.Operation(id="op-3", job_id="job-1", kind=_pb.OPERATION_KIND_RESIZE,
                           state=_pb.OPERATION_STATE_PENDING, to_generation=3,
                           target_layout=layout.make_layout(1, 1, 1, ranks=[("h0", 1)]))
        if at_boundary:
            op.step_boundary = _pb.STEP_BOUNDARY_REACHED
        _begin(L, given, op, 2, lay1)
        assert L.current is old
        _commit(L, given, op)
        new = L.current
        assert (new.name, new.generation, new.alive()) == ("g3", 3, [0])
        assert new.procs[0].pid != old.procs[0].pid
        terminated = [e["world"] for e in _events(tmp_path) if e["event"] == "terminate"]
        # Stopped at a step boundary, the old ranks get --grace to end by themselves.
        assert terminated == ([] if at_boundary else ["g2"])
        _pump(L, lambda: not old.alive())
        assert [e["world"] for e in _events(tmp_path) if e["event"] == "terminate"] == ["g2"]
        assert new.alive() == [0]
    finally:
        L.stop_all()


def test_started_during_a_stop_the_world_operation_waits_for_it(tmp_path):
    given, lay1 = _Given(), layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    L = _launcher(tmp_path, given)
    try:
        op = _pb.Operation(id="op-4", job_id="job-1", kind=_pb.OPERATION_KIND_RECOVER,
                           state=_pb.OPERATION_STATE_TRANSFERRING, to_generation=5,
                           target_layout=layout.make_layout(1, 1, 1, ranks=[("h0", 1)]))
        _begin(L, given, op, 4, lay1)
        assert L.current is None and L.layout is None
        L.on_job(_job(5, op.target_layout, epoch=1))
        assert (L.current.name, L.current.generation, L.current.alive()) == ("g5", 5, [0])
        started = [e for e in _events(tmp_path) if e["event"] == "world"]
        assert [(e["world"], e["ranks"], e["master_port"]) for e in started] == [
            ("g5", [0], launch.rendezvous_port(1))]
    finally:
        L.stop_all()


# The rank script of the warm-process test: records its pid, argv, __name__,
# whether torch was imported before its first line and the pid of a `sleep`
# it leaves running, then ends as $WARM_END_<generation> says (a status, or
# "raise").
_WARM_RANK = """
import json, os, subprocess, sys
had_torch = "torch" in sys.modules
had_helper = "warm_helper" in sys.modules
import warm_helper
try:
    import needs_rank_env
except KeyError:
    needs_rank_env = None
gen = os.environ["RESHARD_GENERATION"]
child = subprocess.Popen(["sleep", "120"])
with open(os.path.join(os.environ["WARM_OUT"], f"g{gen}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "argv": sys.argv, "name": __name__, "torch": had_torch,
               "helper": had_helper, "helper_pid": warm_helper.PID,
               "rank_env": needs_rank_env.RANK if needs_rank_env else None,
               "rank": os.environ["RANK"], "device": os.environ["RESHARD_DEVICE"],
               "child": child.pid}, f)
end = os.environ.get("WARM_END_" + gen, "0")
if end == "raise":
    raise RuntimeError("the rank's own failure")
sys.exit(int(end))
"""


def _warm_rank_script(tmp_path):
    """_WARM_RANK as tmp_path/rank.py, beside the two modules it imports: one
    a spare can import ahead of the rank, one that needs the rank's RANK."""
    (tmp_path / "warm_helper.py").write_text("import os\nPID = os.getpid()\n")
    (tmp_path / "needs_rank_env.py").write_text("import os\nRANK = os.environ['RANK']\n")
    script = tmp_path / "rank.py"
    script.write_text(_WARM_RANK)
    return script


def test_warm_rank_process_serves_the_next_layouts_rank_and_dies_with_a_failure(
        tmp_path, monkeypatch):
    """--spares 1: a rank runs in a rank host (torch imported first, and the
    script's own top-level imports that can be; the script as __main__ with
    its argv); ending with 0 it hands its process to
    the next layout's rank (same pid, torch still imported), and what it
    left running is gone; a rank that raises ends that process with status
    1, and the next rank gets a fresh rank host; sys.exit(3) is status 3."""
    script = _warm_rank_script(tmp_path)
    monkeypatch.setenv("WARM_OUT", str(tmp_path))
    monkeypatch.setenv("WARM_END_3", "raise")
    monkeypatch.setenv("WARM_END_4", "3")
    given = _Given()
    dev0 = layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    dev1 = layout.make_layout(1, 1, 1, ranks=[("h0", 1)])
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock",
                        [sys.executable, str(script), "--flag", "x"], "coord:1",
                        worker_token="wt-x", grace=1.0, recovery_timeout=30.0,
                        events_path=str(tmp_path / "events.jsonl"), log=lambda msg: None,
                        spares=1)

    def record(gen):
        with open(tmp_path / f"g{gen}.json") as f:
            return json.load(f)

    def exits(world):
        return [e["code"] for e in _events(tmp_path) if e["event"] == "exit" and
                e["world"] == world]

    try:
        L.on_job(_job(2, dev0))
        _pump(L, lambda: exits("g2"), timeout=60)
        first = record(2)
        assert exits("g2") == [0]
        child = first.pop("child")
        assert first == {"pid": L.current.procs[0].pid, "argv": [str(script), "--flag", "x"],
                         "name": "__main__", "torch": True, "helper": True,
                         "helper_pid": L.current.procs[0].pid, "rank_env": "0", "rank": "0",
                         "device": "0"}
        # The spare imported the user's module before it said ready; the one
        # that reads RANK failed there and was imported by the rank.
        ready = [e for e in _events(tmp_path) if e["event"] == "spare_ready"]
        assert ready[0]["pid"] == first["pid"]
        assert "warm_helper" in ready[0]["modules"], ready[0]
        assert "needs_rank_env" not in ready[0]["modules"], ready[0]
        assert _alive(first["pid"])  # back in the pool, idle
        assert not _alive(child)     # what the rank left running ended with it

        L.on_job(_job(3, dev1))
        _pump(L, lambda: exits("g3"), timeout=60)
        again = record(3)
        assert (again["pid"], again["torch"], again["device"]) == (first["pid"], True, "1")
        assert [(e["world"], e["pid"], e["warm"], e["served"]) for e in _events(tmp_path)
                if e["event"] == "assign"] == [("g2", first["pid"], False, 0),
                                               ("g3", first["pid"], True, 1)]
        assert exits("g3") == [1]  # raised: the process ends with it
        _pump(L, lambda: not _alive(first["pid"]), timeout=20)

        L.on_job(_job(4, dev0))
        _pump(L, lambda: exits("g4"), timeout=60)
        last = record(4)
        assert last["pid"] != first["pid"] and exits("g4") == [3]
        _pump(L, lambda: not _alive(last["pid"]), timeout=20)
    finally:
        L.stop_all()


def test_a_rank_host_reads_the_scripts_top_level_imports():
    """What a spare pre-imports of a script: its top-level `import` and
    `from ... import` (also in a top-level try), in order, once; not what
    a function or an `if` imports, not relative imports, not __future__."""
    from reshard.launcher import _rank_host
    source = ("from __future__ import annotations\n"
              "import os, model_lib.layers as L\n"
              "from data_lib.loader import Loader\n"
              "from . import sibling\n"
              "try:\n    import optional_lib\nexcept ImportError:\n    pass\n"
              "if os.environ.get('X'):\n    import only_if_x\n"
              "def main():\n    import inside_main\n"
              "import os\n")
    assert _rank_host._top_level_imports(source) == [
        "os", "model_lib.layers", "data_lib.loader", "optional_lib"]
    assert _rank_host._top_level_imports("def broken(:\n") == []


def test_a_spare_pre_imports_a_module_commands_imports(tmp_path):
    """`python -m pkg.train`: the spare reads pkg/train.py (found from the
    launcher's directory, as -m finds it) and imports what it imports at its
    top level, sys.path[0] being that directory; sys.path is left as it was."""
    import importlib
    from reshard.launcher import _rank_host
    pkg = tmp_path / "preimport_pkg_a1"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import preimport_lib_a1\nimport preimport_missing_a1\n")
    (tmp_path / "preimport_lib_a1.py").write_text("VALUE = 7\n")
    path = list(sys.path)
    try:
        got = _rank_host._preimport({"mode": "module", "target": "preimport_pkg_a1.train",
                                     "cwd": str(tmp_path)})
        assert got == ["preimport_lib_a1"]
        assert sys.modules["preimport_lib_a1"].VALUE == 7
        assert "preimport_pkg_a1.train" not in sys.modules  # read, not run
        assert sys.path == path
    finally:
        for name in ("preimport_lib_a1", "preimport_pkg_a1"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()


def test_a_rank_host_outlives_the_thread_that_started_it(tmp_path, monkeypatch):
    """The exec shim's PR_SET_PDEATHSIG (a rank dies with its launcher) fires
    on Linux when the *thread* that started the process ends. A rank host
    started by a thread of the pool that then ends (a timer; the status
    reader of a rank host that ended) must live on and serve the next rank:
    every process start runs on the launcher's one spawn thread."""
    import threading
    script = _warm_rank_script(tmp_path)
    monkeypatch.setenv("WARM_OUT", str(tmp_path))
    given = _Given()
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", [sys.executable, str(script)],
                        "coord:1", worker_token="wt-x", grace=1.0, recovery_timeout=30.0,
                        events_path=str(tmp_path / "events.jsonl"), log=lambda msg: None,
                        spares=1)
    starter, started = L.starter, []

    def start_and_end():
        # Ends only once the rank host is ready: its shim asked for the
        # signal long before.
        with starter._changed:
            started.append(starter._spawn_spare())
            assert starter._changed.wait_for(lambda: started[0].ready, timeout=60)

    try:
        t = threading.Thread(target=start_and_end)
        t.start()
        t.join()
        pid = started[0].pid
        L.on_job(_job(2, layout.make_layout(1, 1, 1, ranks=[("h0", 0)])))
        _pump(L, lambda: [e for e in _events(tmp_path) if e["event"] == "exit"], timeout=60)
        assert [(e["world"], e["code"]) for e in _events(tmp_path) if e["event"] == "exit"] == [
            ("g2", 0)]
        with open(tmp_path / "g2.json") as f:
            assert json.load(f)["pid"] == pid
        assert _alive(pid)
    finally:
        L.stop_all()


def test_a_rank_host_that_dies_before_it_is_ready_leaves_the_ranks_to_cold_starts(
        tmp_path, monkeypatch):
    """A spare that ends before it said ready (here SIGKILLed while it imports
    torch) turns the pool off (event spares_off, no new rank host: no restart
    loop); the next rank starts cold, in a process of its own, and runs."""
    script = _warm_rank_script(tmp_path)
    monkeypatch.setenv("WARM_OUT", str(tmp_path))
    given = _Given()
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", [sys.executable, str(script)],
                        "coord:1", worker_token="wt-x", grace=1.0, recovery_timeout=30.0,
                        events_path=str(tmp_path / "events.jsonl"), log=lambda msg: None,
                        spares=1)
    try:
        L.on_job(_job(2, layout.make_layout(1, 1, 1, ranks=[("h1", 0)])))  # none on h0
        spares = [e["pid"] for e in _events(tmp_path) if e["event"] == "spare"]
        assert len(spares) == 1
        os.kill(spares[0], signal.SIGKILL)
        _pump(L, lambda: any(e["event"] == "spares_off" for e in _events(tmp_path)))
        off = [e for e in _events(tmp_path) if e["event"] == "spares_off"]
        assert [(e["pid"], e["code"]) for e in off] == [(spares[0], -signal.SIGKILL)]
        L.on_job(_job(3, layout.make_layout(1, 1, 1, ranks=[("h0", 0)])))
        _pump(L, lambda: any(e["event"] == "exit" for e in _events(tmp_path)), timeout=60)
        with open(tmp_path / "g3.json") as f:
            ran = json.load(f)
        world = [e for e in _events(tmp_path) if e["event"] == "world" and e["world"] == "g3"]
        assert world[0]["pids"] == {"0": ran["pid"]} and world[0]["warm"] == {"0": False}
        assert ran["torch"] is False  # a fresh interpreter
        kinds = [e["event"] for e in _events(tmp_path)]
        assert kinds.count("spare") == 1 and "assign" not in kinds
        assert [(e["world"], e["code"]) for e in _events(tmp_path) if e["event"] == "exit"] == [
            ("g3", 0)]
    finally:
        L.stop_all()


_DYING_LAUNCHER = """
import sys, time
import reshard
from reshard import launch, layout
class Given:
    def list_hosts(self):
        return []
L = launch.Launcher(Given(), "job-1", "h0", "/run/worker.sock", ["sleep", "120"], "coord:1",
                    log=lambda msg: None)
L.on_job(reshard.coordinator_pb2.Job(id="job-1", generation=1, state=1,
                                     layout=layout.make_layout(
                                         1, 1, 2, ranks=[("h0", 0), ("h0", 1)])))
print(" ".join(str(p.pid) for p in L.current.procs.values()), flush=True)
time.sleep(120)
"""


def test_ranks_die_with_a_killed_launcher():
    p = subprocess.Popen([sys.executable, "-c", _DYING_LAUNCHER], stdout=subprocess.PIPE,
                         text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2
    end = time.monotonic() + 10
    while not all(_exe_of(pid) == "sleep" for pid in pids):  # the shim exec'd the command
        assert time.monotonic() < end
        time.sleep(0.05)
    p.kill()
    p.wait()
    end = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < end, [pid for pid in pids if _alive(pid)]
        time.sleep(0.05)


def _exe_of(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def test_recovery_to_the_same_layout_restarts_and_a_checkpoint_does_not(tmp_path):
    given, lay1 = _Given(), layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    L = _launcher(tmp_path, given)
    try:
        L.on_job(_job(2, lay1))
        old = L.current
        op = _pb.Operation(id="op-5", job_id="job-1", kind=_pb.OPERATION_KIND_RECOVER,
                           state=_pb.OPERATION_STATE_PLANNED, to_generation=3, target_layout=lay1)
        _begin(L, given, op, 2, lay1)
        assert L.current is old
        _commit(L, given, op)
        new = L.current
        assert (new.name, new.generation, new.alive()) == ("g3", 3, [0])
        _pump(L, lambda: not old.alive())
        L.on_job(_job(4, lay1))  # a checkpoint: same layout, no reconfiguration
        assert L.current is new and new.alive() == [0]
        assert [(e["world"], e["ranks"]) for e in _events(tmp_path) if e["event"] == "terminate"] \
            == [("g2", [0])]
    finally:
        L.stop_all()


def test_master_addr_sources_in_order():
    hosts = [reshard.agent_pb2.Host(host_id="h0", address="10.0.0.5:7001"),
             reshard.agent_pb2.Host(host_id="h1", address="[fd00::7]:7001")]
    a = launch.Addresses({"h0": "trainer-0"}, "", lambda: hosts)
    assert (a.of("h0"), a.of("h1")) == ("trainer-0", "fd00::7")
    a = launch.Addresses({}, "{host}.trainers.ns.svc", lambda: hosts)
    assert a.of("h1") == "h1.trainers.ns.svc"
    with pytest.raises(launch.LaunchError, match=r'host "h2": no address'):
        launch.Addresses({}, "", lambda: hosts).of("h2")

    def refused():
        raise reshard.PermissionDenied("ListHosts refused to \"worker:j\" (role worker)",
                                       method="ListHosts")
    with pytest.raises(launch.LaunchError,
                       match=r'host "h0": no --rdzv-host h0=ADDR or --rdzv-host-pattern, and the '
                             r'coordinator does not list hosts to this credential'):
        launch.Addresses({}, "", refused).of("h0")


@pytest.mark.parametrize("then", ["reported", "another reported", "its host lost"])
def test_a_rank_exiting_with_a_status_is_reported_unless_it_is_a_casualty(
        tmp_path, monkeypatch, then):
    monkeypatch.setenv("FAIL_RANK", "0")
    given = _Given()
    lay = layout.make_layout(1, 1, 2, ranks=[("h0", 0), ("h1", 0)])
    cmd = ["sh", "-c", 'if [ "$RANK" = "$FAIL_RANK" ]; then exit 1; fi; exec sleep 120']
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", cmd, "coord:1",
                        settle=0.5 if then == "reported" else 30.0, recovery_timeout=60.0,
                        grace=1.0, events_path=str(tmp_path / "events.jsonl"),
                        log=lambda msg: None)
    try:
        L.on_job(_job(1, lay))
        _pump(L, lambda: any(e["event"] == "failed" for e in _events(tmp_path)))
        assert L.pending and given.reports == []  # held for --settle
        if then == "another reported":
            job = _job(1, lay)
            job.failed_ranks.add(rank=1, generation=1, reason="rank 1 (g1) killed by signal "
                                                              "SIGKILL")
            L.on_job(job)
        elif then == "its host lost":
            job = _job(1, lay)
            job.lost_hosts.append("h1")
            L.on_job(job)
        _pump(L, lambda: not L.pending)
        done = [(e["event"], e["rank"], e.get("of")) for e in _events(tmp_path)
                if e["event"] in ("reported", "casualty")]
        if then == "reported":
            assert done == [("reported", 0, None)]
            assert given.reports == [(0, "rank 0 (g1) exit status 1")]
        else:
            assert done == [("casualty", 0, [1])] and given.reports == []
    finally:
        L.stop_all()


@pytest.mark.parametrize("sibling", ["loses the peer too", "hangs"])
def test_the_ranks_beside_a_peer_lost_rank_get_grace_to_end(tmp_path, sibling):
    """Rank 0 exits EXIT_PEER_LOST: rank 1 on the same host lost the same
    peer, so it gets --grace to end by itself and keeps its own status (75
    here, not SIGTERM's -15); one that does not end is terminated after it."""
    given = _Given()
    lay = layout.make_layout(1, 1, 3, ranks=[("h0", 0), ("h0", 1), ("h1", 0)])
    # Rank 1 waits for rank 0's exit (the launcher has seen it), then ends as
    # PeerLost too or sleeps on.
    then = "exit 75" if sibling == "loses the peer too" else "exec sleep 120"
    cmd = ["sh", "-c", f'if [ "$RANK" = 0 ]; then exit {launch.EXIT_PEER_LOST}; fi; '
                       f'while [ ! -e "{tmp_path}/go" ]; do sleep 0.02; done; {then}']
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", cmd, "coord:1",
                        grace=5.0 if sibling == "loses the peer too" else 1.0,
                        recovery_timeout=60.0, events_path=str(tmp_path / "events.jsonl"),
                        log=lambda msg: None)
    try:
        L.on_job(_job(1, lay))
        world = L.current
        _pump(L, lambda: any(e["event"] == "failed" for e in _events(tmp_path)))
        assert world.alive() == [1] and not [e for e in _events(tmp_path)
                                             if e["event"] == "terminate"]
        (tmp_path / "go").touch()
        _pump(L, lambda: not world.alive())
        exits = [(e["rank"], e["code"]) for e in _events(tmp_path) if e["event"] == "exit"]
        terminated = [(e["world"], e["ranks"]) for e in _events(tmp_path)
                      if e["event"] == "terminate"]
        if sibling == "loses the peer too":
            assert exits == [(0, launch.EXIT_PEER_LOST), (1, launch.EXIT_PEER_LOST)]
            assert terminated == []
        else:
            assert exits == [(0, launch.EXIT_PEER_LOST), (1, -signal.SIGTERM)]
            assert terminated == [("g1", [1])]
        assert given.reports == [] and L.failure is not None
    finally:
        L.stop_all()


_PEER_RANKS = """
import json, os, sys, threading, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
group = dist.new_group([0, 1])
out = os.environ["PEER_OUT"]
if dist.get_rank() == 0:
    if os.environ["PEER_HOLD"] == "1":
        # A thread the rank leaves running holds its group: nothing frees it.
        threading.Thread(target=lambda g=group: time.sleep(600), daemon=True).start()
    sys.exit(75)  # this rank lost a peer (EXIT_PEER_LOST)
t0 = time.monotonic()
try:
    dist.recv(torch.zeros(1), src=0, group=group)  # rank 0 never sends
    waited = None
except Exception as e:  # noqa: BLE001: gloo's "Connection closed by peer"
    waited = time.monotonic() - t0
with open(os.path.join(out, "rank1.json"), "w") as f:
    json.dump({"waited": waited, "pid": os.getpid()}, f)
sys.exit(75)
"""


@pytest.mark.parametrize("hold", ["freed", "held by a thread"])
def test_a_peer_blocked_on_a_rank_that_ended_fails_at_once(tmp_path, monkeypatch, hold):
    """Rank 0 ends (75) in a warm rank host while rank 1 of the same world,
    on the same host, is blocked receiving from it: the rank host frees
    rank 0's process groups as it tears the rank down, so the connection
    closes and rank 1 fails at once (75, well within --grace) instead of
    waiting until the launcher terminates it. When something rank 0 left
    (a thread) still holds its group, the rank host ends the process
    instead of reporting it idle, with the same effect."""
    script = tmp_path / "peer.py"
    script.write_text(_PEER_RANKS)
    monkeypatch.setenv("PEER_OUT", str(tmp_path))
    monkeypatch.setenv("PEER_HOLD", "1" if hold == "held by a thread" else "0")
    given = _Given()
    lay = layout.make_layout(1, 1, 2, ranks=[("h0", 0), ("h0", 1)])
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", [sys.executable, str(script)],
                        "coord:1", grace=60.0, recovery_timeout=120.0,
                        events_path=str(tmp_path / "events.jsonl"), log=lambda msg: None,
                        spares=2, log_dir=str(tmp_path / "logs"))
    try:
        L.on_job(_job(1, lay))
        world = L.current
        _pump(L, lambda: not world.alive(), timeout=90)
        exits = sorted((e["rank"], e["code"]) for e in _events(tmp_path) if e["event"] == "exit")
        assert exits == [(0, launch.EXIT_PEER_LOST), (1, launch.EXIT_PEER_LOST)], exits
        with open(tmp_path / "rank1.json") as f:
            rank1 = json.load(f)
        assert rank1["waited"] is not None and rank1["waited"] < 30, rank1
        idle = {e["pid"] for e in _events(tmp_path) if e["event"] == "rank_host_idle"}
        rank0 = world.procs[0].pid
        log = (tmp_path / "logs" / "g1-rank0.log").read_text()
        if hold == "freed":
            assert rank0 in idle and _alive(rank0), (idle, log)
        else:
            assert rank0 not in idle, idle
            assert "of the rank's process groups and stores are still referenced" in log, log
            _pump(L, lambda: not _alive(rank0), timeout=20)
    finally:
        L.stop_all()


# ---- nothing a rank started outlives it (each rank leads a process group;
# a guard kills the groups when the launcher dies)

def _gone_within(pids, timeout, what):
    end = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < end, \
            f"{what} still running {timeout} s on: {[pid for pid in pids if _alive(pid)]}"
        time.sleep(0.05)


def _children_of(pid):
    """The pids whose parent is `pid` (a scan of /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _kill_leftovers(pids):
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_what_a_failed_rank_started_ends_with_it(tmp_path):
    """A rank that forks a sleeping grandchild and exits 1: once the launcher
    has seen the exit, the grandchild is gone."""
    given = _Given()
    lay = layout.make_layout(1, 1, 1, ranks=[("h0", 0)])
    cmd = ["sh", "-c", f'sleep 120 & echo $! > "{tmp_path}/grandchild.tmp" && '
                       f'mv "{tmp_path}/grandchild.tmp" "{tmp_path}/grandchild"; exit 1']
    L = launch.Launcher(given, "job-1", "h0", "/run/worker.sock", cmd, "coord:1", grace=1.0,
                        recovery_timeout=60.0, events_path=str(tmp_path / "events.jsonl"),
                        log=lambda msg: None)
    grandchild = []
    try:
        L.on_job(_job(1, lay))
        _pump(L, lambda: any(e["event"] == "exit" for e in _events(tmp_path)))
        assert [(e["world"], e["rank"], e["code"]) for e in _events(tmp_path)
                if e["event"] == "exit"] == [("g1", 0, 1)]
        grandchild.append(int((tmp_path / "grandchild").read_text()))
        _gone_within(grandchild, 10, "the failed rank's grandchild")
    finally:
        L.stop_all()
        _kill_leftovers(grandchild)


_LAUNCHER_WITH_GRANDCHILDREN = """
import sys, time
import reshard
from reshard import launch, layout
class Given:
    def list_hosts(self):
        return []
out = sys.argv[1]
cmd = ["sh", "-c", f'sleep 120 & echo $! > "{out}/$RANK.tmp" && mv "{out}/$RANK.tmp" '
                   f'"{out}/$RANK"; wait']
L = launch.Launcher(Given(), "job-1", "h0", "/run/worker.sock", cmd, "coord:1",
                    log=lambda msg: None)
L.on_job(reshard.coordinator_pb2.Job(id="job-1", generation=1, state=1,
                                     layout=layout.make_layout(
                                         1, 1, 2, ranks=[("h0", 0), ("h0", 1)])))
print(" ".join(str(p.pid) for p in L.current.procs.values()), flush=True)
time.sleep(120)
"""


def test_ranks_and_what_they_started_die_with_a_killed_launcher(tmp_path):
    """The launcher SIGKILLed while two ranks run, each with a sleeping
    grandchild: the ranks, the grandchildren and every other process the
    launcher started are gone within seconds."""
    p = subprocess.Popen([sys.executable, "-c", _LAUNCHER_WITH_GRANDCHILDREN, str(tmp_path)],
                         stdout=subprocess.PIPE, text=True)
    ranks, grandchildren, children = [], [], []
    try:
        ranks = [int(x) for x in p.stdout.readline().split()]
        assert len(ranks) == 2
        end = time.monotonic() + 10
        while not all((tmp_path / str(r)).exists() for r in (0, 1)):
            assert time.monotonic() < end, "the ranks started no grandchild"
            time.sleep(0.05)
        grandchildren = [int((tmp_path / str(r)).read_text()) for r in (0, 1)]
        children = _children_of(p.pid)
        assert set(ranks) <= set(children)
        p.kill()
        p.wait()
        _gone_within(ranks + grandchildren + children, 10,
                     "ranks, grandchildren or helpers of the killed launcher")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        _kill_leftovers(ranks + grandchildren + children)


# ---- a coordinator the launcher cannot talk to: one line, no traceback

def _run_cli(tmp_path, coordinator, *tls):
    r = subprocess.run([sys.executable, "-m", "reshard", "run", "--coordinator", coordinator,
                        "--job", "job-1", "--host", "h0", "--worker-socket",
                        str(tmp_path / "worker.sock"), *tls, "--", "true"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, RESHARD_WORKER_TOKEN="wt-x"))
    return r.returncode, r.stderr.splitlines()


@pytest.mark.parametrize("endpoint", ["closed port", "plaintext with --tls-ca",
                                      "TLS with --insecure"])
def test_unreachable_coordinator_is_one_line(tmp_path, endpoint):
    import grpc
    from pki import Pki
    pki = Pki(str(tmp_path / "tls"))
    held = socket.socket()  # bound, not listening: connections are refused
    held.bind(("127.0.0.1", 0))
    server = None
    try:
        if endpoint == "closed port":
            address, tls = f"127.0.0.1:{held.getsockname()[1]}", ["--insecure"]
        else:
            server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
            if endpoint == "plaintext with --tls-ca":
                port = server.add_insecure_port("127.0.0.1:0")
                tls = ["--tls-ca", pki.ca]
            else:
                cert, key = pki.issue("coordinator")
                with open(cert, "rb") as c, open(key, "rb") as k:
                    creds = grpc.ssl_server_credentials([(k.read(), c.read())])
                port = server.add_secure_port("127.0.0.1:0", creds)
                tls = ["--insecure"]
            server.start()
            address = f"127.0.0.1:{port}"
        code, lines = _run_cli(tmp_path, address, *tls)
        assert code == launch.EXIT_USAGE, lines
        assert len(lines) == 1 and "Traceback" not in lines[0], lines
        assert lines[0].startswith(f"reshard run [job-1 h0]: coordinator {address}: cannot "
                                   f"reach it "
                                   f"({'TLS' if '--tls-ca' in tls else 'plaintext'}): "
                                   f"GetJob: UNAVAILABLE: "), lines
    finally:
        held.close()
        if server is not None:
            server.stop(0)
