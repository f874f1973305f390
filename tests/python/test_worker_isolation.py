"""Per-job file isolation between tenants on one host (issue 19, defect 2(a);
docs/security.md, "Workers"), and a truncated sealed file loaded from Python
(defect 7).

Shard files are the agent's alone (0600 until sealed, 0400 after, no group
access), so no worker of any job can open one by path, neither a job's
sealed files nor the buffers a stop-free operation prepares; a worker maps
file descriptors the agent hands it over `<worker socket>.fds`, for exactly
the buffers its job's token may use. Workers run as uid nobody with the
agent's worker group as a supplementary group (needed to reach the socket),
as on a shared host. Needs root (to run workers as another uid).

Before issue 19 the files were mode 0660 (sealed 0440) in the worker group:
every probe below opened them.
"""

import errno
import json
import os
import subprocess
import sys
import time

import pytest

import reshard
from helpers import NOBODY, WORKER_GID, every_kind_ptc, publish_or_load, worker_group_cluster
from reshard import layout
from reshard.v1 import coordinator_pb2, ptc_pb2, worker_pb2

DATASET = {"dataset": {"id": "tokens", "num_samples": 1000, "fingerprint": "sha1:abc"},
           "order": {"seed": 7, "shuffle": "SHUFFLE_FULL"}, "global_batch": 8}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs workers as another uid")

# Run as a worker (uid nobody): argv[2] is a JSON command.
#  publish / load: every host-0 rank of the job through reshard.Worker
#    (descriptors), printing {"sums": ...} / {"bad": [items that differ]};
#  probe: os.open every path read-only and read-write, printing the errno
#    of each (0: it opened);
#  fd: one raw WorkerFdRequest, printing the error class (or "OK").
_WORKER = r"""
import json, os, sys
from reshard.v1 import worker_pb2
sys.path.insert(0, sys.argv[1])
from helpers import print_publish_or_load, worker_process
cmd = json.loads(sys.argv[2])
if cmd["op"] == "probe":
    out = {}
    for path in cmd["paths"]:
        codes = []
        for flags in (os.O_RDONLY, os.O_RDWR):
            try:
                os.close(os.open(path, flags))
                codes.append(0)
            except OSError as e:
                codes.append(e.errno)
        out[path] = codes
    print(json.dumps(out))
    sys.exit(0)
def act(w):
    if cmd["op"] != "fd":
        print_publish_or_load(w, cmd["op"], cmd.get("seed", 5))
        return
    access = worker_pb2.WorkerFdRequest.Access.Value(cmd["access"])
    os.close(w._shard_fd(access, cmd["generation"], cmd["rank"], cmd["size"], "probe"))
    print("OK")
worker_process(cmd["socket"], cmd["job"], act)
"""


@pytest.fixture(scope="module")
def cluster():  # conftest's client fixture connects to this one
    with worker_group_cluster() as c:
        yield c


def lay2():
    return layout.make_layout(2, 1, 1, ["host-0"], 2)


def register(client, name, with_dataset=False):
    spec = ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=every_kind_ptc(), layout=lay2())
    return client.register_job(spec, dataset_state=DATASET if with_dataset else None)


def as_worker(cluster, job_id, cmd):
    """Runs _WORKER as uid nobody in the worker group with job `job_id`'s
    worker token; returns the CompletedProcess."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, HOME="/tmp", RESHARD_WORKER_TOKEN=cluster.worker_token(job_id))
    cmd = dict(cmd, socket=cluster.agents["host-0"].worker_socket)
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={WORKER_GID}",
         sys.executable, "-c", _WORKER, here, json.dumps(cmd)],
        capture_output=True, text=True, timeout=120, env=env)


def publish_as_root(cluster, job_id, seed):
    """Publishes every rank of `job_id` on host-0 (the agent's own user)."""
    with cluster.worker("host-0", job_id, ptc=every_kind_ptc()) as w:
        list(publish_or_load(w, "publish", seed))


def files_of(cluster, job_id, generation):
    shm = cluster.agents["host-0"].shm_dir
    stem = f"-{job_id}-g{generation}-r"
    return sorted(os.path.join(shm, f) for f in os.listdir(shm)
                  if stem in f and not f.endswith((".meta", ".sealing")))


def refused_everywhere(probe):
    """The paths of `probe` (the worker's probe output) that opened."""
    return {p: codes for p, codes in probe.items() if codes != [errno.EACCES, errno.EACCES]}


def test_a_worker_publishes_and_loads_through_descriptors(cluster, client, job_name):
    job = register(client, job_name)
    r = as_worker(cluster, job.id, {"op": "publish", "job": job.id})
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert len(r.stdout.splitlines()) == 2
    files = files_of(cluster, job.id, 1)
    assert len(files) == 2, files
    for f in files:  # sealed, the agent's alone
        st = os.stat(f)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (os.geteuid(), os.getegid(),
                                                                0o400), f
    r = as_worker(cluster, job.id, {"op": "load", "job": job.id})
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"bad": []}] * 2, r.stdout


