"""Property test of the real training loop (issue 12): for seeded random
scenarios (deploy/local/training/elastic.py random_scenario) - tp 1 with a
random dp on random hosts, stop-free resizes to other random dps, and a
host that fails while the job trains (agent SIGKILLed, its ranks killed,
the rest stopped, recovered by the survivor policy from the last commit) -
every sample is delivered exactly once per epoch over the committed steps
(the steps read since the last commit before the failure are replayed,
never skipped), and the losses equal the uninterrupted reference.
Ranks are the loop-API ranks of the training test (elastic_rank.py).
"""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy", "local", "training"))
import elastic  # noqa: E402

SEEDS = [int(s) for s in os.environ.get("RESHARD_TRAINING_PROPERTY_SEEDS", "3").split(",")]


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=4, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


@pytest.mark.parametrize("seed", SEEDS)
def test_random_dp_changes_and_a_failure_deliver_every_sample_once(cluster, client, job_name,
                                                                   tmp_path, seed):
    phases = elastic.random_scenario(cluster.host_ids, seed)
    print("scenario:", [(how, lay and lay.config.dp) for how, lay in phases])
    assert any(how.startswith("fail ") for how, _ in phases)
    out = elastic.run(cluster, client, job_name, str(tmp_path), phases=phases, log=print)
    for p in out["pauses"]:
        print(f"pause at {p['how']}: {p['pause_s']:.2f} s")
    losses, ids = out["losses"], out["ids"]
    np.testing.assert_allclose(losses, out["want_losses"], rtol=1e-9, atol=0)
    assert len(ids) == len(losses) * elastic.BATCH
    for e in range(len(ids) // elastic.N):
        assert sorted(ids[e * elastic.N:(e + 1) * elastic.N]) == list(range(elastic.N)), e
    tail = ids[len(ids) // elastic.N * elastic.N:]
    assert len(set(tail)) == len(tail)
    committed = client.dataset_state(out["job"].id)
    assert committed.step == len(losses)
