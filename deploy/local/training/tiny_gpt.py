"""A tiny GPT-style language model in float64 with Megatron-style tensor
parallelism written with torch.distributed primitives, for the elastic
training test (tests/python/test_training.py).

Per layer: h = h + fc2(dropout(gelu(fc1(causal_mean(h))))): fc1 is
column-parallel (each tp rank holds a slice of its output rows), fc2
row-parallel (a slice of its input columns, outputs summed over tp); the
embedding, fc2's bias and the output head are replicated. Names follow
Megatron so reshard.megatron.build_ptc cuts them (the embedding and head are
declared replicated). Dropout masks are a function of (seed, stream index of
the sample, layer) on the full width, so they do not depend on tp or dp:
a run continues as a fresh run with the same seed would.
"""

import numpy as np
import torch
import torch.distributed as dist

VOCAB, HIDDEN, FFN, LAYERS, SEQ = 32, 16, 32, 2, 8
DROPOUT = 0.1
LR, BETA1, BETA2, EPS = 1e-2, 0.9, 0.999, 1e-8


def param_names():
    names = ["embedding.word_embeddings_rep.weight"]
    for n in range(LAYERS):
        p = f"decoder.layers.{n}.mlp."
        names += [p + "dense_h_to_4h.weight", p + "dense_h_to_4h.bias",
                  p + "dense_4h_to_h.weight", p + "dense_4h_to_h.bias"]
    return names + ["head.weight"]


def init_global(seed):
    """Global float64 parameters and zero Adam moments, and the step blob."""
    rng = np.random.default_rng(seed)
    shapes = {"embedding.word_embeddings_rep.weight": (VOCAB, HIDDEN), "head.weight": (VOCAB, HIDDEN)}
    for n in range(LAYERS):
        p = f"decoder.layers.{n}.mlp."
        shapes.update({p + "dense_h_to_4h.weight": (FFN, HIDDEN), p + "dense_h_to_4h.bias": (FFN,),
                       p + "dense_4h_to_h.weight": (HIDDEN, FFN), p + "dense_4h_to_h.bias": (HIDDEN,)})
    out = {}
    for name in param_names():
        out[name] = rng.standard_normal(shapes[name]) * 0.2
    for kind in ("exp_avg", "exp_avg_sq"):
        for name in param_names():
            out[f"optimizer.{kind}.{name}"] = np.zeros(shapes[name])
    out["step"] = (0).to_bytes(8, "little")
    return out


def replicated_overrides():
    rep = {"tp": {"mode": "TP_REPLICATED"}, "pipeline": {"mode": "PIPELINE_EVERY_STAGE"},
           "dp": {"mode": "DP_REPLICATED"}}
    names = ["embedding.word_embeddings_rep.weight", "head.weight"]
    return {n: rep for base in names for n in (base, f"optimizer.exp_avg.{base}",
                                                 f"optimizer.exp_avg_sq.{base}")}


def sample_tokens(sample_id):
    """The deterministic dataset: sample i is SEQ + 1 tokens."""
    return np.random.default_rng(1_000_003 + sample_id).integers(0, VOCAB, SEQ + 1)


class _CopyToTp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class Model:
    """One rank's shard of the model: tensors from a reshard shard dict."""

    def __init__(self, shard, tp, tp_i, tp_group):
        self.tp, self.tp_i, self.group = tp, tp_i, tp_group
        self.params = {n: torch.tensor(np.array(shard[n]), dtype=torch.float64, requires_grad=True)
                       for n in param_names()}
        self.m = {n: torch.tensor(np.array(shard[f"optimizer.exp_avg.{n}"]), dtype=torch.float64)
                  for n in param_names()}
        self.v = {n: torch.tensor(np.array(shard[f"optimizer.exp_avg_sq.{n}"]),
                                  dtype=torch.float64) for n in param_names()}
        self.step = int.from_bytes(bytes(shard["step"]), "little")

    def _tp_in(self, x):
        return _CopyToTp.apply(x, self.group) if self.tp > 1 else x

    def _tp_out(self, x):
        return _ReduceFromTp.apply(x, self.group) if self.tp > 1 else x

    def loss_sum(self, tokens, stream_indices, seed):
        """Sum over samples and positions of the cross entropy."""
        P = self.params
        x = torch.tensor(tokens[:, :-1])
        y = torch.tensor(tokens[:, 1:])
        h = P["embedding.word_embeddings_rep.weight"][x]
        counts = torch.arange(1, SEQ + 1, dtype=torch.float64).view(1, SEQ, 1)
        f_lo = self.tp_i * (FFN // self.tp)
        f_hi = f_lo + FFN // self.tp
        for n in range(LAYERS):
            p = f"decoder.layers.{n}.mlp."
            mixed = torch.cumsum(h, dim=1) / counts
            a = self._tp_in(mixed) @ P[p + "dense_h_to_4h.weight"].T + P[p + "dense_h_to_4h.bias"]
            a = torch.nn.functional.gelu(a)
            masks = []
            for s in stream_indices:
                g = torch.Generator().manual_seed(int((seed * 1_000_003 + s) * 97 + n) % (2**63))
                full = torch.rand(SEQ, FFN, generator=g, dtype=torch.float64) >= DROPOUT
                masks.append(full[:, f_lo:f_hi])
            a = a * torch.stack(masks).to(torch.float64) / (1 - DROPOUT)
            out = self._tp_out(a @ P[p + "dense_4h_to_h.weight"].T) + P[p + "dense_4h_to_h.bias"]
            h = h + out
        logits = h @ P["head.weight"].T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                                 reduction="sum")

    def adam(self):
        """One Adam step on the (already reduced) gradients; elementwise, so
        a tp shard updates exactly as the same slice of the full model."""
        self.step += 1
        t = self.step
        with torch.no_grad():
            for n, p in self.params.items():
                g = p.grad
                self.m[n].mul_(BETA1).add_(g, alpha=1 - BETA1)
                self.v[n].mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
                mhat = self.m[n] / (1 - BETA1 ** t)
                vhat = self.v[n] / (1 - BETA2 ** t)
                p.sub_(LR * mhat / (vhat.sqrt() + EPS))
                p.grad = None

    def shard(self):
        out = {}
        for n in param_names():
            out[n] = self.params[n].detach().numpy().copy()
            out[f"optimizer.exp_avg.{n}"] = self.m[n].numpy().copy()
            out[f"optimizer.exp_avg_sq.{n}"] = self.v[n].numpy().copy()
        out["step"] = self.step.to_bytes(8, "little")
        return out


def train_step(model, state, dp, dp_i, dp_group, seed):
    """One step of the global batch at state.cursor: this dp rank's share,
    gradients summed over dp and scaled by 1 / (global batch x SEQ).
    Returns (global mean loss, the sample ids this rank read)."""
    share = state.share(dp, dp_i)
    ids = state.samples(share.begin, share.end)
    scale = 1.0 / (state.global_batch * SEQ)
    if ids:
        tokens = np.stack([sample_tokens(i) for i in ids])
        loss = model.loss_sum(tokens, list(range(share.begin, share.end)), seed) * scale
        loss.backward()
        value = loss.detach().clone()
    else:  # B < dp: this rank has no samples this step
        value = torch.zeros((), dtype=torch.float64)
        for p in model.params.values():
            p.grad = torch.zeros_like(p)
    if dp > 1:
        for p in model.params.values():
            dist.all_reduce(p.grad, group=dp_group)
        dist.all_reduce(value, group=dp_group)
    model.adam()
    return float(value), ids
