"""reshard.megatron: partition rules by tensor name, and the hand-written
example specs (examples/make_examples.py) rebuilt from names and shapes only."""

import os
import sys

import numpy as np
import pytest
from google.protobuf import json_format

import reshard
from reshard import layout, megatron
from reshard.megatron import ParallelConfig, TensorMeta
from reshard.v1 import ptc_pb2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples"))
import make_examples  # noqa: E402


def part(ptc, name):
    return next(t.partition for t in ptc.tensors if t.name == name)


def test_layer_numbering_to_stage():
    assert megatron.layer_of("decoder.layers.17.mlp.linear_fc1.weight") == 17
    assert megatron.layer_of("language_model.encoder.layers.3.self_attention.dense.weight") == 3
    assert megatron.layer_of("layers.0.x") == 0
    assert megatron.layer_of("embedding.word_embeddings.weight") is None
    sd = megatron.synthetic_gpt(6, 16, 2, 32, 8, "float32", with_optimizer=False)
    ptc = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=2))
    assert ptc.num_layers == 6
    p = part(ptc, "decoder.layers.4.self_attention.dense.weight").pipeline
    assert (p.mode, p.layer) == (ptc_pb2.PIPELINE_LAYER, 4)
    lay = layout.make_layout(1, 3, 1, ["a"], 3, stage_starts=[0, 1, 4])
    fc1 = "decoder.layers.4.mlp.dense_h_to_4h.weight"
    holders = [r for r in range(3) if layout.holds(ptc, lay, r, fc1)]
    assert holders == [2]


def test_fused_qkv_blocks_and_interleaved():
    # grouped-query attention: [q, k, v] sub-blocks
    sd = {"decoder.layers.0.self_attention.linear_qkv.weight": TensorMeta([8 * 4 + 2 * 2 * 4, 32],
                                                                           "bf16")}
    ptc = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=8, num_query_groups=2))
    tp = part(ptc, "decoder.layers.0.self_attention.linear_qkv.weight").tp
    assert (tp.mode, tp.axis, list(tp.blocks)) == (ptc_pb2.TP_SPLIT, 0, [32, 8, 8])
    assert ptc.tensors[0].dtype == ptc_pb2.DTYPE_BFLOAT16
    # plain multi-head attention: Megatron's per-head interleaved rows, one block
    sd = {"decoder.layers.0.self_attention.query_key_value.weight": TensorMeta([96, 32], "fp16")}
    ptc = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=4))
    assert list(ptc.tensors[0].partition.tp.blocks) == []
    ptc = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=4, qkv_layout="blocks"))
    assert list(ptc.tensors[0].partition.tp.blocks) == [32, 32, 32]
    with pytest.raises(ValueError, match="rows is not q"):
        megatron.build_ptc(sd, ParallelConfig(num_attention_heads=4, num_query_groups=2,
                                              kv_channels=10, qkv_layout="blocks"))


def test_glu_fc1_two_blocks_detected_or_forced():
    sd = {"decoder.layers.0.mlp.linear_fc1.weight": TensorMeta([2 * 48, 16], "bf16"),
          "decoder.layers.0.mlp.linear_fc2.weight": TensorMeta([16, 48], "bf16")}
    ptc = megatron.build_ptc(sd)
    assert list(part(ptc, "decoder.layers.0.mlp.linear_fc1.weight").tp.blocks) == [48, 48]
    fc2 = part(ptc, "decoder.layers.0.mlp.linear_fc2.weight").tp
    assert (fc2.mode, fc2.axis) == (ptc_pb2.TP_SPLIT, 1)
    ptc = megatron.build_ptc(sd, ParallelConfig(glu=False))
    assert list(part(ptc, "decoder.layers.0.mlp.linear_fc1.weight").tp.blocks) == []
    # a plain 4h MLP is not GLU
    sd = {"decoder.layers.0.mlp.dense_h_to_4h.weight": TensorMeta([64, 16], "fp16"),
          "decoder.layers.0.mlp.dense_h_to_4h.bias": TensorMeta([64], "fp16"),
          "decoder.layers.0.mlp.dense_4h_to_h.weight": TensorMeta([16, 64], "fp16"),
          "decoder.layers.0.mlp.dense_4h_to_h.bias": TensorMeta([16], "fp16")}
    ptc = megatron.build_ptc(sd)
    assert list(part(ptc, "decoder.layers.0.mlp.dense_h_to_4h.weight").tp.blocks) == []
    assert part(ptc, "decoder.layers.0.mlp.dense_h_to_4h.bias").tp.mode == ptc_pb2.TP_SPLIT
    assert part(ptc, "decoder.layers.0.mlp.dense_4h_to_h.bias").tp.mode == ptc_pb2.TP_REPLICATED


