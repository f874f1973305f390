"""The fault suite: faults caused for real on a real local cluster
(PostgreSQL, reshard-coordinator, four reshard-agents moving real bytes).

Every case asserts what must survive (issue 9, "A fault suite that stays"):
the operation in flight ends COMMITTED, ABORTED or FAILED within
FINAL_WITHIN_S; a committed generation equals reshard.layout's shards byte for
byte; after an abort the previous generation is current, intact and
loadable; afterwards no shard file, memory accounting or process is left over
(see faultlib.check_no_leaks / check_processes). A resize that the cluster
still accepts after the fault commits and verifies (the cluster is usable).
"""

import os
import signal
import subprocess
import time

import pytest

import faultlib
import reshard
from cluster import LocalCluster
from faultlib import FINAL_WITHIN_S

ATTEMPTS = 4  # a fault that lands after the transfer ended is tried again


def _targets(job, cluster):
    """Two layouts to move between, every byte crossing hosts: tp2 pp1 dp2 on
    host-2/host-3 and back to tp2 pp2 dp1 on host-0/host-1."""
    h = cluster.host_ids
    return [job.make_layout(2, 1, 2, h[2:4]), job.make_layout(2, 2, 1, h[0:2])]


def _finish(job, cluster, client, census, op, before_gen, before_lay, target):
    final = job.wait_final(op.id)
    job.check_outcome(final, before_gen, before_lay, target)
    faultlib.check_no_leaks(cluster, [job])
    faultlib.check_processes(cluster, census)
    # The cluster is still usable: one more resize commits and verifies.
    nxt = [t for t in _targets(job, cluster) if t != job.layout][0]
    gen = job.current().generation
    op2 = client.resize(job.id, nxt)
    after = job.wait_final(op2.id)
    assert after.state == faultlib.COMMITTED, (
        f"resize after the fault ended {faultlib.op_state_name(after)}: {after.error}")
    job.check_outcome(after, gen, job.layout, nxt)
    faultlib.check_no_leaks(cluster, [job])
    return final


def _fault_mid_transfer(job, cluster, client, trigger_host, fault):
    """Starts resizes until `fault()` is called while `trigger_host` runs its
    task (its tasks_started_total went up and the operation is not final).
    Returns (op, generation before, layout before, target)."""
    for attempt in range(ATTEMPTS):
        before_gen, before_lay = job.current().generation, job.layout
        target = [t for t in _targets(job, cluster) if t != before_lay][0]
        started = faultlib.tasks_started(cluster, trigger_host(before_lay, target))
        op = client.resize(job.id, target)
        if (faultlib.wait_transferring(client, op.id)
                and faultlib.wait_task_started(cluster, trigger_host(before_lay, target), started)
                and client.get_operation(op.id).state not in faultlib.FINAL):
            now = client.get_operation(op.id)
            print(f"attempt {attempt + 1}: fault while operation {op.id} is "
                  f"{faultlib.op_state_name(now)} at {now.bytes_done}/{now.bytes_total} bytes",
                  flush=True)
            fault(before_lay, target)
            return op, before_gen, before_lay, target
        # Too late: the transfer was over before the fault. Settle, try again.
        final = job.wait_final(op.id)
        job.check_outcome(final, before_gen, before_lay, target)
    pytest.fail(f"no fault landed mid-transfer in {ATTEMPTS} attempts")


def _source(before, target):
    return before.placement.hosts[0]


def _destination(before, target):
    return target.placement.hosts[0]


def test_coordinator_sigkill_and_restart_on_same_port_mid_transfer(job, cluster, client):
    census = faultlib.process_census(cluster)
    address = cluster.coordinator

    def fault(before, target):
        cluster.kill_coordinator(signal.SIGKILL)
        assert cluster.start_coordinator() == address

    op, gen, before, target = _fault_mid_transfer(job, cluster, client, _destination, fault)
    _finish(job, cluster, client, census, op, gen, before, target)


def test_postgres_sigkill_and_restart_mid_transfer(job, cluster, client):
    census = faultlib.process_census(cluster)

    def fault(before, target):
        cluster.restart_postgres(signal.SIGKILL)

    op, gen, before, target = _fault_mid_transfer(job, cluster, client, _destination, fault)
    _finish(job, cluster, client, census, op, gen, before, target)


def _break_coordinator_connections(cluster, host):
    """Destroys (ss -K) every TCP connection of `host`'s agent to the
    coordinator: its task stream (WaitForTasks), heartbeats and progress
    reports break at once, as a network fault would. Returns how many."""
    coordinator_port = int(cluster.coordinator.rsplit(":", 1)[1])
    ports = faultlib._socket_ports(cluster.agents[host].pid)
    killed = 0
    for port in sorted(ports):
        r = subprocess.run(["ss", "-K", "-tn", "dport", "=", str(coordinator_port), "sport", "=",
                            str(port)], capture_output=True, text=True, check=True)
        killed += sum(1 for line in r.stdout.splitlines()[1:] if line.strip())
    return killed


