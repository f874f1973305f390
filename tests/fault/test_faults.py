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

import signal

import pytest

import faultlib
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
