"""The benchmark's GPT-style state, without ever materialising it globally.

The PTC comes from reshard.megatron.build_ptc on shapes only (TensorMeta).
Every element's bytes are a hash of (tensor, global element index), so any
process can produce the shard of any rank in any layout, and any loaded
buffer can be checked, without the global tensors: local_indices() gives
the global element index of every element of a rank's local buffer (-1 for
padding), content() turns indices into bytes.
"""

import zlib

import numpy as np

from reshard import _dtypes, megatron
from reshard import layout as rlayout
from reshard._proto import ptc_pb2

SIZES = {
    # ~2.4 GB held by one data-parallel replica: 8 layers, hidden 1024,
    # vocab 32000, fp16 weights + fp32 master + two fp32 Adam moments.
    "full": dict(layers=8, hidden=1024, heads=16, vocab=32000, seq=2048),
    # ~1.65 GB: half the layers, for 8 hosts on a machine of 24 GB (the
    # 8-host transition holds four replicas twice, and the zero-copy job).
    "half": dict(layers=4, hidden=1024, heads=16, vocab=32000, seq=2048),
    # --quick: ~75 MB.
    "quick": dict(layers=4, hidden=256, heads=8, vocab=4096, seq=256),
}

BLOBS = {"step": (1234567).to_bytes(8, "little"),
         "data.consumed_samples": (987654321).to_bytes(8, "little")}


def gpt_shapes(layers, hidden, heads, vocab, seq):
    """{name: shape} of the weights, as reshard.megatron.synthetic_gpt names them."""
    ffn = 4 * hidden
    w = {"embedding.word_embeddings.weight": (vocab, hidden),
         "embedding.position_embeddings.weight": (seq, hidden)}
    for n in range(layers):
        p = f"decoder.layers.{n}."
        w.update({
            p + "input_layernorm.weight": (hidden,), p + "input_layernorm.bias": (hidden,),
            p + "self_attention.query_key_value.weight": (3 * hidden, hidden),
            p + "self_attention.query_key_value.bias": (3 * hidden,),
            p + "self_attention.dense.weight": (hidden, hidden),
            p + "self_attention.dense.bias": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.bias": (hidden,),
            p + "mlp.dense_h_to_4h.weight": (ffn, hidden), p + "mlp.dense_h_to_4h.bias": (ffn,),
            p + "mlp.dense_4h_to_h.weight": (hidden, ffn), p + "mlp.dense_4h_to_h.bias": (hidden,),
        })
    w.update({"decoder.final_layernorm.weight": (hidden,),
              "decoder.final_layernorm.bias": (hidden,),
              "output_layer.weight": (vocab, hidden)})
    return w


def build_ptc(size):
    """The Ptc of a SIZES[size] GPT with fp16 weights and fp32 Adam state."""
    s = SIZES[size]
    meta = {}
    shapes = gpt_shapes(**s)
    for name, shape in shapes.items():
        meta[name] = megatron.TensorMeta(shape, "float16")
    for kind in megatron.OPTIMIZER_KINDS:
        for name, shape in shapes.items():
            meta[f"optimizer.{kind}.{name}"] = megatron.TensorMeta(shape, "float32")
    meta.update(BLOBS)
    cfg = megatron.synthetic_config(layers=s["layers"], heads=s["heads"])
    return megatron.build_ptc(meta, cfg, per_rank_blobs=())


def state_bytes(ptc):
    """Bytes of one copy of the whole state (tensors and blobs)."""
    return (sum(int(np.prod(t.shape, dtype=np.int64)) * _dtypes.element_bytes(t.dtype)
                for t in ptc.tensors) + sum(b.size_bytes for b in ptc.blobs))


def local_indices(tensor, config, tp_i, dp_i):
    """Global flat element index of every element of (tp_i, dp_i)'s local
    buffer of `tensor`, as a flat int64 array (-1: padding past the end)."""
    tp, dp = max(config.tp, 1), max(config.dp, 1)
    n = int(np.prod(tensor.shape, dtype=np.int64))
    arr = np.arange(n, dtype=np.int64).reshape(tuple(tensor.shape))
    t_arr = rlayout.tp_local(tensor, tp, tp_i, arr)
    d = tensor.partition.dp
    if d.mode == ptc_pb2.DP_FLAT and dp > 1:
        flat = np.ascontiguousarray(t_arr).reshape(-1)
        chunk = -(-flat.size // dp)
        out = np.full(chunk, -1, dtype=np.int64)
        begin = min(flat.size, dp_i * chunk)
        end = min(flat.size, begin + chunk)
        out[:end - begin] = flat[begin:end]
        return out
    if d.mode == ptc_pb2.DP_SPLIT and dp > 1:
        start, size = rlayout.split(t_arr.shape[d.axis], dp, dp_i)
        t_arr = np.take(t_arr, np.arange(start, start + size), axis=d.axis)
    return np.ascontiguousarray(t_arr).reshape(-1)


def content(tensor_name, indices, element_bytes):
    """The bytes of the elements at `indices` (flat), as a uint16/uint32
    array: a 32-bit mix of (tensor, index); padding (-1) is zero."""
    seed = np.uint32(zlib.crc32(tensor_name.encode()))
    x = indices.astype(np.uint32)
    x *= np.uint32(0x9E3779B1)
    x += seed
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x85EBCA77)
    x ^= x >> np.uint32(13)
    x[indices < 0] = 0
    if element_bytes == 2:
        return x.astype(np.uint16)
    if element_bytes == 4:
        return x
    raise ValueError(f"tensor \"{tensor_name}\": {element_bytes}-byte elements not supported")


class RankView:
    """What one rank of a layout holds: the tensors of its pipeline stage
    (those with elements) and every blob, with their local shapes."""

    def __init__(self, ptc, layout, rank):
        self.ptc = ptc
        self.config = layout.config
        self.rank = rank
        self.tp_i, self.dp_i, pp_i = rlayout.coords(layout.config, rank)
        self.tensors = []
        for t in ptc.tensors:
            if pp_i not in rlayout.stages_holding(layout.config, ptc.num_layers,
                                                  t.partition.pipeline):
                continue
            shape = rlayout.local_shape(t, layout.config, self.tp_i, self.dp_i)
            if int(np.prod(shape, dtype=np.int64)):
                self.tensors.append((t, shape))

    def indices(self, cache=None):
        """Yields (tensor, local shape, flat global indices); tensors of one
        shape and partition (a weight and its optimizer states) share one
        index computation through `cache`."""
        cache = {} if cache is None else cache
        for t, shape in self.tensors:
            key = (tuple(t.shape), t.partition.SerializeToString())
            if key not in cache:
                cache.clear()  # consecutive tensors share keys; keep one
                cache[key] = local_indices(t, self.config, self.tp_i, self.dp_i)
            yield t, shape, cache[key]

    def generate(self):
        """{name: array} with this rank's bytes (local shape, raw uint dtype)
        and {blob: bytes}: what a worker of this rank publishes."""
        out = {}
        cache = {}
        for t, shape, idx in self.indices(cache):
            out[t.name] = content(t.name, idx, _dtypes.element_bytes(t.dtype)).reshape(shape)
        out.update(BLOBS)
        return out
