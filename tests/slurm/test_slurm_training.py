"""A training job submitted the Slurm way, end to end: a real Slurm of
emulated hosts (deploy/slurm/slurm_cluster.py) with reshard beside it
(PostgreSQL and the coordinator on the controller host, an agent beside
each slurmd), the adapter (`reshard slurm watch`) running as the daemon an
admin runs, and the quickstart of docs/pytorch.md (float64, gloo on CPU)
submitted with sbatch, its step `srun reshard run --slurm ... -- python
train.py` on every node of the allocation: placement and rendezvous come
from Slurm (SLURMD_NODENAME, SLURM_STEP_NODELIST, the nodes' NodeAddr).

Each test ends with the Slurm job RUNNING after its event and every step's
loss equal, to a relative 1e-9, to the uninterrupted one-process run (a run
without any event; replays after a node failure included), the job's
committed step its last; deleting the reshard job then ends the Slurm job
(COMPLETED or FAILED: srun's status counts the tasks Slurm killed on a
failed or released node), the launchers of the nodes it ends on exiting 0.

Skipped, with the reason, only where namespaces or the Slurm packages are
missing (scripts/bootstrap.sh installs slurm-wlm and munge)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TORCH2 = os.path.join(ROOT, "tests", "python", "torch2")
sys.path.insert(0, os.path.join(ROOT, "deploy", "slurm"))
sys.path.insert(0, TORCH2)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import helpers  # noqa: E402
import slurm_cluster as slurm  # noqa: E402

from reshard import layout  # noqa: E402
from reshard.launcher.slurm import mark_of  # noqa: E402

MISSING = slurm.missing_capability()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"Slurm cannot run here: {MISSING}")
torch = pytest.importorskip("torch")
import uninterrupted  # noqa: E402

STEPS = 24        # the job's step budget: the first world still trains when the event comes
MIN_STEP_S = 0.4  # the first world's pace (later worlds run at full speed)
BUILD = os.environ.get("RESHARD_BUILD_DIR") or os.path.join(ROOT, "build")


def wait_for(what, check, timeout, also=lambda: None):
    """Polls check() until it is truthy (deadline `timeout` s); also() may
    raise first (a job that ended)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        also()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)  # polling Slurm and the coordinator, not a synchronisation


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with slurm.SlurmCluster(4, slurmd_timeout_s=5, reshard_build_dir=BUILD,
                            reshard_args=dict(devices_per_host=2)).start(timeout=60) as cl:
        yield cl


@pytest.fixture(scope="module")
def client(c):
    with c.reshard.client() as cl:
        yield cl


@pytest.fixture(scope="module")
def reference():
    return uninterrupted.run(STEPS)[0]


@pytest.fixture(scope="module")
def scheduler_token(c, tmp_path_factory):
    """A scheduler token of tenant `training`, as a user registers with."""
    out = subprocess.run([c.reshard.reshardctl, "--coordinator", c.reshard.coordinator,
                          *c.reshard.ctl_args(), "auth", "create", "--name", "slurm-user",
                          "--role", "scheduler", "--tenants", "training", "--output", "json"],
                         stdout=subprocess.PIPE, check=True, timeout=60)
    path = tmp_path_factory.mktemp("tokens") / "scheduler.token"
    path.write_text(json.loads(out.stdout)["bearer_token"])
    return str(path)


@pytest.fixture(scope="module")
def watcher(c, tmp_path_factory):
    """`reshard slurm watch`, the daemon, on the controller host."""
    log = tmp_path_factory.mktemp("watch") / "watch.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "reshard", "slurm", "watch",
                              "--coordinator", c.reshard.coordinator, *c.reshard.ctl_args(),
                              "--interval", "0.5"], env=c.env(), stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
    yield Log(log, p)
    p.terminate()
    p.wait(10)


class Log:
    def __init__(self, path, proc):
        self.path, self.proc = path, proc

    def text(self):
        return self.path.read_text(errors="replace")

    def wait(self, what, timeout=60):
        return wait_for(f"`reshard slurm watch` says {what!r}\n{self.text()}",
                        lambda: what in self.text(), timeout)


