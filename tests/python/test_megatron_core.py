"""reshard.megatron.gpt_ptc / t5_ptc: the PTC of a Megatron-core model as
Megatron holds it. The distributed optimizer's per-rank shard of every
parameter is checked against a transcription of Megatron-LM's own layout
code (megatron/core/optimizer/distrib_optimizer.py
`_compute_per_buffer_param_layout`, param_layout.py `pad_param_start`,
`pad_bucket_end`), which shares nothing with reshard.buckets."""

import math

import numpy as np
import pytest

from reshard import buckets, layout, megatron
from reshard.v1 import ptc_pb2


def part(ptc, name):
    return next(t.partition for t in ptc.tensors if t.name == name)


def megatron_param_layout(params, bucket_size, dp_size):
    """Megatron's layout of one buffer: params [(name, numel, shared_embedding)]
    in module order -> ({name: (start, end, bucket)}, [(bucket start, end)])."""
    def pad_param_start(i):
        return math.ceil(i / 64) * 64

    def pad_bucket_end(i):
        q = math.lcm(dp_size, 128)
        return math.ceil(i / q) * q

    index, bucket_indices = {}, []
    param_start = bucket_start = 0
    bucket_params = []
    param_end = 0

    def finalize(end, start):
        bucket_end = pad_bucket_end(end)
        bucket_indices.append((start, bucket_end))
        return bucket_end

    for name, numel, shared in params[::-1]:
        param_start = pad_param_start(param_start)
        if shared and bucket_params:
            bucket_start = finalize(param_start, bucket_start)
            bucket_params = []
            param_start = bucket_start
        param_end = param_start + numel
        index[name] = (param_start, param_end, len(bucket_indices))
        bucket_params.append(name)
        if (bucket_size is not None and param_end - bucket_start >= bucket_size) or shared:
            bucket_start = finalize(param_end, bucket_start)
            bucket_params = []
            param_start = bucket_start
        else:
            param_start = param_end
    if bucket_params:
        finalize(param_end, bucket_start)
    return index, bucket_indices


def megatron_shard_ranges(params, bucket_size, dp_size, dp_rank):
    """{name: (lo, hi)} of each param's elements in dp_rank's optimizer shard
    (distrib_optimizer `_build_model_gbuf_param_range_map`)."""
    index, bucket_indices = megatron_param_layout(params, bucket_size, dp_size)
    out = {}
    for name, (start, end, b) in index.items():
        bs, be = bucket_indices[b]
        shard = (be - bs) // dp_size
        lo, hi = max(start, bs + dp_rank * shard), min(end, bs + (dp_rank + 1) * shard)
        out[name] = (lo - start, hi - start) if hi > lo else None
    return out


def check_against_megatron(m, ptc, lay, expert):
    """For every rank and every model chunk it holds: reshard's DP_BUCKET
    range of each fp32 main param equals Megatron's shard range."""
    c = lay.config
    weights = [t for t in ptc.tensors if not t.name.startswith("optimizer.")]
    checked = 0
    for rank in range(layout.world_size(c)):
        stage = layout.rank_coords(c, rank).pp
        chunks = {}
        for t in weights:
            if t.partition.HasField("expert") != expert:
                continue
            if stage not in layout.stages_holding(c, ptc.num_layers, t.partition.pipeline):
                continue
            chunk = layout.chunk_holding(c, ptc.num_layers, t.partition.pipeline, stage)
            pc = layout.piece(t, c, rank)
            shared = (m.tied_embeddings and m.pp > 1
                      and t.name == "embedding.word_embeddings.weight")
            chunks.setdefault(chunk, []).append((t.name, int(np.prod(pc.shape)), shared))
            size, index = pc.group, pc.index
        for chunk, params in chunks.items():
            want = megatron_shard_ranges(params, m.bucket_size, size, index)
            for name, _, _ in params:
                lo, hi = buckets.member_range(ptc, c, rank, "optimizer.master." + name)
                assert (None if hi == lo else (lo, hi)) == want[name], (rank, chunk, name)
                checked += 1
    return checked