def test_another_jobs_worker_cannot_reach_a_sealed_generation(cluster, client, job_name):
    victim = register(client, job_name + "-j")
    publish_as_root(cluster, victim.id, seed=11)
    other = register(client, job_name + "-k")
    files = files_of(cluster, victim.id, 1)
    assert len(files) == 2, files
    # Job K's worker, by path: neither read nor write.
    r = as_worker(cluster, other.id, {"op": "probe", "paths": files})
    assert r.returncode == 0, r.stderr
    assert refused_everywhere(json.loads(r.stdout)) == {}
    # ... nor by descriptor: K's token does not open J's buffers.
    size = os.stat(files[0]).st_size
    for access in ("ACCESS_LOAD", "ACCESS_PUBLISH"):
        cmd = {"op": "fd", "job": victim.id, "access": access, "generation": 1, "rank": 0,
               "size": size}
        r = as_worker(cluster, other.id, cmd)
        assert (r.returncode, r.stdout.strip()) == (3, "PermissionDenied"), (access, r.stdout,
                                                                            r.stderr)
    # J's own worker reads them (read-only), and cannot write a sealed one.
    r = as_worker(cluster, victim.id, dict(cmd, access="ACCESS_LOAD"))
    assert (r.returncode, r.stdout.strip()) == (0, "OK"), (r.stdout, r.stderr)
    r = as_worker(cluster, victim.id, dict(cmd, access="ACCESS_PUBLISH"))
    assert (r.returncode, r.stdout.strip()) == (3, "FailedPrecondition"), (r.stdout, r.stderr)


def wait_op(client, op_id, predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        op = client.get_operation(op_id)
        if predicate(op):
            return op
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s: {op}"
        time.sleep(0.05)


def test_no_worker_can_reach_a_buffer_a_stop_free_operation_prepares(cluster, client, job_name):
    job = register(client, job_name, with_dataset=True)
    publish_as_root(cluster, job.id, seed=13)
    # tp 2 -> tp 1 x dp 2 on the same host: the agent pre-copies the new
    # layout into buffers of its own while the job trains on.
    op = client.resize(job.id, layout.make_layout(1, 1, 2, ["host-0"], 2), stop_free=True)
    try:
        op = wait_op(client, op.id, lambda o: o.agents_prepared_unix_ms > 0, "agents prepared")
        generation = op.to_generation  # the one after the cut-over's checkpoint
        prepared = files_of(cluster, job.id, generation)
        assert len(prepared) == 2, prepared
        # Neither another job's worker nor the job's own opens them by path.
        other = register(client, job_name + "-k")
        for who in (other.id, job.id):
            r = as_worker(cluster, who, {"op": "probe", "paths": prepared})
            assert r.returncode == 0, r.stderr
            assert refused_everywhere(json.loads(r.stdout)) == {}, who
        for f in prepared:
            st = os.stat(f)
            assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (os.geteuid(), os.getegid(),
                                                                    0o600), f
        # Nor by descriptor, with the job's own token: the agent writes them.
        size = os.stat(prepared[0]).st_size
        for access in ("ACCESS_PUBLISH", "ACCESS_LOAD"):
            cmd = {"op": "fd", "job": job.id, "access": access, "generation": generation,
                   "rank": 0, "size": size}
            r = as_worker(cluster, job.id, cmd)
            assert (r.returncode, r.stdout.strip()) == (3, "FailedPrecondition"), (
                access, r.stdout, r.stderr)
    finally:
        client.cancel_operation(op.id)
    wait_op(client, op.id, lambda o: o.state == coordinator_pb2.OPERATION_STATE_ABORTED,
            "cancelled")


def test_loading_a_truncated_sealed_file_is_data_loss_naming_it(cluster, client, job_name):
    job = register(client, job_name)
    publish_as_root(cluster, job.id, seed=17)
    with cluster.worker("host-0", job.id, ptc=every_kind_ptc()) as w:
        path = w._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
            job_id=job.id, generation=1, rank=0)).path
        os.truncate(path, os.stat(path).st_size // 2)  # root ignores the file's 0400 mode
        with pytest.raises(reshard.DataLoss) as e:
            w.load(0, 1)
    message = str(e.value)
    assert f'"{job.id}"' in message and "generation 1" in message and "rank 0" in message, message
