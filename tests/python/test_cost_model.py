"""The coordinator's cost model against real agents (docs/scheduler.md, "The
cost of an operation"): PreviewPlan's prediction, the same prediction stored
on the operation it plans, the operation's actual seconds beside it, the
agents' registration probes, and rates learned from committed operations
(the second way back is predicted from measured rates only)."""

import os
import subprocess

import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2, ptc_pb2

from helpers import check_generation, publish_all, random_globals, tensor

MIB = 1 << 20


def big_ptc():
    """One fp32 tensor of 64 MiB, TP-split: every phase of every host's task
    moves at least the 16 MiB the cost model learns a rate from."""
    return reshard.as_message(
        {"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT32", [8192, 2048], tp=True)]},
        ptc_pb2.Ptc)


def on(host):
    return layout.make_layout(2, 1, 1, [host], 2)


def costs_by_host(prediction):
    return {h.host: h for h in prediction.hosts}


def migrate(client, job_id, target):
    op = client.migrate(job_id, target)
    done = client.wait(op.id, timeout=120)
    assert done.state == coordinator_pb2.OPERATION_STATE_COMMITTED, done.error
    return client.get_operation(op.id)


def test_predicted_before_measured_after_and_learned(cluster, client, job_name):
    ptc = big_ptc()
    start = on("host-0")
    job = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                              layout=start))
    sd = random_globals(ptc, 2, seed=5)
    publish_all(cluster, job.id, ptc, start, sd)

    # Every agent measured its copy and hash rates when it started.
    for h in client.list_hosts():
        assert h.probe.copy_bytes_per_s > 0 and h.probe.hash_bytes_per_s > 0, h

    # Before any operation: the seeds (probes, the default link rate).
    preview = client.preview(job.id, on("host-1"))
    p = preview.prediction
    assert not p.calibrated
    hosts = costs_by_host(p)
    assert set(hosts) == {"host-0", "host-1"}
    assert (hosts["host-0"].bytes_out, hosts["host-0"].bytes_in) == (64 * MIB, 0)
    assert (hosts["host-1"].bytes_in, hosts["host-1"].bytes_new) == (64 * MIB, 64 * MIB)
    assert hosts["host-0"].bytes_new == 0
    # 64 MiB over the default 10 Gb/s NIC bounds it.
    assert abs(p.bound_seconds - 64 * MIB / 1.25e9) < 1e-9
    assert p.critical_link == "host-0->host-1"
    assert p.seconds > p.overhead_seconds == 0.5

    # The operation stores the prediction it was planned with (nothing was
    # learned since the preview), and what it took.
    op = migrate(client, job.id, on("host-1"))
    assert op.prediction == p
    assert op.planned_unix_ms >= op.created_unix_ms
    assert op.actual_seconds > 0
    assert check_generation(cluster, job.id, ptc, on("host-1"), sd, 2) == []

    # reshardctl shows both.
    ctl = os.path.join(os.environ["RESHARD_BUILD_DIR"], "client", "cli", "reshardctl")
    out = subprocess.run([ctl, "--coordinator", cluster.coordinator,
                          *cluster.ctl_args(), "ops", "show", op.id],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "predicted:" in out.stdout and "x the prediction" in out.stdout, out.stdout

    # Back again: now host-1 sends and host-0 receives, each at a rate the
    # first move taught only in the other direction.
    back = client.preview(job.id, on("host-0")).prediction
    assert not back.calibrated
    migrate(client, job.id, on("host-0"))

    # Every rate the next move needs was measured; the overhead too.
    again = client.preview(job.id, on("host-1")).prediction
    assert again.calibrated, again
    assert again.overhead_seconds != 0.5
    learned = costs_by_host(again)
    assert learned["host-1"].move_seconds > 0
    third = migrate(client, job.id, on("host-1"))
    assert third.prediction.calibrated
    for name, o in (("first", op), ("third", third)):
        print(f"{name}: predicted {o.prediction.seconds:.3f} s, took {o.actual_seconds:.3f} s")
    assert check_generation(cluster, job.id, ptc, on("host-1"), sd, 4) == []