class SlurmJob:
    """The quickstart submitted with sbatch: one `reshard run --slurm`
    launcher per node of the allocation (srun --ntasks-per-node=1)."""

    def __init__(self, c, client, work, name, token, sbatch, first, policy=None):
        self.c, self.client, self.work, self.name = c, client, work, name
        self.log = os.path.join(work, "train.jsonl")
        launcher = [sys.executable, "-m", "reshard", "run", "--slurm",
                    "--coordinator", c.reshard.coordinator, "--tls-ca", c.reshard.pki.ca,
                    "--job-name", name, "--tenant", "training", "--register-token-file", token,
                    "--devices-per-host", "2", *first,
                    "--worker-socket", c.worker_socket_pattern(),
                    "--log-dir", os.path.join(work, "logs"),
                    "--events", os.path.join(work, "events-{host}.jsonl"),
                    "--recovery-timeout", "120"]
        if policy is not None:
            launcher += ["--policy", json.dumps(policy)]
        self.script = os.path.join(work, "job.sh")
        with open(self.script, "w") as f:
            f.write("#!/bin/bash\n"
                    "# Preempted with a grace time (sbatch --signal=B:USR1@...), Slurm signals\n"
                    "# this shell only: the tasks run on while reshard moves the job off.\n"
                    "trap 'echo \"Slurm: preempted; reshard moves the job off\"' USR1\n"
                    "# one launcher per node; a node's failure or release ends only its task\n"
                    "srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 "
                    f"{shlex.join(launcher)} -- {shlex.quote(sys.executable)} train.py &\n"
                    "pid=$!\n"
                    "while true; do wait $pid; rc=$?; kill -0 $pid 2>/dev/null || exit $rc; done\n")
        self.env = dict(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                        os.path.abspath(layout.__file__))), TORCH2]),
                        PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", TRAIN_LOG=self.log,
                        STEPS=str(STEPS), CKPT_EVERY="3", MIN_STEP_S=str(MIN_STEP_S),
                        GLOO_SOCKET_IFNAME="eth0")  # each node's veth
        self.slurm_id = self.submit(sbatch)

    def submit(self, sbatch):
        """sbatch of the job's script (the first allocation, or one that
        grows it: the same launchers join the job that exists)."""
        return self.c.run(["sbatch", "--parsable", "--no-kill", "--chdir", TORCH2,
                           "-o", os.path.join(self.work, "slurm-%j.out"), *sbatch, self.script],
                          env=self.env).strip()

    def records(self):
        return helpers.read_json_lines(self.log)

    def slurm(self):
        return slurm_job(self.c, self.slurm_id)

    def output(self):
        out = []
        for d, names in ((self.work, None), (os.path.join(self.work, "logs"), None)):
            for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                p = os.path.join(d, n)
                if os.path.isfile(p) and (n.endswith(".out") or n.endswith(".log")):
                    with open(p, errors="replace") as f:
                        out.append(f"--- {n}\n" + "".join(f.readlines()[-12:]))
        return "\n".join(out)

    def _alive(self):
        state = self.slurm().get("JobState")
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise AssertionError(f"Slurm job {self.slurm_id} is {state}\n{self.output()}")

    def wait(self, what, until, timeout=180):
        return wait_for(f"{what}\n{self.output()}", lambda: until(self.records()), timeout,
                        also=self._alive)

    def job(self):
        from reshard.launcher.register import find_job
        return wait_for(f"job {self.name} registered", lambda: find_job(
            self.client, "training", self.name), 120, also=self._alive)

    def events(self, host):
        return helpers.read_json_lines(os.path.join(self.work, f"events-{host}.jsonl"))

    def committed_step(self):
        return self.client.get_job(self.job().id).dataset_state.step

    def finish(self, reference):
        """Waits for the last step's commit; checks every loss; deletes the
        reshard job, and the Slurm job then completes."""
        wait_for(f"job {self.name} commits step {STEPS}\n{self.output()}",
                 lambda: self.committed_step() == STEPS, 240, also=self._alive)
        steps = [r for r in self.records() if "loss" in r]
        assert sorted({r["step"] for r in steps}) == list(range(1, STEPS + 1))
        for r in steps:
            np.testing.assert_allclose(r["loss"], reference[r["step"] - 1], rtol=1e-9, atol=0,
                                       err_msg=f"step {r['step']} (world {r['world_key']})")
        assert self.slurm()["JobState"] == "RUNNING"
        final = self.client.get_job(self.job().id)
        self.client.delete_job(final.id)
        # The launchers of the nodes the job ends on stop its ranks and exit
        # 0; srun's status also counts the tasks Slurm killed on a failed or
        # released node (docs/slurm.md), so the Slurm job ends COMPLETED or
        # FAILED: it leaves the queue either way.
        for host in layout.hosts_of(final.layout):
            wait_for(f"the launcher of {host} exits 0 once the job is deleted\n{self.output()}",
                     lambda: any(e.get("event") == "stop" for e in self.events(host)), 120)
            stop = [e for e in self.events(host) if e.get("event") == "stop"][-1]
            assert stop["code"] == 0 and "deleted" in stop["why"], stop
        wait_for(f"Slurm job {self.slurm_id} ends\n{self.output()}",
                 lambda: self.slurm().get("JobState") in ("COMPLETED", "FAILED"), 120)
        return steps

    def cancel(self):
        self.c.run(["scancel", self.slurm_id], check=False)