def test_agent_task_stream_broken_mid_transfer(job, cluster, client):
    """The destination agent's connections to the coordinator are destroyed
    while it runs its task (issue 21, item 6): it reconnects, reopens its
    task stream, and the operation commits byte for byte."""
    census = faultlib.process_census(cluster)
    broken = []

    def fault(before, target):
        broken.append(_break_coordinator_connections(cluster, _destination(before, target)))

    op, gen, before, target = _fault_mid_transfer(job, cluster, client, _destination, fault)
    assert broken and broken[0] >= 1, "the agent had no connection to the coordinator to break"
    final = _finish(job, cluster, client, census, op, gen, before, target)
    assert final.state == faultlib.COMMITTED, (
        f"ended {faultlib.op_state_name(final)}: {final.error}")


@pytest.mark.parametrize("side", ["source", "destination"])
def test_agent_sigkill_mid_transfer_and_restart_keeping_shm(job, cluster, client, side):
    """The agent comes back (same host id, its shm files kept) within the
    lease: the operation ends within the bound (defect 4: not stuck
    TRANSFERRING), and a retry of an aborted one commits (defect 5: no
    ALREADY_EXISTS on the leftovers of the killed attempt)."""
    census = faultlib.process_census(cluster)
    pick = _source if side == "source" else _destination
    killed = {}

    def fault(before, target):
        host = pick(before, target)
        killed["host"] = host
        cluster.restart_agent(host, keep_shm=True)

    op, gen, before, target = _fault_mid_transfer(job, cluster, client, pick, fault)
    final = job.wait_final(op.id)
    # A peer the kill took down through a UCX 1.13 abort
    # (faultlib.UCX_PEER_DEATH_ABORTS) is restarted, as a restart policy would,
    # before anything is loaded from it.
    faultlib.restart_agents_ucx_aborted(cluster)
    job.check_outcome(final, gen, before, target)
    if final.state != faultlib.COMMITTED:
        # The same resize again must commit: the restarted agent's leftovers
        # of the killed attempt may not get in its way. Retried only while
        # each abort was such a crash.
        for retries in range(1, len(cluster.host_ids) + 1):
            retry = client.resize(job.id, target)
            again = job.wait_final(retry.id)
            restarted = faultlib.restart_agents_ucx_aborted(cluster)
            job.check_outcome(again, gen, before, target)
            if again.state == faultlib.COMMITTED or not restarted:
                break
        assert again.state == faultlib.COMMITTED, (
            f"retry {retries} after killing the {side} agent {killed['host']} ended "
            f"{faultlib.op_state_name(again)}: {again.error}")
    faultlib.check_no_leaks(cluster, [job])
    faultlib.check_processes(cluster, census)


def test_agent_sigstop_past_the_lease_then_sigcont(job, cluster, client):
    """The only holder of generation 1 (host-0) is frozen past its lease:
    it is marked LOST and the job DEGRADED naming it; after SIGCONT it is
    ALIVE again with its shards intact, so the job must be ACTIVE again with
    no lost hosts (defect 6), its generation loadable byte for byte, and a
    resize must commit."""
    census = faultlib.process_census(cluster)
    host = job.layout.placement.hosts[0]
    cluster.stop_agent(host)
    try:
        faultlib.wait_host_state(client, host, "LOST", timeout=cluster.lease_ms / 1000 + 30)
        job_now = faultlib.wait_until(
            "job DEGRADED naming the frozen host",
            lambda: (lambda j: j if faultlib.job_state_name(j) == "JOB_STATE_DEGRADED" else None)(
                job.current()), 30)
        assert list(job_now.lost_hosts) == [host]
    finally:
        cluster.continue_agent(host)
    faultlib.wait_host_state(client, host, "ALIVE", timeout=30)
    job.verify(job.layout, job.current().generation)
    last = {}

    def active():
        j = job.current()
        last["job"] = j
        return faultlib.job_state_name(j) == "JOB_STATE_ACTIVE" and not j.lost_hosts

    try:
        faultlib.wait_until("job ACTIVE again", active, FINAL_WITHIN_S, interval=0.2)
    except faultlib.FaultCheckError:
        j = last["job"]
        raise faultlib.FaultCheckError(
            f"{host} is ALIVE again with its shards intact, but job is still "
            f"{faultlib.job_state_name(j)} lost_hosts={list(j.lost_hosts)} after "
            f"{FINAL_WITHIN_S:.0f} s") from None
    gen = job.current().generation
    target = _targets(job, cluster)[0]
    op = client.resize(job.id, target)
    final = job.wait_final(op.id)
    assert final.state == faultlib.COMMITTED, f"{faultlib.op_state_name(final)}: {final.error}"
    job.check_outcome(final, gen, job.layout, target)
    faultlib.check_no_leaks(cluster, [job])
    faultlib.check_processes(cluster, census)


