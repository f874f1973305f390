#!/usr/bin/env python3
"""Writes the example jobs and targets under examples/ (stdlib only).

Two models with Megatron-style tensor names:
  gpt3-xl/    GPT-3 XL (1.3B): fp16 weights; fp32 master weights and Adam
              moments replicated across data parallel (classic optimizer).
  llama3-8b/  Llama-3-8B-like: bf16 weights; fp32 master weights and Adam
              moments split flat across data parallel (distributed optimizer).

Each has job.json (a reshard.v1.JobSpec: PTC + starting layout) and several
targets (reshard.v1.Layout), all in the protobuf JSON mapping. index.json
lists every target with its --lost argument; README.md is written from it.

  make_examples.py            rewrite the files next to this script
  make_examples.py --out DIR  write them under DIR instead
  make_examples.py --check    exit 1 if the committed files are out of date
"""

import argparse
import json
import os
import sys

RNG_STATE_BYTES = 5120  # torch CPU + CUDA generator states, python and numpy RNG


# ---------------------------------------------------------------- partitions


def partition(tp=None, axis=0, blocks=None, pipeline="layer", layer=0, dp="DP_REPLICATED",
              dp_axis=0):
    """A PartitionSpec; tp is None (replicated) or "split"."""
    tp_spec = {"mode": "TP_REPLICATED"}
    if tp == "split":
        tp_spec = {"mode": "TP_SPLIT", "axis": axis}
        if blocks:
            tp_spec["blocks"] = list(blocks)
    if pipeline == "layer":
        pipe = {"mode": "PIPELINE_LAYER", "layer": layer}
    else:
        pipe = {"mode": {"first": "PIPELINE_FIRST_STAGE", "last": "PIPELINE_LAST_STAGE",
                         "every": "PIPELINE_EVERY_STAGE"}[pipeline]}
    dp_spec = {"mode": dp}
    if dp == "DP_SPLIT":
        dp_spec["axis"] = dp_axis
    return {"tp": tp_spec, "pipeline": pipe, "dp": dp_spec}


def tensor(name, dtype, shape, part):
    return {"name": name, "dtype": dtype, "shape": list(shape), "partition": part}


def with_optimizer(weights, optimizer_dp):
    """The weights, then fp32 master weights and both Adam moments of each.

    The optimizer state has each weight's tensor-parallel and pipeline rule;
    across data parallel it is replicated (classic Megatron optimizer) or
    DP_FLAT (distributed optimizer)."""
    out = list(weights)
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        for w in weights:
            part = json.loads(json.dumps(w["partition"]))
            part["dp"] = {"mode": optimizer_dp}
            out.append(tensor(f"optimizer.{kind}.{w['name']}", "DTYPE_FLOAT32", w["shape"], part))
    return out


def blobs():
    return [
        {"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"},
        {"name": "data.consumed_samples", "sizeBytes": 8, "scope": "BLOB_REPLICATED"},
        {"name": "rng_state", "sizeBytes": RNG_STATE_BYTES, "scope": "BLOB_PER_RANK"},
    ]


# -------------------------------------------------------------------- models


def gpt3_xl_ptc():
    layers, h, seq, vocab = 24, 2048, 2048, 50257
    f16 = "DTYPE_FLOAT16"
    w = [
        tensor("embedding.word_embeddings.weight", f16, [vocab, h],
               partition("split", 0, pipeline="first")),
        tensor("embedding.position_embeddings.weight", f16, [seq, h], partition(pipeline="first")),
    ]
    for n in range(layers):
        p = f"decoder.layers.{n}."
        col = partition("split", 0, layer=n)  # column-parallel: output rows split
        row = partition("split", 1, layer=n)  # row-parallel: input columns split
        rep = partition(layer=n)
        w += [
            tensor(p + "input_layernorm.weight", f16, [h], rep),
            tensor(p + "input_layernorm.bias", f16, [h], rep),
            tensor(p + "self_attention.query_key_value.weight", f16, [3 * h, h], col),
            tensor(p + "self_attention.query_key_value.bias", f16, [3 * h], col),
            tensor(p + "self_attention.dense.weight", f16, [h, h], row),
            tensor(p + "self_attention.dense.bias", f16, [h], rep),
            tensor(p + "post_attention_layernorm.weight", f16, [h], rep),
            tensor(p + "post_attention_layernorm.bias", f16, [h], rep),
            tensor(p + "mlp.dense_h_to_4h.weight", f16, [4 * h, h], col),
            tensor(p + "mlp.dense_h_to_4h.bias", f16, [4 * h], col),
            tensor(p + "mlp.dense_4h_to_h.weight", f16, [h, 4 * h], row),
            tensor(p + "mlp.dense_4h_to_h.bias", f16, [h], rep),
        ]
    w += [
        tensor("decoder.final_layernorm.weight", f16, [h], partition(pipeline="last")),
        tensor("decoder.final_layernorm.bias", f16, [h], partition(pipeline="last")),
        tensor("output_layer.weight", f16, [vocab, h], partition("split", 0, pipeline="last")),
    ]
    return {"numLayers": layers, "tensors": with_optimizer(w, "DP_REPLICATED"), "blobs": blobs()}


