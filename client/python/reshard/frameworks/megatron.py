"""PTC specs from Megatron-style state dicts, and a synthetic GPT for tests.

build_ptc(state_dict, config) reads tensor names the way Megatron-LM writes
them (legacy "language_model"/"decoder" names and megatron-core names) and
picks each tensor's partition:

- `...layers.N...`: held by the pipeline stage owning layer N;
- fused QKV (`query_key_value`, `linear_qkv`): column-parallel; with grouped
  query attention and qkv_layout "blocks" the rows are sub-blocks [q, k, v],
  each split across tp separately (every rank keeps whole KV heads); with
  "interleaved" (Megatron's own per-head-group layout) a plain row split;
- MLP fc1 (`dense_h_to_4h`, `linear_fc1`): column-parallel; GLU / SwiGLU (fc1
  twice as wide as fc2's input) as two sub-blocks [gate, up];
- attention output and fc2 (`dense`, `linear_proj`, `dense_4h_to_h`,
  `linear_fc2`) weights: row-parallel (split the input axis 1); their biases
  replicated;
- word embeddings: vocab-parallel (split axis 0) on the first stage; position
  embeddings replicated on the first stage; the output layer vocab-parallel on
  the last stage, the final norm replicated on the last stage; with
  tied_embeddings the word embeddings are on every stage;
- norms and anything unrecognised: replicated (overrides= can say otherwise);
- optimizer state `optimizer.<kind>.<param>` (fp32 master weights and Adam
  exp_avg / exp_avg_sq): the parameter's tensor- and pipeline-parallel rule;
  across data parallel replicated, or DP_FLAT with distributed_optimizer
  (ZeRO-1, Megatron's distributed optimizer);
- blobs: bytes-like values (step counters, RNG state), ints (8 bytes), and
  per-rank values given as a list (one bytes value per rank) -> BLOB_PER_RANK.

Values may be numpy arrays, torch tensors or TensorMeta(shape, dtype), so a
spec for a large model needs no memory.

gpt_ptc(GptModel(...)) / t5_ptc(...) (reshard.megatron_core) build the PTC of
a Megatron-core model exactly as Megatron holds it in memory: vocabulary
padding that depends on tp, the distributed optimizer's bucketed buffers,
interleaved stages, context and expert parallelism, tied embeddings on the
first and last stage (or a layer set), grouped-query attention, and a
regenerable per-rank rng_state.
"""

import collections
import re

import numpy as np

from reshard.core import _dtypes
from reshard.core._proto import as_message, ptc_pb2
from reshard.frameworks.megatron_core import (  # noqa: F401  (re-exported)
    GptModel, gpt_params, gpt_ptc, synthetic_state, t5_params, t5_ptc)

TensorMeta = collections.namedtuple("TensorMeta", ["shape", "dtype"])
TensorMeta.__doc__ = "Shape and dtype of a tensor that is not materialised."

OPTIMIZER_KINDS = ("master", "exp_avg", "exp_avg_sq")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OPT = re.compile(r"^optimizer\.(%s)\.(.+)$" % "|".join(OPTIMIZER_KINDS))


