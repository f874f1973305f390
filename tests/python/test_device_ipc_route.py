"""Cross-host device steps between agents of ONE machine through device IPC
handles, through real agents (issue 23 item 5): both agents run the fake
device (agent/transfer/fake_device.h), whose IPC handles open across
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
import xxhash

from helpers import (every_kind_ptc, item_raws, publish_fake_device, random_globals,
                     read_device, register)
from reshard import layout
from reshard.v1 import agent_pb2 as AG
from reshard.v1 import coordinator_pb2 as OP
# Publishing from, and reading, fake device allocations as the communicator's test does.


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
    ptc = every_kind_ptc()
    g = random_globals(ptc, world=2, seed=31)
    source = layout.make_layout(2, 1, 1, ["host-0"], 2)
    target = layout.make_layout(2, 1, 2, ["host-0", "host-1"], 2)
    job = register(client, cluster, job_name, ptc, source)
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        for rank in (0, 1):
            _, raws = item_raws(ptc, layout.shard(ptc, source, rank, g))
            publish_fake_device(w, rank, raws, device=rank)
    final = client.wait(client.resize(job.id, target).id, timeout=120)
    assert final.state == OP.OPERATION_STATE_COMMITTED, final.error
    op = client.get_operation(final.id)
    done = AG.HOST_TASK_STATE_DONE
    assert {h.host_id: (h.route, h.route_reason, h.state) for h in op.hosts} == {
        "host-0": ("device-ipc", "", done), "host-1": ("device-ipc", "", done)}
    for rank, host in ((0, "host-0"), (1, "host-0"), (2, "host-1"), (3, "host-1")):
        raws = item_raws(ptc, layout.shard(ptc, target, rank, g))[1]
        with cluster.worker(host, job.id, ptc=ptc) as w:
            resp = w.open_device(rank, 2)
        assert read_device(resp) == raws, (rank, host)
        assert list(resp.checksums) == [xxhash.xxh3_64_intdigest(r) for r in raws]
