"""The Python reading of docs/partitioning.md (reshard.layout.shard) against
the C++ planner and agents: publish shard(old layout) on a real cluster,
reshard, load every new rank and compare its bytes with shard(new layout).
Any disagreement between the two readings of the docs fails here."""

import os

import pytest

from helpers import (check_generation, every_kind_ptc, hsdp_ptc, publish_all, random_globals,
                     register)
import reshard
from reshard import layout, megatron
from reshard.v1 import coordinator_pb2, ptc_pb2

COMMITTED = coordinator_pb2.OPERATION_STATE_COMMITTED


@pytest.fixture(scope="module")
def hosts(cluster):
    return cluster.host_ids


def start(cluster, client, name, hosts, ptc=None, lay=None, seed=0):
    """A registered job at `lay` (default tp 2, pp 2, dp 2 on 4 hosts x 2) with
    every rank published from random global tensors."""
    ptc = ptc or every_kind_ptc()
    lay = lay or layout.make_layout(2, 2, 2, hosts, 2)
    g = random_globals(ptc, layout.world_size(lay), seed)
    job = register(client, cluster, name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, g)
    assert check_generation(cluster, job.id, ptc, lay, g, 1) == []
    return job, ptc, g


def reshard_and_check(cluster, client, job, ptc, g, new, generation, lost_hosts=None):
    if lost_hosts:
        # The targets here keep fewer copies than the job had (dp 1, or FSDP
        # after HSDP): accepted (docs/coordinator.md, "Recovery keeps the
        # job's redundancy").
        op = client.recover(job.id, lost_hosts, new, accept_degraded=True)
    elif layout.world_size(new) == layout.world_size(client.get_job(job.id).layout) and \
            new.config == client.get_job(job.id).layout.config:
        op = client.migrate(job.id, new)
    else:
        op = client.resize(job.id, new)
    final = client.wait(op.id, timeout=120)
    assert final.state == COMMITTED, final.error
    assert final.to_generation == generation
    assert client.get_job(job.id).generation == generation
    g = layout.after_reshard(ptc, new, g)
    assert check_generation(cluster, job.id, ptc, new, g, generation) == []
    return g, final


def test_tensor_parallel_change(cluster, client, hosts, job_name):
    job, ptc, g = start(cluster, client, job_name, hosts, seed=1)
    new = layout.make_layout(4, 2, 1, hosts, 2)
    g, op = reshard_and_check(cluster, client, job, ptc, g, new, 2)
    assert op.stats.bytes_cross_host == op.stats.lower_bound_cross_host
    # and back down to tp 1 with dp 4
    reshard_and_check(cluster, client, job, ptc, g, layout.make_layout(1, 2, 4, hosts, 2), 3)


def test_pipeline_change_uneven_stages(cluster, client, hosts, job_name):
    job, ptc, g = start(cluster, client, job_name, hosts, seed=2)
    new = layout.make_layout(2, 4, 1, hosts, 2, stage_starts=[0, 1, 3, 4])
    g, _ = reshard_and_check(cluster, client, job, ptc, g, new, 2)
    reshard_and_check(cluster, client, job, ptc, g, layout.make_layout(1, 1, 8, hosts, 2), 3)


def test_data_parallel_change_and_rank_order(cluster, client, hosts, job_name):
    job, ptc, g = start(cluster, client, job_name, hosts[:2], lay=layout.make_layout(
        2, 1, 2, hosts[:2], 2), seed=3)
    # grow dp 2 -> 4 onto two more hosts: flat optimizer shards re-cut
    g, _ = reshard_and_check(cluster, client, job, ptc, g, layout.make_layout(2, 1, 4, hosts, 2), 2)
    # the other rank order with an explicit, shuffled placement
    slots = [(h, d) for h in reversed(hosts) for d in (1, 0)]
    new = layout.make_layout(2, 2, 2, ranks=slots, order="tp_pp_dp", stage_starts=[0, 2])
    g, _ = reshard_and_check(cluster, client, job, ptc, g, new, 3)
    # shrink dp to 1 on one host
    reshard_and_check(cluster, client, job, ptc, g, layout.make_layout(2, 1, 1, hosts[3:], 2), 4)


def test_migrate_same_config(cluster, client, hosts, job_name):
    job, ptc, g = start(cluster, client, job_name, hosts[:2],
                        lay=layout.make_layout(2, 2, 1, hosts[:2], 2), seed=4)
    new = layout.make_layout(2, 2, 1, hosts[2:], 2)
    _, op = reshard_and_check(cluster, client, job, ptc, g, new, 2)
    assert op.kind == coordinator_pb2.OPERATION_KIND_MIGRATE
    assert op.stats.bytes_local == 0  # every byte moved to the new hosts