def test_embeddings_head_and_norms():
    sd = megatron.synthetic_gpt(2, 16, 2, 40, 8, "float16", with_optimizer=False)
    ptc = megatron.build_ptc(sd)
    word = part(ptc, "embedding.word_embeddings.weight")
    assert (word.tp.mode, word.tp.axis, word.pipeline.mode) == \
        (ptc_pb2.TP_SPLIT, 0, ptc_pb2.PIPELINE_FIRST_STAGE)
    pos = part(ptc, "embedding.position_embeddings.weight")
    assert (pos.tp.mode, pos.pipeline.mode) == (ptc_pb2.TP_REPLICATED, ptc_pb2.PIPELINE_FIRST_STAGE)
    head = part(ptc, "output_layer.weight")
    assert (head.tp.mode, head.pipeline.mode) == (ptc_pb2.TP_SPLIT, ptc_pb2.PIPELINE_LAST_STAGE)
    norm = part(ptc, "decoder.final_layernorm.weight")
    assert (norm.tp.mode, norm.pipeline.mode) == (ptc_pb2.TP_REPLICATED,
                                                  ptc_pb2.PIPELINE_LAST_STAGE)
    ln = part(ptc, "decoder.layers.1.input_layernorm.weight")
    assert (ln.tp.mode, ln.pipeline.mode, ln.pipeline.layer) == (ptc_pb2.TP_REPLICATED,
                                                                 ptc_pb2.PIPELINE_LAYER, 1)
    tied = megatron.build_ptc(sd, ParallelConfig(tied_embeddings=True))
    assert part(tied, "embedding.word_embeddings.weight").pipeline.mode == \
        ptc_pb2.PIPELINE_EVERY_STAGE


def test_legacy_and_te_names():
    m = "language_model.encoder.layers.2."
    sd = {"language_model.embedding.word_embeddings.weight": TensorMeta([64, 8], "fp16"),
          m + "self_attention.query_key_value.weight": TensorMeta([24, 8], "fp16"),
          m + "self_attention.dense.weight": TensorMeta([8, 8], "fp16"),
          "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight": TensorMeta([8], "fp16"),
          "language_model.encoder.final_layernorm.weight": TensorMeta([8], "fp16"),
          "language_model.output_layer.weight": TensorMeta([64, 8], "fp16")}
    ptc = megatron.build_ptc(sd)
    got = {t.name: (t.partition.tp.mode, t.partition.tp.axis, t.partition.pipeline.mode)
           for t in ptc.tensors}
    S, R = ptc_pb2.TP_SPLIT, ptc_pb2.TP_REPLICATED
    assert got == {
        "language_model.embedding.word_embeddings.weight": (S, 0, ptc_pb2.PIPELINE_FIRST_STAGE),
        m + "self_attention.query_key_value.weight": (S, 0, ptc_pb2.PIPELINE_LAYER),
        m + "self_attention.dense.weight": (S, 1, ptc_pb2.PIPELINE_LAYER),
        "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight":
            (R, 0, ptc_pb2.PIPELINE_LAYER),
        "language_model.encoder.final_layernorm.weight": (R, 0, ptc_pb2.PIPELINE_LAST_STAGE),
        "language_model.output_layer.weight": (S, 0, ptc_pb2.PIPELINE_LAST_STAGE)}
    assert ptc.num_layers == 3


def test_optimizer_state_follows_its_parameter():
    sd = megatron.synthetic_gpt(2, 16, 2, 40, 8, "bfloat16", with_optimizer=True)
    classic = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=2))
    zero = megatron.build_ptc(sd, ParallelConfig(num_attention_heads=2,
                                                 distributed_optimizer=True))
    for kind in megatron.OPTIMIZER_KINDS:
        for param in ("decoder.layers.1.self_attention.dense.weight", "output_layer.weight"):
            name = f"optimizer.{kind}.{param}"
            p, c, z = part(classic, param), part(classic, name), part(zero, name)
            assert c.tp == p.tp and c.pipeline == p.pipeline and z.tp == p.tp
            assert c.dp.mode == ptc_pb2.DP_REPLICATED and z.dp.mode == ptc_pb2.DP_FLAT
            assert next(t for t in classic.tensors if t.name == name).dtype == \
                ptc_pb2.DTYPE_FLOAT32
    assert part(zero, "output_layer.weight").dp.mode == ptc_pb2.DP_REPLICATED


def test_blobs_and_overrides():
    sd = {"layers.0.w": np.zeros((4, 4), np.float32), "step": 12,
          "rng_state": [b"a" * 16, b"b" * 16], "scheduler": b"xyz"}
    ptc = megatron.build_ptc(sd, overrides={"layers.0.w": {
        "tp": {"mode": "TP_SPLIT", "axis": 1}, "pipeline": {"mode": "PIPELINE_EVERY_STAGE"}}},
        blobs={"rng_extra": 64})
    blobs = {b.name: (b.size_bytes, b.scope) for b in ptc.blobs}
    assert blobs == {"step": (8, ptc_pb2.BLOB_REPLICATED),
                     "rng_state": (16, ptc_pb2.BLOB_PER_RANK),
                     "scheduler": (3, ptc_pb2.BLOB_REPLICATED),
                     "rng_extra": (64, ptc_pb2.BLOB_REPLICATED)}
    assert ptc.tensors[0].partition.pipeline.mode == ptc_pb2.PIPELINE_EVERY_STAGE


