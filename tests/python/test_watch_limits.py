"""A watch refused for the coordinator's watch limits waits for a slot
(issue 31, defect 2): against a real coordinator with one watch stream per
identity, the Python SDK's watch_job and watch_operation are refused
RESOURCE_EXHAUSTED while another stream of the same identity holds the slot,
open again with backoff (reported through on_retry, counted apart from
max_attempts) and deliver the job once the slot is free. Before, the
refusal was raised at once, and elastic.Loop, which watches the job, raised
it on every rank: the loop's watcher (elastic._Watch, the thread that feeds
Loop.boundary its flags, testable without a torch world) now records no
error while refused and follows the job once a slot frees."""

import threading

import grpc
import pytest

from helpers import every_kind_ptc, publish_all, random_globals, register
import reshard
from reshard import elastic, layout


@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=1,
                      coordinator_args=["--max-watch-streams-per-identity", "1"]) as c:
        yield c


@pytest.mark.parametrize("watch", ["job", "operation"])
def test_a_refused_watch_waits_for_a_slot(cluster, job_name, watch):
    with cluster.client(timeout=30.0) as admin:
        ptc = every_kind_ptc()
        job = register(admin, cluster, job_name, ptc,
                       layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1))
    retries = []
    with cluster.client(timeout=30.0, max_attempts=2,
                        on_retry=lambda *a: retries.append(a)) as c:
        holder = c.watch_job(job.id, timeout=60)
        assert next(holder).id == job.id  # holds the identity's one slot
        got = {}

        def second():
            try:
                if watch == "job":
                    got["job"] = next(c.watch_job(job.id, timeout=60))
                else:
                    # A job's first operation is none: watch a made-up one,
                    # admitted only once a slot is free (then NOT_FOUND).
                    next(c.watch_operation("no-such-operation", timeout=60))
            except reshard.ReshardError as e:
                got["error"] = e

        t = threading.Thread(target=second)
        t.start()
        # Refused for real, more times than max_attempts allows other errors.
        deadline = threading.Event()
        for _ in range(600):
            if len([r for r in retries if r[2] is not None
                    and r[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED]) >= 3:
                break
            deadline.wait(0.05)
        refused = [r for r in retries
                   if r[2] is not None and r[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(refused) >= 3, retries
        assert refused[0][0] == ("WatchJob" if watch == "job" else "WatchOperation")
        assert "limit --max-watch-streams-per-identity 1" in refused[0][2].message
        assert t.is_alive()
        holder.close()  # the first stream ends: its slot comes back
        t.join(timeout=60)
        assert not t.is_alive()
        if watch == "job":
            assert got["job"].id == job.id, got
        else:
            assert isinstance(got.get("error"), reshard.NotFound), got


def _refused(retries, method):
    return [r for r in retries if r[0] == method and r[2] is not None
            and r[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED]


def _wait_until(condition, seconds=30.0):
    gate = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        gate.wait(0.05)
    return condition()


def test_the_loops_watch_survives_a_refusal_and_follows_the_job(cluster, job_name):
    """elastic.Loop's watcher, refused its WatchJob stream, keeps no error
    (Loop.boundary would raise it on every rank) and, once the slot is free,
    sees the job's next operation."""
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    with cluster.client(timeout=30.0) as admin:
        ptc = every_kind_ptc()
        job = register(admin, cluster, job_name, ptc, lay)
        publish_all(cluster, job.id, ptc, lay, random_globals(ptc, 1))
        retries = []
        c = cluster.client(timeout=30.0, max_attempts=2, on_retry=lambda *a: retries.append(a))
        try:
            holder = c.watch_job(job.id, timeout=60)
            assert next(holder).id == job.id  # holds the identity's one slot
            watch = elastic._Watch(c, job.id)
            watch.start()
            _wait_until(lambda: len(_refused(retries, "WatchJob")) >= 3 or watch.error is not None)
            assert watch.error is None, watch.error
            assert len(_refused(retries, "WatchJob")) >= 3, retries
            assert watch.is_alive()
            holder.close()  # the slot comes back: the loop's watch gets it
            op = admin.checkpoint(job.id)
            assert _wait_until(lambda: op.id in watch._seen or watch.error is not None)
            assert watch.error is None, watch.error
            assert op.id in watch._seen
        finally:
            c.close()  # ends the watcher's streams (and its retries)
