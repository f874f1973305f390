"""Property test of reshard.data at the sampler level (issue 12, item 5's last
sentence): random sequences of dp changes, global batches, micro-batch sizes
and ranks that die mid-step. Whatever happens, the samples of committed steps
cover every epoch exactly once, and shares differ by at most one.

A step is simulated the way a training loop runs it: each rank builds an
ElasticBatchSampler from the last committed DatasetState and reads its first
step; if a rank dies mid-step the step is not committed (its samples are
dropped, the job shrinks) and the next step starts from the same cursor."""

import collections
import random

import pytest

from reshard import data


def run_job(rng, num_samples, order, epochs):
    st = data.DatasetState(data.DatasetDescriptor("prop", num_samples), order,
                           global_batch=rng.randint(1, 2 * num_samples))
    dp = rng.randint(1, 9)
    consumed = []  # (stream index, sample id) of committed steps
    failures = 0
    while st.cursor < epochs * num_samples:
        if rng.random() < 0.3:
            dp = rng.randint(1, 9)  # resize between steps
        micro = rng.choice([0, 1, 2, 3, 5, 64])
        # Every rank reads its share of the next step.
        per_rank = []
        for rank in range(dp):
            sampler = data.ElasticBatchSampler(st, dp=dp, rank=rank, micro_batch_size=micro,
                                               steps=1)
            (state0, sh), = list(sampler.step_shares())
            assert state0 == st
            batches = list(sampler)
            ids = [i for b in batches for i in b]
            sizes = [len(b) for b in batches]
            assert sum(sizes) == sh.count
            if sizes:
                assert max(sizes) - min(sizes) <= 1
                assert micro == 0 or max(sizes) <= micro
            assert ids == st.samples(sh.begin, sh.end)
            per_rank.append((sh, ids))
        counts = [sh.count for sh, _ in per_rank]
        assert max(counts) - min(counts) <= 1 and sum(counts) == st.global_batch
        assert counts == data.share_counts(st.global_batch, dp)
        if failures == 0 or rng.random() < 0.2:
            # A rank dies mid-step: nothing is committed; the survivors
            # (possibly fewer) replay the same cursor.
            failures += 1
            dp = max(1, dp - rng.randint(1, 2))
            continue
        for sh, ids in per_rank:
            consumed.extend(zip(range(sh.begin, sh.end), ids))
        st = st.advanced()
        if rng.random() < 0.1:
            # Occasionally change the global batch too: the cursor counts
            # samples, so exactly-once does not depend on it.
            st = data.DatasetState(st.descriptor, st.order, rng.randint(1, 2 * num_samples),
                                   st.cursor, st.step)
    return consumed, failures


@pytest.mark.parametrize("seed", range(40))
def test_exactly_once_per_epoch_across_resizes_and_failures(seed):
    rng = random.Random(seed)
    num_samples = rng.choice([1, 2, 7, 10, 31, 64, 100, 257])
    shuffle = rng.choice(["none", "full", "block"])
    order = data.Order(rng.getrandbits(64), shuffle,
                       rng.randint(1, 40) if shuffle == "block" else 0)
    epochs = 3
    consumed, failures = run_job(rng, num_samples, order, epochs)
    # Stream indices of committed steps are exactly 0 .. cursor-1, once each.
    indices = [i for i, _ in consumed]
    assert sorted(indices) == list(range(len(indices)))
    by_epoch = collections.defaultdict(list)
    for i, sample in consumed:
        by_epoch[i // num_samples].append(sample)
    for epoch in range(epochs):
        # Every complete epoch delivered every sample exactly once.
        assert sorted(by_epoch[epoch]) == list(range(num_samples)), (epoch, order)
    assert failures > 0  # every run replays at least its first step


def test_a_failed_step_is_replayed_not_skipped():
    st = data.DatasetState(data.DatasetDescriptor("ds", 50), data.Order(4, "full"),
                           global_batch=12, cursor=40, step=3)
    before = [list(data.ElasticSampler(st, dp=4, rank=r, steps=1)) for r in range(4)]
    # Rank 2 dies mid-step: the step is not committed; 3 ranks replay it.
    after = [list(data.ElasticSampler(st, dp=3, rank=r, steps=1)) for r in range(3)]
    assert sorted(sum(before, [])) == sorted(sum(after, []))
    assert [len(x) for x in after] == [4, 4, 4]
