"""A training process's credentials (issue 20; docs/pytorch.md, "Credentials
of a training process"): the job's worker token alone does everything the
loop does on its own job (watch, checkpoint, publish, commit steps, read
the dataset state, report a dead rank) through reshard.Client, over TLS with
only the CA (Client.from_env reads the launcher's RESHARD_* variables) or
plaintext; another job and every scheduler-only call are refused. And a
checkpoint's publish no longer waits for the agent's heartbeat: with agents
heartbeating every 30 s, a checkpoint + publish of every rank commits in a
small fraction of that (the agent fetches the checkpoint's task when the
first worker publishes)."""

import threading
import time

import pytest

from helpers import every_kind_ptc, random_globals
import reshard
from reshard import data, layout
from reshard.v1 import coordinator_pb2, ptc_pb2

OP = coordinator_pb2
HEARTBEAT_MS = 30000
# Far below one heartbeat: a publish that waited for the agent's heartbeat
# could not commit within it.
PUBLISH_DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    # A lease long enough for 30 s heartbeats (a third of it).
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=1, lease_ms=90000,
                      heartbeat_ms=HEARTBEAT_MS) as c:  # mutual TLS
        yield c


@pytest.fixture(scope="module")
def admin(cluster):
    with cluster.client(timeout=30.0) as c:
        yield c


def _configured():
    return data.DatasetState(data.DatasetDescriptor("tiny-corpus", 64, "sha1:0123"),
                             global_batch=4)


def _register(admin, cluster, name):
    ptc = every_kind_ptc()
    lay = layout.make_layout(1, 1, 2, cluster.host_ids, 1)
    spec = ptc_pb2.JobSpec(name=name, tenant="pytest", ptc=ptc, layout=lay)
    job, token = admin.register_job(spec, dataset_state=_configured(), with_token=True)
    return job, token, ptc, lay


def _publish_all(cluster, job_id, token, ptc, lay, globals_, generation):
    """Every rank of `lay` through its host's Worker with the worker token;
    seconds from the first call to the last seal."""
    start = time.monotonic()
    for host in layout.hosts_of(lay):
        with reshard.Worker(cluster.agents[host].worker_socket, job_id, ptc=ptc,
                            worker_token=token) as w:
            for rank, _ in layout.ranks_on_host(lay, host):
                w.publish(rank, generation, layout.shard(ptc, lay, rank, globals_))
    return time.monotonic() - start


def _env(cluster, token, tls=True):
    env = {"RESHARD_COORDINATOR": cluster.coordinator, "RESHARD_WORKER_TOKEN": token}
    if tls:
        env["RESHARD_TLS_CA"] = cluster.pki.ca
    return env