def test_vocab_padding_embeddings_and_tied_stages():
    m = megatron.GptModel(2, 16, 2, 50257, pp=2, distributed_optimizer=False)
    ptc = megatron.gpt_ptc(m)
    word = next(t for t in ptc.tensors if t.name == "embedding.word_embeddings.weight")
    assert list(word.shape) == [50257, 16]
    assert (word.partition.padding.multiple, word.partition.padding.times_tp) == (128, True)
    assert [layout.held_shape(word, ptc_pb2.ParallelConfig(tp=t))[0] for t in (1, 2, 4)] == \
        [50304, 50432, 50688]
    assert word.partition.pipeline.mode == ptc_pb2.PIPELINE_FIRST_AND_LAST_STAGE
    assert "output_layer.weight" not in [t.name for t in ptc.tensors]
    opt = part(ptc, "optimizer.exp_avg.embedding.word_embeddings.weight")
    assert opt.padding == word.partition.padding and opt.dp.mode == ptc_pb2.DP_REPLICATED
    untied = megatron.gpt_ptc(megatron.GptModel(2, 16, 2, 50257, tied_embeddings=False))
    assert part(untied, "embedding.word_embeddings.weight").pipeline.mode == \
        ptc_pb2.PIPELINE_FIRST_STAGE
    head = part(untied, "output_layer.weight")
    assert head.pipeline.mode == ptc_pb2.PIPELINE_LAST_STAGE and head.padding.multiple == 128
    rng = next(b for b in ptc.blobs if b.name == "rng_state")
    assert rng.scope == ptc_pb2.BLOB_PER_RANK and rng.regenerable


def test_gqa_interleaved_groups_and_blocks():
    # head dim 4, 4 q heads a group
    m = megatron.GptModel(1, 32, 8, 64, num_query_groups=2, dtype="float32")
    qkv = part(megatron.gpt_ptc(m), "decoder.layers.0.self_attention.linear_qkv.weight")
    assert (qkv.tp.axis, list(qkv.tp.blocks), qkv.tp.granularity) == (0, [], (4 + 2) * 4)
    # tp 2: one group (24 rows: q 16, k 4, v 4) a rank
    t = next(t for t in megatron.gpt_ptc(m).tensors if t.name.endswith("linear_qkv.weight"))
    g = np.arange(48 * 32, dtype=np.float32).reshape(48, 32)
    c = ptc_pb2.ParallelConfig(tp=2)
    assert layout.local_tensor(t, c, 1, g).tolist() == g[24:48].tolist()
    b = megatron.GptModel(1, 32, 8, 64, num_query_groups=2, qkv_layout="blocks",
                          dtype="float32")
    qkv = part(megatron.gpt_ptc(b), "decoder.layers.0.self_attention.linear_qkv.weight")
    assert (list(qkv.tp.blocks), qkv.tp.granularity) == ([32, 8, 8], 4)
    # tp 4 with 2 KV heads: each KV head replicated on two ranks
    t = next(t for t in megatron.gpt_ptc(b).tensors if t.name.endswith("linear_qkv.weight"))
    c = ptc_pb2.ParallelConfig(tp=4)
    rows = [layout.local_tensor(t, c, r, g)[:, 0] / 32 for r in range(4)]
    assert rows[1].tolist() == list(range(8, 16)) + [32, 33, 34, 35, 40, 41, 42, 43]
    assert rows[2].tolist() == list(range(16, 24)) + [36, 37, 38, 39, 44, 45, 46, 47]


