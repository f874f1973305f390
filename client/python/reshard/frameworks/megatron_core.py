"""The PTC of a Megatron-core GPT (and a T5-like encoder-decoder) exactly as
Megatron holds it: what every rank's memory contains, not a consolidated
checkpoint. Re-exported by reshard.megatron.

Followed from NVIDIA/Megatron-LM (commit d98e8a64, Aug 2026):
- vocabulary padding, megatron/training/vocab_utils.py
  `_calculate_padded_vocab_size_cached`: the vocabulary is padded to a multiple
  of make_vocab_size_divisible_by x tensor_model_parallel_size, so the held
  shape of the word embeddings, the output layer and their optimizer state
  depends on tp -> AxisPadding(axis 0, multiple, times_tp);
- the distributed optimizer's buffers, megatron/core/optimizer/distrib_optimizer.py
  `_compute_per_buffer_param_layout` and param_layout.py `pad_param_start`
  (64-element alignment) / `pad_bucket_end` (bucket end padded to
  lcm(data-parallel size, 128)): parameters in reverse order, a bucket closes
  once it holds >= bucket_size elements, and a parameter marked
  `shared_embedding` (the tied word embeddings on the first and the last stage
  when pp > 1, language_module.py `setup_embeddings_and_output_layer`) gets a
  bucket of its own -> BucketGroup(reverse_order, param_align 64,
  bucket_elements = bucket_size, pad_multiple 128), one group per optimizer
  state (fp32 main params, exp_avg, exp_avg_sq), dense and expert parameters
  in separate groups (separate buffers: the expert ones shard over the
  expert-data-parallel group), the shared embedding in groups of its own
  (equivalent to its own bucket); every model chunk (vpp) has its own buffer;
- the data-parallel group of the distributed optimizer is dp x cp
  (parallel_state `get_data_parallel_group(with_context_parallel=True)`);
  ranks are ordered tp-cp-ep-dp-pp and experts tp-ep-dp inside a stage
  (parallel_state.py `RankGenerator`);
- fused QKV (`linear_qkv`): rows interleaved by query group, [q heads of group
  0, k of group 0, v of group 0, q of group 1, ...], split at query-group
  granularity (attention.py `get_query_key_value_tensors`);
- model weights (bf16/fp16) are replicated over data parallel: the
  distributed optimizer all-gathers them into every rank's param buffer.

Limits, by design of a fixed PTC: Megatron's default bucket size when
overlapping grad reduction is max(40M, 1M x dp) elements and the shared-
embedding bucket exists only when pp > 1; the PTC fixes both at build time
(bucket_elements, pp > 1), so a reshard that changes them yields the layout
the PTC names, not the one Megatron would build at the new size.
"""

import collections

from reshard.core import _dtypes
from reshard.core._proto import ptc_pb2

OPTIMIZER_STATES = ("master", "exp_avg", "exp_avg_sq")


class GptModel:
    """A Megatron-core GPT's shape and options (names as megatron-core).

    vocab_size: the tokenizer's (unpadded) vocabulary; held padded to
      make_vocab_size_divisible_by x tp.
    num_query_groups: grouped-query attention (default: heads).
    qkv_layout: "interleaved" (Megatron: split at query-group units; a group
      count below tp replicates whole groups) or "blocks" ([q, k, v] split at
      head units, KV heads replicated when fewer than tp: vLLM-style).
    num_experts: MoE in every layer (router replicated, experts stacked).
    tied_embeddings: word embeddings shared with the output layer, held by the
      first and the last stage; False: a separate output_layer.weight.
    distributed_optimizer: fp32 main params and Adam moments in DP_BUCKET
      groups; False: replicated over data parallel. pp: whether the shared
      embedding gets buckets of its own (Megatron does so when pp > 1).
    """

    def __init__(self, num_layers, hidden, heads, vocab_size, ffn_hidden=None,
                 num_query_groups=None, kv_channels=None, qkv_layout="interleaved", glu=False,
                 max_position_embeddings=None, make_vocab_size_divisible_by=128,
                 num_experts=0, moe_ffn_hidden=None, tied_embeddings=True,
                 distributed_optimizer=True, bucket_size=None, pp=1, dtype="bfloat16",
                 rng_state_bytes=64):
        if qkv_layout not in ("interleaved", "blocks"):
            raise ValueError(f"qkv_layout {qkv_layout!r}: expected interleaved or blocks")
        groups = num_query_groups or heads
        if heads % groups:
            raise ValueError(f"{heads} attention heads are not a multiple of {groups} query groups")
        self.num_layers, self.hidden, self.heads = num_layers, hidden, heads
        self.vocab_size, self.ffn_hidden = vocab_size, ffn_hidden or 4 * hidden
        self.groups, self.head_dim = groups, kv_channels or hidden // heads
        self.qkv_layout, self.glu = qkv_layout, glu
        self.max_position_embeddings = max_position_embeddings
        self.divisible_by = make_vocab_size_divisible_by
        self.num_experts, self.moe_ffn_hidden = num_experts, moe_ffn_hidden or self.ffn_hidden
        self.tied_embeddings, self.distributed_optimizer = tied_embeddings, distributed_optimizer
        self.bucket_size, self.pp, self.dtype = bucket_size, pp, dtype
        self.rng_state_bytes = rng_state_bytes