# Issue 19, defect 5: PostgreSQL frozen (SIGSTOP) mid-transfer for more than
# three leases (docs/coordinator.md, "When PostgreSQL does not answer"). Two
# settings of the store's deadlines (statement ms, acquire ms, connect s):
#  - "short": calls fail fast, and the bound on a call's answer is short; the
#    leader lock's query gets no answer either, so the leader steps down and
#    takes the lock again once PostgreSQL answers (resuming with the grace);
#  - "past_the_freeze": nothing times out; the leader keeps its lock and
#    must see from the store's health that the database was silent.
FROZEN_LEASES = 4
STORE_DEADLINES = {"short": (1000, 1000, 2), "past_the_freeze": (30000, 30000, 30)}


@pytest.fixture(params=sorted(STORE_DEADLINES))
def deadline_cluster(request):
    statement_ms, acquire_ms, connect_s = STORE_DEADLINES[request.param]
    with LocalCluster(build_dir=faultlib.BUILD, hosts=4, devices_per_host=2,
                      work_dir=os.environ.get("RESHARD_FAULT_WORK_DIR"),
                      coordinator_args=["--store-statement-timeout-ms", str(statement_ms),
                                        "--store-acquire-timeout-ms", str(acquire_ms),
                                        "--store-connect-timeout-s", str(connect_s)]) as c:
        c.store_deadlines = request.param
        yield c


@pytest.fixture
def deadline_client(deadline_cluster):
    with deadline_cluster.client(timeout=30.0, max_attempts=50, max_backoff=1.0) as c:
        yield c


@pytest.fixture
def deadline_job(deadline_cluster, deadline_client):
    j = faultlib.Job(deadline_cluster, deadline_client, f"pg-frozen-{os.getpid()}", layers=4,
                     hidden=256, vocab=2048, seq=128)
    j.register_and_publish(j.make_layout(2, 2, 1, deadline_cluster.host_ids[0:2]))
    return j


def _registrations(cluster):
    """{host: successful RegisterAgent calls}: an agent registers again only
    after its host was marked LOST."""
    def ok(metrics):
        return sum(v for k, v in metrics.items()
                   if k.startswith("reshard_agent_registrations_total") and 'result="ok"' in k)
    return {h: ok(cluster.metrics_of(h)) for h in cluster.host_ids}


def test_postgres_sigstop_past_three_leases_mid_transfer(deadline_job, deadline_cluster,
                                                         deadline_client):
    """Every PostgreSQL process frozen for FROZEN_LEASES leases while a resize
    transfers. After SIGCONT no live host was marked LOST (the store's
    silence never counts against hosts: they get the lease grace a restarted
    PostgreSQL gives) and the resize commits byte for byte. With short
    deadlines a GetJob made meanwhile answers UNAVAILABLE within them
    (acquire + connect + statement), far before its own deadline. Before
    the fix GetJob hung until its deadline and every host was LOST the moment
    PostgreSQL answered again, aborting the resize ("host lost (lease
    expired) during transfer")."""
    job, cluster, client = deadline_job, deadline_cluster, deadline_client
    short = cluster.store_deadlines == "short"
    statement_ms, acquire_ms, connect_s = STORE_DEADLINES[cluster.store_deadlines]
    census = faultlib.process_census(cluster)
    registered = _registrations(cluster)
    frozen_s = FROZEN_LEASES * cluster.lease_ms / 1000
    bound_s = (acquire_ms + connect_s * 1000 + statement_ms) / 1000 + 2.0
    get_job_deadline_s = 20.0
    probe = cluster.client(timeout=get_job_deadline_s, max_attempts=1)
    seen = {}

    def fault(before, target):
        frozen_at = time.monotonic()
        cluster.stop_postgres()
        try:
            if short:
                start = time.monotonic()
                try:
                    probe.get_job(job.id)
                    seen["get_job"] = "answered OK"
                except reshard.ReshardError as e:
                    seen["get_job"] = e
                seen["get_job_s"] = time.monotonic() - start
            # The fault lasts FROZEN_LEASES leases: PostgreSQL stays frozen.
            time.sleep(max(0.0, frozen_s - (time.monotonic() - frozen_at)))
        finally:
            cluster.continue_postgres()

    try:
        op, gen, before, target = _fault_mid_transfer(job, cluster, client, _destination, fault)
        final = job.wait_final(op.id)
    finally:
        probe.close()
    print(f"deadlines {cluster.store_deadlines}: GetJob while frozen: {seen.get('get_job')!r} "
          f"after {seen.get('get_job_s', 0):.2f} s; operation {faultlib.op_state_name(final)} "
          f"{final.error}", flush=True)
    if short:
        assert isinstance(seen["get_job"], reshard.Unavailable), (
            f"GetJob while PostgreSQL was frozen: {seen['get_job']!r}, expected UNAVAILABLE")
        assert seen["get_job_s"] < bound_s, (
            f"GetJob answered UNAVAILABLE after {seen['get_job_s']:.1f} s; the store's deadlines "
            f"bound it to {bound_s:.1f} s (its own deadline {get_job_deadline_s:.0f} s)")
    assert final.state == faultlib.COMMITTED, (
        f"resize across a {frozen_s:.0f} s PostgreSQL freeze ended "
        f"{faultlib.op_state_name(final)}: {final.error}")
    assert _registrations(cluster) == registered, (
        "an agent registered again, so its live host was marked LOST while PostgreSQL was frozen")
    _finish(job, cluster, client, census, op, gen, before, target)
    for host in cluster.host_ids:
        faultlib.wait_host_state(client, host, "ALIVE", timeout=1)