def test_torch_state_dict():
    torch = pytest.importorskip("torch")
    sd = {"decoder.layers.0.self_attention.linear_proj.weight": torch.zeros(8, 6,
                                                                           dtype=torch.bfloat16)}
    t = megatron.build_ptc(sd).tensors[0]
    assert t.dtype == ptc_pb2.DTYPE_BFLOAT16 and list(t.shape) == [8, 6]
    assert (t.partition.tp.mode, t.partition.tp.axis) == (ptc_pb2.TP_SPLIT, 1)


def _weights_only(example_ptc):
    """name -> TensorMeta of an example's model weights (no optimizer.*)."""
    return {t["name"]: TensorMeta(t["shape"], t["dtype"]) for t in example_ptc["tensors"]
            if not t["name"].startswith("optimizer.")}


@pytest.mark.parametrize("which", ["gpt3", "llama"])
def test_rebuilds_the_hand_written_examples(which):
    if which == "gpt3":
        want = make_examples.gpt3_xl_ptc()
        cfg = ParallelConfig(num_attention_heads=16, add_optimizer=True)
    else:
        want = make_examples.llama3_8b_ptc()
        cfg = ParallelConfig(num_attention_heads=32, num_query_groups=8, add_optimizer=True,
                             distributed_optimizer=True)
    sizes = {b["name"]: b["sizeBytes"] for b in want["blobs"]}
    got = megatron.build_ptc(_weights_only(want), cfg, blobs=sizes)
    assert got == json_format.ParseDict(want, ptc_pb2.Ptc())
    # and the committed job.json holds the same PTC
    sub = "gpt3-xl" if which == "gpt3" else "llama3-8b"
    with open(os.path.join(REPO, "examples", sub, "job.json")) as f:
        spec = reshard.as_message(__import__("json").load(f), ptc_pb2.JobSpec)
    assert got == spec.ptc


def test_synthetic_gpt_shapes_and_determinism():
    a = megatron.synthetic_gpt(3, 32, 4, 50, 16, "bfloat16", seed=1, num_query_groups=2, glu=True,
                               ffn=40, world=4)
    b = megatron.synthetic_gpt(3, 32, 4, 50, 16, "bfloat16", seed=1, num_query_groups=2, glu=True,
                               ffn=40, world=4)
    assert a.keys() == b.keys()
    assert all(layout.same_bytes(a[k], b[k]) if not isinstance(a[k], list) else a[k] == b[k]
               for k in a)
    assert a["decoder.layers.2.self_attention.query_key_value.weight"].shape == (32 + 2 * 16, 32)
    assert a["decoder.layers.0.mlp.dense_h_to_4h.weight"].shape == (80, 32)
    assert a["embedding.word_embeddings.weight"].dtype == np.uint16  # bfloat16 bits
    assert a["optimizer.exp_avg.output_layer.weight"].dtype == np.float32
    assert len(a["rng_state"]) == 4 and len(a["step"]) == 8
    ptc = megatron.build_ptc(a, megatron.synthetic_config(3, 4, num_query_groups=2, glu=True))
    qkv = part(ptc, "decoder.layers.2.self_attention.query_key_value.weight")
    assert list(qkv.tp.blocks) == [32, 16, 16]
    assert list(part(ptc, "decoder.layers.0.mlp.dense_h_to_4h.weight").tp.blocks) == [40, 40]
    c = megatron.synthetic_gpt(3, 32, 4, 50, 16, "bfloat16", seed=2)
    assert not layout.same_bytes(a["output_layer.weight"], c["output_layer.weight"])
    # finite values: array_equal works on the float dtypes
    f = megatron.synthetic_gpt(1, 16, 2, 20, 8, "float16")
    assert all(np.isfinite(v).all() for v in f.values() if isinstance(v, np.ndarray))


def test_make_job_spec_is_accepted_shape():
    sd = megatron.synthetic_gpt(2, 16, 2, 40, 8, "float16", with_optimizer=False)
    spec = megatron.make_job_spec("m", "t", sd, ParallelConfig(tp=2, pp=2, dp=1), ["h0", "h1"], 2)
    assert spec.layout.config.tp == 2 and list(spec.layout.placement.hosts) == ["h0", "h1"]
    assert len(spec.ptc.tensors) == len([v for v in sd.values() if isinstance(v, np.ndarray)])