class ParallelConfig:
    """What build_ptc needs to know about the model and its parallelism.

    num_layers: transformer layers (default: 1 + the largest `layers.N`).
    num_attention_heads, num_query_groups, kv_channels: for fused QKV sub-
      blocks (num_query_groups < heads is grouped-query attention).
    qkv_layout: "auto" ("blocks" with grouped-query attention, else
      "interleaved"), "blocks" or "interleaved".
    glu: True / False, or None to detect (fc1 rows == 2 x fc2 columns).
    distributed_optimizer: optimizer state DP_FLAT instead of replicated.
    tied_embeddings: word embeddings on every stage (output head shares them).
    add_optimizer: add fp32 master + Adam moment specs for every parameter
      when the state dict has no optimizer.* entries (weights-only dicts).
    fsdp_axis: None, or split weights across dp along this axis (DP_SPLIT).
    tp, pp, dp: the starting layout's degrees (used by make_job_spec).
    """

    def __init__(self, tp=1, pp=1, dp=1, num_layers=None, num_attention_heads=None,
                 num_query_groups=None, kv_channels=None, qkv_layout="auto", glu=None,
                 distributed_optimizer=False, tied_embeddings=False, add_optimizer=False,
                 fsdp_axis=None):
        if qkv_layout not in ("auto", "blocks", "interleaved"):
            raise ValueError(f"qkv_layout {qkv_layout!r}: expected auto, blocks or interleaved")
        self.tp, self.pp, self.dp = tp, pp, dp
        self.num_layers = num_layers
        self.num_attention_heads = num_attention_heads
        self.num_query_groups = num_query_groups
        self.kv_channels = kv_channels
        self.qkv_layout = qkv_layout
        self.glu = glu
        self.distributed_optimizer = distributed_optimizer
        self.tied_embeddings = tied_embeddings
        self.add_optimizer = add_optimizer
        self.fsdp_axis = fsdp_axis


