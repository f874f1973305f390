"""Checkpoint operations against a real local cluster: a job's workers
publish the state of a later step into the next generation on the same
layout, which commits once every rank is sealed; the previous generation
stays current until then, so an aborted checkpoint loses nothing; a resize
after a checkpoint moves the checkpointed state."""

import dataclasses

import pytest

from helpers import check_generation, every_kind_ptc, publish_all, random_globals, register
import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2

OP = coordinator_pb2


def _lay(cluster):
    return layout.make_layout(2, 2, 1, cluster.host_ids[:2], 2)


def test_checkpoint_commits_what_the_workers_publish(cluster, client, job_name):
    ptc, lay = every_kind_ptc(), _lay(cluster)
    step0, step7 = random_globals(ptc, 4, seed=1), random_globals(ptc, 4, seed=2)
    job = register(client, cluster, job_name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, step0)

    # Generation 2 is not open to publishing without a checkpoint.
    with pytest.raises(reshard.FailedPrecondition, match="generation 1, not 2"):
        publish_all(cluster, job.id, ptc, lay, step7, generation=2)

    op = client.checkpoint(job.id)
    assert op.kind == OP.OPERATION_KIND_CHECKPOINT and op.to_generation == 2
    # Until every rank is sealed generation 1 is current and whole.
    assert client.get_job(job.id).generation == 1
    publish_all(cluster, job.id, ptc, lay, step7, generation=2)
    final = client.wait(op.id, timeout=60, raise_on_failure=True)
    assert final.state == OP.OPERATION_STATE_COMMITTED
    assert client.get_job(job.id).generation == 2
    assert check_generation(cluster, job.id, ptc, lay, step7, 2) == []

    # A resize moves the checkpointed state, not the registered one.
    target = layout.make_layout(1, 1, 2, cluster.host_ids[2:4], 1)
    moved = client.wait(client.resize(job.id, target).id, timeout=120, raise_on_failure=True)
    assert moved.to_generation == 3
    assert check_generation(cluster, job.id, ptc, target, step7, 3) == []


def test_aborted_checkpoint_keeps_the_previous_generation(cluster, client, job_name):
    ptc, lay = every_kind_ptc(), _lay(cluster)
    step0, step5 = random_globals(ptc, 4, seed=3), random_globals(ptc, 4, seed=4)
    job = register(client, cluster, job_name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, step0)
    op = client.checkpoint(job.id)
    # The workers of one host publish; the other host's never do (they died).
    host = cluster.host_ids[0]
    with cluster.worker(host, job.id) as w:
        for rank, _ in layout.ranks_on_host(lay, host):
            w.publish(rank, 2, layout.shard(ptc, lay, rank, step5))
    client.cancel_operation(op.id)
    final = client.wait(op.id, timeout=60)
    assert final.state == OP.OPERATION_STATE_ABORTED
    j = client.get_job(job.id)
    assert j.generation == 1 and j.state == OP.JOB_STATE_ACTIVE
    assert check_generation(cluster, job.id, ptc, lay, step0, 1) == []
    # The aborted generation is closed again.
    with pytest.raises(reshard.FailedPrecondition):
        publish_all(cluster, job.id, ptc, lay, step5, generation=2)
    # And the next checkpoint works.
    op = client.checkpoint(job.id)
    publish_all(cluster, job.id, ptc, lay, step5, generation=op.to_generation)
    assert client.wait(op.id, timeout=60, raise_on_failure=True).state == \
        OP.OPERATION_STATE_COMMITTED
    assert check_generation(cluster, job.id, ptc, lay, step5, op.to_generation) == []


def test_checkpoint_refusals(cluster, client, job_name):
    ptc, lay = every_kind_ptc(), _lay(cluster)
    job = register(client, cluster, job_name, ptc, lay)
    with pytest.raises(reshard.InvalidArgument, match="job_id"):
        client.checkpoint("", expected_generation=1)
    with pytest.raises(reshard.NotFound):
        client.checkpoint("no-such-job", expected_generation=1)
    with pytest.raises(reshard.Aborted, match="expected 7"):
        client.checkpoint(job.id, expected_generation=7)


def _data_state():
    from reshard import data
    return data.DatasetState(data.DatasetDescriptor("ckpt-corpus", 40, "sha1:42"),
                             data.Order(seed=7, shuffle="full"), global_batch=6)


def test_checkpoint_commits_the_step_with_the_model_state(cluster, client, job_name):
    """The model state of step k and the cursor after step k commit in one
    transaction: before the commit the job shows step 0, after it step 3;
    an aborted checkpoint leaves the cursor where it was."""
    from reshard import data
    ptc, lay = every_kind_ptc(), _lay(cluster)
    step0, step3 = random_globals(ptc, 4, seed=5), random_globals(ptc, 4, seed=6)
    job = client.register_job({"name": job_name, "tenant": "pytest", "ptc": reshard.to_dict(ptc),
                               "layout": reshard.to_dict(lay)}, dataset_state=_data_state())
    publish_all(cluster, job.id, ptc, lay, step0)
    state = data.resume(client.dataset_state(job.id), _data_state())
    after3 = state.advanced(3)

    # Aborted: nothing of step 3 lands.
    op = client.checkpoint(job.id, dataset_state=after3)
    client.cancel_operation(op.id)
    assert client.wait(op.id, timeout=60).state == OP.OPERATION_STATE_ABORTED
    assert (client.dataset_state(job.id).step, client.dataset_state(job.id).cursor) == (0, 0)

    op = client.checkpoint(job.id, dataset_state=after3)
    assert (client.dataset_state(job.id).step, client.dataset_state(job.id).cursor) == (0, 0)
    publish_all(cluster, job.id, ptc, lay, step3, generation=op.to_generation)
    client.wait(op.id, timeout=60, raise_on_failure=True)
    committed = client.dataset_state(job.id)
    assert (committed.step, committed.cursor, committed.committed_generation) == \
        (3, 18, op.to_generation)
    assert check_generation(cluster, job.id, ptc, lay, step3, op.to_generation) == []

    # A step that does not follow the committed one is refused up front.
    with pytest.raises(reshard.FailedPrecondition):
        client.checkpoint(job.id, dataset_state=after3)  # step 3 again
    skipping = data.resume(committed, _data_state()).advanced(2)
    skipping = dataclasses.replace(skipping, cursor=skipping.cursor + 1)
    with pytest.raises(reshard.FailedPrecondition):
        client.checkpoint(job.id, dataset_state=skipping)


def test_watch_job_shows_a_pending_reconfiguration(cluster, client, job_name):
    """WatchJob streams the job when an operation starts and when it
    commits: the training loop's signal, with no polling of the scheduler."""
    ptc, lay = every_kind_ptc(), _lay(cluster)
    job = register(client, cluster, job_name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, random_globals(ptc, 4, seed=8))
    updates = client.watch_job(job.id, timeout=60)
    first = next(updates)
    assert (first.generation, first.active_operation_id) == (1, "")
    op = client.checkpoint(job.id)
    pending = next(updates)
    assert pending.active_operation_id == op.id and pending.generation == 1
    publish_all(cluster, job.id, ptc, lay, random_globals(ptc, 4, seed=9),
                generation=op.to_generation)
    while True:
        update = next(updates)
        if update.generation == op.to_generation:
            break
    assert update.active_operation_id == ""
    updates.close()
    with pytest.raises(reshard.NotFound):
        next(client.watch_job("no-such-job", timeout=10))
