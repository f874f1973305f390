"""The user's own code of the quickstart (docs/pytorch.md): a tiny decoder-only
transformer in float64, its FSDP2 + tensor-parallel plan, the samples and one
training step. Nothing here knows reshard beyond reading a DatasetState's
share; the test (tests/python/test_pytorch_training.py) also runs it
unparallelized, in one process, as the uninterrupted reference.
"""

import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, LAYERS, SEQ = 32, 16, 4, 2, 9
SEED, LR = 7, 1e-2
NUM_SAMPLES, GLOBAL_BATCH = 24, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.o = nn.Linear(DIM, DIM, bias=False)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        # Under tensor parallelism q/k/v hold this rank's heads only.
        q, k, v = (p(h).view(b, t, -1, DIM // HEADS).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build():
    """The same initial weights on every rank (and in the reference)."""
    _phase("build")
    torch.manual_seed(SEED)
    return Transformer().double()


def parallelize(model, mesh):
    """Tensor parallel over mesh["tp"] (heads and MLP columns), then FSDP2
    over the data-parallel dims (HSDP when the mesh has dp_replicate)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "o": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in model.layers:
        parallelize_module(block, mesh["tp"], plan)
    names = mesh.mesh_dim_names
    dp_mesh = mesh["dp_replicate", "dp_shard"] if "dp_replicate" in names else mesh["dp"]
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def optimizer(model):
    _phase("optimizer")
    return torch.optim.Adam(model.parameters(), lr=LR)


def tokens(ids):
    """Sample i's tokens: a function of i only."""
    rows = []
    for i in ids:
        g = torch.Generator().manual_seed(1000 + int(i))
        rows.append(torch.randint(0, VOCAB, (SEQ,), generator=g))
    return torch.stack(rows) if rows else torch.zeros((0, SEQ), dtype=torch.int64)


def train_step(model, opt, ids, dp_size=1, tp_size=1):
    """One step on this data-parallel rank's samples `ids` of a global batch
    of GLOBAL_BATCH; returns the global batch's mean loss (the same on every
    rank). FSDP averages gradients over dp: the local loss is scaled so the
    average is the global batch's mean whatever each rank's share."""
    _phase("first step")
    x = tokens(ids)
    logits = model(x[:, :-1])
    loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                               reduction="sum")
    (loss_sum * (dp_size / (GLOBAL_BATCH * (SEQ - 1)))).backward()
    opt.step()
    opt.zero_grad()
    total = loss_sum.detach().clone()
    if dp_size * tp_size > 1:
        import torch.distributed as dist
        dist.all_reduce(total)  # every tp rank of a dp rank holds the same sum
    return total.item() / tp_size / (GLOBAL_BATCH * (SEQ - 1))


_last = [None]
_phased = set()


def _phase(name):
    """Appends {"phase": name, "t", "rank", "world_key"} to $TRAIN_LOG the
    first time this world's rank gets there (the test splits a pause into
    its parts: process group and mesh ready at build(), parallelized at
    optimizer(), loaded at the first train_step())."""
    path = os.environ.get("TRAIN_LOG")
    key = (f"{os.environ.get('RESHARD_GENERATION', '')}/"
           f"{os.environ.get('RESHARD_OPERATION_ID', '')}")
    if not path or (key, name) in _phased:
        return
    _phased.add((key, name))
    with open(path, "a") as f:
        f.write(json.dumps({"phase": name, "t": time.time(), "rank": os.environ.get("RANK"),
                            "world_key": key}) + "\n")


def report(**record):
    """Appends one JSON line to $TRAIN_LOG (the test reads it); no-op without.
    The job's first world (a fresh start) keeps a cadence of $MIN_STEP_S
    per step, a real job's pace, so that it is still training when the test
    reconfigures it; later worlds run at full speed."""
    # The pace first, as if the step had taken that long: a step's record is
    # stamped when it ends, right before its step_end (the pauses are
    # measured from it).
    pace = float(os.environ.get("MIN_STEP_S", "0"))
    if pace and "loss" in record and os.environ.get("RESHARD_GENERATION") == "0" and (
            not os.environ.get("RESHARD_OPERATION_ID")):
        now = time.monotonic()
        if _last[0] is not None:
            time.sleep(max(0.0, pace - (now - _last[0])))
        _last[0] = time.monotonic()
    path = os.environ.get("TRAIN_LOG")
    record.setdefault("t", time.time())  # the test measures the pauses from it
    record["world_key"] = (f"{os.environ.get('RESHARD_GENERATION', '')}/"
                           f"{os.environ.get('RESHARD_OPERATION_ID', '')}")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