def layer_of(name):
    """N of the first `layers.N.` in a tensor name, or None."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _shape_dtype(name, value):
    if isinstance(value, TensorMeta):
        return [int(x) for x in value.shape], _dtypes.dtype_enum(value.dtype)
    if type(value).__module__.startswith("torch"):
        return [int(x) for x in value.shape], _dtypes.dtype_enum(str(value.dtype))
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    try:
        return list(arr.shape), _dtypes.dtype_enum(arr.dtype)
    except ValueError as e:
        raise ValueError(f"tensor \"{name}\": {e}") from None


def _is_blob(value):
    return (isinstance(value, (bytes, bytearray, memoryview, int, np.integer))
            or (isinstance(value, (list, tuple)) and value
                and all(isinstance(v, (bytes, bytearray)) for v in value)))


def _blob_spec(name, value, per_rank_names):
    if isinstance(value, (list, tuple)):
        sizes = {len(v) for v in value}
        if len(sizes) != 1:
            raise ValueError(f"blob \"{name}\": per-rank values of different sizes {sorted(sizes)}")
        return ptc_pb2.BlobSpec(name=name, size_bytes=sizes.pop(), scope=ptc_pb2.BLOB_PER_RANK)
    size = 8 if isinstance(value, (int, np.integer)) else len(bytes(value))
    scope = ptc_pb2.BLOB_PER_RANK if name in per_rank_names else ptc_pb2.BLOB_REPLICATED
    return ptc_pb2.BlobSpec(name=name, size_bytes=size, scope=scope)


def _partition(tp=None, axis=0, blocks=None, pipeline=ptc_pb2.PIPELINE_LAYER, layer=0,
               dp=ptc_pb2.DP_REPLICATED, dp_axis=0):
    p = ptc_pb2.PartitionSpec()
    p.tp.SetInParent()  # present even when replicated, like the proto-JSON specs
    p.dp.SetInParent()
    if tp == "split":
        p.tp.mode = ptc_pb2.TP_SPLIT
        p.tp.axis = axis
        p.tp.blocks.extend(blocks or ())
    p.pipeline.mode = pipeline
    if pipeline == ptc_pb2.PIPELINE_LAYER:
        p.pipeline.layer = layer
    p.dp.mode = dp
    if dp == ptc_pb2.DP_SPLIT:
        p.dp.axis = dp_axis
    return p


def _qkv_blocks(name, shape, cfg):
    """[q, k, v] rows of a fused QKV weight/bias, or None for a plain split."""
    layout = cfg.qkv_layout
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups
    if layout == "auto":
        layout = "blocks" if (heads and groups and groups != heads) else "interleaved"
    if layout == "interleaved":
        return None
    if not heads:
        raise ValueError(f"tensor \"{name}\": qkv_layout \"blocks\" needs num_attention_heads")
    groups = groups or heads
    rows = shape[0]
    head_dim = cfg.kv_channels or rows // (heads + 2 * groups)
    q, kv = heads * head_dim, groups * head_dim
    if q + 2 * kv != rows:
        raise ValueError(f"tensor \"{name}\": {rows} rows is not q {q} + 2 x kv {kv} "
                         f"({heads} heads, {groups} query groups, head dim {head_dim})")
    return [q, kv, kv]


_COLUMN = ("query_key_value", "linear_qkv", "dense_h_to_4h", "linear_fc1", "gate_proj",
           "up_proj", "q_proj", "k_proj", "v_proj")
_ROW = ("self_attention.dense", "attention.dense", "linear_proj", "dense_4h_to_h", "linear_fc2",
        "o_proj", "down_proj")


def weight_partition(name, shape, cfg, fc2_inputs=None):
    """The PartitionSpec of a model weight (no optimizer prefix) by its name.

    fc2_inputs: {layer: fc2 input width} for GLU detection."""
    layer = layer_of(name)
    dp_mode = ptc_pb2.DP_SPLIT if cfg.fsdp_axis is not None else ptc_pb2.DP_REPLICATED
    dp_axis = cfg.fsdp_axis or 0
    if layer is None:
        if "word_embeddings" in name or name.endswith("embed_tokens.weight"):
            pipe = (ptc_pb2.PIPELINE_EVERY_STAGE if cfg.tied_embeddings
                    else ptc_pb2.PIPELINE_FIRST_STAGE)
            return _partition("split", 0, pipeline=pipe, dp=dp_mode, dp_axis=dp_axis)
        if "embedding" in name:  # position / token-type embeddings
            return _partition(pipeline=ptc_pb2.PIPELINE_FIRST_STAGE, dp=dp_mode, dp_axis=dp_axis)
        if "output_layer" in name or "lm_head" in name:
            return _partition("split", 0, pipeline=ptc_pb2.PIPELINE_LAST_STAGE, dp=dp_mode,
                              dp_axis=dp_axis)
        if "final" in name or name.startswith("norm.") or ".norm." in name:
            return _partition(pipeline=ptc_pb2.PIPELINE_LAST_STAGE, dp=dp_mode, dp_axis=dp_axis)
        return _partition(pipeline=ptc_pb2.PIPELINE_EVERY_STAGE, dp=dp_mode, dp_axis=dp_axis)
    kw = dict(layer=layer, dp=dp_mode, dp_axis=dp_axis)
    leaf = name.rsplit(".", 1)[-1]
    module = name[:-len(leaf) - 1]
    is_norm_param = "norm" in leaf  # megatron-core fuses layer_norm_weight into linears
    if not is_norm_param and module.endswith(("query_key_value", "linear_qkv")):
        return _partition("split", 0, blocks=_qkv_blocks(name, shape, cfg), **kw)
    if not is_norm_param and module.endswith(("dense_h_to_4h", "linear_fc1")):
        glu = cfg.glu
        if glu is None and fc2_inputs and layer in fc2_inputs:
            glu = shape[0] == 2 * fc2_inputs[layer]
        blocks = [shape[0] // 2, shape[0] - shape[0] // 2] if glu else None
        return _partition("split", 0, blocks=blocks, **kw)
    if not is_norm_param and module.endswith(_COLUMN):
        return _partition("split", 0, **kw)
    if not is_norm_param and module.endswith(_ROW):
        if leaf == "weight" and len(shape) == 2:
            return _partition("split", 1, **kw)
        return _partition(**kw)  # the bias is added after the reduction
    return _partition(**kw)


def _fc2_inputs(shapes):
    out = {}
    for name, shape in shapes.items():
        if re.search(r"(dense_4h_to_h|linear_fc2)\.weight$", name) and len(shape) == 2:
            out[layer_of(name)] = shape[1]
    return out


def build_ptc(state_dict, config=None, overrides=None, per_rank_blobs=("rng_state",),
              blobs=None, num_layers=None):
    """A reshard.v1.Ptc for a Megatron-style state dict of global tensors.

    state_dict: name -> array / torch tensor / TensorMeta (tensors), bytes /
      int / list of bytes (blobs), in the item order wanted.
    config: a ParallelConfig (model facts and options; default: all defaults).
    overrides: {name: PartitionSpec or dict} for tensors the rules get wrong.
    per_rank_blobs: names of bytes blobs that differ per rank.
    blobs: extra blobs without values, {name: size_bytes or (size, scope)}.
    """
    cfg = config or ParallelConfig()
    overrides = overrides or {}
    per_rank = set(per_rank_blobs or ())
    shapes, dtypes, blob_specs, order = {}, {}, [], []
    for name, value in state_dict.items():
        if _is_blob(value):
            blob_specs.append(_blob_spec(name, value, per_rank))
            continue
        shapes[name], dtypes[name] = _shape_dtype(name, value)
        order.append(name)
    fc2 = _fc2_inputs(shapes)
    layers = [layer_of(n) for n in order if layer_of(n) is not None]
    n_layers = num_layers or cfg.num_layers or (max(layers) + 1 if layers else 0)
    ptc = ptc_pb2.Ptc(num_layers=n_layers)

    def add(name, dtype, shape, part):
        t = ptc.tensors.add(name=name, dtype=dtype, shape=shape)
        t.partition.CopyFrom(part)

    params = []
    for name in order:
        if name in overrides:
            part = as_message(overrides[name], ptc_pb2.PartitionSpec, f"override of {name}")
        else:
            m = _OPT.match(name)
            if m:
                base = m.group(2)
                base_shape = shapes.get(base, shapes[name])
                part = weight_partition(base, base_shape, cfg, fc2)
                if list(base_shape) != list(shapes[name]):
                    raise ValueError(f"optimizer state \"{name}\" has shape {shapes[name]}, its "
                                     f"parameter \"{base}\" {base_shape}")
                part.dp.Clear()
                if cfg.distributed_optimizer:
                    part.dp.mode = ptc_pb2.DP_FLAT
            else:
                part = weight_partition(name, shapes[name], cfg, fc2)
                params.append(name)
        add(name, dtypes[name], shapes[name], part)
    has_optimizer = any(_OPT.match(n) for n in order)
    if cfg.add_optimizer and not has_optimizer:
        for kind in OPTIMIZER_KINDS:
            for name in params:
                part = ptc_pb2.PartitionSpec()
                part.CopyFrom(next(t.partition for t in ptc.tensors if t.name == name))
                part.dp.Clear()
                if cfg.distributed_optimizer:
                    part.dp.mode = ptc_pb2.DP_FLAT
                add(f"optimizer.{kind}.{name}", ptc_pb2.DTYPE_FLOAT32, shapes[name], part)
    ptc.blobs.extend(blob_specs)
    for name, spec in (blobs or {}).items():
        size, scope = spec if isinstance(spec, tuple) else (spec, ptc_pb2.BLOB_PER_RANK
                                                            if name in per_rank
                                                            else ptc_pb2.BLOB_REPLICATED)
        if isinstance(scope, str):
            scope = ptc_pb2.BlobScope.Value(scope)
        ptc.blobs.add(name=name, size_bytes=size, scope=scope)
    return ptc


def build_spec(state_dict, name, layout, tenant="default", config=None, **kwargs):
    """A reshard.v1.JobSpec: build_ptc(state_dict, config, **kwargs) and the
    given starting Layout (message or dict)."""
    spec = ptc_pb2.JobSpec(name=name, tenant=tenant, ptc=build_ptc(state_dict, config, **kwargs))
    spec.layout.CopyFrom(as_message(layout, ptc_pb2.Layout, "layout"))
    return spec


def make_job_spec(name, tenant, state_dict, config, hosts, devices_per_host, **kwargs):
    """A reshard.v1.JobSpec: build_ptc(state_dict, config, **kwargs) and the
    layout config.tp x pp x dp on hosts x devices_per_host."""
    from reshard.core import layout
    spec = ptc_pb2.JobSpec(name=name, tenant=tenant, ptc=build_ptc(state_dict, config, **kwargs))
    spec.layout.CopyFrom(layout.make_layout(config.tp, config.pp, config.dp, hosts,
                                            devices_per_host))
    return spec


# ------------------------------------------------------------------- synthetic


def synthetic_gpt(layers, hidden, heads, vocab, seq, dtype="float16", with_optimizer=True,
                  seed=0, ffn=None, num_query_groups=None, glu=False, world=None,
                  rng_state_bytes=64):
    """Global tensors of a small Megatron GPT with random values.

    Names as Megatron's GPT (`embedding.word_embeddings.weight`,
    `decoder.layers.N.self_attention.query_key_value.weight`, ...). With
    num_query_groups the QKV rows are [q, k, v] blocks (build it with
    ParallelConfig(num_attention_heads=heads, num_query_groups=...)); with
    glu fc1 is [gate; up] (2 x ffn rows). Values are finite (normal, std
    0.02) so array comparisons work; bfloat16 comes as uint16 bit patterns.
    with_optimizer adds fp32 optimizer.{master,exp_avg,exp_avg_sq}.<param>.
    Blobs: "step" and "data.consumed_samples" (8-byte ints as bytes) and,
    when world is given, "rng_state": a list of `world` per-rank values.
    """
    rng = np.random.default_rng(seed)
    enum = _dtypes.dtype_enum(dtype)
    ffn = ffn or 4 * hidden
    groups = num_query_groups or heads
    head_dim = hidden // heads
    qkv_rows = heads * head_dim + 2 * groups * head_dim

    def rand(shape, d=enum):
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        if d == ptc_pb2.DTYPE_BFLOAT16:
            return (x.view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(_dtypes.numpy_dtype(d))

    w = {
        "embedding.word_embeddings.weight": (vocab, hidden),
        "embedding.position_embeddings.weight": (seq, hidden),
    }
    for n in range(layers):
        p = f"decoder.layers.{n}."
        w.update({
            p + "input_layernorm.weight": (hidden,),
            p + "input_layernorm.bias": (hidden,),
            p + "self_attention.query_key_value.weight": (qkv_rows, hidden),
            p + "self_attention.query_key_value.bias": (qkv_rows,),
            p + "self_attention.dense.weight": (hidden, heads * head_dim),
            p + "self_attention.dense.bias": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.bias": (hidden,),
            p + "mlp.dense_h_to_4h.weight": ((2 if glu else 1) * ffn, hidden),
            p + "mlp.dense_h_to_4h.bias": ((2 if glu else 1) * ffn,),
            p + "mlp.dense_4h_to_h.weight": (hidden, ffn),
            p + "mlp.dense_4h_to_h.bias": (hidden,),
        })
    w.update({
        "decoder.final_layernorm.weight": (hidden,),
        "decoder.final_layernorm.bias": (hidden,),
        "output_layer.weight": (vocab, hidden),
    })
    out = {name: rand(shape) for name, shape in w.items()}
    if with_optimizer:
        for kind in OPTIMIZER_KINDS:
            for name, shape in w.items():
                out[f"optimizer.{kind}.{name}"] = rand(shape, ptc_pb2.DTYPE_FLOAT32)
    out["step"] = int(rng.integers(1, 10**6)).to_bytes(8, "little")
    out["data.consumed_samples"] = int(rng.integers(1, 10**9)).to_bytes(8, "little")
    if world:
        out["rng_state"] = [rng.integers(0, 256, rng_state_bytes, dtype=np.uint8).tobytes()
                            for _ in range(world)]
    return out


def synthetic_config(layers, heads, num_query_groups=None, glu=False, tp=1, pp=1, dp=1,
                     distributed_optimizer=False):
    """The ParallelConfig that build_ptc needs for a synthetic_gpt dict."""
    return ParallelConfig(tp=tp, pp=pp, dp=dp, num_layers=layers, num_attention_heads=heads,
                          num_query_groups=num_query_groups, glu=glu,
                          distributed_optimizer=distributed_optimizer)