def test_the_worker_token_runs_the_loop_on_its_job(cluster, admin, job_name):
    job, token, ptc, lay = _register(admin, cluster, job_name)
    other, _, _, _ = _register(admin, cluster, job_name + "-other")
    _publish_all(cluster, job.id, token, ptc, lay, random_globals(ptc, 2, seed=1), 1)

    # TLS with only the CA, from the launcher's environment: no certificate.
    with reshard.Client.from_env(env=_env(cluster, token), timeout=30.0) as w:
        watch = w.watch_job(job.id, timeout=60)
        first = next(watch)
        assert (first.id, first.generation, list(first.failed_ranks)) == (job.id, 1, [])
        state = w.dataset_state(job.id)
        assert (state.cursor, state.step) == (0, 0)
        # A step commits; the next step's state goes into a checkpoint.
        committed = w.commit_step(job.id, 1, state=state.advanced(1))
        assert (committed.cursor, committed.step) == (4, 1)
        op = w.checkpoint(job.id, dataset_state=state.advanced(2), idempotency_key="ckpt-2")
        assert (op.kind, op.to_generation) == (OP.OPERATION_KIND_CHECKPOINT, 2)
        # A retry with the key (another rank's, a lost reply) gets the same
        # checkpoint; the key is the job's workers', not a scheduler's.
        again = w.checkpoint(job.id, dataset_state=state.advanced(2), idempotency_key="ckpt-2")
        assert again.id == op.id
        assert w.get_operation(op.id).job_id == job.id
        _publish_all(cluster, job.id, token, ptc, lay, random_globals(ptc, 2, seed=2), 2)
        final = w.wait(op.id, timeout=60, raise_on_failure=True)
        assert final.state == OP.OPERATION_STATE_COMMITTED
        assert w.get_job(job.id).generation == 2
        # Not a stop-free operation: the logic answers, not the authorizer.
        with pytest.raises(reshard.FailedPrecondition):
            w.mark_prepared(op.id)
        # A dead rank: the watch (this process's own stream) sees it.
        failure = w.report_rank_failure(job.id, 1, reason="exit status -9")
        assert (failure.rank, failure.reason, failure.generation) == (1, "exit status -9", 2)
        assert failure.reported_by == "worker:" + job.id
        seen = next(j for j in watch if j.failed_ranks)
        assert [(f.rank, f.reason) for f in seen.failed_ranks] == [(1, "exit status -9")]
        with pytest.raises(reshard.InvalidArgument, match="rank 2 "):
            w.report_rank_failure(job.id, 2, reason="no such rank")

        # Another job: answered as a job that does not exist (the token learns
        # neither that it exists nor whose it is); scheduler-only calls:
        # refused.
        for call in (lambda: w.get_job(other.id), lambda: w.watch_job(other.id).__next__(),
                     lambda: w.checkpoint(other.id), lambda: w.dataset_state(other.id),
                     lambda: w.report_rank_failure(other.id, 0, "x"),
                     lambda: w.commit_step(other.id, 1, state=state.advanced(1))):
            with pytest.raises(reshard.NotFound) as e:
                call()
            assert e.value.message == f'job "{other.id}" not found'
        target = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
        for call in (lambda: w.resize(job.id, target), lambda: w.delete_job(job.id),
                     lambda: w.worker_token(job.id), lambda: w.list_hosts(),
                     lambda: w.list_jobs(tenant="pytest"), lambda: w.audit(tenant="pytest"),
                     lambda: w.cancel_operation(op.id)):
            with pytest.raises(reshard.PermissionDenied):
                call()

    # The audit trail names the worker's calls.
    methods = {(e.method, e.role) for e in admin.audit(job_id=job.id, limit=200)
               if e.code == "OK"}
    assert {("CommitStep", "worker"), ("Checkpoint", "worker"),
            ("ReportRankFailure", "worker")} <= methods
    # The scheduler's view carries the failure too.
    assert [f.rank for f in admin.get_job(job.id).failed_ranks] == [1]


def test_from_env_names_what_is_missing(cluster):
    with pytest.raises(ValueError, match="RESHARD_COORDINATOR"):
        reshard.Client.from_env(env={"RESHARD_WORKER_TOKEN": "wt-x.y"})
    with pytest.raises(ValueError, match="RESHARD_WORKER_TOKEN"):
        reshard.Client.from_env(env={"RESHARD_COORDINATOR": cluster.coordinator})
    with pytest.raises(ValueError, match="/no/such/ca.pem"):
        reshard.Client.from_env(env={"RESHARD_COORDINATOR": cluster.coordinator,
                                     "RESHARD_WORKER_TOKEN": "wt-x.y",
                                     "RESHARD_TLS_CA": "/no/such/ca.pem"})


def test_checkpoint_publish_does_not_wait_for_the_heartbeat(cluster, admin, job_name):
    job, token, ptc, lay = _register(admin, cluster, job_name)
    _publish_all(cluster, job.id, token, ptc, lay, random_globals(ptc, 2, seed=3), 1)
    with reshard.Client.from_env(env=_env(cluster, token), timeout=30.0) as w:
        timings = []
        for generation in (2, 3):
            start = time.monotonic()
            op = w.checkpoint(job.id)
            assert op.to_generation == generation
            published_s = _publish_all(cluster, job.id, token, ptc, lay,
                                       random_globals(ptc, 2, seed=generation), generation)
            final = w.wait(op.id, timeout=PUBLISH_DEADLINE_S, raise_on_failure=True)
            total_s = time.monotonic() - start
            assert final.state == OP.OPERATION_STATE_COMMITTED
            timings.append((published_s, total_s))
        print(f"checkpoint publish with {HEARTBEAT_MS} ms heartbeats: "
              + ", ".join(f"publish {p:.3f} s, checkpoint->commit {t:.3f} s" for p, t in timings))
        for published_s, total_s in timings:
            assert total_s < PUBLISH_DEADLINE_S, timings


def test_insecure_coordinator_with_the_worker_token(job_name):
    """The plaintext path: a coordinator run with --insecure, no RESHARD_TLS_CA."""
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=1, tls=False) as c:
        with c.client(timeout=30.0) as admin:
            spec = ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=every_kind_ptc(),
                                   layout=layout.make_layout(1, 1, 1, c.host_ids, 1))
            job, token = admin.register_job(spec, with_token=True)
        with reshard.Client.from_env(env=_env(c, token, tls=False), timeout=30.0) as w:
            assert w.get_job(job.id).id == job.id
            assert w.report_rank_failure(job.id, 0, "oom").rank == 0