def llama3_8b_ptc():
    layers, h, heads, kv_heads, head_dim, ffn, vocab = 32, 4096, 32, 8, 128, 14336, 128256
    q, kv = heads * head_dim, kv_heads * head_dim
    bf16 = "DTYPE_BFLOAT16"
    w = [
        tensor("embedding.word_embeddings.weight", bf16, [vocab, h],
               partition("split", 0, pipeline="first")),
    ]
    for n in range(layers):
        p = f"decoder.layers.{n}."
        w += [
            tensor(p + "input_layernorm.weight", bf16, [h], partition(layer=n)),
            # Fused QKV with grouped-query attention: q, k and v are split
            # across tp separately, so every rank keeps whole KV heads.
            tensor(p + "self_attention.linear_qkv.weight", bf16, [q + 2 * kv, h],
                   partition("split", 0, blocks=[q, kv, kv], layer=n)),
            tensor(p + "self_attention.linear_proj.weight", bf16, [h, q],
                   partition("split", 1, layer=n)),
            tensor(p + "pre_mlp_layernorm.weight", bf16, [h], partition(layer=n)),
            # SwiGLU: gate and up projections fused, each split across tp.
            tensor(p + "mlp.linear_fc1.weight", bf16, [2 * ffn, h],
                   partition("split", 0, blocks=[ffn, ffn], layer=n)),
            tensor(p + "mlp.linear_fc2.weight", bf16, [h, ffn], partition("split", 1, layer=n)),
        ]
    w += [
        tensor("decoder.final_layernorm.weight", bf16, [h], partition(pipeline="last")),
        tensor("output_layer.weight", bf16, [vocab, h], partition("split", 0, pipeline="last")),
    ]
    return {"numLayers": layers, "tensors": with_optimizer(w, "DP_FLAT"), "blobs": blobs()}


# ------------------------------------------------------------------- layouts


def layout(tp, pp, dp, hosts, devices_per_host, stage_starts=None):
    config = {"tp": tp, "pp": pp, "dp": dp}
    if stage_starts:
        config["stageStarts"] = list(stage_starts)
    assert tp * pp * dp == len(hosts) * devices_per_host, (tp, pp, dp, hosts)
    return {"config": config,
            "placement": {"hosts": list(hosts), "devicesPerHost": devices_per_host}}


def names(prefix, first, count):
    return [f"{prefix}-{i}" for i in range(first, first + count)]


def gpt3_xl():
    node = lambda first, count: names("node", first, count)  # noqa: E731
    job = {"name": "gpt3-xl", "tenant": "examples", "ptc": gpt3_xl_ptc(),
           "layout": layout(2, 2, 4, node(0, 4), 4)}
    targets = [
        # Stage 0 is ranks 0-15 (the first four hosts listed), stage 1 ranks
        # 16-31: listing the old hosts where they held the same stage keeps
        # their state in place, so only the new hosts receive bytes.
        ("to-dp8.json", layout(2, 2, 8, ["node-0", "node-1", "node-4", "node-5",
                                         "node-2", "node-3", "node-6", "node-7"], 4), "",
         "grow data parallel 4 -> 8: four more hosts join, each old host keeps "
         "its pipeline stage"),
        ("to-tp4.json", layout(4, 2, 2, node(0, 4), 4), "",
         "tensor parallel 2 -> 4 (dp 4 -> 2) on the same 16 GPUs"),
        ("to-pp4-uneven.json", layout(2, 4, 2, node(0, 4), 4, [0, 5, 11, 18]), "",
         "pipeline 2 -> 4 with uneven stages (5, 6, 7, 6 layers), dp 4 -> 2"),
        ("to-new-hosts.json", layout(2, 2, 4, node(4, 4), 4), "",
         "same configuration, migrated to four new hosts node-4..node-7"),
        ("after-lost-node-3.json", layout(2, 2, 3, node(0, 3), 4), "node-3",
         "node-3 is lost: shrink to dp 3 on the 3 survivors (data-parallel "
         "replicas hold everything it had)"),
    ]
    return "gpt3-xl", job, targets