def slurm_job(c, job_id):
    from reshard.launcher import slurm as launcher_slurm
    return launcher_slurm.parse_job(c.run(["scontrol", "-o", "show", "job", job_id],
                                          check=False))


def _trained(step):
    return lambda recs: any(r.get("step", 0) >= step for r in recs if "loss" in r)


def test_a_node_failure_heals_onto_the_allocations_spare(c, client, watcher, reference,
                                                         scheduler_token, tmp_path):
    """sbatch -N3 --no-kill; HSDP on host-0 and host-1 (a replica each),
    host-2 the allocation's spare (the adapter makes it the policy's). host-1
    fails for real (slurmd, agent, launcher and ranks SIGKILLed): Slurm marks
    it DOWN and keeps the job RUNNING on the rest, the policy heals the job
    onto host-2, and training goes on with exact losses."""
    job = SlurmJob(c, client, str(tmp_path), "slurm-heal", scheduler_token,
                   ["-N3", "-w", "host-0,host-1,host-2"],
                   ["--hosts", "host-0,host-1", "--dp-shard", "2"], policy={"heal": True})
    try:
        rjob = job.job()
        watcher.wait(f"job {rjob.id}: spares host-2")
        job.wait("the first world trains 5 steps", _trained(5))
        c.kill_host("host-1")
        healed = wait_for("the job healed", lambda: (lambda j: j if j.layout_epoch > 0 else None)(
            client.get_job(rjob.id)), 120, also=job._alive)
        assert layout.slots(healed.layout) == [("host-0", 0), ("host-0", 1), ("host-2", 0),
                                               ("host-2", 1)]
        assert "policy heal: host-1 lost; recovering host-1 onto spare host-2" in \
            healed.policy_status, healed.policy_status
        wait_for("Slurm marks host-1 down", lambda: "down" in c.node_states()["host-1"], 60)
        assert job.slurm()["JobState"] == "RUNNING"
        job.finish(reference)
    finally:
        job.cancel()
        c.restart_host("host-1")


