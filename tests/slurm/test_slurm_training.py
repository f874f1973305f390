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
COMPLETED.

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
import slurm_cluster as slurm  # noqa: E402

from reshard import layout  # noqa: E402

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
        script = os.path.join(work, "job.sh")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n"
                    "# one launcher per node; a node's failure or release ends only its task\n"
                    "exec srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 "
                    f"{shlex.join(launcher)} -- {shlex.quote(sys.executable)} train.py\n")
        env = dict(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                       os.path.abspath(layout.__file__))), TORCH2]),
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", TRAIN_LOG=self.log,
                   STEPS=str(STEPS), CKPT_EVERY="3", MIN_STEP_S=str(MIN_STEP_S),
                   GLOO_SOCKET_IFNAME="eth0")  # each node's veth
        self.slurm_id = c.run(["sbatch", "--parsable", "--no-kill", "--chdir", TORCH2,
                               "-o", os.path.join(work, "slurm-%j.out"), *sbatch, script],
                              env=env).strip()

    def records(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

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
        self.client.delete_job(self.job().id)
        wait_for(f"Slurm job {self.slurm_id} completes once its reshard job is deleted\n"
                 f"{self.output()}", lambda: self.slurm().get("JobState") == "COMPLETED", 120)
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
