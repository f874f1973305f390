"""Unit tests of reshard.layout, the reference of docs/partitioning.md: every
partition kind against hand-computed expectations (no cluster needed)."""

import numpy as np
import pytest

from helpers import every_kind_ptc, random_globals, tensor
import reshard
from reshard import layout
from reshard.v1 import ptc_pb2


def spec(**kw):
    return reshard.as_message(tensor("t", kw.pop("dtype", "DTYPE_INT32"), kw.pop("shape"), **kw),
                              ptc_pb2.TensorSpec)


def cfg(tp=1, pp=1, dp=1, order=0, stage_starts=()):
    return ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp, order=order, stage_starts=stage_starts)


def cut(t, c, tp_i, dp_i):
    g = np.arange(int(np.prod(t.shape)), dtype=np.int32).reshape(t.shape)
    return layout.shard_tensor(t, c, tp_i, dp_i, g)


def test_split_is_array_split():
    for n in range(0, 12):
        for k in range(1, 6):
            parts = np.array_split(np.arange(n), k)
            for i in range(k):
                start, size = layout.split(n, k, i)
                assert size == len(parts[i])
                if size:
                    assert start == parts[i][0]
    assert [layout.split(10, 3, i) for i in range(3)] == [(0, 4), (4, 3), (7, 3)]
    assert [layout.split(2, 4, i) for i in range(4)] == [(0, 1), (1, 1), (2, 0), (2, 0)]


def test_rank_coords_both_orders():
    c = cfg(2, 2, 2)
    assert layout.coords(c, 5) == (1, 0, 1)
    c2 = cfg(2, 2, 2, order=ptc_pb2.RANK_ORDER_TP_PP_DP)
    assert layout.coords(c2, 5) == (1, 1, 0)
    for conf in (cfg(2, 3, 4), cfg(3, 2, 2, order=ptc_pb2.RANK_ORDER_TP_PP_DP)):
        seen = set()
        for r in range(24 if conf.tp == 2 else 12):
            tp_i, dp_i, pp_i = layout.coords(conf, r)
            assert layout.rank_of(conf, tp_i, dp_i, pp_i) == r
            seen.add((tp_i, dp_i, pp_i))
        assert len(seen) == layout.world_size(conf)
    with pytest.raises(ValueError):
        layout.coords(c, 8)


def test_stages_even_and_explicit():
    assert layout.stage_starts(cfg(pp=3), 10) == [0, 4, 7]
    assert [layout.stage_of_layer(cfg(pp=3), 10, n) for n in (0, 3, 4, 6, 7, 9)] == \
        [0, 0, 1, 1, 2, 2]
    c = cfg(pp=3, stage_starts=[0, 1, 5])
    assert [layout.stage_of_layer(c, 10, n) for n in range(10)] == [0] + [1] * 4 + [2] * 5
    mk = lambda mode, layer=0: ptc_pb2.Pipeline(mode=mode, layer=layer)  # noqa: E731
    assert layout.stages_holding(c, 10, mk(ptc_pb2.PIPELINE_LAYER, 4)) == [1]
    assert layout.stages_holding(c, 10, mk(ptc_pb2.PIPELINE_FIRST_STAGE)) == [0]
    assert layout.stages_holding(c, 10, mk(ptc_pb2.PIPELINE_LAST_STAGE)) == [2]
    assert layout.stages_holding(c, 10, mk(ptc_pb2.PIPELINE_EVERY_STAGE)) == [0, 1, 2]


def test_tp_replicated_is_whole_tensor():
    t = spec(shape=[3, 4])
    for tp_i in range(2):
        assert cut(t, cfg(tp=2), tp_i, 0).tolist() == np.arange(12).reshape(3, 4).tolist()


