#!/usr/bin/env python3
"""Real framework layouts (issue 13), small enough for a local cluster:

- megatron-gpt: a Megatron-core GPT with vocabulary padding (1100 -> 1280 rows
  at tp 2, 1152 at tp 1), the distributed optimizer (bucketed fp32 main params
  and Adam moments, the tied embedding in buckets of its own), interleaved
  stages (vpp 2) and context parallelism (cp 2), grouped-query attention and
  SwiGLU: tp 2, cp 2, pp 2 -> tp 1, cp 2, dp 2, pp 2 (uneven chunks) -> tp 4,
  pp 2 (no cp, no vpp).
- mixtral-moe: a Mixtral-like MoE (4 experts, SwiGLU experts, router
  replicated) with ep 2 < dp 4 and expert tp 1 -> tp 2, dp 2, ep 2, expert tp 2
  -> dp 4, ep 4.
- t5: a T5-like encoder-decoder (3 + 3 layers) whose word embeddings are tied
  on the stages of the first encoder and the first decoder layer: tp 2, pp 2,
  dp 2 -> tp 1, pp 3, dp 2 -> tp 2, pp 3, vpp 2 (both tied layers on stage 0).
- fsdp: a torch 1.13 FSDP job (flat parameters of two wrapped units, Adam
  state): world 4 -> 6 -> 3.
- fsdp2-dtensor: the same model sharded per parameter on dim 0 (DTensor
  Shard(0), FSDP2: torch.chunk sizes, trailing ranks short or empty): 4 -> 6.

`EXAMPLES[name]()` returns (ptc, starting layout, [target layouts]) for hosts
h0, h1, ... with 2 devices each. Run this file with --write to (re)write the
JobSpec and target Layout JSON files under examples/framework-jobs/.
"""

import json
import os
import sys

from google.protobuf import json_format

from reshard import fsdp, layout, megatron
from reshard.v1 import ptc_pb2

HOSTS = [f"h{i}" for i in range(4)]


def megatron_gpt(hosts=HOSTS):
    m = megatron.GptModel(8, 32, 4, 1100, num_query_groups=2, glu=True, ffn_hidden=40, pp=2,
                          bucket_size=3000, max_position_embeddings=16)
    old = layout.make_layout(2, 2, 1, hosts[:4], 2, cp=2, vpp=2)
    new = layout.make_layout(1, 2, 2, hosts[:4], 2, cp=2, vpp=2,
                             stage_starts=[0, 3, 5, 6])  # uneven chunks
    tp4 = layout.make_layout(4, 2, 1, hosts[:4], 2)  # 1536 vocabulary rows, no cp, no vpp
    return megatron.gpt_ptc(m), old, [new, tp4]


def mixtral_moe(hosts=HOSTS):
    m = megatron.GptModel(2, 32, 4, 500, num_query_groups=2, glu=True, num_experts=4,
                          moe_ffn_hidden=24, tied_embeddings=False, bucket_size=4000)
    old = layout.make_layout(2, 1, 4, hosts[:4], 2, ep=2, expert_tp=1)  # edp 4
    new = layout.make_layout(2, 1, 2, hosts[1:3], 2, ep=2, expert_tp=2)  # edp 1
    ep4 = layout.make_layout(1, 1, 4, hosts[2:4], 2, ep=4, expert_tp=1)  # one expert a rank
    return megatron.gpt_ptc(m), old, [new, ep4]


def t5(hosts=HOSTS):
    m = megatron.GptModel(6, 32, 4, 700, pp=2, bucket_size=2000)
    old = layout.make_layout(2, 2, 2, hosts[:4], 2)
    new = layout.make_layout(1, 3, 2, hosts[:3], 2)
    vpp = layout.make_layout(2, 3, 1, hosts[1:4], 2, vpp=2)  # chunks 0 and 3 on stage 0
    return megatron.t5_ptc(m, encoder_layers=3), old, [new, vpp]


def fsdp_units():
    """The units torch 1.13 FSDP flattens for a small model with its
    transformer block wrapped (names and shapes of fsdp.units_of)."""
    f32 = "float32"
    return [("", [("embed.weight", ([97, 24], f32)), ("norm.weight", ([24], f32)),
                  ("head.weight", ([13, 24], f32)), ("head.bias", ([13], f32))]),
            ("block", [("block.0.weight", ([61, 24], f32)), ("block.0.bias", ([61], f32)),
                       ("block.2.weight", ([24, 61], f32)), ("block.2.bias", ([24], f32))])]


def fsdp_job(hosts=HOSTS):
    old = layout.make_layout(1, 1, 4, hosts[:2], 2)
    new = layout.make_layout(1, 1, 6, hosts[1:4], 2)
    back = layout.make_layout(1, 1, 3, ranks=[(hosts[0], 1), (hosts[3], 0), (hosts[3], 1)])
    return fsdp.flat_param_ptc(fsdp_units()), old, [new, back]


def fsdp2_job(hosts=HOSTS):
    """The same model sharded per parameter (DTensor Shard(0), FSDP2)."""
    params = {n: v for _, ps in fsdp_units() for n, v in ps}
    old = layout.make_layout(1, 1, 4, hosts[:2], 2)
    new = layout.make_layout(1, 1, 6, hosts[1:4], 2)
    return fsdp.dtensor_ptc(params), old, [new]


EXAMPLES = {"megatron-gpt": megatron_gpt, "mixtral-moe": mixtral_moe, "t5": t5,
            "fsdp": fsdp_job, "fsdp2-dtensor": fsdp2_job}


def as_json(message):
    return json.dumps(json_format.MessageToDict(message), indent=1, sort_keys=True) + "\n"


def files():
    """{relative path: JSON text} of every example's job and targets."""
    out = {}
    for name, make in EXAMPLES.items():
        ptc, old, targets = make()
        spec = ptc_pb2.JobSpec(name=name, tenant="examples", ptc=ptc, layout=old)
        out[f"framework-jobs/{name}/job.json"] = as_json(spec)
        for i, target in enumerate(targets):
            out[f"framework-jobs/{name}/to-{i + 1}.json"] = as_json(target)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: frameworks.py --write   (rewrites examples/framework-jobs/*)")
    here = os.path.dirname(os.path.abspath(__file__))
    for rel, text in files().items():
        path = os.path.join(here, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(path)