Param = collections.namedtuple("Param", "name shape partition group")
Param.__doc__ = "A model parameter: its PartitionSpec and its optimizer buffer ('dense', ...)."


def _part(tp_axis=None, blocks=(), granularity=0, pipeline=ptc_pb2.PIPELINE_LAYER, layer=0,
          layers=(), padding=None, expert_axis=None):
    p = ptc_pb2.PartitionSpec()
    p.tp.SetInParent()
    p.dp.SetInParent()
    if tp_axis is not None:
        p.tp.mode = ptc_pb2.TP_SPLIT
        p.tp.axis = tp_axis
        p.tp.blocks.extend(blocks)
        p.tp.granularity = granularity
    p.pipeline.mode = pipeline
    if pipeline == ptc_pb2.PIPELINE_LAYER:
        p.pipeline.layer = layer
    p.pipeline.layers.extend(layers)
    if padding:
        p.padding.axis, p.padding.multiple, p.padding.times_tp = 0, padding, True
        # A small vocabulary at a large tp can leave a rank nothing but
        # padding rows; Megatron runs that, so it is allowed here.
        p.allow_empty = True
    if expert_axis is not None:
        p.expert.axis = expert_axis
    return p


def qkv_partition(m, layer):
    """TP rule of a fused QKV weight / bias (rows on axis 0)."""
    d, q_per = m.head_dim, m.heads // m.groups
    if m.qkv_layout == "interleaved":
        return _part(0, granularity=(q_per + 2) * d, layer=layer)
    return _part(0, blocks=[m.heads * d, m.groups * d, m.groups * d], granularity=d, layer=layer)


def _fc1_blocks(m, width):
    return [width, width] if m.glu else []


def _attention(m, prefix, layer, cross=False):
    h, d = m.hidden, m.head_dim
    rows = (m.heads + 2 * m.groups) * d
    if cross:  # T5 cross attention: q from the decoder, kv from the encoder output
        out = [Param(prefix + "linear_q.weight", [m.heads * d, h],
                     _part(0, granularity=d, layer=layer), "dense"),
               Param(prefix + "linear_kv.weight", [2 * m.groups * d, h],
                     _part(0, granularity=2 * d, layer=layer), "dense")]
    else:
        out = [Param(prefix + "linear_qkv.layer_norm_weight", [h], _part(layer=layer), "dense"),
               Param(prefix + "linear_qkv.weight", [rows, h], qkv_partition(m, layer), "dense")]
    out.append(Param(prefix + "linear_proj.weight", [h, m.heads * d],
                     _part(1, granularity=d, layer=layer), "dense"))
    return out


def _mlp(m, prefix, layer):
    h = m.hidden
    if not m.num_experts:
        f = m.ffn_hidden
        return [Param(prefix + "mlp.linear_fc1.layer_norm_weight", [h], _part(layer=layer),
                      "dense"),
                Param(prefix + "mlp.linear_fc1.weight", [(2 if m.glu else 1) * f, h],
                      _part(0, blocks=_fc1_blocks(m, f), layer=layer), "dense"),
                Param(prefix + "mlp.linear_fc2.weight", [h, f], _part(1, layer=layer), "dense")]
    e, f = m.num_experts, m.moe_ffn_hidden
    return [Param(prefix + "pre_mlp_layernorm.weight", [h], _part(layer=layer), "dense"),
            Param(prefix + "mlp.router.weight", [e, h], _part(layer=layer), "dense"),
            Param(prefix + "mlp.experts.linear_fc1.weight", [e, (2 if m.glu else 1) * f, h],
                  _part(1, blocks=_fc1_blocks(m, f), layer=layer, expert_axis=0), "expert"),
            Param(prefix + "mlp.experts.linear_fc2.weight", [e, h, f],
                  _part(2, layer=layer, expert_axis=0), "expert")]


def _embeddings(m, tied_pipeline, tied_layers=()):
    """Word (and learned position) embeddings; the word embeddings hold the
    shared output weight when tied."""
    h, pad = m.hidden, m.divisible_by
    shared = m.tied_embeddings and m.pp > 1
    word = Param("embedding.word_embeddings.weight", [m.vocab_size, h],
                 _part(0, pipeline=tied_pipeline if m.tied_embeddings else
                       ptc_pb2.PIPELINE_FIRST_STAGE, layers=tied_layers if m.tied_embeddings
                       else (), padding=pad), "shared_embedding" if shared else "dense")
    out = [word]
    if m.max_position_embeddings:
        out.append(Param("embedding.position_embeddings.weight", [m.max_position_embeddings, h],
                         _part(pipeline=ptc_pb2.PIPELINE_FIRST_STAGE), "dense"))
    return out


def _output(m):
    out = [Param("decoder.final_layernorm.weight", [m.hidden],
                 _part(pipeline=ptc_pb2.PIPELINE_LAST_STAGE), "dense")]
    if not m.tied_embeddings:
        out.append(Param("output_layer.weight", [m.vocab_size, m.hidden],
                         _part(0, pipeline=ptc_pb2.PIPELINE_LAST_STAGE, padding=m.divisible_by),
                         "dense"))
    return out


