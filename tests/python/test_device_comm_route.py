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

from helpers import (check_device_generation, check_generation, host_routes,
                     resize_device_published)
from reshard.v1 import agent_pb2 as AG


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


def _route_count(cluster, host, route):
    return cluster.metrics_of(host).get(f'reshard_agent_tasks_by_route_total{{route="{route}"}}', 0)


def test_cross_host_resize_moves_device_to_device(cluster, client, job_name):
    before = _route_count(cluster, "host-0", "device-comm fake-nccl")
    ptc, target, g, op = resize_device_published(cluster, client, job_name, seed=23)
    done = AG.HOST_TASK_STATE_DONE
    assert host_routes(op) == {"host-0": ("device-comm fake-nccl", "", done),
                               "host-1": ("device-comm fake-nccl", "", done)}
    assert _route_count(cluster, "host-0", "device-comm fake-nccl") == before + 1
    check_device_generation(cluster, op.job_id, ptc, target, g, 2)


def test_a_job_declared_in_host_memory_stays_off_the_communicator(cluster, client, job_name):
    """The same resize, the job registered with its state in host memory
    (JobSpec.state_memory HOST): no host takes the communicator, each says
    why, and the new generation is still on host-1's devices, byte for byte."""
    from reshard.v1 import ptc_pb2
    before = _route_count(cluster, "host-0", "device-comm fake-nccl")
    ptc, target, g, op = resize_device_published(cluster, client, job_name, seed=31,
                                                 state_memory=ptc_pb2.STATE_MEMORY_HOST)
    done = AG.HOST_TASK_STATE_DONE
    why = "cross-host steps move host memory (the job's state_memory is not DEVICE)"
    assert host_routes(op) == {"host-0": ("host-staged", why, done),
                               "host-1": ("host-staged", why, done)}
    assert _route_count(cluster, "host-0", "device-comm fake-nccl") == before
    check_device_generation(cluster, op.job_id, ptc, target, g, 2)


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
    ptc, target, g, op = resize_device_published(cluster, client, job_name, seed=29)
    done = AG.HOST_TASK_STATE_DONE
    assert host_routes(op) == {
        "host-0": ("host-staged", 'cross-host steps move host memory '
                   '(host "host-1" does not advertise fake-nccl)', done),
        "host-1": ("host", "", done)}
    assert check_generation(cluster, op.job_id, ptc, target, g, op.to_generation) == []