def test_a_shrink_moves_state_off_before_slurm_releases(c, client, watcher, reference,
                                                        scheduler_token, tmp_path):
    """sbatch -N3; HSDP over the three nodes (3 replicas), registered with
    no policy (the adapter says so; a shrink needs none). An admin runs
    `scontrol update JobId=J NumNodes=2`: job_submit.lua keeps the job's
    nodes and records the request, the adapter gives host-2 a host notice,
    the job resizes onto host-0 and host-1 while host-2 is still allocated,
    and only then does the adapter have Slurm release host-2. The job stays
    RUNNING on two nodes and trains on with exact losses."""
    job = SlurmJob(c, client, str(tmp_path), "slurm-shrink", scheduler_token,
                   ["-N3", "-w", "host-0,host-1,host-2"], ["--dp-shard", "2"])
    try:
        rjob = job.job()
        assert layout.hosts_of(rjob.layout) == ["host-0", "host-1", "host-2"]
        watcher.wait(f"job {rjob.id} (Slurm job {job.slurm_id}) has no elastic policy")
        job.wait("the first world trains 5 steps", _trained(5))
        c.run(["scontrol", "update", f"JobId={job.slurm_id}", "NumNodes=2"])
        assert job.slurm()["NodeList"] == "host-[0-2]", "Slurm waits for reshard"
        watcher.wait(f"Slurm job {job.slurm_id} (reshard job {rjob.id}): releasing host-2, "
                     "keeping host-0,host-1; moving the job off first")
        watcher.wait(f"Slurm job {job.slurm_id} now on host-0,host-1", timeout=120)
        shrunk = client.get_job(rjob.id)
        assert layout.hosts_of(shrunk.layout) == ["host-0", "host-1"]
        assert shrunk.layout.config.dp == 4 and shrunk.layout.config.dp_shard == 2
        assert job.slurm()["NodeList"] == "host-[0-1]"
        assert job.slurm()["Comment"] == mark_of(rjob.id, client.worker_token(rjob.id),
                                                 job.slurm_id), "the request is done"
        assert job.slurm()["JobState"] == "RUNNING"
        # host-2's ranks had left the job before Slurm killed its launcher.
        out = job.output()
        moved = out.index(f"[{rjob.id} host-2]: terminating g1 ranks [4, 5]")
        assert moved < out.index("srun: error: host-2: task 2: Killed"), out
        assert all(h.leaves_unix_ms == 0 for h in client.list_hosts()), "notices withdrawn"
        job.finish(reference)
    finally:
        job.cancel()


def test_grown_by_a_second_allocation_then_preempted_within_its_grace_time(
        c, client, watcher, reference, scheduler_token, tmp_path):
    """sbatch -N2 (HSDP, a replica per node, policy heal + grow); a second
    allocation in the preemptible partition `spot` (sbatch -p spot -N1
    --signal=B:USR1@30, the same script) joins the job: the adapter makes
    its node the policy's spare and the job grows onto it at its next
    checkpoint. Then a job of partition `urgent` needs that node: Slurm
    preempts the spot allocation with a 30 s grace time, the adapter gives
    the node a host notice that leaves when the grace ends, and the job
    shrinks back onto its first two nodes before Slurm cancels the spot
    job. The first Slurm job runs on throughout, with exact losses."""
    job = SlurmJob(c, client, str(tmp_path), "slurm-grow", scheduler_token,
                   ["-N2", "-w", "host-0,host-1"], ["--dp-shard", "2"],
                   policy={"heal": True, "grow": True})
    spot = urgent = None
    try:
        rjob = job.job()
        job.wait("the first world trains 3 steps", _trained(3))
        spot = job.submit(["-p", "spot", "-N1", "-w", "host-2", "--signal=B:USR1@30"])
        grown = wait_for("the policy grows the job onto the spot allocation's node", lambda: (
            lambda j: j if "host-2" in layout.hosts_of(j.layout) else None)(
                client.get_job(rjob.id)), 180, also=job._alive)
        assert layout.hosts_of(grown.layout) == ["host-0", "host-1", "host-2"]
        assert grown.layout.config.dp == 6 and grown.layout.config.dp_shard == 2
        assert slurm_job(c, spot)["Comment"] == mark_of(rjob.id, client.worker_token(rjob.id),
                                                        spot)
        wait_for("the grown world trains", lambda: client.get_job(rjob.id).dataset_state.step
                 >= job.committed_step() and any(
                     r.get("world", 0) == 6 for r in job.records() if "loss" in r), 120,
                 also=job._alive)
        urgent = c.run(["sbatch", "--parsable", "-p", "urgent", "-N1", "-w", "host-2",
                        "-o", "/dev/null", "--wrap", "sleep 600"]).strip()
        preempting = time.monotonic()
        watcher.wait(f"Slurm job {spot} preempted: host-2 leaves in", timeout=90)
        def moved_off():
            j = client.get_job(rjob.id)
            return j if "host-2" not in layout.hosts_of(j.layout) and \
                not j.active_operation_id else None
        try:
            shrunk = wait_for("the job moves off host-2 within the grace time", moved_off, 30,
                              also=job._alive)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{watcher.text()}\ncoordinator:\n"
                                 f"{c.reshard._coordinator_proc.tail(60)}") from None
        print(f"moved off host-2 {time.monotonic() - preempting:.1f} s after the urgent job's "
              "submission (grace time 30 s)")
        assert slurm_job(c, spot)["JobState"] == "RUNNING", "moved off before the grace ended"
        assert layout.hosts_of(shrunk.layout) == ["host-0", "host-1"]
        wait_for("Slurm gives host-2 to the urgent job", lambda: slurm_job(c, urgent).get(
            "JobState") == "RUNNING", 120)
        wait_for("Slurm ends the spot job PREEMPTED", lambda: slurm_job(c, spot).get(
            "JobState") == "PREEMPTED", 60)
        watcher.wait(f"Slurm job {spot} ended: host-2's notice withdrawn")
        assert [h.leaves_unix_ms for h in client.list_hosts() if h.host_id == "host-2"] == [0]
        assert job.slurm()["JobState"] == "RUNNING"
        job.finish(reference)
    finally:
        for j in (spot, urgent):
            if j:
                c.run(["scancel", j], check=False)
        job.cancel()