def test_tp_split_uneven_rows_and_columns():
    t = spec(shape=[5, 2], tp=True)
    assert cut(t, cfg(tp=2), 0, 0).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert cut(t, cfg(tp=2), 1, 0).tolist() == [[6, 7], [8, 9]]
    t = spec(shape=[2, 5], tp=True, axis=1)
    assert cut(t, cfg(tp=2), 1, 0).tolist() == [[3, 4], [8, 9]]
    assert layout.local_shape(t, cfg(tp=2), 0, 0) == [2, 3]


def test_tp_split_sub_blocks_fused_qkv_and_glu():
    qkv = spec(shape=[8, 1], tp=True, blocks=[4, 2, 2])  # q 4 rows, k 2, v 2
    assert cut(qkv, cfg(tp=2), 0, 0).ravel().tolist() == [0, 1, 4, 6]
    assert cut(qkv, cfg(tp=2), 1, 0).ravel().tolist() == [2, 3, 5, 7]
    glu = spec(shape=[6, 1], tp=True, blocks=[3, 3])  # gate, up: uneven halves
    assert cut(glu, cfg(tp=2), 0, 0).ravel().tolist() == [0, 1, 3, 4]
    assert cut(glu, cfg(tp=2), 1, 0).ravel().tolist() == [2, 5]
    assert layout.local_shape(glu, cfg(tp=2), 1, 0) == [2, 1]


def test_dp_split_slab_of_tp_piece():
    t = spec(shape=[4, 6], dp="DP_SPLIT", dp_axis=1)
    c = cfg(dp=4)
    assert cut(t, c, 0, 2).tolist() == [[4], [10], [16], [22]]
    assert cut(t, c, 0, 0).shape == (4, 2)
    # tp split on axis 0, then the dp slab along axis 1 of the tp piece
    t = spec(shape=[4, 6], tp=True, dp="DP_SPLIT", dp_axis=1)
    assert cut(t, cfg(tp=2, dp=2), 1, 1).tolist() == [[15, 16, 17], [21, 22, 23]]


def test_dp_flat_chunks_with_zero_padding():
    t = spec(shape=[2, 5], dp="DP_FLAT")
    c = cfg(dp=3)  # N 10, chunk 4
    assert cut(t, c, 0, 0).tolist() == [0, 1, 2, 3]
    assert cut(t, c, 0, 1).tolist() == [4, 5, 6, 7]
    assert cut(t, c, 0, 2).tolist() == [8, 9, 0, 0]
    assert layout.local_shape(t, c, 0, 2) == [4]
    # dp 1: the buffer is T itself, with T's shape (as the agent reports it)
    assert cut(t, cfg(dp=1), 0, 0).tolist() == np.arange(10).reshape(2, 5).tolist()
    # flat range of the tp piece: tp0 holds global rows 0-1 = elements 0..5
    t = spec(shape=[4, 3], tp=True, dp="DP_FLAT", allow_empty=True)
    c = cfg(tp=2, dp=4)  # T has 6 elements, chunk 2
    assert cut(t, c, 0, 2).tolist() == [4, 5]
    assert cut(t, c, 1, 0).tolist() == [6, 7]
    assert cut(t, c, 0, 3).tolist() == [0, 0]  # all padding


def test_shard_pipeline_ownership_and_blobs():
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 2, 2, ["a", "b", "c", "d"], 2)  # stages: layers 0-2, 3-4
    g = random_globals(ptc, world=3)
    first = layout.shard(ptc, lay, 0, g)  # tp 0, dp 0, pp 0
    last = layout.shard(ptc, lay, 7, g)   # tp 1, dp 1, pp 1
    assert "emb.word" in first and "emb.word" not in last
    assert "head" in last and "head" not in first
    assert "shared.tied" in first and "shared.tied" in last
    assert "layers.2.qkv" in first and "layers.3.qkv" not in first
    assert "layers.3.qkv" in last and "layers.2.qkv" not in last
    assert layout.holds(ptc, lay, 7, "layers.4.norm") and not layout.holds(ptc, lay, 0, "head")
    # replicated blob: the same bytes everywhere; per-rank: value r mod old world (3)
    assert first["step"] == last["step"] == g["step"]
    assert first["rng_state"] == g["rng_state"][0]
    assert last["rng_state"] == g["rng_state"][7 % 3]
    # every held tensor has the shape local_shape() gives
    for rank in range(8):
        tp_i, dp_i, _ = layout.coords(lay.config, rank)
        got = layout.shard(ptc, lay, rank, g)
        for t in ptc.tensors:
            if t.name in got:
                assert list(got[t.name].shape) == layout.local_shape(t, lay.config, tp_i, dp_i)


