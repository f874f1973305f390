"""reshard.data (docs/data.md) without a cluster: the shared test vectors
(tests/data/share_vectors.json, also verified by the C++ data_share_test), the
order and share functions, DatasetState conversions and the samplers."""

import subprocess
import sys

import pytest

from reshard import data
from reshard.v1 import ptc_pb2
from helpers import check_vectors_reproduce, read_vectors


@pytest.fixture(scope="module")
def vectors():
    return read_vectors("share_vectors.json")


def order_of(case):
    return data.Order(int(case["seed"]), case["shuffle"], case["block_size"])


# ------------------------------------------------------------ the vectors


def test_vectors_splitmix64(vectors):
    assert vectors["splitmix64"]
    for case in vectors["splitmix64"]:
        assert data.splitmix64(int(case["x"])) == int(case["out"])


def test_vectors_permutations(vectors):
    assert vectors["permutations"]
    for case in vectors["permutations"]:
        perm = data.Permutation(case["n"], int(case["key"]))
        if "forward" in case:
            assert [perm.forward(i) for i in range(case["n"])] == case["forward"]
        else:
            assert [perm.forward(i) for i in case["at"]] == case["values"]
            assert [perm.inverse(v) for v in case["values"]] == case["at"]


def test_vectors_orders(vectors):
    assert len(vectors["orders"]) > 300
    for case in vectors["orders"]:
        n, order, epoch = case["num_samples"], order_of(case), case["epoch"]
        eo = data.EpochOrder(n, order, epoch)
        if "samples" in case:
            assert [eo.sample(i) for i in range(n)] == case["samples"], case
            assert data.sample_at(n, order, epoch * n + n - 1) == case["samples"][-1]
        else:
            assert [eo.sample(i) for i in case["at"]] == case["values"], case


def test_vectors_shares(vectors):
    shuffles = set()
    for case in vectors["shares"]:
        st = data.DatasetState(data.DatasetDescriptor("vectors", case["num_samples"], "fp"),
                               order_of(case), global_batch=case["global_batch"],
                               cursor=case["cursor"])
        shuffles.add(case["shuffle"])
        assert data.share_counts(case["global_batch"], case["dp"]) == case["counts"]
        for want in case["ranks"]:
            sh = st.share(case["dp"], want["rank"], case["micro_batch_size"])
            assert (sh.begin, sh.end, sh.count) == (want["begin"], want["end"], want["count"])
            assert [[s.epoch, s.begin, s.end] for s in sh.segments] == want["segments"]
            assert [list(m) for m in sh.micro_batches] == want["micro_batches"]
            assert st.samples(sh.begin, sh.end) == want["samples"]
    assert shuffles == {"none", "full", "block"}
    # The cases cover what they claim: uneven counts, epoch straddling, empty shares.
    assert any(len(set(c["counts"])) > 1 for c in vectors["shares"])
    assert any(len(r["segments"]) > 1 for c in vectors["shares"] for r in c["ranks"])
    assert any(r["count"] == 0 for c in vectors["shares"] for r in c["ranks"])


def test_vectors_layout_fingerprints(vectors):
    for case in vectors["layout_fingerprints"]:
        got = data.layout_fingerprint(
            data.DatasetDescriptor(case["id"], case["num_samples"], case["fingerprint"]),
            order_of(case), case["global_batch"])
        assert got == case["layout_fingerprint"]


def test_vector_file_is_what_the_generator_writes(tmp_path):
    # The checked-in file is reproducible from data.py (no hand edits).
    check_vectors_reproduce("gen_share_vectors.py", "share_vectors.json", tmp_path)


# ------------------------------------------------------------- the order


@pytest.mark.parametrize("shuffle,block", [("none", 0), ("full", 0), ("block", 1), ("block", 3),
                                           ("block", 16), ("block", 500)])