def test_shrink_refuses_what_it_cannot_do(c, client, scheduler_token, tmp_path, monkeypatch):
    """Bad input, each refused with exit 2 and a line naming what is wrong,
    and Slurm untouched: a Slurm job that holds no reshard job, a node count
    that is no shrink, a node not in the job, the batch host."""
    plain = c.run(["sbatch", "--parsable", "-N2", "-w", "host-0,host-1", "-o", "/dev/null",
                   "--wrap", "sleep 300"]).strip()
    try:
        wait_for("the plain job runs", lambda: slurm_job(c, plain).get("JobState") == "RUNNING",
                 60)

        def shrink(*args):
            r = subprocess.run([sys.executable, "-m", "reshard", "slurm", "shrink", plain, *args,
                                "--coordinator", c.reshard.coordinator, *c.reshard.ctl_args()],
                               env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=60)
            return r.returncode, r.stdout.decode().strip()
        code, said = shrink("--nodes", "1")
        assert code == 2 and f"Slurm job {plain} is no reshard job's" in said, said
        c.run(["scontrol", "update", f"JobId={plain}", "Comment=reshard:no-such-job"])
        code, said = shrink("--nodes", "2")
        assert code == 2 and "--nodes 2: Slurm job" in said and "keeps 1 to 1" in said, said
        code, said = shrink("--release", "host-3")
        assert code == 2 and "host-3 not in Slurm job" in said, said
        code, said = shrink("--release", "host-0")
        assert code == 2 and "host-0 is Slurm job" in said and "batch host" in said, said
        assert slurm_job(c, plain)["NodeList"] == "host-[0-1]"
        # An admin's shrink of a reshard job, by count or by list, is held
        # as a request (job_submit.lua) for the adapter: Slurm keeps the
        # nodes. (This job's reshard job does not exist: nothing carries it out.)
        c.run(["scontrol", "update", f"JobId={plain}", "NumNodes=1"])
        assert (slurm_job(c, plain)["NodeList"], slurm_job(c, plain)["Comment"]) == (
            "host-[0-1]", "reshard:no-such-job shrink:1")
        c.run(["scontrol", "update", f"JobId={plain}", "NodeList=host-0"])
        assert (slurm_job(c, plain)["NodeList"], slurm_job(c, plain)["Comment"]) == (
            "host-[0-1]", "reshard:no-such-job keep:host-0")
        # The adapter's own update passes.
        from reshard.launcher import slurm_adapter
        monkeypatch.setenv("SLURM_CONF", c.conf)
        slurm_adapter.Shrink(None, slurm_adapter.read_jobs()[plain], ["host-1"], 60,
                             print).finish()
        assert (slurm_job(c, plain)["NodeList"], slurm_job(c, plain)["Comment"]) == (
            "host-0", "reshard:no-such-job")
    finally:
        c.run(["scancel", plain], check=False)


