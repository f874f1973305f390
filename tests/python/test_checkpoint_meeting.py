"""A checkpoint and an operation that meet (docs/coordinator.md, "Checkpoints
and operations"), on a real local cluster (PostgreSQL, reshard-coordinator,
agents moving the bytes): a resize requested while a checkpoint is in flight
is queued, survives a coordinator restart, and moves the checkpointed state
once the workers' publish commits; a checkpoint while a stop-free operation
prepares is folded into it; a stop-the-world resize at_step_boundary moves
the state of the checkpoint that names it, or the last committed state when
none does by its deadline; a recovery aborts the checkpoint that its lost
host can never finish instead of waiting behind it; a resize whose
generation a checkpoint overtakes before it lands is read again, not
refused (unless the caller gave the generation)."""

import pytest

from helpers import (check_generation, every_kind_ptc, publish_all, random_globals, register,
                     tensor)
import reshard
from reshard import layout
from reshard.v1 import coordinator_pb2, ptc_pb2

OP = coordinator_pb2


def _start(cluster, client, job_name, seed):
    ptc, lay = every_kind_ptc(), layout.make_layout(2, 2, 1, cluster.host_ids[:2], 2)
    job = register(client, cluster, job_name, ptc, lay)
    step0 = random_globals(ptc, 4, seed=seed)
    publish_all(cluster, job.id, ptc, lay, step0)
    return ptc, lay, job, step0


def _target(cluster):
    return layout.make_layout(1, 1, 2, cluster.host_ids[2:4], 1)


def test_a_resize_during_a_checkpoint_is_queued_survives_a_restart_and_moves_its_state(
        cluster, client, job_name):
    ptc, lay, job, _ = _start(cluster, client, job_name, seed=11)
    step7 = random_globals(ptc, 4, seed=12)
    cp = client.checkpoint(job.id)
    assert cp.to_generation == 2

    # Accepted while the checkpoint is in flight: queued, not refused.
    resize = client.resize(job.id, _target(cluster))
    assert resize.state == OP.OPERATION_STATE_PENDING
    assert (resize.queued_behind_operation_id, resize.from_generation,
            resize.to_generation) == (cp.id, 1, 0)
    assert client.get_job(job.id).active_operation_id == cp.id

    # The queue lives in PostgreSQL: a new coordinator process keeps it.
    cluster.restart_coordinator()
    again = client.get_operation(resize.id)
    assert (again.state, again.queued_behind_operation_id) == (OP.OPERATION_STATE_PENDING, cp.id)

    # The training loop publishes its step; the checkpoint commits and the
    # resize starts by itself from the checkpoint's generation.
    publish_all(cluster, job.id, ptc, lay, step7, generation=cp.to_generation)
    assert client.wait(cp.id, timeout=60, raise_on_failure=True).to_generation == 2
    done = client.wait(resize.id, timeout=120, raise_on_failure=True)
    assert (done.queued_behind_operation_id, done.from_generation, done.to_generation) == \
        ("", 2, 3)
    assert client.get_job(job.id).generation == 3
    assert check_generation(cluster, job.id, ptc, _target(cluster), step7, 3) == []


def test_a_checkpoint_during_a_stop_free_operation_is_folded_into_it(cluster, client, job_name):
    _, _, job, _ = _start(cluster, client, job_name, seed=13)
    stop_free = client.resize(job.id, _target(cluster), stop_free=True)
    folded = client.checkpoint(job.id)
    assert folded.checkpoint_folded
    assert (folded.id, folded.kind) == (stop_free.id, OP.OPERATION_KIND_RESIZE)
    # Nothing was created: the job's active operation and generation stay.
    j = client.get_job(job.id)
    assert (j.active_operation_id, j.generation) == (stop_free.id, 1)
    client.cancel_operation(stop_free.id)
    assert client.wait(stop_free.id, timeout=60).state == OP.OPERATION_STATE_ABORTED


def test_a_resize_at_the_step_boundary_moves_the_state_of_the_checkpoint_naming_it(
        cluster, client, job_name):
    ptc, lay, job, _ = _start(cluster, client, job_name, seed=15)
    step9 = random_globals(ptc, 4, seed=16)
    updates = client.watch_job(job.id, timeout=120)
    assert next(updates).step_boundary_operation_id == ""

    resize = client.resize(job.id, _target(cluster), at_step_boundary=True)
    assert resize.at_step_boundary
    assert resize.step_boundary == OP.STEP_BOUNDARY_WAITING
    # The loop learns of it from its job watch (no polling).
    seen = next(j for j in updates if j.step_boundary_operation_id)
    assert seen.step_boundary_operation_id == resize.id
    updates.close()

    # Its next step boundary: a checkpoint naming the resize.
    cp = client.checkpoint(job.id, cut_over_operation_id=resize.id)
    assert cp.kind == OP.OPERATION_KIND_CHECKPOINT and cp.to_generation == 2
    publish_all(cluster, job.id, ptc, lay, step9, generation=cp.to_generation)
    done = client.wait(resize.id, timeout=120, raise_on_failure=True)
    assert (done.step_boundary, done.cutover_operation_id, done.from_generation,
            done.to_generation) == (OP.STEP_BOUNDARY_REACHED, cp.id, 2, 3)
    assert check_generation(cluster, job.id, ptc, _target(cluster), step9, 3) == []


