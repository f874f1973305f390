"""reshard.Client.advise and resize(choose=True) against a real local cluster
(PostgreSQL, coordinator, four agents x 2 devices): advise answers a Pareto
set whose model facts default from the PTC, and a chosen resize commits the
layout advise marked best, with every byte where the new layout puts it."""

import pytest

from helpers import check_generation, publish_all
import reshard
from reshard import layout, megatron
from reshard.v1 import coordinator_pb2

# synthetic_gpt(2, 32, 4, 64, 8): 2 layers, hidden 32, 4 heads, vocabulary 64,
# sequences of 8. The PTC gives layers, hidden and vocab; the rest is declared.
MODEL = {"heads": 4, "seq_length": 8, "global_batch": 16}


@pytest.fixture
def job(cluster, client, job_name):
    """A published tp 2 x pp 1 x dp 2 job on the first 2 hosts x 2, and its data."""
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=4, seed=11)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(2, 4))
    lay = layout.make_layout(2, 1, 2, cluster.host_ids[:2], 2)
    spec = {"name": job_name, "tenant": "pytest", "ptc": reshard.to_dict(ptc),
            "layout": reshard.to_dict(lay)}
    created = client.register_job(spec)
    publish_all(cluster, created.id, ptc, lay, sd)
    return created, ptc, sd


def dominated(a, b):
    """b is at least as good as a in both and better in one."""
    return (b.step_seconds <= a.step_seconds and b.memory_bytes <= a.memory_bytes
            and (b.step_seconds < a.step_seconds or b.memory_bytes < a.memory_bytes))


def test_advise_returns_a_pareto_set(cluster, client, job):
    created, _, _ = job
    advice = client.advise(created.id, gpus=8, **MODEL)
    assert isinstance(advice, coordinator_pb2.AdviseResponse)
    assert list(advice.hosts) == cluster.host_ids and list(advice.host_devices) == [2] * 4
    cands = list(advice.candidates)
    assert cands
    for a in cands:
        assert not any(dominated(a, b) for b in cands if b is not a), a
        assert a.tp * a.pp * a.dp <= 8 and len(layout.slots(a.layout)) == a.tp * a.pp * a.dp
    assert [c.step_seconds for c in cands] == sorted(c.step_seconds for c in cands)
    assert 0 <= advice.best < len(cands)
    best = cands[advice.best]
    assert best.reconfig_priced
    assert best.steps_in_horizon == max(c.steps_in_horizon for c in cands)
    # hidden, vocab and layers came from the PTC: declaring them changes nothing.
    declared = client.advise(created.id, gpus=8, layers=2, hidden=32, vocab=64, **MODEL)
    assert declared == advice
    # A shorter horizon and named hosts reach the coordinator.
    two = client.advise(created.id, gpus=4, hosts=cluster.host_ids[2:], horizon_s=60, **MODEL)
    assert list(two.hosts) == cluster.host_ids[2:] and two.horizon_s == 60


def test_advise_errors_name_the_field(client, job):
    created, _, _ = job
    with pytest.raises(reshard.InvalidArgument) as e:
        client.advise(created.id, gpus=0, **MODEL)
    assert "gpus 0" in e.value.message
    with pytest.raises(reshard.InvalidArgument) as e:
        client.advise(created.id, gpus=8, seq_length=8, global_batch=16)
    assert "model.heads" in e.value.message
    with pytest.raises(reshard.InvalidArgument) as e:
        client.advise(created.id, gpus=8, devices={"gpu_type": "X9"}, **MODEL)
    assert 'devices.gpu_type "X9"' in e.value.message
    with pytest.raises(reshard.FailedPrecondition) as e:
        client.advise(created.id, gpus=100, **MODEL)
    assert "gpus 100" in e.value.message
    with pytest.raises(reshard.NotFound):
        client.advise("0123456789abcdef0123456789abcdef", gpus=8, **MODEL)
    with pytest.raises(ValueError):  # caught before any call
        client.advise(created.id, gpus=8, no_such_fact=1, **MODEL)
    with pytest.raises(ValueError):
        client.resize(created.id, choose=True, model=MODEL)  # no gpus
    with pytest.raises(ValueError):
        client.resize(created.id, layout.make_layout(1, 1, 1, ["host-0"], 1), choose=True, gpus=8)


def test_resize_choose_commits_the_best_layout(cluster, client, job):
    created, ptc, sd = job
    advice = client.advise(created.id, gpus=8, **MODEL)
    best = advice.candidates[advice.best]
    assert best.cross_host_bytes > 0  # a real move: onto the two other hosts
    op = client.resize(created.id, choose=True, gpus=8, model=MODEL)
    assert op.target_layout == best.layout
    final = client.wait(op.id, timeout=120, raise_on_failure=True)
    assert final.state == coordinator_pb2.OPERATION_STATE_COMMITTED
    after = client.get_job(created.id)
    assert after.generation == 2 and after.layout == best.layout
    assert check_generation(cluster, created.id, ptc, best.layout, sd, 2) == []


def test_recover_choose_picks_on_the_survivors(cluster, client, job_name):
    """recover(choose=True): the advisor's best layout on the hosts that
    survive (the lost one is not offered), each move priced as a recovery;
    it commits with every byte from the surviving replica. (No per-rank
    rng_state here: a per-rank blob of a lost host cannot be recovered.)"""
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", seed=12)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(2, 4))
    lay = layout.make_layout(2, 1, 2, cluster.host_ids[:2], 2)
    created = client.register_job({"name": job_name, "tenant": "pytest",
                                   "ptc": reshard.to_dict(ptc), "layout": reshard.to_dict(lay)})
    publish_all(cluster, created.id, ptc, lay, sd)
    lost = cluster.host_ids[1]  # holds one of the two data-parallel replicas
    # The advisor picks for speed; one copy on the survivors is accepted
    # (docs/coordinator.md, "Recovery keeps the job's redundancy").
    op = client.recover(created.id, [lost], choose=True, gpus=6, model=MODEL,
                        accept_degraded=True)
    target = op.target_layout
    assert lost not in layout.hosts_of(target)
    assert len(layout.slots(target)) <= 6
    final = client.wait(op.id, timeout=120, raise_on_failure=True)
    assert final.kind == coordinator_pb2.OPERATION_KIND_RECOVER
    assert check_generation(cluster, created.id, ptc, target, sd, 2) == []
    with pytest.raises(ValueError, match="not both"):
        client.recover(created.id, [lost], layout=target, choose=True, gpus=6, model=MODEL)
