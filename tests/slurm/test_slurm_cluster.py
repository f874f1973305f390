"""The Slurm cluster of deploy/slurm/slurm_cluster.py, for real: munged, slurmctld
and one slurmd per emulated host in its own network namespace and hostname.
Every node comes up idle; srun and an sbatch job submitted from a node run
on exactly the nodes Slurm gives them; a host whose processes are SIGKILLed
is marked down by Slurm while the others stay idle; close() leaves no
namespace, link, daemon or directory behind.

The launcher's reading of a Slurm allocation (`reshard run --slurm`):
hostlists expanded as scontrol expands them, and each step of a real
sbatch job finding its node and the job's nodes.

Skipped, with the reason, only where namespaces or the Slurm packages are
missing (scripts/bootstrap.sh installs slurm-wlm and munge)."""

import os
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "deploy", "slurm"))
import slurm_cluster as slurm  # noqa: E402
from reshard.launcher import slurm as launcher_slurm  # noqa: E402
from reshard.launcher._launch_env import LaunchError  # noqa: E402

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


HOSTLISTS = ["host-[0-2,5]", "gpu[01-03],login", "a[1-2]b[3-4]", "n1", "h[8-10]",
             "rack1-n[001-002],rack2-n[9-11]"]


@pytest.mark.parametrize("text", HOSTLISTS)
def test_the_launchers_hostlist_expands_as_scontrol_does(c, text):
    want = c.run(["scontrol", "show", "hostnames", text]).split()
    assert launcher_slurm.expand_hostlist(text) == want


@pytest.mark.parametrize("text", ["host-[0-2", "host-0]", "h[[1]]", "h[3-1]", "h[a-b]", "a,,b",
                                  ""])
def test_a_bad_hostlist_is_named(text):
    with pytest.raises(ValueError, match="hostlist"):
        launcher_slurm.expand_hostlist(text)


def test_outside_a_step_or_off_the_allocation_is_named():
    step = {"SLURMD_NODENAME": "host-0", "SLURM_STEP_NODELIST": "host-[0-1]"}
    a = launcher_slurm.allocation(dict(step, SLURM_STEP_TASKS_PER_NODE="1(x2)"))
    assert (a.host, a.hosts) == ("host-0", ["host-0", "host-1"])
    with pytest.raises(LaunchError, match=r"\$SLURMD_NODENAME is not set: run it as a Slurm job "
                                          r"step, one task per node"):
        launcher_slurm.allocation({"SLURM_STEP_NODELIST": "host-[0-1]"})
    # A batch script: the job's nodes, but no step.
    with pytest.raises(LaunchError, match=r"\$SLURM_STEP_NODELIST is not set"):
        launcher_slurm.allocation({"SLURMD_NODENAME": "host-0", "SLURM_JOB_NODELIST": "host-0"})
    with pytest.raises(LaunchError, match=r"'host-7' \(\$SLURMD_NODENAME\) is not in the step's "
                                          r"nodes 'host-\[0-1\]'"):
        launcher_slurm.allocation(dict(step, SLURMD_NODENAME="host-7"))
    for tasks in ("2(x2)", "1,2"):
        with pytest.raises(LaunchError, match=rf"the step runs {re.escape(tasks)} tasks per node"):
            launcher_slurm.allocation(dict(step, SLURM_STEP_TASKS_PER_NODE=tasks))
    with pytest.raises(LaunchError, match=r"\$SLURM_STEP_TASKS_PER_NODE 'x': 'x' is not COUNT"):
        launcher_slurm.allocation(dict(step, SLURM_STEP_TASKS_PER_NODE="x"))

    class Args:
        host, hosts = "host-1", ""
    with pytest.raises(LaunchError, match=r"--host 'host-1' with --slurm: this step runs on "
                                          r"'host-0'"):
        launcher_slurm.apply(Args(), step)


def test_each_step_of_an_sbatch_job_reads_its_node_and_the_jobs_nodes(c):
    # What `reshard run --slurm` reads, on every node of a real allocation.
    out_file = os.path.join(c.workdir, "alloc-%j.out")
    probe = ("from reshard.launcher import slurm\n"
             "try:\n"
             "    a = slurm.allocation()\n"
             "    print(a.host, ','.join(a.hosts), a.job_name)\n"
             "except Exception as e:\n"
             "    print('refused:', e)\n")
    script = os.path.join(c.workdir, "probe.py")
    with open(script, "w") as f:
        f.write(probe)
    # The batch script itself (not a step) is refused; each step reads its
    # node and the step's nodes; a step of one node sees that node only.
    sub = c.on("host-1", ["sbatch", "--parsable", "-N2", "-J", "probe", "-o", out_file, "--wrap",
                          f"{sys.executable} {script}; srun --ntasks-per-node=1 {sys.executable} "
                          f"{script}; srun -N1 -w host-1 {sys.executable} {script}"])
    job = sub.strip().split(";")[0]
    wait_for(f"job {job} completed", lambda: job_state(c, job) == "COMPLETED", 60)
    with open(out_file.replace("%j", job)) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("refused: --slurm: $SLURM_STEP_NODELIST is not set"), lines
    assert sorted(lines[1:3]) == ["host-0 host-0,host-1 probe", "host-1 host-0,host-1 probe"], lines
    assert lines[3:] == ["host-1 host-1 probe"], lines


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


@pytest.mark.parametrize("flags,message", [
    (["--slurm"], "reshard run: --slurm: $SLURMD_NODENAME is not set: run it as a Slurm job "
                  "step, one task per node (srun --ntasks-per-node=1 reshard run --slurm ...)"),
    ([], "reshard run: --host: this host's id is required (or --slurm inside a Slurm job step)"),
])
def test_reshard_run_outside_a_step_is_a_usage_error(flags, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    r = subprocess.run([sys.executable, "-m", "reshard", "run", "--coordinator", "127.0.0.1:1",
                        "--job", "j", "--worker-socket", "/nonexistent", "--insecure"] + flags +
                       ["--", sys.executable, "-c", "pass"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert r.returncode == 2, r.stderr.decode()
    assert r.stderr.decode().strip() == message
