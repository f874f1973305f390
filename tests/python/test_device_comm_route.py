"""Cross-host device steps over the device communicator, through real agents
(issue 23 item 3): both agents run the fake device (agent/transfer/
fake_device.h) and so the fake communicator (fake_comm.h), advertise it
("fake-nccl") to the coordinator, which hands every host its peers'
transports; with every host advertising it the route rule
(device_comm_steps.h) sends the cross-host steps of device-published state
device to device between the agents (the executor tests check the rule and
the fallback; here the whole chain runs through real processes). The bytes
on both hosts equal the expected reshard, with the XXH3 checksums.
GetOperation names each host's route ("device-comm fake-nccl"), and, once
host-1's agent runs without a device, host-0's fallback ("host-staged" and
why). The agents run with RESHARD_DEVICE_COMM=auto (the communicator is
opt-in) and without the device IPC route (opt-in too), which two agents of
one machine would otherwise take and which test_device_ipc_route.py tests."""

import time

import pytest
import xxhash

from helpers import (check_generation, every_kind_ptc, item_raws, publish_fake_device,
                     random_globals, read_device, register)
from reshard import layout
from reshard.v1 import agent_pb2 as AG
from reshard.v1 import coordinator_pb2 as OP


@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    with pytest.MonkeyPatch.context() as env:  # inherited by the agents (also when restarted)
        env.setenv("RESHARD_DEVICE_COMM", "auto")
        env.setenv("RESHARD_DEVICE_IPC", "none")
        with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                          agent_device="fake:2") as c:
            yield c


def test_agents_advertise_the_fake_communicator(cluster, client):
    hosts = {h.host_id: list(h.transports) for h in client.list_hosts()}
    assert hosts == {"host-0": ["local", "ucx", "fake", "fake-nccl"],
                     "host-1": ["local", "ucx", "fake", "fake-nccl"]}


def _resize_device_published(cluster, client, job_name, seed):
    """tp=2 on host-0, published from its two fake devices, resized to a
    replica on host-1: (ptc, target, globals, the committed operation as
    GetOperation answers it)."""
    ptc = every_kind_ptc()
    g = random_globals(ptc, world=2, seed=seed)
    source = layout.make_layout(2, 1, 1, ["host-0"], 2)
    target = layout.make_layout(2, 1, 2, ["host-0", "host-1"], 2)  # a replica on host-1
    job = register(client, cluster, job_name, ptc, source)
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        for rank in (0, 1):
            _, raws = item_raws(ptc, layout.shard(ptc, source, rank, g))
            publish_fake_device(w, rank, raws, device=rank)
    final = client.wait(client.resize(job.id, target).id, timeout=120)
    assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
    return ptc, target, g, client.get_operation(final.id)


def _routes(op):
    return {h.host_id: (h.route, h.route_reason, h.state) for h in op.hosts}


def _route_count(cluster, host, route):
    return cluster.metrics_of(host).get(f'reshard_agent_tasks_by_route_total{{route="{route}"}}', 0)


def test_cross_host_resize_moves_device_to_device(cluster, client, job_name):
    before = _route_count(cluster, "host-0", "device-comm fake-nccl")
    ptc, target, g, op = _resize_device_published(cluster, client, job_name, seed=23)
    done = AG.HOST_TASK_STATE_DONE
    assert _routes(op) == {"host-0": ("device-comm fake-nccl", "", done),
                           "host-1": ("device-comm fake-nccl", "", done)}
    assert _route_count(cluster, "host-0", "device-comm fake-nccl") == before + 1
    for rank, host in ((0, "host-0"), (1, "host-0"), (2, "host-1"), (3, "host-1")):
        raws = item_raws(ptc, layout.shard(ptc, target, rank, g))[1]
        with cluster.worker(host, op.job_id, ptc=ptc) as w:
            resp = w.open_device(rank, 2)
        assert read_device(resp) == raws, (rank, host)
        assert list(resp.checksums) == [xxhash.xxh3_64_intdigest(r) for r in raws]


def test_a_host_without_device_makes_the_other_host_staged_saying_why(cluster, client, job_name):
    """Last in this file: host-1's agent restarts without a device, so it no
    longer advertises fake-nccl; host-0's device sources then travel
    host-staged, and the operation says so, with the reason."""
    cluster.agent_device = {"host-0": "fake:2", "host-1": "none"}
    cluster.restart_agent("host-1")
    deadline = time.monotonic() + 30
    while True:  # until the coordinator has host-1's new registration
        hosts = {h.host_id: list(h.transports) for h in client.list_hosts()}
        if "fake-nccl" not in hosts["host-1"]:
            break
        assert time.monotonic() < deadline, hosts
        time.sleep(0.2)
    ptc, target, g, op = _resize_device_published(cluster, client, job_name, seed=29)
    done = AG.HOST_TASK_STATE_DONE
    assert _routes(op) == {
        "host-0": ("host-staged", 'cross-host steps move host memory '
                   '(host "host-1" does not advertise fake-nccl)', done),
        "host-1": ("host", "", done)}
    assert check_generation(cluster, op.job_id, ptc, target, g, op.to_generation) == []