# Issue 31, defect 5: an agent's waits on its peers (transfer proofs, step
# seals) must not run out while the coordinator's store does not answer. The
# agents' wait is made short (--peer-wait-ms, here through its environment
# variable) and PostgreSQL frozen for three times as long.
PEER_WAIT_MS = 4000
PEER_WAIT_OUTAGES = 3


@pytest.fixture
def peer_wait_cluster(monkeypatch):
    monkeypatch.setenv("RESHARD_PEER_WAIT_MS", str(PEER_WAIT_MS))
    statement_ms, acquire_ms, connect_s = STORE_DEADLINES["short"]
    with LocalCluster(build_dir=faultlib.BUILD, hosts=4, devices_per_host=2,
                      work_dir=os.environ.get("RESHARD_FAULT_WORK_DIR"),
                      coordinator_args=["--store-statement-timeout-ms", str(statement_ms),
                                        "--store-acquire-timeout-ms", str(acquire_ms),
                                        "--store-connect-timeout-s", str(connect_s)]) as c:
        yield c


def test_postgres_sigstop_longer_than_the_peer_wait_mid_transfer(peer_wait_cluster):
    """A receiving host starts its task while a sending peer has not fetched
    its own yet, and PostgreSQL freezes for three peer waits before the peer
    can: the receiver waits for the peer's transfer proof all that time, and
    the resize commits byte for byte. (The sender's agent is held with
    SIGSTOP only until the receiver has started, so that the freeze lands
    between the two.) Before the fix the receiver failed its task
    --peer-wait-ms after it started ("UNAUTHENTICATED: operation ...: no
    transfer proof from host "host-0" within 4 s") and the resize aborted."""
    cluster = peer_wait_cluster
    with cluster.client(timeout=30.0, max_attempts=50, max_backoff=1.0) as client:
        job = faultlib.Job(cluster, client, f"peer-wait-{os.getpid()}", layers=4, hidden=256,
                           vocab=2048, seq=128)
        job.register_and_publish(job.make_layout(2, 2, 1, cluster.host_ids[0:2]))
        census = faultlib.process_census(cluster)
        frozen_s = PEER_WAIT_OUTAGES * PEER_WAIT_MS / 1000
        gen, before = job.current().generation, job.layout
        target = _targets(job, cluster)[0]  # host-0/host-1 -> host-2/host-3: all bytes cross
        sender, receiver = _source(before, target), _destination(before, target)
        started = faultlib.tasks_started(cluster, receiver)
        sender_pid = cluster.agents[sender].pid
        os.kill(sender_pid, signal.SIGSTOP)
        try:
            op = client.resize(job.id, target)
            assert faultlib.wait_task_started(cluster, receiver, started), (
                f"{receiver} did not start its task of operation {op.id}")
            cluster.stop_postgres()
        finally:
            os.kill(sender_pid, signal.SIGCONT)
        try:
            time.sleep(frozen_s)  # the fault itself: PostgreSQL stays frozen this long
        finally:
            cluster.continue_postgres()
        final = job.wait_final(op.id)
        assert final.state == faultlib.COMMITTED, (
            f"resize across a {frozen_s:.0f} s PostgreSQL freeze with {PEER_WAIT_MS} ms peer "
            f"waits ended {faultlib.op_state_name(final)}: {final.error}")
        _finish(job, cluster, client, census, op, gen, before, target)