def test_moe_router_replicated_experts_stacked():
    m = megatron.GptModel(2, 16, 2, 64, num_experts=4, moe_ffn_hidden=8, glu=True)
    ptc = megatron.gpt_ptc(m)
    router = part(ptc, "decoder.layers.1.mlp.router.weight")
    assert router.tp.mode == ptc_pb2.TP_REPLICATED and not router.HasField("expert")
    fc1 = part(ptc, "decoder.layers.1.mlp.experts.linear_fc1.weight")
    assert (fc1.expert.axis, fc1.tp.axis, list(fc1.tp.blocks)) == (0, 1, [8, 8])
    assert part(ptc, "optimizer.master.decoder.layers.1.mlp.experts.linear_fc2.weight").dp.bucket \
        == "expert.master"
    assert part(ptc, "optimizer.exp_avg.decoder.layers.1.mlp.router.weight").dp.bucket == \
        "dense.exp_avg"
    g = {b.name: b for b in ptc.buckets}["dense.master"]
    assert (g.reverse_order, g.param_align, g.pad_multiple) == (True, 64, 128)


@pytest.mark.parametrize("bucket_size", [None, 3000, 700])
def test_distributed_optimizer_shards_match_megatron(bucket_size):
    """GPT with vocab padding, tied embeddings on first and last stage (own
    bucket: shared_embedding), vpp 2, cp 2, dp 2, tp 2."""
    m = megatron.GptModel(8, 32, 4, 1000, num_query_groups=2, glu=True, pp=2,
                          bucket_size=bucket_size, max_position_embeddings=16)
    ptc = megatron.gpt_ptc(m)
    lay = layout.make_layout(2, 2, 2, ["a", "b", "c", "d"], 4, cp=2, vpp=2)
    assert check_against_megatron(m, ptc, lay, expert=False) > 100


def test_moe_expert_buffers_match_megatron():
    m = megatron.GptModel(2, 16, 2, 300, num_experts=4, moe_ffn_hidden=24, glu=True,
                          bucket_size=1000)
    ptc = megatron.gpt_ptc(m)
    lay = layout.make_layout(2, 1, 4, ["a", "b"], 4, ep=2, expert_tp=1)  # edp 4
    assert check_against_megatron(m, ptc, lay, expert=True) > 0
    assert check_against_megatron(m, ptc, lay, expert=False) > 0


def test_t5_embeddings_tied_on_a_layer_set():
    m = megatron.GptModel(6, 16, 2, 200, pp=2, distributed_optimizer=True)
    ptc = megatron.t5_ptc(m, encoder_layers=3)
    word = part(ptc, "embedding.word_embeddings.weight")
    assert word.pipeline.mode == ptc_pb2.PIPELINE_LAYERS and list(word.pipeline.layers) == [0, 3]
    names = [t.name for t in ptc.tensors]
    assert "decoder.layers.0.cross_attention.linear_kv.weight" in names
    assert part(ptc, "decoder.layers.2.mlp.linear_fc1.weight").pipeline.layer == 5
    assert part(ptc, "encoder.final_layernorm.weight").pipeline.layer == 2
    lay = layout.make_layout(1, 2, 1, ["a"], 2)  # stages: layers 0-2 | 3-5
    assert layout.stages_holding(lay.config, 6, word.pipeline) == [0, 1]
    lay = layout.make_layout(1, 3, 1, ["a"], 3)  # 0-1 | 2-3 | 4-5: held by stages 0 and 1
    assert layout.stages_holding(lay.config, 6, word.pipeline) == [0, 1]
    assert check_against_megatron(m, ptc, lay, expert=False) > 0


def test_synthetic_state_covers_the_ptc():
    m = megatron.GptModel(2, 16, 2, 100, num_experts=2)
    ptc = megatron.gpt_ptc(m)
    g = megatron.synthetic_state(ptc, world=4, seed=3)
    assert set(g) == {t.name for t in ptc.tensors} | {b.name for b in ptc.blobs}
    assert g["embedding.word_embeddings.weight"].dtype == np.uint16
    assert len(g["rng_state"]) == 4
    lay = layout.make_layout(2, 1, 2, ["a"], 4, ep=2, expert_tp=1)
    for r in range(4):
        layout.shard(ptc, lay, r, g)
