"""reshard.layout and reshard.buckets on the issue-13 kinds of
docs/partitioning.md (cp, vpp, ep / expert_tp, axis padding, unit granularity
with replication, DP_CHUNK, DP_BUCKET, first-and-last and layer-set
pipelines, regenerable blobs), against values computed by hand from the page."""

import numpy as np
import pytest

import reshard
from reshard import buckets, layout
from reshard.v1 import ptc_pb2


def cfg(tp=1, pp=1, dp=1, cp=0, vpp=0, ep=0, expert_tp=0, order=0, stage_starts=()):
    return ptc_pb2.ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, ep=ep,
                                  expert_tp=expert_tp, order=order, stage_starts=stage_starts)


def spec(name="t", shape=(4,), dtype="DTYPE_INT32", **part):
    return reshard.as_message({"name": name, "dtype": dtype, "shape": list(shape),
                               "partition": part}, ptc_pb2.TensorSpec)


def glob(t):
    return np.arange(int(np.prod(t.shape)), dtype=np.int32).reshape(list(t.shape))


def cut(t, c, rank, ptc=None):
    return layout.local_tensor(t, c, rank, glob(t), ptc)


def test_coordinates_with_context_parallel_both_orders():
    c = cfg(tp=2, cp=2, dp=2, pp=2)
    assert layout.world_size(c) == 16
    assert layout.rank_coords(c, 13) == (1, 0, 1, 1)  # tp, cp, dp, pp
    assert layout.rank_coords(c, 11) == (1, 1, 0, 1)
    assert layout.dp_group(c, 13) == (4, 2)  # G = dp*cp, g = cp_i + cp*dp_i
    assert layout.dp_group(c, 11) == (4, 1)
    c2 = cfg(tp=2, cp=2, dp=2, pp=2, order=ptc_pb2.RANK_ORDER_TP_PP_DP)
    assert layout.rank_coords(c2, 11) == (1, 1, 1, 0)
    for conf in (c, c2):
        seen = set()
        for r in range(16):
            rc = layout.rank_coords(conf, r)
            assert layout.rank_of(conf, rc.tp, rc.dp, rc.pp, rc.cp) == r
            seen.add(rc)
        assert len(seen) == 16
    assert layout.coords(c, 13) == (1, 1, 1)  # (tp, dp, pp), as before
    lay = layout.make_layout(2, 1, 1, ["a", "b"], 2, cp=2)
    assert lay.config.cp == 2 and layout.world_size(lay) == 4
    with pytest.raises(ValueError, match="world of 8"):
        layout.make_layout(2, 1, 2, ["a"], 4, cp=2)


def test_expert_coordinates():
    c = cfg(tp=2, dp=4, ep=4, expert_tp=1)  # 8 ranks a stage, edp = 8 / 4 = 2
    assert layout.expert_coords(c, 5) == (0, 1, 1, 2)  # l = 1 + 2*2 = 5
    c = cfg(tp=2, dp=4, ep=2)  # expert_tp 0 means tp: edp 2
    assert layout.expert_coords(c, 5) == (1, 0, 1, 2)
    assert layout.dims(c).etp == 2
    c = cfg(tp=1, cp=2, dp=2, ep=2, expert_tp=1)  # l counts cp too
    assert [layout.expert_coords(c, r)[:3] for r in range(4)] == \
        [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)]
    with pytest.raises(ValueError, match="not a multiple"):
        layout.expert_coords(cfg(tp=2, dp=2, ep=3, expert_tp=1), 0)


