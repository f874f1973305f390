"""Agents are told of their tasks (docs/agent.md, "Told of tasks"): with a
heartbeat far longer than the whole test (60 s, lease 180 s), resizes still
commit within seconds, because each agent keeps a WaitForTasks long poll open
and the coordinator wakes it when it creates the task. Before, an agent learnt
of a task only at its next heartbeat: each resize here would have waited up
to 60 s and hit the deadline."""

import time

import pytest

from helpers import check_generation, publish_all
from reshard import layout, megatron
from reshard.v1 import coordinator_pb2 as OP
from reshard.v1 import ptc_pb2

HEARTBEAT_MS = 60000
# Far below one heartbeat; generous for a 2-core machine under load.
COMMIT_DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                      lease_ms=3 * HEARTBEAT_MS, heartbeat_ms=HEARTBEAT_MS) as c:
        yield c


def test_resizes_commit_without_waiting_for_a_heartbeat(cluster, client, job_name):
    hosts = cluster.host_ids
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=4, seed=7)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(2, 4))
    layouts = [layout.make_layout(2, 2, 1, hosts, 2), layout.make_layout(1, 2, 2, hosts, 2)]
    job = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc,
                                              layout=layouts[0]))
    publish_all(cluster, job.id, ptc, layouts[0], sd)
    # Every agent heartbeat once at registration, before the job existed;
    # the next is a minute away. Three resizes, each one's tasks new to them.
    for generation in (2, 3, 4):
        target = layouts[(generation - 1) % 2]
        started = time.monotonic()
        op = client.resize(job.id, target)
        done = client.wait(op.id, timeout=COMMIT_DEADLINE_S, raise_on_failure=True)
        took = time.monotonic() - started
        print(f"resize to generation {generation}: committed in {took:.2f} s "
              f"(heartbeat {HEARTBEAT_MS / 1000:.0f} s)")
        assert done.state == OP.OPERATION_STATE_COMMITTED
        assert client.get_job(job.id).generation == generation
        assert check_generation(cluster, job.id, ptc, target, sd, generation) == []


def test_checkpoint_commits_without_waiting_for_a_heartbeat(cluster, client, job_name):
    hosts = cluster.host_ids
    step0 = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=4, seed=1)
    step5 = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=4, seed=2)
    ptc = megatron.build_ptc(step0, megatron.synthetic_config(2, 4))
    lay = layout.make_layout(2, 2, 1, hosts, 2)
    job = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc, layout=lay))
    publish_all(cluster, job.id, ptc, lay, step0)
    started = time.monotonic()
    op = client.checkpoint(job.id)
    publish_all(cluster, job.id, ptc, lay, step5, generation=op.to_generation)
    done = client.wait(op.id, timeout=COMMIT_DEADLINE_S, raise_on_failure=True)
    print(f"checkpoint: committed {time.monotonic() - started:.2f} s after the request "
          f"(heartbeat {HEARTBEAT_MS / 1000:.0f} s)")
    assert done.state == OP.OPERATION_STATE_COMMITTED
    assert client.get_job(job.id).generation == op.to_generation == 2
    assert check_generation(cluster, job.id, ptc, lay, step5, 2) == []
