"""Elastic policies with a real PyTorch job (docs/scheduler.md, "Elastic
policies"): the user's FSDP2 + TP training script under `reshard run`, with
no client call once its policy is set: a free spare grows it at a step
boundary, and a lost host is healed onto a spare; the losses are the
uninterrupted run's, step for step, and the final state its state."""

import pytest

from reshard import layout

from helpers import wait_for
from test_pytorch_training import Job, _check, _ended, _trained, job_ptc, reference  # noqa: F401


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=3, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


def _reconfigured(client, job_id):
    """The job once a reconfiguration committed (its layout epoch moved;
    the loop's checkpoints move only its generation)."""
    return wait_for(f"job {job_id} reconfigured by its policy",
                    lambda: (lambda j: j if j.layout_epoch > 0 else None)(client.get_job(job_id)),
                    timeout=180)


def _policy_actions(client, job_id):
    return [(e.method, e.code) for e in client.audit(job_id=job_id) if e.identity == "policy"]


def test_grown_by_policy_at_a_step_boundary(cluster, client, job_name, job_ptc, reference,
                                            tmp_path):
    """FSDP dp 2 on host 0; the scheduler offers host 1 by policy: the job
    grows to dp 4 at its next step boundary."""
    hosts = cluster.host_ids
    first = layout.make_layout(1, 1, 2, hosts[:1], 2)
    job = Job(cluster, client, job_name, job_ptc, first, str(tmp_path))
    try:
        job.wait("the first world trains 4 steps", lambda r: _trained(r, 4))
        client.set_policy(job.job.id, {"grow": True, "spareHosts": [hosts[1]],
                                       "maxDevices": 4})
        grown = _reconfigured(client, job.job.id)
        job.wait("the job trained its steps", lambda r: len(
            [e for e in _ended(r) if e["started"] == "loaded"]) == 4)
        _check(job, reference, grown.layout)
    finally:
        job.stop()
    assert grown.layout.config.dp == 4
    assert layout.hosts_of(grown.layout) == hosts[:2]
    assert "policy grow: onto free spare host-1; 2 -> 4 devices, dp 2 -> 4" in grown.policy_status, \
        grown.policy_status
    assert _policy_actions(client, job.job.id) == [("Resize", "OK")]


def test_lost_host_healed_by_policy(cluster, client, job_name, job_ptc, reference, tmp_path):
    """HSDP (a replica per host) on hosts 0 and 1 -> host 1 lost (agent,
    launcher and ranks SIGKILLed) -> the policy recovers its ranks onto the
    spare host 2, the same layout: no client call, no redundancy given up."""
    hosts = cluster.host_ids
    first = layout.make_layout(1, 1, 4, [hosts[0], hosts[1]], 2, dp_shard=2)
    job = Job(cluster, client, job_name, job_ptc, first, str(tmp_path),
              policy={"heal": True, "spareHosts": [hosts[2]]})
    try:
        job.wait("the first world trains 7 steps", lambda r: _trained(r, 7))
        job.kill_host(hosts[1])
        healed = _reconfigured(client, job.job.id)
        job.wait("the job trained its steps", lambda r: len(
            [e for e in _ended(r) if e["started"] == "loaded"]) == 4)
        _check(job, reference, healed.layout)
    finally:
        job.stop()
    assert layout.slots(healed.layout) == [(hosts[0], 0), (hosts[0], 1),
                                           (hosts[2], 0), (hosts[2], 1)]
    assert healed.layout.config.dp_shard == 2
    assert f"policy heal: {hosts[1]} lost; recovering {hosts[1]} onto spare {hosts[2]}" in \
        healed.policy_status, healed.policy_status
    assert _policy_actions(client, job.job.id) == [("RecoverFromFailure", "OK")]