def test_a_slurm_outage_is_said_and_survived(c, client, watcher, tmp_path):
    """slurmctld SIGKILLed while a job runs: the adapter says Slurm does not
    answer and goes on looking; `reshard slurm shrink` exits 2 naming
    scontrol's error; nothing changes. slurmctld restarted from its state:
    the job is still RUNNING on its nodes and the adapter follows again."""
    plain = c.run(["sbatch", "--parsable", "-N2", "-w", "host-0,host-1", "-o", "/dev/null",
                   "--wrap", "sleep 300"]).strip()
    try:
        wait_for("the job runs", lambda: slurm_job(c, plain).get("JobState") == "RUNNING", 60)
        marked = time.time()
        c.run(["scontrol", "update", f"JobId={plain}", "Comment=reshard:no-such-job"])
        c.wait_state_saved(marked)
        before = watcher.text().count("reshard slurm watch: Slurm: scontrol")
        c.kill_slurmctld()
        try:
            wait_for("the adapter says Slurm does not answer", lambda: watcher.text().count(
                "reshard slurm watch: Slurm: scontrol -o show job") > before, 120)
            r = subprocess.run([sys.executable, "-m", "reshard", "slurm", "shrink", plain,
                                "--nodes", "1", "--coordinator", c.reshard.coordinator,
                                *c.reshard.ctl_args()], env=c.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=120)
            said = r.stdout.decode()
            assert r.returncode == 2 and "scontrol -o show job: exit 1" in said, said
            assert watcher.proc.poll() is None, "the adapter runs on"
        finally:
            c.start_slurmctld()
        wait_for("the job is RUNNING again, on its nodes", lambda: (lambda j: j.get(
            "JobState") == "RUNNING" and j.get("NodeList") == "host-[0-1]")(
                slurm_job(c, plain)), 60)
        watcher.wait("Slurm answers again")
        assert watcher.proc.poll() is None
    finally:
        c.run(["scancel", plain], check=False)


def test_a_node_without_an_agent_is_said(c, client, scheduler_token, tmp_path):
    """Slurm's nodes and reshard's agents disagree: host-3's agent is down
    (the coordinator holds it LOST) when Slurm allocates it. Both launchers
    exit 2 before any rank starts, each saying why (host-3: no agent at its
    socket; host-2: the first layout's host-3 is LOST); no job is
    registered, and the Slurm job ends at once."""
    c.reshard.kill_agent("host-3")
    try:
        wait_for("the coordinator holds host-3 LOST", lambda: any(
            h.host_id == "host-3" and h.state == 2 for h in client.list_hosts()), 60)
        job = SlurmJob(c, client, str(tmp_path), "slurm-no-agent", scheduler_token,
                       ["-N2", "-w", "host-2,host-3"], ["--dp-shard", "2"])
        wait_for(f"the Slurm job ends\n{job.output()}", lambda: job.slurm().get("JobState") ==
                 "FAILED", 120)
        out = job.output()
        assert "host-3/worker.sock\": no agent answers there" in out, out
        assert "the first layout's host 'host-3': its agent's lease expired (LOST), so its " \
            "ranks cannot start (live hosts: host-0, host-1, host-2)" in out, out
        assert "started g1" not in out and not os.path.exists(job.log), out
        from reshard.launcher.register import find_job
        assert find_job(client, "training", "slurm-no-agent") is None
    finally:
        c.reshard.start_agent("host-3")
