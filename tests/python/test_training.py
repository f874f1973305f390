"""A real training loop across reconfigurations (issue 12): a tiny GPT-style
model in float64 (deploy/local/training/tiny_gpt.py: Megatron-style
column/row-parallel layers over torch.distributed with gloo, Adam, dropout)
trained by one process per rank on a real local cluster, driven by
deploy/local/training/elastic.py as a scheduler would: each phase ends with a
checkpoint that carries the step's dataset state (every rank publishes into
the new generation), then a resize or a host loss and recover; the next
phase's ranks load their shards through their agents and resume the
committed cursor.

Phases: tp 2 x dp 2 on 2 hosts -> tp 1 x dp 4 on 4 hosts -> host-3 lost
(agent SIGKILLed, shared memory removed) and recovered by the coordinator's
survivor policy to tp 1 x dp 3 -> tp 2 x dp 1 on one host; 3 steps each,
global batch 7 (dealt 4+3, 2+2+2+1, 3+2+2: no divisibility requirement).
Asserted: every step's loss equals an uninterrupted single-process run with
the same global batch to a relative 1e-9 (float64; only the order of sums
differs: dp all-reduces and tp splits of fc1/fc2; measured about 1e-16),
the final model and Adam state likewise, every sample of each epoch is read
exactly once, and dropout continues as a fresh run would (its masks are a
function of the seed and the sample's stream index, so a layout change that
altered them would break the loss match).
"""

import os
import sys

import numpy as np
import pytest

from reshard import layout

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy", "local", "training"))
import elastic  # noqa: E402
import tiny_gpt  # noqa: E402


def test_training_continues_across_reconfigurations(cluster, client, job_name, tmp_path):
    out = elastic.run(cluster, client, job_name, str(tmp_path), log=print)
    losses, want = out["losses"], out["want_losses"]
    print("step  loss (elastic)        loss (reference)      rel. diff")
    for s, (a, b) in enumerate(zip(losses, want), 1):
        print(f"{s:4d}  {a:.15f}  {b:.15f}  {abs(a - b) / abs(b):.1e}")
    for p in out["pauses"]:
        print(f"pause at {p['how']}: {p['pause_s']:.2f} s (checkpoint {p['checkpoint_s']:.2f} s, "
              f"reconfiguration {p['reconfigure_s']:.2f} s)")
    phases = len(elastic.scenario(cluster.host_ids))
    assert len(losses) == len(want) == elastic.STEPS * phases
    np.testing.assert_allclose(losses, want, rtol=1e-9, atol=0)
    # The cursor travelled with the model: each phase's checkpoint committed
    # the step after it, and the lost host's phase was recovered to dp 3.
    recovered = out["committed"][2]["layout"]
    assert (recovered.config.tp, recovered.config.dp) == (1, 3)
    assert cluster.host_ids[3] not in layout.hosts_of(recovered)
    committed = client.dataset_state(out["job"].id)
    assert (committed.step, committed.committed_generation) == (len(losses), out["generation"])
    # Exactly once: 12 steps x 7 = 84 samples = 4 epochs of 21.
    ids = out["ids"]
    assert len(ids) == len(losses) * elastic.BATCH
    for e in range(len(ids) // elastic.N):
        assert sorted(ids[e * elastic.N:(e + 1) * elastic.N]) == list(range(elastic.N)), e
    # The final model and Adam state, loaded through the agents, match.
    last, ptc = out["layout"], out["ptc"]
    for host in layout.hosts_of(last):
        with cluster.worker(host, out["job"].id, ptc=ptc) as w:
            for rank, _ in layout.ranks_on_host(last, host):
                got = w.load(rank, out["generation"])
                want_shard = layout.shard(ptc, last, rank, out["want_final"])
                for name in tiny_gpt.param_names():
                    for key in (name, f"optimizer.exp_avg.{name}", f"optimizer.exp_avg_sq.{name}"):
                        np.testing.assert_allclose(got[key], want_shard[key], rtol=1e-9,
                                                   atol=1e-12, err_msg=key)
                assert int.from_bytes(bytes(got["step"]), "little") == len(losses)
