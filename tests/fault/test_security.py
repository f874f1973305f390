"""Issue 11's forged-report attack against a real cluster: PostgreSQL, the
real reshard-coordinator and real reshard-agents, all on mutual TLS.

While a resize transfers (its destination agents frozen with SIGSTOP), an
attacker sends AgentService.ReportProgress(DONE) with invented checksums for
every destination host: without a certificate, with another host's real
agent certificate, with a certificate of another CA, and in plaintext. Every
attempt is refused; the job stays at its generation; once the agents run
again the operation commits from their own reports, and every byte of the
new generation (and, before it, the old one) matches the reference.
"""

import os

import grpc
import numpy as np
import pytest

import faultlib
import reshard
from cluster import LocalCluster
from pki import Pki
from reshard import layout as rlayout
from reshard.v1 import agent_pb2, agent_pb2_grpc


@pytest.fixture
def cluster():
    # A longer lease: the frozen destination agents must not be declared
    # lost while the attack runs.
    with LocalCluster(build_dir=faultlib.BUILD, hosts=4, devices_per_host=2, lease_ms=8000,
                      tls=True) as c:
        yield c


def forged_done(ptc, target, host, operation_id, state):
    """A DONE report for every shard `target` places on `host`, with invented
    checksums and the right sizes."""
    index = {t.name: i for i, t in enumerate(ptc.tensors)}
    index.update({b.name: len(ptc.tensors) + i for i, b in enumerate(ptc.blobs)})
    req = agent_pb2.ReportProgressRequest(host_id=host, operation_id=operation_id,
                                          state=agent_pb2.HOST_TASK_STATE_DONE)
    for rank, _ in rlayout.ranks_on_host(target, host):
        for name, value in rlayout.shard(ptc, target, rank, state).items():
            nbytes = np.asarray(value).nbytes
            if nbytes:
                req.checksums.add(item=index[name], rank=rank, checksum=0xDEADBEEF, bytes=nbytes)
    return req


def report(cluster, credentials, req):
    """ReportProgress over `credentials` (None: plaintext); the status code."""
    if credentials is None:
        channel = grpc.insecure_channel(cluster.coordinator)
    else:
        channel = grpc.secure_channel(cluster.coordinator, credentials)
    with channel:
        try:
            agent_pb2_grpc.AgentServiceStub(channel).ReportProgress(req, timeout=10)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def test_forged_progress_reports_are_refused(cluster, tmp_path):
    client = cluster.client(timeout=30.0)
    job = faultlib.Job(cluster, client, f"forged-{os.getpid()}", layers=4, hidden=128,
                       vocab=1024, seq=64)
    old = job.make_layout(2, 2, 1, cluster.host_ids[0:2])
    job.register_and_publish(old)
    target = job.make_layout(2, 2, 1, cluster.host_ids[2:4])

    for host in cluster.host_ids[2:4]:
        cluster.stop_agent(host)
    try:
        op = client.resize(job.id, target)
        assert faultlib.wait_transferring(client, op.id), "the resize ended before the attack"
        foreign = Pki(str(tmp_path / "other-ca"), name="attacker")
        foreign_cert, foreign_key = foreign.issue("agent:host-2")
        attackers = {
            "no client certificate": reshard.tls_credentials(cluster.pki.ca),
            "a source host's agent certificate": reshard.tls_credentials(
                cluster.pki.ca, *cluster.pki.issue("agent:host-0")),
            "an agent certificate of another CA": reshard.tls_credentials(
                cluster.pki.ca, foreign_cert, foreign_key),
            "plaintext": None,
        }
        expected = {
            "no client certificate": grpc.StatusCode.UNAUTHENTICATED,
            "a source host's agent certificate": grpc.StatusCode.PERMISSION_DENIED,
            "an agent certificate of another CA": grpc.StatusCode.UNAVAILABLE,
            "plaintext": grpc.StatusCode.UNAVAILABLE,
        }
        for who, credentials in attackers.items():
            for host in cluster.host_ids[2:4]:
                req = forged_done(job.ptc, target, host, op.id, job.state)
                assert len(req.checksums) > 0
                code = report(cluster, credentials, req)
                assert code == expected[who], f"{who} reporting DONE for {host}: {code}"
        now = client.get_operation(op.id)
        assert now.state == faultlib.TRANSFERRING, reshard.OperationState.Name(now.state)
        assert client.get_job(job.id).generation == 1
        job.verify(old, 1)  # the old generation is untouched
    finally:
        for host in cluster.host_ids[2:4]:
            cluster.continue_agent(host)

    final = job.wait_final(op.id)
    assert final.state == reshard.OperationState.Value("OPERATION_STATE_COMMITTED"), final.error
    assert client.get_job(job.id).generation == 2
    assert job.verify(target, 2) > 0  # byte for byte against the reference
    client.close()
