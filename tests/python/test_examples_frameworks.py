"""The issue-13 examples (examples/frameworks.py) through a real local
cluster: register, publish every rank's shards (reshard.layout.shard of
random global values), reshard, load every new rank and compare its bytes
with reshard.layout.shard of the new layout (the Python reading of
docs/partitioning.md against the C++ planner and agents). The FSDP job is
also driven from torch's own FlatParamHandle and Adam state: its local flat
shards are published, resharded from world 2 to world 3 and loaded into new
handles, whose unsharded state must equal the full state dict."""

import os
import sys

import numpy as np
import pytest

from helpers import check_generation, publish_all, register
from reshard import fsdp, layout, megatron
from reshard.v1 import coordinator_pb2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples"))
import frameworks  # noqa: E402

COMMITTED = coordinator_pb2.OPERATION_STATE_COMMITTED


def reshard_to(client, job, new):
    op = client.resize(job.id, new)
    final = client.wait(op.id, timeout=180)
    assert final.state == COMMITTED, final.error
    assert final.stats.bytes_cross_host == final.stats.lower_bound_cross_host
    return final


@pytest.mark.parametrize("name", sorted(frameworks.EXAMPLES))
def test_example_reshards_byte_for_byte(cluster, client, job_name, name):
    ptc, old, targets = frameworks.EXAMPLES[name](cluster.host_ids)
    g = megatron.synthetic_state(ptc, layout.world_size(old), seed=len(name))
    job = register(client, cluster, job_name, ptc, old)
    publish_all(cluster, job.id, ptc, old, g)
    assert check_generation(cluster, job.id, ptc, old, g, 1) == []
    generation = 1
    for new in targets:
        generation += 1
        final = reshard_to(client, job, new)
        assert final.to_generation == generation
        g = layout.after_reshard(ptc, new, g)
        assert check_generation(cluster, job.id, ptc, new, g, generation) == []


def test_torch_fsdp_flat_params_through_the_cluster(cluster, client, job_name):
    torch = pytest.importorskip("torch")
    import test_fsdp as tf  # torch's FlatParamHandle (see its docstring) and the model
    ref = tf.Net(5)
    grads = {id(p): torch.randn_like(p) for p in ref.parameters()}
    by_name = {n: grads[id(p)] for n, p in ref.named_parameters()}
    full_opt = tf.adam_state(ref, grads)
    ptc = fsdp.flat_param_ptc(ref.units())
    hosts = cluster.host_ids
    old_lay = layout.make_layout(1, 1, 2, hosts[:1], 2)
    new_lay = layout.make_layout(1, 1, 3, ranks=[(hosts[1], 0), (hosts[1], 1), (hosts[2], 0)])
    old = tf.run_sharded(5, 2, by_name)  # world 2 after one Adam step
    items = tf.collect_items(ptc, old_lay, old)
    job = register(client, cluster, job_name, ptc, old_lay)
    step = np.int64(1).tobytes()
    with cluster.worker(hosts[0], job.id) as w:
        for rank in range(2):
            w.publish(rank, 1, items[rank] | {"optimizer.step": step})
    reshard_to(client, job, new_lay)
    loaded = {}
    for host in layout.hosts_of(new_lay):
        with cluster.worker(host, job.id, ptc=ptc) as w:
            for rank, _ in layout.ranks_on_host(new_lay, host):
                loaded[rank] = w.load(rank, 2)
                assert bytes(loaded[rank]["optimizer.step"]) == step
    loaded = {r: {k: np.asarray(v) for k, v in items.items() if k != "optimizer.step"}
              for r, items in loaded.items()}
    new = tf.run_sharded(9, 3, by_name, loaded, ptc, new_lay, step=False)
    tf.compare(new, ref, full_opt)


def test_regenerable_rng_state_after_a_lost_host(cluster, client, job_name):
    """Last in this module: kills an agent. A Megatron GPT without the
    distributed optimizer (every tensor has a data-parallel replica) at tp 2,
    dp 2 on hosts 0 and 1 loses host 1: new ranks 2 and 3 (on host 2) need
    the rng_state of old ranks 2 and 3, which nobody holds any more. The
    blob is regenerable, so the recovery commits with those two values
    zero-filled (TransferPlan.regenerate) and everything else exact; the
    agents report those two, and only those, as regenerated on load."""
    hosts = cluster.host_ids
    m = megatron.GptModel(2, 16, 2, 300, distributed_optimizer=False, max_position_embeddings=8)
    ptc = megatron.gpt_ptc(m)
    old = layout.make_layout(2, 1, 2, hosts[:2], 2)
    g = megatron.synthetic_state(ptc, 4, seed=11)
    job = register(client, cluster, job_name, ptc, old)
    publish_all(cluster, job.id, ptc, old, g)
    cluster.kill_agent(hosts[1])
    new = layout.make_layout(2, 1, 2, [hosts[0], hosts[2]], 2)
    op = client.recover(job.id, [hosts[1]], new)
    final = client.wait(op.id, timeout=180)
    assert final.state == COMMITTED, final.error
    regenerated = [(2, "rng_state"), (3, "rng_state")]
    g = layout.after_reshard(ptc, new, g, regenerate=regenerated)
    assert g["rng_state"][2] == bytes(m.rng_state_bytes)
    # The agents tell the workers of ranks 2 and 3 to regenerate rng_state,
    # and nobody anything else.
    assert check_generation(cluster, job.id, ptc, new, g, 2, regenerated=regenerated) == []
    with cluster.worker(hosts[2], job.id, ptc=ptc) as w:
        assert w.load(2, 2).regenerated == {"rng_state"}
    with cluster.worker(hosts[0], job.id, ptc=ptc) as w:
        assert w.load(0, 2).regenerated == frozenset()