def test_without_a_checkpoint_by_its_deadline_it_moves_the_last_committed_state(
        cluster, client, job_name):
    ptc, _, job, step0 = _start(cluster, client, job_name, seed=17)
    resize = client.resize(job.id, _target(cluster), at_step_boundary=True,
                           step_boundary_timeout=1.0)
    done = client.wait(resize.id, timeout=120, raise_on_failure=True)
    assert (done.step_boundary, done.from_generation, done.to_generation) == \
        (OP.STEP_BOUNDARY_TIMED_OUT, 1, 2)
    assert check_generation(cluster, job.id, ptc, _target(cluster), step0, 2) == []
    with pytest.raises(ValueError, match="needs at_step_boundary"):
        client.resize(job.id, _target(cluster), step_boundary_timeout=5)
    # Migrate takes the same keywords.
    back = layout.make_layout(1, 1, 2, cluster.host_ids[:2], 1)
    moved = client.migrate(job.id, back, at_step_boundary=True, step_boundary_timeout=0.5)
    assert moved.step_boundary == OP.STEP_BOUNDARY_WAITING
    done = client.wait(moved.id, timeout=120, raise_on_failure=True)
    assert (done.step_boundary, done.from_generation, done.to_generation) == \
        (OP.STEP_BOUNDARY_TIMED_OUT, 2, 3)
    assert check_generation(cluster, job.id, ptc, back, step0, 3) == []


def _replicated_ptc():
    """Every item replicated over dp: a dp-2 job loses nothing with a host."""
    t = [tensor("emb", "DTYPE_FLOAT32", [9, 4]), tensor("layers.0.w", "DTYPE_FLOAT16", [6, 5])]
    blobs = [{"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"}]
    return reshard.as_message({"numLayers": 1, "tensors": t, "blobs": blobs}, ptc_pb2.Ptc)


def test_a_recovery_aborts_the_checkpoint_a_lost_host_can_never_finish(cluster, client,
                                                                       job_name):
    """Last in this module: it freezes an agent (thawed at the end)."""
    ptc = _replicated_ptc()
    h0, h1 = cluster.host_ids[:2]
    lay = layout.make_layout(1, 1, 2, [h0, h1], 1)
    job = register(client, cluster, job_name, ptc, lay)
    step0, step4 = random_globals(ptc, 2, seed=19), random_globals(ptc, 2, seed=20)
    publish_all(cluster, job.id, ptc, lay, step0)
    cp = client.checkpoint(job.id)
    # Host 0's rank publishes step 4; host 1 is lost before its rank does.
    with cluster.worker(h0, job.id) as w:
        for rank, _ in layout.ranks_on_host(lay, h0):
            w.publish(rank, cp.to_generation, layout.shard(ptc, lay, rank, step4))
    cluster.stop_agent(h1)
    try:
        # h0 alone keeps one copy: accepted (docs/coordinator.md, "Recovery
        # keeps the job's redundancy").
        recovery = client.recover(job.id, lost_hosts=[h1], accept_degraded=True)
        # Not queued behind a checkpoint that can never finish: it ended it.
        assert recovery.queued_behind_operation_id == ""
        aborted = client.get_operation(cp.id)
        assert aborted.state == OP.OPERATION_STATE_ABORTED
        assert aborted.error == (f'aborted: recovery "{recovery.id}" replaced it (lost host '
                                 f'"{h1}"); a checkpoint needs every rank of its generation')
        done = client.wait(recovery.id, timeout=120, raise_on_failure=True)
        survivors = client.get_job(job.id).layout
        assert (list(layout.hosts_of(survivors)), survivors.config.dp) == ([h0], 1)
        # The last committed state (step 0), never the half-published step 4.
        assert check_generation(cluster, job.id, ptc, survivors, step0,
                                done.to_generation) == []
    finally:
        cluster.continue_agent(h1)


def test_a_checkpoint_that_commits_between_the_read_and_the_resize_is_read_again(
        cluster, client, job_name):
    ptc, lay, job, _ = _start(cluster, client, job_name, seed=21)
    real_get_job = client.get_job

    def checkpoint(job_id, seed):
        cp = client.checkpoint(job_id, expected_generation=real_get_job(job_id).generation)
        state = random_globals(ptc, 4, seed=seed)
        publish_all(cluster, job_id, ptc, lay, state, generation=cp.to_generation)
        client.wait(cp.id, timeout=60, raise_on_failure=True)
        return cp.to_generation, state

    # A generation the caller gives is its own precondition: Aborted.
    assert checkpoint(job.id, seed=22)[0] == 2
    with pytest.raises(reshard.Aborted, match="is at generation 2, request expected 1"):
        client.resize(job.id, _target(cluster), expected_generation=1)

    # Without one, the resize reads generation 2; the training loop's
    # checkpoint commits generation 3 before the call lands: the coordinator
    # answers Aborted, the client reads 3 and the resize goes through.
    reads, state3 = [], []

    def get_job_then_checkpoint(job_id, **kw):
        got = real_get_job(job_id, **kw)
        reads.append(got.generation)
        if len(reads) == 1:
            state3.append(checkpoint(job_id, seed=23))
        return got

    client.get_job = get_job_then_checkpoint
    try:
        op = client.resize(job.id, _target(cluster))
    finally:
        client.get_job = real_get_job
    assert reads == [2, 3, 3]
    assert state3[0][0] == 3
    done = client.wait(op.id, timeout=120, raise_on_failure=True)
    assert (done.from_generation, done.to_generation) == (3, 4)
    assert check_generation(cluster, job.id, ptc, _target(cluster), state3[0][1],
                            generation=4) == []