def test_dp_replicas_hold_identical_bytes():
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 1, 2, ["a", "b"], 2)
    g = random_globals(ptc, world=4)
    r0, r2 = layout.shard(ptc, lay, 0, g), layout.shard(ptc, lay, 2, g)  # tp 0, dp 0 / dp 1
    assert layout.same_bytes(r0["layers.0.qkv"], r2["layers.0.qkv"])  # DP_REPLICATED
    assert not layout.same_bytes(r0["layers.0.opt.flat"], r2["layers.0.opt.flat"])  # DP_FLAT


def test_shard_checks_global_arrays():
    ptc = every_kind_ptc()
    lay = layout.make_layout(1, 1, 1, ["a"], 1)
    g = random_globals(ptc, world=1)
    bad = dict(g, **{"emb.pos": np.zeros((7, 11), np.float32)})
    with pytest.raises(ValueError, match=r'"emb.pos".*shape \[7, 11\]'):
        layout.shard(ptc, lay, 0, bad)
    bad = dict(g, **{"emb.pos": np.zeros((7, 12), np.float64)})
    with pytest.raises(ValueError, match=r'"emb.pos".*8-byte'):
        layout.shard(ptc, lay, 0, bad)
    bad = dict(g)
    del bad["layers.1.fc2"]
    with pytest.raises(KeyError, match="layers.1.fc2"):
        layout.shard(ptc, lay, 0, bad)
    with pytest.raises(ValueError, match="per rank"):
        layout.shard(ptc, lay, 0, dict(g, rng_state=b"x" * 40))


def test_torch_global_tensors_match_numpy():
    torch = pytest.importorskip("torch")
    t = spec(shape=[4, 6], tp=True, dtype="DTYPE_BFLOAT16", dp="DP_FLAT")
    g = torch.randn(4, 6).to(torch.bfloat16)
    a = layout.shard_tensor(t, cfg(tp=2, dp=3), 1, 2, g)
    b = layout.shard_tensor(t, cfg(tp=2, dp=3), 1, 2, g.view(torch.int16).numpy().view(np.uint16))
    assert a.dtype == np.uint16 and layout.same_bytes(a, b)


def test_make_layout_placements():
    lay = layout.make_layout(2, 1, 2, ["h0", "h1"], 2)
    assert layout.slots(lay) == [("h0", 0), ("h0", 1), ("h1", 0), ("h1", 1)]
    assert layout.ranks_on_host(lay, "h1") == [(2, 0), (3, 1)]
    assert layout.hosts_of(lay) == ["h0", "h1"]
    lay = layout.make_layout(1, 1, 3, ranks=[("x", 1), ("y", 0), ("x", 0)], order="tp_pp_dp")
    assert lay.config.order == ptc_pb2.RANK_ORDER_TP_PP_DP
    assert layout.ranks_on_host(lay, "x") == [(0, 1), (2, 0)]
    with pytest.raises(ValueError, match="world of 8"):
        layout.make_layout(2, 2, 2, ["a", "b", "c"], 2)
    with pytest.raises(ValueError, match="3 rank slots"):
        layout.make_layout(2, 1, 2, ranks=[("a", 0)] * 3)
    # dict form in, message out
    d = {"config": {"tp": 2, "pp": 1, "dp": 1}, "placement": {"hosts": ["a"], "devicesPerHost": 2}}
    assert layout.world_size(d) == 2 and layout.slots(d) == [("a", 0), ("a", 1)]
