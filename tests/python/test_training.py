"""A real training loop across reconfigurations (issue 12): a tiny GPT-style
model in float64 (tests/python/training/tiny_gpt.py: Megatron-style
column/row-parallel layers over torch.distributed with gloo, Adam, dropout)
trained by one process per rank on a real local cluster. Between phases the
driver acts as the scheduler: it checkpoints the step's model state together
with the dataset cursor (Checkpoint with a step: every rank publishes into
the new generation), then resizes; the next phase's ranks load their shards
through their agents and continue from the committed cursor.

Phases: tp 2 x dp 2 on 2 hosts -> tp 1 x dp 3 on 3 hosts -> tp 2 x dp 1 on
one host, 3 steps each, global batch 7 (dealt 4+3 and 3+2+2: no
divisibility). Asserted: every step's loss equals an uninterrupted
single-process run with the same global batch to a relative 1e-9 (float64;
only the order of sums differs: dp all-reduces and tp splits of fc1/fc2),
the final model and Adam state likewise, every sample of each epoch is
consumed exactly once, and dropout continues as a fresh run would (its masks
are a function of the seed and the sample's stream index, so a layout change
that altered them would break the loss match).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import reshard
from reshard import data, layout, megatron

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "training"))
torch = pytest.importorskip("torch")
import tiny_gpt  # noqa: E402

SEED, N, BATCH, STEPS = 11, 21, 7, 3


def dataset_state():
    return data.DatasetState(data.DatasetDescriptor("tiny-tokens", N, "gen:1000003"),
                             data.Order(seed=5, shuffle="full"), global_batch=BATCH)


def reference(steps):
    """The uninterrupted run: one process, tp 1, dp 1."""
    model = tiny_gpt.Model(tiny_gpt.init_global(SEED), 1, 0, None)
    state, losses = dataset_state(), []
    for _ in range(steps):
        loss, _ = tiny_gpt.train_step(model, state, 1, 0, None, SEED)
        losses.append(loss)
        state = state.advanced()
    return losses, model.shard()


def run_phase(cluster, client, job, ptc, lay, load_generation, state, tmp_path, name):
    """Runs one phase's ranks; returns (losses, ids read, committed op)."""
    world = lay.config.tp * lay.config.dp
    store = tmp_path / f"{name}.store"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = []
    for rank in range(world):
        cfg = {"rank": rank, "layout": reshard.to_dict(lay), "ptc": reshard.to_dict(ptc),
               "store": str(store), "job_id": job.id, "seed": SEED, "steps": STEPS,
               "worker_token": cluster.worker_token(job.id),
               "sockets": {h: cluster.agents[h].worker_socket for h in cluster.host_ids},
               "load_generation": load_generation, "dataset_state": state.to_dict()}
        path = tmp_path / f"{name}-rank{rank}.json"
        path.write_text(json.dumps(cfg))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "training", "elastic_rank.py"), str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
    losses, ids = [], []
    try:
        for p in procs:
            for line in p.stdout:
                if line.strip() == "READY":
                    break
                out = json.loads(line)
                if "loss" in out:
                    losses.append(out["loss"])
                ids.extend(out.get("ids", []))
            else:
                raise AssertionError(f"{name}: a rank exited before READY (rc {p.wait()})")
        after = state.advanced(STEPS)
        op = client.checkpoint(job.id, dataset_state=after)
        for p in procs:
            p.stdin.write(f"PUBLISH {op.to_generation}\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "PUBLISHED"
            assert p.wait(timeout=120) == 0
        final = client.wait(op.id, timeout=120, raise_on_failure=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return losses, ids, final


def test_training_continues_across_reconfigurations(cluster, client, job_name, tmp_path):
    h = cluster.host_ids
    phases = [layout.make_layout(2, 1, 2, h[:2], 2),
              layout.make_layout(1, 1, 3, h[1:4], 1),
              layout.make_layout(2, 1, 1, h[3:4], 2)]
    ptc = megatron.build_ptc(tiny_gpt.init_global(SEED), overrides=tiny_gpt.replicated_overrides(),
                             per_rank_blobs=())
    job = client.register_job({"name": job_name, "tenant": "pytest", "ptc": reshard.to_dict(ptc),
                               "layout": reshard.to_dict(phases[0])},
                              dataset_state=dataset_state())
    want_losses, want_final = reference(STEPS * len(phases))

    losses, ids, generation = [], [], 0
    state = data.resume(client.dataset_state(job.id), dataset_state())
    for i, lay in enumerate(phases):
        if i > 0:
            op = client.wait(client.resize(job.id, lay).id, timeout=120, raise_on_failure=True)
            generation = op.to_generation
            state = data.resume(client.dataset_state(job.id), dataset_state())
            assert state.step == STEPS * i  # the cursor came along with the model
        got, read, committed = run_phase(cluster, client, job, ptc, lay, generation, state,
                                         tmp_path, f"phase{i}")
        losses += got
        ids += read
        state = data.resume(client.dataset_state(job.id), dataset_state())
        assert (state.step, state.committed_generation) == (STEPS * (i + 1),
                                                             committed.to_generation)
        generation = committed.to_generation

    print("step  loss (elastic)        loss (reference)      rel. diff")
    for s, (a, b) in enumerate(zip(losses, want_losses), 1):
        print(f"{s:4d}  {a:.15f}  {b:.15f}  {abs(a - b) / abs(b):.1e}")
    assert len(losses) == len(want_losses)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-9, atol=0)
    # Exactly once: 9 steps x 7 = 63 samples = 3 epochs of 21.
    assert len(ids) == STEPS * len(phases) * BATCH
    for e in range(len(ids) // N):
        assert sorted(ids[e * N:(e + 1) * N]) == list(range(N)), f"epoch {e}"
    # The final model and Adam state, loaded through the agents, match the reference.
    last = phases[-1]
    for host in layout.hosts_of(last):
        with cluster.worker(host, job.id, ptc=ptc) as w:
            for rank, _ in layout.ranks_on_host(last, host):
                got = w.load(rank, generation)
                want = layout.shard(ptc, last, rank, want_final)
                for name in tiny_gpt.param_names():
                    for key in (name, f"optimizer.exp_avg.{name}", f"optimizer.exp_avg_sq.{name}"):
                        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12,
                                                   err_msg=key)
                assert int.from_bytes(bytes(got["step"]), "little") == STEPS * len(phases)
