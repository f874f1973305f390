"""Deadlines and host notices against real agents (docs/scheduler.md,
"Deadlines", "Host notices"): a deadline the coordinator's prediction misses
is refused at once and moves nothing; one it meets commits; past an
aborting deadline the operation ends ABORTED and the job keeps its
generation; a host notice moves a job onto a spare before the host goes
(reshardctl hosts notice), or answers at once what the job keeps."""

import json
import os
import subprocess
import time

import pytest

import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2, ptc_pb2

from helpers import check_generation, publish_all, random_globals, tensor


def big_ptc():
    """One fp32 tensor of 64 MiB, TP-split over 2 ranks."""
    return reshard.as_message(
        {"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT32", [8192, 2048], tp=True)]},
        ptc_pb2.Ptc)


def on(host):
    return layout.make_layout(2, 1, 1, [host], 2)


def now_ms():
    return int(time.time() * 1000)


def start(cluster, client, job_name, host, seed):
    ptc = big_ptc()
    job = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                              layout=on(host)))
    sd = random_globals(ptc, 2, seed=seed)
    publish_all(cluster, job.id, ptc, on(host), sd)
    return job, ptc, sd


def test_a_deadline_is_refused_at_once_or_met(cluster, client, job_name):
    job, ptc, sd = start(cluster, client, job_name, "host-0", seed=11)
    predicted = client.preview(job.id, on("host-1")).prediction.seconds
    assert predicted >= 0.5

    with pytest.raises(reshard.FailedPrecondition) as refused:
        client.migrate(job.id, on("host-1"), deadline_unix_ms=now_ms() + 50)
    message = str(refused.value)
    assert f"predicted {predicted:.1f} s" in message, message
    assert "s past the deadline" in message and "stop_free" in message, message
    # Nothing was created: the job is at generation 1, no operation active.
    after = client.get_job(job.id)
    assert (after.generation, after.active_operation_id) == (1, "")

    op = client.migrate(job.id, on("host-1"), deadline_unix_ms=now_ms() + 120_000,
                        abort_past_deadline=True)
    assert op.deadline.abort_past
    done = client.wait(op.id, timeout=120)
    assert done.state == coordinator_pb2.OPERATION_STATE_COMMITTED, done.error
    assert check_generation(cluster, job.id, ptc, on("host-1"), sd, 2) == []


def test_past_an_aborting_deadline_the_operation_aborts_and_the_job_keeps_its_state(
        cluster, client, job_name):
    job, ptc, sd = start(cluster, client, job_name, "host-0", seed=12)
    # The operation waits for a step boundary that never comes (no training
    # loop checkpoints): the deadline passes first.
    deadline = now_ms() + 3000
    op = client.migrate(job.id, on("host-1"), at_step_boundary=True, step_boundary_timeout=600,
                        deadline_unix_ms=deadline, abort_past_deadline=True)
    seen = client.get_operation(op.id)
    assert seen.state == coordinator_pb2.OPERATION_STATE_PENDING
    done = client.wait(op.id, timeout=120)
    assert now_ms() >= deadline
    assert done.state == coordinator_pb2.OPERATION_STATE_ABORTED, done
    assert "passed (abort_past) in AT_STEP_BOUNDARY" in done.error, done.error
    after = client.get_job(job.id)
    assert (after.generation, after.state) == (1, coordinator_pb2.JOB_STATE_ACTIVE)
    assert check_generation(cluster, job.id, ptc, on("host-0"), sd, 1) == []


def test_a_host_notice_moves_the_job_onto_a_spare_or_says_what_it_keeps(
        cluster, client, job_name):
    job, ptc, sd = start(cluster, client, job_name, "host-2", seed=13)
    ctl = os.path.join(os.environ["RESHARD_BUILD_DIR"], "client", "cli", "reshardctl")

    def notice(*args):
        out = subprocess.run([ctl, "--coordinator", cluster.coordinator, *cluster.ctl_args(),
                              "--output", "json", "hosts", "notice", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["jobs"]

    # Too soon: nothing moves, and the answer says what the job keeps (all
    # of it is on host-2).
    jobs = notice("host-2", "--leaves", "50ms", "--spare", "host-3")
    assert [j["job_id"] for j in jobs] == [job.id]
    refused = jobs[0]["refused"]
    assert "onto spare host-3: " in refused and "s past the deadline" in refused, refused
    assert "when host-2 goes, no layout is left on the job's other hosts" in refused, refused
    assert client.get_job(job.id).active_operation_id == ""

    # In time: a migrate onto the spare, with the leaving time as deadline.
    leaves = now_ms() + 120_000
    jobs = notice("host-2", "--leaves", "2m", "--spare", "host-3")
    assert [j["job_id"] for j in jobs] == [job.id]
    op_id = jobs[0]["operation_id"]
    assert op_id, jobs
    op = client.get_operation(op_id)
    assert op.kind == coordinator_pb2.OPERATION_KIND_MIGRATE
    assert abs(op.deadline.unix_ms - leaves) < 10_000 and not op.deadline.abort_past
    done = client.wait(op_id, timeout=120)
    assert done.state == coordinator_pb2.OPERATION_STATE_COMMITTED, done.error
    assert check_generation(cluster, job.id, ptc, on("host-3"), sd, 2) == []
    # Nothing of the job is left on host-2.
    assert client.notice_host("host-2", now_ms() + 60_000, ["host-1"]).jobs == []
    # host-2 is marked as leaving: a migration back onto it is refused
    # until the notice is withdrawn (reshardctl hosts notice --withdraw).
    hosts = {h.host_id: h for h in client.list_hosts()}
    assert hosts["host-2"].leaves_unix_ms > now_ms() and hosts["host-3"].leaves_unix_ms == 0
    with pytest.raises(reshard.errors.FailedPrecondition, match='host "host-2" leaves at '):
        client.migrate(job.id, on("host-2"))
    out = subprocess.run([ctl, "--coordinator", cluster.coordinator, *cluster.ctl_args(),
                          "hosts", "notice", "host-2", "--withdraw"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "host host-2: notice withdrawn\n", out
    assert {h.host_id: h for h in client.list_hosts()}["host-2"].leaves_unix_ms == 0
    back = client.wait(client.migrate(job.id, on("host-2")).id, timeout=120)
    assert back.state == coordinator_pb2.OPERATION_STATE_COMMITTED, back.error
