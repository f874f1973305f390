"""reshard.layout on HSDP (ParallelConfig.dp_shard) and dp-only splits
(DataParallel.over = DP_OVER_DP), against docs/partitioning.md ("Data-parallel
groups"): the page's golden example (the C++ planner's HsdpGoldenExample
checks the same numbers; test_reshard_compare.py's HSDP cases compare both
readings byte for byte on a real cluster), and the rules checked for every
rank of small layouts."""

import itertools

import numpy as np
import pytest

import reshard
from reshard import buckets, layout
from reshard.v1 import ptc_pb2


def cfg(tp=1, pp=1, dp=1, cp=0, dp_shard=0, order=0):
    return ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, dp_shard=dp_shard, order=order)


def spec(name="t", shape=(8, 3), **part):
    return reshard.as_message({"name": name, "dtype": "DTYPE_INT32", "shape": list(shape),
                               "partition": part}, ptc_pb2.TensorSpec)


def glob(t):
    return np.arange(int(np.prod(t.shape)), dtype=np.int32).reshape(list(t.shape))


def rows(t, c, rank):
    """The global rows [begin, end) of a DP_CHUNK-on-axis-0 shard."""
    local = layout.local_tensor(t, c, rank, glob(t))
    first = local.reshape(local.shape[0], -1)[:, 0] // int(np.prod(t.shape[1:]))
    return (int(first[0]), int(first[-1]) + 1) if len(first) else None


def test_hsdp_golden_example():
    # docs/partitioning.md: tp 1, cp 2, dp 4, dp_shard 2, [8, 3], DP_CHUNK axis 0.
    c = cfg(cp=2, dp=4, dp_shard=2)
    dpcp = spec(dp={"mode": "DP_CHUNK", "axis": 0})
    dp = spec(dp={"mode": "DP_CHUNK", "axis": 0, "over": "DP_OVER_DP"})
    assert layout.shard_group(c, 5) == (4, 1)
    assert layout.shard_group(c, 5, ptc_pb2.DP_OVER_DP) == (2, 0)
    assert [rows(dpcp, c, r) for r in range(8)] == \
        [(0, 2), (2, 4), (4, 6), (6, 8), (0, 2), (2, 4), (4, 6), (6, 8)]
    assert [rows(dp, c, r) for r in range(8)] == \
        [(0, 4), (0, 4), (4, 8), (4, 8), (0, 4), (0, 4), (4, 8), (4, 8)]
    fsdp = cfg(cp=2, dp=4)
    assert [rows(dpcp, fsdp, r) for r in range(8)] == [(k, k + 1) for k in range(8)]
    assert [rows(dpcp, cfg(cp=2, dp=4, dp_shard=4), r) for r in range(8)] == \
        [(k, k + 1) for k in range(8)]


@pytest.mark.parametrize("tp,cp,dp,order", [(1, 1, 4, 0), (2, 2, 4, 0), (1, 2, 6, 1),
                                             (2, 1, 6, 1), (1, 3, 2, 0)])
def test_every_rank_follows_the_table(tp, cp, dp, order):
    """For every dp_shard and both `over`s: S and s from the page's table,
    replicas (equal tp_i and s) hold identical buffers, and one replica's
    shards of a DP_FLAT tensor tile its tp piece."""
    for ds in [0] + [d for d in range(1, dp + 1) if dp % d == 0]:
        c = cfg(tp=tp, cp=cp, dp=dp, dp_shard=ds, order=order, pp=2)
        eff = ds or dp
        for over in (ptc_pb2.DP_OVER_DP_CP, ptc_pb2.DP_OVER_DP):
            t = spec(shape=(7, 5), tp={"mode": "TP_SPLIT", "axis": 1},
                     dp={"mode": "DP_FLAT", "over": over})
            seen = {}
            for r in range(layout.world_size(c)):
                rc = layout.rank_coords(c, r)
                size, s = layout.shard_group(c, r, over)
                if over == ptc_pb2.DP_OVER_DP:
                    assert (size, s) == (eff, rc.dp % eff)
                else:
                    assert (size, s) == (eff * cp, rc.cp + cp * (rc.dp % eff))
                buf = layout.local_tensor(t, c, r, glob(t))
                key = (rc.tp, s)
                if key in seen:
                    assert buf.tolist() == seen[key].tolist(), (ds, over, r)
                seen[key] = buf
            for tp_i in range(tp):
                piece = layout.tp_local(t, tp, tp_i, glob(t)).reshape(-1)
                size = layout.shard_group(c, 0, over)[0]
                got = np.concatenate([seen[(tp_i, s)].reshape(-1) for s in range(size)])[:piece.size]
                assert got.tolist() == piece.tolist()


def test_dp_only_chunks_are_torch_chunk_over_the_shard_group():
    torch = pytest.importorskip("torch")
    for n, dp, ds, cp in itertools.product((1, 5, 8), (2, 4), (1, 2), (1, 2)):
        if dp % ds:
            continue
        c = cfg(cp=cp, dp=dp, dp_shard=ds)
        t = spec(shape=[n], dp={"mode": "DP_CHUNK", "over": "DP_OVER_DP"}, allowEmpty=True)
        want = list(torch.arange(n).chunk(ds)) + [torch.arange(0)] * ds
        for r in range(layout.world_size(c)):
            dp_i = layout.rank_coords(c, r).dp
            assert layout.local_tensor(t, c, r, glob(t)).tolist() == \
                want[dp_i % ds].tolist()


def test_buckets_shard_over_the_hsdp_group():
    # One member of 5 elements, pad to lcm(S, 1): S = dp_shard x cp = 2.
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        {"name": "a", "dtype": "DTYPE_INT32", "shape": [5], "partition": {
            "pipeline": {"mode": "PIPELINE_EVERY_STAGE"},
            "dp": {"mode": "DP_BUCKET", "bucket": "g"}}}],
        "buckets": [{"name": "g"}]}, ptc_pb2.Ptc)
    c = cfg(dp=4, dp_shard=2)
    got = [layout.local_tensor(ptc.tensors[0], c, r, np.arange(5, dtype=np.int32), ptc).tolist()
           for r in range(4)]
    assert got == [[0, 1, 2], [3, 4], [0, 1, 2], [3, 4]]  # padded to 6, 3 per shard
    assert buckets.member_range(ptc, c, 1, "a") == (3, 5)


def test_bad_sizes_are_value_errors():
    with pytest.raises(ValueError, match="dp_shard 3 does not divide dp 4"):
        layout.make_layout(1, 1, 4, ["a"], 4, dp_shard=3)
    with pytest.raises(ValueError, match="dp_shard 8 does not divide dp 4"):
        layout.shard_group(cfg(dp=4, dp_shard=8), 0)
    with pytest.raises(ValueError, match="partition.dp.over 7"):
        layout.shard_group(cfg(dp=4), 0, 7)
    lay = layout.make_layout(1, 1, 4, ["a", "b"], 2, dp_shard=2)
    assert lay.config.dp_shard == 2
    assert not layout.make_layout(1, 1, 4, ["a"], 4).config.dp_shard
