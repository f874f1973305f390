"""The dataset state through a real cluster (docs/data.md): a job registered
with its DatasetState, a simulated training loop that reads its shares from
reshard.data samplers and commits every step with Client.commit_step, a
resize (dp 2 -> 1) that carries the committed cursor, a step that dies
mid-way and is replayed, and the refusals a loop meets (stale generation,
another layout, backward cursor, a resume with another configuration).
Over the epoch every sample is consumed exactly once."""

import collections

import pytest

from helpers import publish_all
import reshard
from reshard import data, layout, megatron

N, BATCH = 50, 7  # 7 does not divide by dp 2: shares of 4 and 3


def configured(global_batch=BATCH):
    return data.DatasetState(data.DatasetDescriptor("tiny-corpus", N, "sha1:0123"),
                             data.Order(seed=20261123, shuffle="block", block_size=8),
                             global_batch=global_batch)


def small_job(name, hosts):
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=8, seed=3)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(2, 4))
    lay = layout.make_layout(2, 2, 2, hosts, 2)
    spec = {"name": name, "tenant": "pytest", "ptc": reshard.to_dict(ptc),
            "layout": reshard.to_dict(lay)}
    return spec, ptc, lay, sd


def run_steps(client, job_id, generation, state, dp, steps, consumed):
    """`steps` committed steps at `dp`: each rank reads its share through an
    ElasticSampler; the step commits after all ranks read. Returns the state."""
    for _ in range(steps):
        for rank in range(dp):
            consumed.extend(data.ElasticSampler(state, dp=dp, rank=rank, steps=1))
        state = client.commit_step(job_id, generation, state=state.advanced())
    return state


def test_training_loop_commits_and_a_resize_carries_the_cursor(cluster, client, job_name):
    spec, ptc, lay, sd = small_job(job_name, cluster.host_ids)
    job = client.register_job(spec, dataset_state=configured())
    assert job.dataset_state.layout_fingerprint == configured().layout_fingerprint
    publish_all(cluster, job.id, ptc, lay, sd)

    consumed = []
    state = data.resume(client.dataset_state(job.id), configured())
    assert (state.cursor, state.step) == (0, 0)
    state = run_steps(client, job.id, 1, state, dp=2, steps=3, consumed=consumed)
    assert (state.cursor, state.step, state.committed_generation) == (21, 3, 1)

    # A rank dies mid-step 4: its samples were read but the step never commits.
    in_flight = list(data.ElasticSampler(state, dp=2, rank=0, steps=1))
    assert len(in_flight) == 4

    op = client.resize(job.id, layout.make_layout(4, 2, 1, cluster.host_ids, 2))
    assert client.wait(op, timeout=120).state == reshard.OperationState.Value(
        "OPERATION_STATE_COMMITTED")
    job = client.get_job(job.id)
    assert job.generation == 2

    # The old generation can no longer commit.
    with pytest.raises(reshard.FailedPrecondition, match="not the current generation 2"):
        client.commit_step(job.id, 1, state=state.advanced())

    # The resized run resumes from the committed state: step 4 is replayed.
    resumed = data.resume(client.dataset_state(job.id), configured())
    assert (resumed.cursor, resumed.step) == (21, 3)
    replay = list(data.ElasticSampler(resumed, dp=1, rank=0, steps=1))
    assert set(in_flight) <= set(replay)
    state = run_steps(client, job.id, 2, resumed, dp=1, steps=5, consumed=consumed)
    assert (state.cursor, state.committed_generation) == (56, 2)

    # Every sample of epoch 0 exactly once (50 of the 56 consumed).
    epoch0 = consumed[:N]
    assert sorted(epoch0) == list(range(N))
    assert collections.Counter(consumed[N:]) == collections.Counter(
        configured().samples(N, 56))

    # A backward cursor and another layout are refused, naming the values.
    with pytest.raises(reshard.FailedPrecondition, match="would move backwards"):
        client.commit_step(job.id, 2, step=9, cursor=14,
                           layout_fingerprint=state.layout_fingerprint)
    with pytest.raises(reshard.FailedPrecondition, match="does not match"):
        client.commit_step(job.id, 2, state=configured(global_batch=8).advanced(9))
    with pytest.raises(reshard.InvalidArgument, match="step: 0"):
        client.commit_step(job.id, 2, step=0, cursor=0, layout_fingerprint="sha256:x")
    # A run configured with another global batch may not resume this job.
    with pytest.raises(reshard.FailedPrecondition, match="refusing to resume"):
        data.resume(client.dataset_state(job.id), configured(global_batch=8))


def test_register_refuses_a_bad_dataset_state(cluster, client, job_name):
    spec, _, _, _ = small_job(job_name, cluster.host_ids)
    bad = configured().to_dict()
    bad["globalBatch"] = "0"
    with pytest.raises(reshard.InvalidArgument, match="dataset_state.global_batch: 0"):
        client.register_job(spec, dataset_state=bad)
    plain = client.register_job(spec)
    assert client.dataset_state(plain.id) is None
