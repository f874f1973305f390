"""A real training loop across reconfigurations (issue 12): a tiny GPT-style
model in float64 (deploy/local/training/tiny_gpt.py: Megatron-style
column/row-parallel layers over torch.distributed with gloo, Adam,
dropout) trained by one process per rank on a real local cluster
(PostgreSQL, coordinator, agents), each rank written against the loop API
(reshard.elastic), driven by deploy/local/training/elastic.py as a
scheduler would.

One job, in one run: tp 2 x dp 2 on 2 hosts trains on while a STOP-FREE
resize to tp 1 x dp 4 on 4 hosts is prepared (new ranks started and warm)
and cut over at a step boundary -> host-3 lost (agent SIGKILLed, shared
memory removed) and recovered by the coordinator's survivor policy to tp 1 x
dp 3 -> a STOP-THE-WORLD resize (plain Resize, cold ranks) to tp 2 x dp 1
on one host. Global batch 7 (dealt 4+3, 2+2+2+1, 3+2+2: no divisibility
requirement).
Asserted: every step's loss equals an uninterrupted single-process run with
the same global batch to a relative 1e-9 (float64; only the order of sums
differs: dp all-reduces and tp splits of fc1/fc2; measured about 1e-16 over
a few steps, the bound leaves room for the tens of steps the first layout
trains while the second warms up), the final model and Adam state likewise,
every sample of each epoch is read exactly once, dropout continues as a
fresh run would (its masks are a function of the seed and the sample's
stream index, so a layout change that altered them would break the loss
match), and the stop-free operation reports its preparation and pause.
Both pauses are printed.
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


@pytest.fixture(scope="module")
def cluster():
    """The suite's cluster (conftest.py), with agents that heartbeat, and so
    pick up their tasks, every 200 ms: the pauses measured are the
    reconfiguration's, not the heartbeat period's."""
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=4, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


def test_training_continues_across_reconfigurations(cluster, client, job_name, tmp_path):
    out = elastic.run(cluster, client, job_name, str(tmp_path), log=print)
    losses, want = out["losses"], out["want_losses"]
    print("step  loss (elastic)        loss (reference)      rel. diff")
    for s, (a, b) in enumerate(zip(losses, want), 1):
        print(f"{s:4d}  {a:.15f}  {b:.15f}  {abs(a - b) / abs(b):.1e}")
    for p in out["pauses"]:
        extra = (f" (stop-free: prepared in {p['prepare_s']:.2f} s while the old layout trained, "
                 f"cut over after step {p['cut_step']}; coordinator cut-over -> commit "
                 f"{p['coordinator_pause_s']:.2f} s)" if p["stop_free"] else "")
        print(f"pause at {p['how']}: {p['pause_s']:.2f} s{extra}")
    np.testing.assert_allclose(losses, want, rtol=1e-9, atol=0)
    # The first layout trained on while the stop-free resize was prepared.
    assert len(losses) >= 4 * elastic.STEPS
    stop_free, recovered_op, stop_world = (c["operation"] for c in out["committed"])
    assert stop_free.stop_free and not stop_world.stop_free
    assert stop_free.prepare_seconds > 0 and stop_free.pause_seconds > 0
    assert stop_free.cutover_operation_id
    # The agents prepared too: they pre-copied the new layout from the
    # generation current when it was planned, before the workers were warm
    # or at least before the cut-over; the cut-over moved again only what the
    # step changed (here every tensor: training updates them all).
    assert stop_free.agents_prepared_unix_ms > 0 and stop_free.workers_prepared_unix_ms > 0
    assert stop_free.prepared_unix_ms == max(stop_free.agents_prepared_unix_ms,
                                             stop_free.workers_prepared_unix_ms)
    assert stop_free.prepared_from_generation < stop_free.from_generation
    assert 0 < stop_free.bytes_total <= stop_free.bytes_precopied
    assert stop_free.bytes_total + stop_free.bytes_skipped_unchanged <= stop_free.bytes_precopied
    pauses = {p["how"]: p for p in out["pauses"]}
    assert pauses["stop-free resize"]["cut_step"] >= elastic.STEPS
    # The cursor travelled with the model; the lost host's phase was
    # recovered to dp 3.
    recovered = out["committed"][1]["layout"]
    assert (recovered.config.tp, recovered.config.dp) == (1, 3)
    assert cluster.host_ids[3] not in layout.hosts_of(recovered)
    committed = client.dataset_state(out["job"].id)
    assert (committed.step, committed.committed_generation) == (len(losses), out["generation"])
    # Exactly once: every epoch of 21 samples (3 steps of 7) read once; the
    # last, partial one without a repeat.
    ids = out["ids"]
    assert len(ids) == len(losses) * elastic.BATCH
    for e in range(len(ids) // elastic.N):
        assert sorted(ids[e * elastic.N:(e + 1) * elastic.N]) == list(range(elastic.N)), e
    tail = ids[len(ids) // elastic.N * elastic.N:]
    assert len(set(tail)) == len(tail)
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