def gpt_params(m):
    """Megatron-core GPT parameters in module (named_parameters) order."""
    out = _embeddings(m, ptc_pb2.PIPELINE_FIRST_AND_LAST_STAGE)
    for n in range(m.num_layers):
        p = f"decoder.layers.{n}."
        out += _attention(m, p + "self_attention.", n) + _mlp(m, p, n)
    return out + _output(m)


def t5_params(m, encoder_layers, tied_layers=None):
    """A T5-like encoder-decoder: layers [0, encoder_layers) encode, the rest
    decode (with cross attention); the word embeddings are tied on the stages
    owning `tied_layers` (default: the first encoder and the first decoder
    layer, Megatron T5's pipeline split)."""
    tied = list(tied_layers if tied_layers is not None else (0, encoder_layers))
    out = _embeddings(m, ptc_pb2.PIPELINE_LAYERS, tied)
    for n in range(m.num_layers):
        if n < encoder_layers:
            p = f"encoder.layers.{n}."
            out += _attention(m, p + "self_attention.", n) + _mlp(m, p, n)
        else:
            p = f"decoder.layers.{n - encoder_layers}."
            out += (_attention(m, p + "self_attention.", n)
                    + _attention(m, p + "cross_attention.", n, cross=True) + _mlp(m, p, n))
        if n == encoder_layers - 1:
            out.append(Param("encoder.final_layernorm.weight", [m.hidden], _part(layer=n), "dense"))
    return out + _output(m)


def bucket_groups(m):
    """BucketGroups of the distributed optimizer: {buffer}.{state}."""
    out = []
    for buffer in ("dense", "expert", "shared_embedding"):
        for state in OPTIMIZER_STATES:
            out.append(ptc_pb2.BucketGroup(name=f"{buffer}.{state}", reverse_order=True,
                                           param_align=64, bucket_elements=m.bucket_size or 0,
                                           pad_multiple=128))
    return out


def build(m, params, extra_blobs=()):
    """The Ptc of `params` (Param list in module order) for model m: the
    weights (m.dtype, replicated over data parallel), then per optimizer
    state the fp32 copies (DP_BUCKET groups or replicated), then blobs."""
    num_layers = m.num_layers
    ptc = ptc_pb2.Ptc(num_layers=num_layers)
    dtype = _dtypes.dtype_enum(m.dtype)
    for p in params:
        ptc.tensors.add(name=p.name, dtype=dtype, shape=p.shape).partition.CopyFrom(p.partition)
    used = set()
    for state in OPTIMIZER_STATES:
        for p in params:
            t = ptc.tensors.add(name=f"optimizer.{state}.{p.name}", dtype=ptc_pb2.DTYPE_FLOAT32,
                                shape=p.shape)
            t.partition.CopyFrom(p.partition)
            if m.distributed_optimizer:
                t.partition.dp.mode = ptc_pb2.DP_BUCKET
                t.partition.dp.bucket = f"{p.group}.{state}"
                used.add(t.partition.dp.bucket)
    ptc.buckets.extend(g for g in bucket_groups(m) if g.name in used)
    ptc.blobs.add(name="iteration", size_bytes=8, scope=ptc_pb2.BLOB_REPLICATED)
    ptc.blobs.add(name="rng_state", size_bytes=m.rng_state_bytes, scope=ptc_pb2.BLOB_PER_RANK,
                  regenerable=True)
    for name, size in extra_blobs:
        ptc.blobs.add(name=name, size_bytes=size, scope=ptc_pb2.BLOB_REPLICATED)
    return ptc


def gpt_ptc(m):
    """The PTC of a Megatron-core GPT held as Megatron holds it."""
    return build(m, gpt_params(m), [("data.consumed_samples", 8)])


def t5_ptc(m, encoder_layers, tied_layers=None):
    """The PTC of a T5-like encoder-decoder (see t5_params)."""
    return build(m, t5_params(m, encoder_layers, tied_layers), [("data.consumed_samples", 8)])


def synthetic_state(ptc, world, seed=0):
    """Random global values for every tensor (logical shapes, raw dtypes:
    bfloat16 as uint16 bits, finite floats) and blob of a PTC; per-rank blobs
    get one value per rank of a world of `world`."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for t in ptc.tensors:
        x = rng.standard_normal(list(t.shape), dtype=np.float32) * 0.02
        if t.dtype == ptc_pb2.DTYPE_BFLOAT16:
            out[t.name] = (x.view(np.uint32) >> 16).astype(np.uint16)
        else:
            out[t.name] = x.astype(_dtypes.numpy_dtype(t.dtype))
    for b in ptc.blobs:
        if b.scope == ptc_pb2.BLOB_PER_RANK:
            out[b.name] = [rng.integers(0, 256, b.size_bytes, dtype=np.uint8).tobytes()
                           for _ in range(world)]
        else:
            out[b.name] = rng.integers(0, 256, b.size_bytes, dtype=np.uint8).tobytes()
    return out
