"""The Slurm cluster of deploy/slurm/cluster.py, for real: munged, slurmctld
and one slurmd per emulated host in its own network namespace and hostname.
Every node comes up idle; srun and an sbatch job submitted from a node run
on exactly the nodes Slurm gives them; a host whose processes are SIGKILLed
is marked down by Slurm while the others stay idle; close() leaves no
namespace, link, daemon or directory behind.

Skipped, with the reason, only where namespaces or the Slurm packages are
missing (scripts/bootstrap.sh installs slurm-wlm and munge)."""

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "deploy", "slurm"))
import cluster as slurm  # noqa: E402

MISSING = slurm.missing_capability()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"Slurm cannot run here: {MISSING}")


def wait_for(what, check, timeout):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)  # polling Slurm's client commands, not a synchronisation


@pytest.fixture(scope="module")
def c():
    with slurm.SlurmCluster(3, slurmd_timeout_s=5).start(timeout=60) as cl:
        yield cl


def job_state(c, job):
    out = c.run(["scontrol", "show", "job", job], check=False)
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def test_every_node_comes_up_idle(c):
    assert c.node_states() == {"host-0": "idle", "host-1": "idle", "host-2": "idle"}


def test_srun_runs_on_each_node_under_its_own_hostname(c):
    out = c.run(["srun", "-N3", "hostname"])
    assert sorted(out.split()) == ["host-0", "host-1", "host-2"]


def test_an_sbatch_job_from_a_node_runs_its_steps_on_its_allocation(c):
    out_file = os.path.join(c.workdir, "job-%j.out")
    sub = c.on("host-0", ["sbatch", "--parsable", "-N2", "-o", out_file, "--wrap",
                          "echo nodes=$SLURM_JOB_NODELIST nnodes=$SLURM_JOB_NUM_NODES; "
                          "srun hostname"])
    job = sub.strip().split(";")[0]
    wait_for(f"job {job} completed", lambda: job_state(c, job) == "COMPLETED", 60)
    with open(out_file.replace("%j", job)) as f:
        lines = f.read().split()
    assert lines[0] == "nodes=host-[0-1]"
    assert lines[1] == "nnodes=2"
    assert sorted(lines[2:]) == ["host-0", "host-1"]


def test_a_host_killed_is_down_and_the_others_stay_idle(c):
    c.kill_host("host-2")
    states = wait_for("host-2 down", lambda: (lambda s: s if s.get("host-2", "").startswith(
        "down") else None)(c.node_states()), 60)
    assert states["host-0"] == "idle" and states["host-1"] == "idle", states
    # Back: its slurmd restarts in the same namespace and the node returns
    # (ReturnToService=2).
    c.start_slurmd("host-2")
    c.wait_nodes("idle", ["host-0", "host-1", "host-2"], 60)


def test_close_leaves_nothing_behind():
    cl = slurm.SlurmCluster(2).start(timeout=60)
    namespaces = [n.netns for n in cl.topology.nodes.values()]
    bridge, workdir = cl.topology.bridge, cl.workdir
    pids = [p.pid for p in cl._procs.values()]
    cl.close()
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE).stdout.decode()
    assert not any(ns in listed for ns in namespaces), listed
    assert subprocess.run(["ip", "link", "show", bridge], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode != 0
    assert not os.path.exists(workdir)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def daemons_of(pid):
    """pids of processes whose command line names run `pid`'s work directory."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f"/rsbc{pid}-slurm-".encode() in f.read():
                    out.append(int(p))
        except OSError:
            pass
    return out


def test_a_cluster_whose_process_was_killed_is_removed_by_the_next():
    child = subprocess.Popen([sys.executable, slurm.__file__, "--hosts", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        lines = []
        for raw in child.stdout:
            lines.append(raw.decode())
            if lines[-1].startswith("Slurm is up"):
                break
        assert lines and lines[-1].startswith("Slurm is up"), "".join(lines)
        daemons = daemons_of(child.pid)
        assert len(daemons) == 3, daemons  # munged, slurmctld, host-0's slurmd
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    slurm.remove_stale()
    wait_for("the killed cluster's daemons gone", lambda: daemons_of(child.pid) == [], 10)
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE).stdout.decode()
    assert f"rsbc{child.pid}" not in listed, listed
