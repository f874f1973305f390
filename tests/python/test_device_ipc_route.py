"""Cross-host device steps between agents of ONE machine through device IPC
handles, through real agents (issue 23 item 5): both agents run the fake
device (agent/device/fake_device.h), whose IPC handles open across
processes of one machine, and advertise "fake-ipc:<boot id>:<pid ns>:<ipc ns>"
(this kernel's /proc/sys/kernel/random/boot_id without dashes and the pid
and ipc namespace inodes, the same for both); with every host
advertising this host's exact entry the route rule (device_ipc_steps.h,
checked before the device communicator's) has the receiver open the
sender's device buffers and copy device to device, no network library
moving the bytes. The bytes on both hosts equal the expected reshard, with
the XXH3 checksums, and GetOperation names each host's route
("device-ipc")."""


import pytest

from helpers import check_device_generation, host_routes, resize_device_published
from reshard.v1 import agent_pb2 as AG
# The resize of device-published state and its checks are test_device_comm_route.py's too.


def _ipc_entry():
    """This machine's fake IPC entry: the agents share the test's kernel and
    namespaces."""
    import os
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot_id = f.read().strip().replace("-", "")
    pid_ns, ipc_ns = (os.stat(f"/proc/self/ns/{k}").st_ino for k in ("pid", "ipc"))
    return f"fake-ipc:{boot_id}:{pid_ns}:{ipc_ns}"


@pytest.fixture(scope="module")
def cluster():
    from conftest import build_dir
    from cluster import LocalCluster
    with pytest.MonkeyPatch.context() as env:  # the agents inherit it: the route is opt-in
        env.setenv("RESHARD_DEVICE_IPC", "auto")
        env.setenv("RESHARD_DEVICE_COMM", "auto")  # advertised too; IPC comes first
        with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                          agent_device="fake:2") as c:
            yield c


def test_agents_advertise_their_ipc_entry(cluster, client):
    entry = _ipc_entry()
    hosts = {h.host_id: list(h.transports) for h in client.list_hosts()}
    assert hosts == {"host-0": ["local", "ucx", "fake", "fake-nccl", entry],
                     "host-1": ["local", "ucx", "fake", "fake-nccl", entry]}


def test_cross_host_resize_moves_device_to_device_through_ipc(cluster, client, job_name):
    """tp=2 on host-0, published from its two fake devices, resized to a
    replica on host-1 (host-0 sends its device buffers' handles to host-1)."""
    ptc, target, g, op = resize_device_published(cluster, client, job_name, seed=31)
    done = AG.HOST_TASK_STATE_DONE
    assert host_routes(op) == {"host-0": ("device-ipc", "", done),
                               "host-1": ("device-ipc", "", done)}
    check_device_generation(cluster, op.job_id, ptc, target, g, 2)