def test_megatron_spec_reshards(cluster, client, hosts, job_name):
    """A synthetic GQA + SwiGLU GPT with the distributed optimizer, spec by
    reshard.megatron, through tp 2 -> 4 with bf16 weights."""
    sd = megatron.synthetic_gpt(4, 64, 8, 96, 16, "bfloat16", num_query_groups=2, glu=True,
                                world=4, seed=7)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(4, 8, num_query_groups=2, glu=True,
                                                           distributed_optimizer=True))
    lay = layout.make_layout(2, 2, 1, hosts[:2], 2)
    job = register(client, cluster, job_name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, sd)
    reshard_and_check(cluster, client, job, ptc, sd, layout.make_layout(4, 1, 2, hosts, 2), 2)


def test_hsdp_resizes(cluster, client, hosts, job_name):
    """HSDP (dp_shard) and dp-only splits through HSDP -> FSDP -> HSDP at
    another tp -> HSDP at cp 2 (replicas that plan alone) -> a smaller shard
    group on fewer hosts, every new rank
    compared byte for byte with reshard.layout's reading of the page."""
    ptc = hsdp_ptc()
    lay = layout.make_layout(1, 1, 4, hosts, 2, cp=2, dp_shard=2)
    job, ptc, g = start(cluster, client, job_name, hosts, ptc=ptc, lay=lay, seed=11)
    bad = layout.make_layout(1, 1, 4, hosts, 2, cp=2)
    bad.config.dp_shard = 3
    with pytest.raises(reshard.InvalidArgument, match=r"config\.dp_shard is 3; it must divide dp 4"):
        client.resize(job.id, bad)
    g, op = reshard_and_check(cluster, client, job, ptc, g,
                              layout.make_layout(1, 1, 4, hosts, 2, cp=2), 2)
    assert op.stats.bytes_cross_host == op.stats.lower_bound_cross_host
    g, _ = reshard_and_check(cluster, client, job, ptc, g,
                             layout.make_layout(2, 1, 4, hosts, 2, dp_shard=2), 3)
    # HSDP -> HSDP, a replica on each pair of hosts on both sides: the two
    # replicas plan alone (TransferPlan.replicas; the planner's
    # ReplicasTest.ThePythonHsdpResizeSplits pins the split), the agents get
    # their hosts' slices written out.
    g, op = reshard_and_check(cluster, client, job, ptc, g,
                              layout.make_layout(1, 1, 4, hosts, 2, cp=2, dp_shard=2), 4)
    assert op.stats.bytes_cross_host == op.stats.lower_bound_cross_host
    with open(os.path.join(cluster.work_dir, "coordinator.log")) as f:
        assert f"operation={op.id} PENDING -> PLANNED: {op.stats.steps} steps (2 replicas " \
               "planned alone)" in f.read()
    reshard_and_check(cluster, client, job, ptc, g,
                      layout.make_layout(1, 1, 2, hosts[:2], 2, cp=2, dp_shard=1), 5)


def test_recover_after_lost_host(cluster, client, hosts, job_name):
    """Last in this module: kills an agent. Every tensor is data-parallel
    replicated, so the survivors hold everything."""
    sd = megatron.synthetic_gpt(4, 32, 4, 64, 16, "float16", world=8, seed=9)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(4, 4))
    lay = layout.make_layout(2, 2, 2, hosts, 2)
    job = register(client, cluster, job_name, ptc, lay)
    publish_all(cluster, job.id, ptc, lay, sd)
    cluster.kill_agent(hosts[3])
    target = layout.make_layout(2, 2, 1, hosts[:2], 2)
    assert layout.hosts_of(target) == hosts[:2]
    reshard_and_check(cluster, client, job, ptc, sd, target, 2, lost_hosts=[hosts[3]])


def test_hsdp_replica_recovers_a_lost_host(cluster, client, hosts, job_name):
    """Last: kills a second agent (hosts[3] is gone already). HSDP dp 6,
    dp_shard 2 on hosts[:3]: each host holds one replica, so losing hosts[2]
    loses nothing (under FSDP it would lose a third of every Shard(0) tensor);
    the survivors re-shard over dp 4 (FSDP) from the replicas on their own hosts."""
    ptc = hsdp_ptc()
    lay = layout.make_layout(1, 1, 6, hosts[:3], 2, dp_shard=2)
    job, ptc, g = start(cluster, client, job_name, hosts[:3], ptc=ptc, lay=lay, seed=12)
    cluster.kill_agent(hosts[2])
    _, op = reshard_and_check(cluster, client, job, ptc, g, layout.make_layout(1, 1, 4, hosts[:2], 2),
                              2, lost_hosts=[hosts[2]])
    assert op.stats.bytes_cross_host == op.stats.lower_bound_cross_host
