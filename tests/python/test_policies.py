"""Elastic policies against real agents (docs/scheduler.md, "Elastic
policies"): a host lost under a heal policy is recovered by the coordinator's
leader with no client call, onto a declared spare, its bytes exact; a free
spare grows a job under a grow policy; reshardctl shows the policy and its
status, and the audit trail each action with its reason."""

import os
import subprocess

import pytest

import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2, ptc_pb2

from helpers import check_generation, publish_all, random_globals, tensor, wait_for

TIMEOUT = 120


def replicated_ptc():
    """Two fp32 tensors of 8 MiB, replicated over dp: every replica holds
    the whole state, so losing one host loses nothing."""
    return reshard.as_message(
        {"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT32", [2048, 1024]),
                                     tensor("v", "DTYPE_FLOAT32", [2048, 1024])]},
        ptc_pb2.Ptc)


def register(client, name, ptc, lay, policy):
    return client.register_job(ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=ptc, layout=lay,
                                               policy=reshard.as_message(
                                                   policy, ptc_pb2.ElasticPolicy)))


def test_a_lost_host_is_healed_onto_a_spare_with_no_client_call(cluster, client, job_name):
    ptc = replicated_ptc()
    start = layout.make_layout(1, 1, 2, ["host-0", "host-1"], 1)
    job = register(client, job_name, ptc, start, {"heal": True, "spareHosts": ["host-2"]})
    sd = random_globals(ptc, 2, seed=21)
    publish_all(cluster, job.id, ptc, start, sd)

    cluster.lose_host("host-1")
    # Nothing but the coordinator acts from here: the lease runs out, the
    # job goes DEGRADED, the policy recovers it onto host-2 and commits.
    healed = wait_for("the heal to commit",
                      lambda: (lambda j: j if j.layout_epoch == 1 and
                               j.state == coordinator_pb2.JOB_STATE_ACTIVE else None)(
                          client.get_job(job.id)), timeout=TIMEOUT)
    want = layout.make_layout(1, 1, 2, ["host-0", "host-2"], 1)
    assert layout.slots(healed.layout) == [("host-0", 0), ("host-2", 0)]
    assert "policy heal: host-1 lost; recovering host-1 onto spare host-2" in \
        healed.policy_status, healed.policy_status
    assert check_generation(cluster, job.id, ptc, want, sd, 2) == []

    # The audit trail says who and why; reshardctl shows the policy.
    entries = [e for e in client.audit(job_id=job.id) if e.identity == "policy"]
    assert [e.method for e in entries] == ["RecoverFromFailure"], entries
    assert entries[0].code == "OK" and "host-1 lost" in entries[0].message
    ctl = os.path.join(os.environ["RESHARD_BUILD_DIR"], "client", "cli", "reshardctl")
    out = subprocess.run([ctl, "--coordinator", cluster.coordinator, *cluster.ctl_args(),
                          "jobs", "show", job.id], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "heal, spares host-2" in out.stdout and "policy heal: host-1 lost" in out.stdout, \
        out.stdout


def test_a_free_spare_grows_the_job(cluster, client, job_name):
    ptc = replicated_ptc()
    start = layout.make_layout(1, 1, 1, ["host-0"], 1)
    job = register(client, job_name, ptc, start, {})
    sd = random_globals(ptc, 1, seed=22)
    publish_all(cluster, job.id, ptc, start, sd)
    # The scheduler offers host-3 by policy: the job grows onto it now.
    client.set_policy(job.id, {"grow": True, "growAt": "GROW_NOW", "spareHosts": ["host-3"],
                               "maxDevices": 2})
    grown = wait_for("the growth to commit",
                     lambda: (lambda j: j if j.layout_epoch == 1 else None)(
                         client.get_job(job.id)), timeout=TIMEOUT)
    want = layout.make_layout(1, 1, 2, ["host-0", "host-3"], 1)
    assert grown.layout.config.dp == 2
    assert "policy grow: onto free spare host-3; 1 -> 2 devices, dp 1 -> 2" in grown.policy_status
    assert check_generation(cluster, job.id, ptc, want, sd, 2) == []


def test_a_policy_may_leave_the_layout_to_the_advisor(cluster, client, job_name):
    """ElasticPolicy.advise: checked when set (a figure the advisor needs and
    the PTC does not say is refused, naming the field), shown by reshardctl."""
    ptc = replicated_ptc()
    job = register(client, job_name, ptc, layout.make_layout(1, 1, 1, ["host-0"], 1), {})
    model = {"hidden": 1024, "heads": 8, "vocab": 2048, "seqLength": 256, "globalBatch": 8}
    with pytest.raises(reshard.errors.InvalidArgument,
                       match=r"policy\.advise\.model\.heads 0: required"):
        client.set_policy(job.id, {"heal": True, "advise": {"model": dict(model, heads=0)}})
    with pytest.raises(reshard.errors.InvalidArgument, match="exclude one another"):
        client.set_policy(job.id, {"heal": True, "advise": {"model": model},
                                   "allowed": [{"tp": 1, "pp": 1, "dp": 1}]})
    job = client.set_policy(job.id, {"heal": True, "advise": {"model": model, "horizonS": 600}})
    assert job.policy.advise.model.heads == 8 and job.policy.advise.horizon_s == 600
    ctl = os.path.join(os.environ["RESHARD_BUILD_DIR"], "client", "cli", "reshardctl")
    out = subprocess.run([ctl, "--coordinator", cluster.coordinator, *cluster.ctl_args(),
                          "jobs", "show", job.id], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "heal, as the advisor recommends (horizon 600 s)" in out.stdout, out.stdout