def llama3_8b():
    dgx = lambda first, count: names("dgx", first, count)  # noqa: E731
    job = {"name": "llama3-8b", "tenant": "examples", "ptc": llama3_8b_ptc(),
           "layout": layout(4, 2, 2, dgx(0, 2), 8)}
    targets = [
        ("to-dp4.json", layout(4, 2, 4, ["dgx-0", "dgx-2", "dgx-1", "dgx-3"], 8), "",
         "grow data parallel 2 -> 4 onto two more hosts, each old host keeping "
         "its stage; the flat optimizer shards are re-cut into quarters"),
        ("to-tp2.json", layout(2, 2, 4, dgx(0, 2), 8), "",
         "tensor parallel 4 -> 2 (dp 2 -> 4): fused QKV (GQA) and gate/up "
         "blocks re-split"),
        ("to-pp4-uneven.json", layout(4, 4, 1, dgx(0, 2), 8, [0, 7, 15, 24]), "",
         "pipeline 2 -> 4 with uneven stages (7, 8, 9, 8 layers), dp 2 -> 1"),
        ("to-new-hosts.json", layout(4, 2, 2, dgx(2, 2), 8), "",
         "same configuration, migrated to two new hosts dgx-2, dgx-3"),
    ]
    return "llama3-8b", job, targets


# ------------------------------------------------------------------- writing


def dump(obj):
    """Indented JSON with every tensor, blob and short list on one line."""

    def enc(value, indent):
        pad = "  " * indent
        if isinstance(value, dict):
            if "name" in value and ("partition" in value or "sizeBytes" in value):
                return json.dumps(value)
            items = [f'{pad}  {json.dumps(k)}: {enc(v, indent + 1)}' for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = [pad + "  " + enc(v, indent + 1) for v in value]
            return "[\n" + ",\n".join(items) + "\n" + pad + "]"
        return json.dumps(value)

    return enc(obj, 0) + "\n"


CMD = "build/client/cli/reshardctl plan --spec examples/{job} --to examples/{target}{lost}"


def readme(index):
    lines = [
        "# Examples",
        "",
        "Generated by `make_examples.py` (do not edit by hand; run",
        "`.venv/bin/python examples/make_examples.py` after changing it).",
        "",
        "- `gpt3-xl/`: GPT-3 XL (24 layers, hidden 2048, 16 heads, seq 2048, vocab",
        "  50257), fp16 weights, fp32 master weights and Adam moments replicated across",
        "  data parallel (classic Megatron optimizer). Starts at tp 2, pp 2, dp 4 on 4",
        "  hosts x 4 GPUs (`node-0`..`node-3`).",
        "- `llama3-8b/`: Llama-3-8B-like (32 layers, hidden 4096, 32 query / 8 KV heads,",
        "  ffn 14336, vocab 128256), bf16 weights, fp32 master weights and Adam moments",
        "  split flat across data parallel (distributed optimizer). Starts at tp 4, pp 2,",
        "  dp 2 on 2 hosts x 8 GPUs (`dgx-0`, `dgx-1`).",
        "",
        "`job.json` is a `reshard.v1.JobSpec` (PTC + current layout), every other file",
        "a target `reshard.v1.Layout`, in the protobuf JSON mapping. `index.json` lists",
        "the targets for scripts and tests. From the repository root, after",
        "`./scripts/build.sh` (the binary is `build/client/cli/reshardctl`):",
        "",
    ]
    for e in index:
        lost = f" --lost {e['lost']}" if e["lost"] else ""
        lines += [f"- `{e['target']}`: {e['what']}.", "  ```",
                  "  " + CMD.format(job=e["job"], target=e["target"], lost=lost), "  ```"]
    lines += [
        "",
        "Add `--format json` to any command for the full `reshard.v1.TransferPlan`.",
        "",
        "Losing a host of the Llama job cannot be recovered from: its optimizer state",
        "is split across data parallel without replicas, and each host holds a whole",
        "pipeline stage. The planner says so and lists every lost tensor region",
        "(exit status 1, `FAILED_PRECONDITION`):",
        "```",
        CMD.format(job="llama3-8b/job.json", target="llama3-8b/to-new-hosts.json",
                   lost=" --lost dgx-1"),
        "```",
        "",
    ]
    return "\n".join(lines)


def generate():
    """{relative path: contents}."""
    files, index = {}, []
    for model in (gpt3_xl, llama3_8b):
        name, job, targets = model()
        files[f"{name}/job.json"] = dump(job)
        for filename, target, lost, what in targets:
            files[f"{name}/{filename}"] = dump(target)
            index.append({"job": f"{name}/job.json", "target": f"{name}/{filename}",
                          "lost": lost, "what": what})
    files["index.json"] = dump({"examples": index})
    files["README.md"] = readme(index)
    return files


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=here, help="directory to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="compare with the files under --out instead of writing")
    args = parser.parse_args()
    stale = []
    for rel, text in generate().items():
        path = os.path.join(args.out, rel)
        if args.check:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() == text:
                        continue
            except OSError:
                pass
            stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    if stale:
        print(f"out of date under {args.out}: {', '.join(stale)}; "
              f"run {os.path.join(here, 'make_examples.py')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