def test_every_epoch_is_a_permutation(shuffle, block):
    for n in (1, 2, 5, 16, 17, 100, 333):
        for epoch in (0, 1, 9):
            eo = data.EpochOrder(n, data.Order(123, shuffle, block), epoch)
            assert sorted(eo.sample(i) for i in range(n)) == list(range(n))


def test_epochs_and_seeds_give_different_orders():
    n = 1000
    a = [data.sample_at(n, data.Order(1, "full"), i) for i in range(n)]
    b = [data.sample_at(n, data.Order(1, "full"), n + i) for i in range(n)]
    c = [data.sample_at(n, data.Order(2, "full"), i) for i in range(n)]
    assert a != b and a != c and a != list(range(n))


def test_block_shuffle_keeps_blocks_together():
    n, s = 103, 10  # the last block has 3 samples, wherever it lands
    eo = data.EpochOrder(n, data.Order(7, "block", s), 4)
    seq = [eo.sample(i) for i in range(n)]
    blocks, i = [], 0
    while i < n:
        b = seq[i] // s
        size = 3 if b == 10 else s
        assert {x // s for x in seq[i:i + size]} == {b}
        blocks.append(b)
        i += size
    assert sorted(blocks) == list(range(11)) and blocks != list(range(11))


def test_permutation_inverse_and_huge_domain():
    n = 10**15 + 37
    p = data.Permutation(n, 99)
    for i in (0, 1, n // 2, n - 1):
        assert p.inverse(p.forward(i)) == i and 0 <= p.forward(i) < n


def test_bad_orders_name_the_field():
    with pytest.raises(ValueError, match=r"order.shuffle: 'random'"):
        data.Order(0, "random").validate()
    with pytest.raises(ValueError, match=r"order.block_size: 0 must be >= 1"):
        data.Order(0, "block", 0).validate()
    with pytest.raises(ValueError, match=r"order.block_size: 4 is only meaningful"):
        data.Order(0, "full", 4).validate()
    with pytest.raises(ValueError, match=r"num_samples: 0"):
        data.EpochOrder(0, data.Order(), 0)


# ------------------------------------------------------------- the shares


def test_uneven_shares_worked_example():
    # docs/data.md, worked example 1: N 10, B 7, dp 3, cursor 7.
    st = data.DatasetState(data.DatasetDescriptor("ds", 10), data.Order(1, "full"),
                           global_batch=7, cursor=7)
    shares = [st.share(3, r, micro_batch_size=2) for r in range(3)]
    assert [(s.begin, s.end) for s in shares] == [(7, 10), (10, 12), (12, 14)]
    assert [s.count for s in shares] == data.share_counts(7, 3) == [3, 2, 2]
    assert shares[0].micro_batches == ((7, 9), (9, 10))
    assert [s.segments for s in shares] == [(data.Segment(0, 7, 10),), (data.Segment(1, 0, 2),),
                                            (data.Segment(1, 2, 4),)]
    assert sum(s.weight for s in shares) == pytest.approx(1.0)


def test_micro_batches_differ_by_at_most_one():
    for count in range(0, 40):
        for m in range(0, 9):
            mb = data.micro_batches(100, 100 + count, m)
            sizes = [e - b for b, e in mb]
            assert sum(sizes) == count
            if count:
                assert max(sizes) - min(sizes) <= 1 and (m == 0 or max(sizes) <= m)
                assert len(mb) == (1 if m == 0 else -(-count // m))


def test_bad_share_arguments_name_the_field():
    with pytest.raises(ValueError, match=r"dp: 0 must be >= 1"):
        data.share(0, 8, 0, 0)
    with pytest.raises(ValueError, match=r"rank: 3 out of range \[0, 3\)"):
        data.share(0, 8, 3, 3)
    with pytest.raises(ValueError, match=r"global_batch: 0"):
        data.share(0, 0, 1, 0)
    with pytest.raises(ValueError, match=r"cursor: -1"):
        data.share(-1, 8, 1, 0)
    with pytest.raises(ValueError, match=r"micro_batch_size: -2"):
        data.share(0, 8, 1, 0, micro_batch_size=-2)


# ------------------------------------------------------------- the state


def state(**kw):
    base = dict(descriptor=data.DatasetDescriptor("wiki", 1000, "sha1:abc"),
                order=data.Order(2**64 - 1, "block", 64), global_batch=48, cursor=960, step=20)
    base.update(kw)
    return data.DatasetState(**base)


def test_state_round_trips_through_dict_and_proto():
    st = state()
    assert st.epoch == 0 and st.advanced().epoch == 1 and st.advanced(2).step == 22
    assert data.DatasetState.from_dict(st.to_dict()) == st
    msg = st.to_proto()
    assert isinstance(msg, ptc_pb2.DatasetState)
    assert msg.order.shuffle == ptc_pb2.SHUFFLE_BLOCK and msg.order.seed == 2**64 - 1
    assert msg.cursor == 960 and msg.layout_fingerprint == st.layout_fingerprint
    assert data.DatasetState.from_proto(msg) == st
    snake = {"descriptor": {"id": "wiki", "num_samples": 1000, "fingerprint": "sha1:abc"},
             "order": {"seed": 2**64 - 1, "shuffle": "block", "block_size": 64},
             "global_batch": 48, "cursor": 960, "step": 20}
    assert data.DatasetState.from_dict(snake) == st


def test_layout_fingerprint_covers_what_fixes_the_stream():
    fp = state().layout_fingerprint
    assert fp.startswith("sha256:") and len(fp) == 7 + 64
    assert state(cursor=0, step=0).layout_fingerprint == fp  # progress is not in it
    assert state(global_batch=47).layout_fingerprint != fp
    assert state(order=data.Order(1, "block", 64)).layout_fingerprint != fp
    other = data.DatasetDescriptor("wiki", 1001, "sha1:abc")
    assert state(descriptor=other).layout_fingerprint != fp


def test_bad_state_names_the_field():
    with pytest.raises(ValueError, match=r"descriptor.id"):
        state(descriptor=data.DatasetDescriptor("", 10))
    with pytest.raises(ValueError, match=r"global_batch: 0"):
        state(global_batch=0)


# ------------------------------------------------------------ samplers


def test_sampler_yields_the_rank_share_step_after_step():
    st = state(cursor=0, step=0, order=data.Order(5, "full"), global_batch=10)
    s = data.ElasticSampler(st, dp=3, rank=1, steps=3)
    want = []
    for k in range(3):
        b = k * 10 + 4  # counts 4, 3, 3: rank 1 starts at 4
        want += st.samples(b, b + 3)
    assert list(s) == want and len(s) == 9
    bs = data.ElasticBatchSampler(st, dp=3, rank=0, micro_batch_size=3, steps=2)
    batches = list(bs)
    assert [len(b) for b in batches] == [2, 2, 2, 2] and len(bs) == 4
    assert sum(batches[:2], []) == st.samples(0, 4)
    with pytest.raises(TypeError, match="endless"):
        len(data.ElasticSampler(st, 2, 0))


def test_torch_is_imported_only_for_the_torch_samplers():
    code = ("import sys, reshard, reshard.data; assert 'torch' not in sys.modules; "
            "reshard.data.TorchElasticSampler; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_samplers_feed_a_dataloader():
    import torch  # in .venv (requirements/python.txt), a test dependency
    import torch.utils.data as tud
    st = state(cursor=990, step=0, order=data.Order(3, "full"), global_batch=16)
    sampler = data.TorchElasticSampler(st, dp=3, rank=2, steps=2)
    assert isinstance(sampler, tud.Sampler)
    dataset = torch.arange(1000) * 10
    loader = tud.DataLoader(dataset, batch_sampler=data.TorchElasticBatchSampler(
        st, dp=3, rank=2, micro_batch_size=3, steps=2))
    got = torch.cat(list(loader)).tolist()
    assert got == [10 * i for i in sampler] and len(got) == 10