def test_interleaved_stages():
    c = cfg(pp=2, vpp=2)
    assert layout.chunk_starts(c, 8) == [0, 2, 4, 6]
    assert [layout.stage_of_layer(c, 8, n) for n in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [layout.chunk_of_layer(c, 8, n) for n in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    c = cfg(pp=2, vpp=2, stage_starts=[0, 1, 3, 6])
    assert [layout.stage_of_layer(c, 8, n) for n in range(8)] == [0, 1, 1, 0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="expected 4"):
        layout.chunk_starts(cfg(pp=2, vpp=2, stage_starts=[0, 4]), 8)
    # a layer's tensor is on its chunk's stage only
    ptc = reshard.as_message({"numLayers": 8, "tensors": [
        {"name": f"l{n}", "dtype": "DTYPE_INT8", "shape": [2],
         "partition": {"pipeline": {"mode": "PIPELINE_LAYER", "layer": n}}} for n in range(8)]},
        ptc_pb2.Ptc)
    lay = layout.make_layout(1, 2, 1, ["a"], 2, vpp=2)
    g = {f"l{n}": np.full(2, n, np.int8) for n in range(8)}
    assert sorted(layout.shard(ptc, lay, 0, g)) == ["l0", "l1", "l4", "l5"]
    assert sorted(layout.shard(ptc, lay, 1, g)) == ["l2", "l3", "l6", "l7"]


def test_first_and_last_and_layer_set_pipelines_and_their_chunks():
    P = ptc_pb2.Pipeline
    fl = P(mode=ptc_pb2.PIPELINE_FIRST_AND_LAST_STAGE)
    assert layout.stages_holding(cfg(pp=3), 6, fl) == [0, 2]
    assert layout.stages_holding(cfg(pp=1), 6, fl) == [0]
    c = cfg(pp=3, vpp=2)  # 6 chunks, last chunk 5 on stage 2
    assert layout.chunk_holding(c, 6, fl, 0) == 0 and layout.chunk_holding(c, 6, fl, 2) == 5
    every = P(mode=ptc_pb2.PIPELINE_EVERY_STAGE)
    assert [layout.chunk_holding(c, 6, every, s) for s in range(3)] == [0, 1, 5]
    assert layout.chunk_holding(c, 6, P(mode=ptc_pb2.PIPELINE_LAST_STAGE), 2) == 5
    c = cfg(pp=2, vpp=2)  # 8 layers: chunks [0,2) [2,4) [4,6) [6,8)
    t5 = P(mode=ptc_pb2.PIPELINE_LAYERS, layers=[0, 5])  # both on stage 0 (chunks 0, 2)
    assert layout.stages_holding(c, 8, t5) == [0]
    assert layout.chunk_holding(c, 8, t5, 0) == 0
    t5 = P(mode=ptc_pb2.PIPELINE_LAYERS, layers=[6, 3])  # chunks 3 and 1, both stage 1
    assert layout.stages_holding(c, 8, t5) == [1] and layout.chunk_holding(c, 8, t5, 1) == 1
    t5 = P(mode=ptc_pb2.PIPELINE_LAYERS, layers=[0, 4])
    assert layout.stages_holding(cfg(pp=2), 8, t5) == [0, 1]
    with pytest.raises(ValueError, match="does not hold"):
        layout.chunk_holding(c, 8, P(mode=ptc_pb2.PIPELINE_FIRST_STAGE), 1)


def test_vocabulary_padding_depends_on_tp():
    t = spec(shape=[50257, 2], tp={"mode": "TP_SPLIT", "axis": 0},
             padding={"axis": 0, "multiple": 128, "timesTp": True})
    assert [layout.held_shape(t, cfg(tp=k))[0] for k in (1, 2, 4, 8)] == \
        [50304, 50432, 50688, 51200]
    t = spec(shape=[10, 1], tp={"mode": "TP_SPLIT", "axis": 0},
             padding={"axis": 0, "multiple": 4, "timesTp": True})
    # tp 2: held 16 rows, 8 a rank; rank 1 holds rows 8, 9 and six padding rows
    assert cut(t, cfg(tp=2), 1).ravel().tolist() == [8, 9, 0, 0, 0, 0, 0, 0]
    assert cut(t, cfg(tp=2), 0).ravel().tolist() == list(range(8))
    # tp 3: held 12 rows, 4 a rank
    assert cut(t, cfg(tp=3), 2).ravel().tolist() == [8, 9, 0, 0]
    fixed = spec(shape=[10, 1], padding={"axis": 0, "multiple": 4})  # not times tp
    assert layout.held_shape(fixed, cfg(tp=3)) == [12, 1]
    # DP_FLAT of a padded tensor: the padding rows are zero in the flat range
    t = spec(shape=[10, 1], tp={"mode": "TP_SPLIT", "axis": 0}, dp={"mode": "DP_FLAT"},
             padding={"axis": 0, "multiple": 4, "timesTp": True})
    assert cut(t, cfg(tp=2, dp=3), layout.rank_of(cfg(tp=2, dp=3), 1, 1, 0)).tolist() == \
        [0, 0, 0]  # T = [8, 9, 0 x 6], chunk 3: g 1 holds T[3:6]


def test_units_and_replication():
    # blocks [q 8 rows, k 2, v 2], unit 2 rows (a head): 4 q heads, 1 kv head
    t = spec(shape=[12, 1], tp={"mode": "TP_SPLIT", "axis": 0, "blocks": [8, 2, 2],
                                "granularity": 2})
    assert cut(t, cfg(tp=2), 0).ravel().tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert cut(t, cfg(tp=2), 1).ravel().tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert cut(t, cfg(tp=4), 3).ravel().tolist() == [6, 7, 8, 9, 10, 11]
    # Megatron's interleaved-by-group QKV: 2 groups of (2 q + k + v) = 4 rows
    m = spec(shape=[8, 1], tp={"mode": "TP_SPLIT", "axis": 0, "granularity": 4})
    assert cut(m, cfg(tp=2), 1).ravel().tolist() == [4, 5, 6, 7]
    assert [cut(m, cfg(tp=4), i).ravel().tolist() for i in range(4)] == \
        [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2  # groups replicated over 2 ranks each
    # 5 units of 2 over 2 ranks: 3 and 2 units, never half a unit
    u = spec(shape=[10, 1], tp={"mode": "TP_SPLIT", "axis": 0, "granularity": 2})
    assert cut(u, cfg(tp=2), 0).ravel().tolist() == list(range(6))
    # granularity 0 (unset): element-wise as before units, never replicated
    e = spec(shape=[3, 1], tp={"mode": "TP_SPLIT", "axis": 0}, allowEmpty=True)
    assert [cut(e, cfg(tp=4), i).ravel().tolist() for i in range(4)] == [[0], [1], [2], []]
    one = spec(shape=[2, 1], tp={"mode": "TP_SPLIT", "axis": 0, "granularity": 1})
    assert [cut(one, cfg(tp=4), i).ravel().tolist() for i in range(4)] == [[0], [0], [1], [1]]
    with pytest.raises(ValueError, match="cannot be replicated"):
        cut(m, cfg(tp=3), 0)
    with pytest.raises(ValueError, match="not a multiple of granularity"):
        cut(spec(shape=[9, 1], tp={"mode": "TP_SPLIT", "axis": 0, "granularity": 2}),
            cfg(tp=2), 0)


def test_expert_slabs_with_expert_tp_and_expert_dp():
    # 4 experts x 6 x 2; experts on axis 0, expert tp on axis 1, dp over edp
    t = spec(shape=[4, 6, 2], expert={"axis": 0}, tp={"mode": "TP_SPLIT", "axis": 1},
             dp={"mode": "DP_SPLIT", "axis": 1})
    g = glob(t)
    c = cfg(tp=2, dp=2, ep=2, expert_tp=1)  # stage of 4: etp 0, ep r%2, edp r//2
    assert layout.local_tensor(t, c, 1, g).tolist() == g[2:4, 0:3].tolist()
    assert layout.local_tensor(t, c, 2, g).tolist() == g[0:2, 3:6].tolist()
    c = cfg(tp=2, dp=2, ep=2)  # expert_tp 2: edp 1
    assert layout.local_tensor(t, c, 3, g).tolist() == g[2:4, 3:6].tolist()  # etp 1, ep 1
    # uneven experts: 4 over ep 3 is 2, 1, 1; dense tp rule ignored for experts
    c = cfg(tp=3, ep=3, expert_tp=1)
    assert layout.local_shape_of(t, c, 0) == [2, 6, 2]
    assert layout.local_tensor(t, c, 2, g).tolist() == g[3:4].tolist()


def test_dp_chunk_is_torch_chunk():
    t = spec(shape=[5, 2], dp={"mode": "DP_CHUNK", "axis": 0}, allowEmpty=True)
    rows = [cut(t, cfg(dp=4), r)[:, 0].tolist() for r in range(4)]
    assert rows == [[0, 2], [4, 6], [8], []]  # ceil(5/4) = 2 rows each, the last empty
    split = spec(shape=[5, 2], dp={"mode": "DP_SPLIT", "axis": 0})
    assert [cut(split, cfg(dp=4), r).shape[0] for r in range(4)] == [2, 1, 1, 1]
    torch = pytest.importorskip("torch")
    for n in range(1, 12):
        for k in range(1, 6):
            t = spec(shape=[n], dp={"mode": "DP_CHUNK"}, allowEmpty=True)
            want = list(torch.arange(n).chunk(k)) + [torch.arange(0)] * k
            for r in range(k):
                assert cut(t, cfg(dp=k), r).tolist() == want[r].tolist()


def test_data_parallel_over_dp_times_cp():
    t = spec(shape=[8], dp={"mode": "DP_FLAT"})
    c = cfg(cp=2, dp=2)  # G 4: rank r = cp_i + 2 dp_i, g = r
    assert [cut(t, c, r).tolist() for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    rep = spec(shape=[3])
    assert cut(rep, c, 3).tolist() == [0, 1, 2]  # replicated over cp


def bucket_ptc(reverse=False, tp_a=False):
    """Members a(5) b(3) c(7) d(2) of one group: align 4, buckets of >= 10,
    pad to lcm(G, 3)."""
    part = lambda n, **kw: {"name": n, "dtype": "DTYPE_INT32", "shape": [  # noqa: E731
        {"a": 5, "b": 3, "c": 7, "d": 2}[n]], "partition": dict(
        {"pipeline": {"mode": "PIPELINE_LAYER"}, "dp": {"mode": "DP_BUCKET", "bucket": "g"}},
        **kw)}
    tensors = [part("a", **({"tp": {"mode": "TP_SPLIT"}} if tp_a else {})),
               part("b"), part("c"), part("d")]
    return reshard.as_message({"numLayers": 1, "tensors": tensors, "buckets": [
        {"name": "g", "reverseOrder": reverse, "paramAlign": 4, "bucketElements": 10,
         "padMultiple": 3}]}, ptc_pb2.Ptc)


def test_bucket_layout_by_hand():
    ptc = bucket_ptc()
    c = cfg(dp=2)
    buf = buckets.chunk_buffer(ptc, c, 0, "g")
    assert buf.members == [("a", 0, 5), ("b", 8, 3), ("c", 12, 7), ("d", 20, 2)]
    assert [(b.start, b.size, b.members) for b in buf.buckets] == \
        [(0, 12, ["a", "b"]), (12, 12, ["c", "d"])]
    assert buf.size == 24 and buf.group_size == 2
    ranges = {r: {n: buckets.member_range(ptc, c, r, n) for n in "abcd"} for r in range(2)}
    assert ranges[0] == {"a": (0, 5), "b": (0, 0), "c": (0, 6), "d": (0, 0)}
    assert ranges[1] == {"a": (5, 5), "b": (0, 3), "c": (6, 7), "d": (0, 2)}
    g = {n: np.arange(10 * i, 10 * i + {"a": 5, "b": 3, "c": 7, "d": 2}[n], dtype=np.int32)
         for i, n in enumerate("abcd")}
    got = layout.shard(ptc, layout.make_layout(1, 1, 2, ["h"], 2), 1, g)
    assert {k: v.tolist() for k, v in got.items()} == {"b": [10, 11, 12], "c": [26], "d": [30, 31]}
    # reversed: d(0) c(4) | b(12) a(16); the last bucket 9 elements padded to 12
    rev = buckets.chunk_buffer(bucket_ptc(reverse=True), c, 0, "g")
    assert rev.members == [("d", 0, 2), ("c", 4, 7), ("b", 12, 3), ("a", 16, 5)]
    assert [(b.start, b.size) for b in rev.buckets] == [(0, 12), (12, 12)]
    # a tp-split member: its size (and everything after it) depends on tp_i
    ptc = bucket_ptc(tp_a=True)
    c = cfg(tp=2, dp=2)
    assert buckets.chunk_buffer(ptc, c, 0, "g").members[1] == ("b", 4, 3)  # a has 3 elements
    assert buckets.chunk_buffer(ptc, c, 1, "g").members[1] == ("b", 4, 3)  # a has 2 elements
    assert buckets.chunk_buffer(ptc, c, 1, "g").members[0] == ("a", 0, 2)


def test_bucket_shard_and_full_buffers_round_trip():
    ptc = bucket_ptc()
    c = cfg(dp=2)
    full = np.arange(100, 124, dtype=np.int32)  # a full chunk buffer
    for r in range(2):
        buf = buckets.chunk_buffer(ptc, c, r, "g")
        items = buckets.items_from_full(buf, full)
        start = r * 6
        shard = np.concatenate([full[start:start + 6], full[12 + start:18 + start]])
        assert {k: v.tolist() for k, v in buckets.items_from_shard(buf, shard).items()} == \
            {k: v.tolist() for k, v in items.items()}
        back = buckets.shard_from_items(buf, items, np.int32)
        # gaps (a..b alignment 5-7, bucket padding 11, 19, 22-23) come back zero
        keep = np.zeros(24, bool)
        for m in buf.members:
            keep[m.start:m.start + m.numel] = True
        want = np.where(keep, full, 0)
        assert back.tolist() == np.concatenate([want[start:start + 6],
                                                want[12 + start:18 + start]]).tolist()
    assert buckets.member_view(buf, full, "c", (7,)).tolist() == list(range(112, 119))
    with pytest.raises(ValueError, match="shard buffer of 5"):
        buckets.items_from_shard(buf, np.zeros(5, np.int32))


def test_buckets_per_chunk_and_tied_members():
    """vpp 2, pp 2, 4 layers: one buffer per chunk; a first-and-last member
    joins chunk 0 on stage 0 and the last chunk on stage 1."""
    t = lambda n, pipe: {"name": n, "dtype": "DTYPE_INT8", "shape": [3],  # noqa: E731
                         "partition": {"pipeline": pipe,
                                       "dp": {"mode": "DP_BUCKET", "bucket": "g"}}}
    ptc = reshard.as_message({"numLayers": 4, "tensors": [
        t("emb", {"mode": "PIPELINE_FIRST_AND_LAST_STAGE"})] + [
        t(f"l{n}", {"mode": "PIPELINE_LAYER", "layer": n}) for n in range(4)],
        "buckets": [{"name": "g"}]}, ptc_pb2.Ptc)
    c = cfg(pp=2, vpp=2)  # chunks: l0 (stage 0), l1 (1), l2 (0), l3 (1)
    s0 = {b.chunk: [m.name for m in b.members] for b in buckets.rank_buffers(ptc, c, 0)}
    s1 = {b.chunk: [m.name for m in b.members] for b in buckets.rank_buffers(ptc, c, 1)}
    assert s0 == {0: ["emb", "l0"], 2: ["l2"]}
    assert s1 == {1: ["l1"], 3: ["emb", "l3"]}


def test_regenerated_blobs_are_zero():
    ptc = reshard.as_message({"numLayers": 1, "blobs": [
        {"name": "rng", "sizeBytes": 2, "scope": "BLOB_PER_RANK", "regenerable": True}]},
        ptc_pb2.Ptc)
    g = {"rng": [b"\x01\x01", b"\x02\x02"]}
    new = layout.make_layout(1, 1, 3, ["a"], 3)
    after = layout.after_reshard(ptc, new, g, regenerate=[(1, "rng")])
    assert after["rng"] == [b"\x01\x01", b"\x00\x00", b"\x01\x01"]
