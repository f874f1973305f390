"""Per-job worker tokens (docs/security.md, "Worker tokens"): a real agent
serves a worker-socket call only with the worker token of the job it names;
the token is also a coordinator credential with the role `worker`, which
may read only its job."""

import grpc
import pytest

from helpers import every_kind_ptc, random_globals
import reshard
from reshard import layout
from reshard.v1 import worker_pb2, worker_pb2_grpc

@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=1) as c:  # mutual TLS
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with cluster.client(timeout=30.0) as c:
        yield c


def new_job(client, cluster, name):
    ptc = every_kind_ptc()
    lay = layout.make_layout(1, 1, 1, ["host-0"], 1)
    job, token = client.register_job(_spec(name, ptc, lay), with_token=True)
    return job, token, ptc, lay


def _spec(name, ptc, lay):
    from reshard.v1 import ptc_pb2
    return ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=ptc, layout=lay)


def raw_publish(cluster, job_id, token=None):
    """PublishShard of rank 0 generation 1 straight on the socket; returns
    the gRPC status code and details."""
    ch = grpc.insecure_channel("unix:" + cluster.agents["host-0"].worker_socket)
    with ch:
        stub = worker_pb2_grpc.WorkerServiceStub(ch)
        md = (("authorization", "Bearer " + token),) if token is not None else ()
        try:
            stub.PublishShard(worker_pb2.PublishShardRequest(job_id=job_id, generation=1, rank=0),
                              metadata=md, timeout=30)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()


def test_register_job_returns_the_token_get_worker_token_agrees(cluster, client, job_name):
    job, token, _, _ = new_job(client, cluster, job_name)
    assert token.startswith("wt-" + job.id + ".")
    assert client.worker_token(job.id) == token
    # RegisterJob answers the same token to an idempotent retry's caller.
    assert cluster.worker_token(job.id) == token


def test_worker_without_token_is_unauthenticated(cluster, client, job_name):
    job, _, _, _ = new_job(client, cluster, job_name)
    code, details = raw_publish(cluster, job.id)
    assert code == grpc.StatusCode.UNAUTHENTICATED, details
    assert job.id in details
    code, details = raw_publish(cluster, job.id, token="")
    assert code == grpc.StatusCode.UNAUTHENTICATED, details


def test_worker_of_another_job_is_refused_naming_the_job(cluster, client, job_name):
    job, token, _, _ = new_job(client, cluster, job_name)
    other, other_token, _, _ = new_job(client, cluster, job_name + "-other")
    code, details = raw_publish(cluster, job.id, token=other_token)
    assert code == grpc.StatusCode.PERMISSION_DENIED, details
    assert f'job "{job.id}"' in details
    assert other_token not in details and other_token.split(".")[1] not in details
    # A forged token for the job (right form, wrong MAC) is refused alike.
    forged = "wt-" + job.id + "." + "A" * 43
    code, details = raw_publish(cluster, job.id, token=forged)
    assert code == grpc.StatusCode.PERMISSION_DENIED, details
    # Every method checks, not only PublishShard: the Worker API sees it too.
    with reshard.Worker(cluster.agents["host-0"].worker_socket, job.id, ptc=every_kind_ptc(),
                        worker_token=other_token) as w:
        with pytest.raises(reshard.PermissionDenied, match=job.id):
            w.load(0, 1)
    # Nothing was created for the refused calls.
    assert not [f for f in cluster.shm_files("host-0") if job.id in f]


def test_worker_of_the_job_publishes_and_loads(cluster, client, job_name):
    job, token, ptc, lay = new_job(client, cluster, job_name)
    g = random_globals(ptc, world=1, seed=3)
    want = layout.shard(ptc, lay, 0, g)
    with reshard.Worker(cluster.agents["host-0"].worker_socket, job.id, ptc=ptc,
                        worker_token=token) as w:
        w.publish(0, 1, want)
        got = w.load(0, 1)
    for name, value in want.items():
        if isinstance(value, bytes) or value.size:
            assert layout.same_bytes(got[name], value), name


def test_worker_token_from_the_environment(cluster, client, job_name, monkeypatch):
    job, token, ptc, lay = new_job(client, cluster, job_name)
    monkeypatch.setenv("RESHARD_WORKER_TOKEN", token)
    with reshard.Worker(cluster.agents["host-0"].worker_socket, job.id, ptc=ptc) as w:
        w.publish(0, 1, layout.shard(ptc, lay, 0, random_globals(ptc, world=1, seed=4)))


def test_worker_role_on_the_coordinator_reads_only_its_job(cluster, client, job_name):
    job, token, _, _ = new_job(client, cluster, job_name)
    other, _, _, _ = new_job(client, cluster, job_name + "-other")
    kwargs = cluster.client_kwargs(identity=None)  # TLS, no client certificate
    with reshard.Client(cluster.coordinator, token=token, **kwargs) as w:
        assert w.get_job(job.id, include_ptc=True).id == job.id
        # Another job is answered as a job that does not exist, word for
        # word: the token learns neither that it exists nor whose it is.
        with pytest.raises(reshard.NotFound) as e:
            w.get_job(other.id)
        assert e.value.message == f'job "{other.id}" not found'
        with pytest.raises(reshard.NotFound) as missing:
            w.get_job("no-such-job")
        assert missing.value.message == 'job "no-such-job" not found'
        with pytest.raises(reshard.PermissionDenied):
            w.list_jobs(tenant="pytest")
        with pytest.raises(reshard.PermissionDenied):
            w.worker_token(job.id)  # a worker cannot fetch tokens
    with reshard.Client(cluster.coordinator, token="wt-" + job.id + ".forged", **kwargs) as w:
        with pytest.raises(reshard.Unauthenticated):
            w.get_job(job.id)
    # A Worker given the coordinator's address uses its token there: the
    # dtypes of a load come from the coordinator's PTC.
    with reshard.Worker(cluster.agents["host-0"].worker_socket, job.id, worker_token=token,
                        coordinator=cluster.coordinator, **kwargs) as w:
        assert w._coordinator.get_job(job.id).id == job.id


def test_scheduler_of_another_tenant_cannot_fetch_the_token(cluster, client, job_name):
    job, _, _, _ = new_job(client, cluster, job_name)
    with cluster.client(identity="scheduler:s@elsewhere") as c:
        with pytest.raises(reshard.NotFound) as e:  # as if there were no such job
            c.worker_token(job.id)
        assert e.value.message == f'job "{job.id}" not found'
    with cluster.client(identity="scheduler:s@pytest") as c:
        assert c.worker_token(job.id).startswith("wt-" + job.id)
    with cluster.client(identity="viewer:v@pytest") as c:
        with pytest.raises(reshard.PermissionDenied):
            c.worker_token(job.id)


def test_reshardctl_jobs_worker_token(cluster, client, job_name):
    import subprocess
    job, token, _, _ = new_job(client, cluster, job_name)
    base = [cluster.reshardctl] + cluster.ctl_args() + ["--coordinator", cluster.coordinator]
    r = subprocess.run(base + ["jobs", "worker-token", job.id], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == token
    r = subprocess.run(base + ["jobs", "worker-token", "0" * 32], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "0" * 32 in r.stderr, (r.returncode, r.stderr)
