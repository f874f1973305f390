"""reshard.Client against a real coordinator: every call, the error classes
(NOT_FOUND, INVALID_ARGUMENT, ALREADY_EXISTS, ABORTED, FAILED_PRECONDITION,
DEADLINE_EXCEEDED, UNAVAILABLE), retries on UNAVAILABLE only with one
idempotency key, watch/wait, and recovery after a killed agent."""

import socket
import threading
import time

import grpc
import pytest

from helpers import check_generation, every_kind_ptc, publish_all
import reshard
from reshard import layout, megatron
from reshard.v1 import agent_pb2, coordinator_pb2, ptc_pb2

OP = coordinator_pb2


def small_spec(name, hosts, tenant="pytest"):
    """A DP-replicated synthetic GPT on tp 2 x pp 2 x dp 2 over 4 hosts x 2."""
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=8, seed=3)
    ptc = megatron.build_ptc(sd, megatron.synthetic_config(2, 4))
    lay = layout.make_layout(2, 2, 2, hosts, 2)
    return {"name": name, "tenant": tenant, "ptc": reshard.to_dict(ptc),
            "layout": reshard.to_dict(lay)}, ptc, lay, sd


@pytest.fixture(scope="module")
def published(cluster, client):
    """A registered and published job every test here may read (not change)."""
    spec, ptc, lay, sd = small_spec("shared-job", cluster.host_ids)
    job = client.register_job(spec)
    publish_all(cluster, job.id, ptc, lay, sd)
    return job


def test_register_get_list_delete(cluster, client, job_name):
    spec, ptc, lay, _ = small_spec(job_name, cluster.host_ids, tenant="tenant-a")
    job = client.register_job(spec)
    assert len(job.id) == 32 and job.generation == 1 and job.state == OP.JOB_STATE_ACTIVE
    assert (job.name, job.tenant, job.tensor_count) == (job_name, "tenant-a", len(ptc.tensors))
    got = client.get_job(job.id)
    assert got.layout == lay and not got.HasField("ptc")
    assert client.get_job(job.id, include_ptc=True).ptc == ptc
    assert job.id in [j.id for j in client.list_jobs()]
    assert [j.id for j in client.list_jobs(tenant="tenant-a")] == [job.id]
    assert job.id in [j.id for j in client.list_jobs(state="JOB_STATE_ACTIVE", page_size=1)]
    client.delete_job(job.id)
    with pytest.raises(reshard.NotFound):
        client.get_job(job.id)


def test_not_found_carries_code_and_message(client):
    with pytest.raises(reshard.NotFound) as e:
        client.get_job("0123456789abcdef0123456789abcdef")
    assert isinstance(e.value, reshard.ReshardError)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "0123456789abcdef0123456789abcdef" in e.value.message
    assert e.value.method == "GetJob"
    with pytest.raises(reshard.NotFound):
        client.get_operation("no-such-operation")
    with pytest.raises(reshard.NotFound):
        client.resize("0123456789abcdef0123456789abcdef", layout.make_layout(1, 1, 1, ["h"], 1),
                      expected_generation=1)


def test_invalid_argument_names_the_problem(cluster, client, job_name, published):
    spec, _, _, _ = small_spec(job_name, cluster.host_ids)
    bad = spec["ptc"]["tensors"][0]
    bad["partition"]["tp"] = {"mode": "TP_SPLIT", "axis": 5}
    with pytest.raises(reshard.InvalidArgument) as e:
        client.register_job(spec)
    assert bad["name"] in e.value.message and e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # migrate keeps the world size: 8 ranks cannot go onto 2 slots
    with pytest.raises(reshard.InvalidArgument):
        client.migrate(published.id, {"hosts": ["host-0"], "devicesPerHost": 2})
    with pytest.raises(ValueError):  # malformed dict: caught before any call
        client.register_job({"name": "x", "noSuchField": 1})


def test_already_exists_and_idempotent_register(cluster, client, job_name):
    spec, _, _, _ = small_spec(job_name, cluster.host_ids)
    first = client.register_job(spec, idempotency_key="key-" + job_name)
    again = client.register_job(spec, idempotency_key="key-" + job_name)
    assert again.id == first.id
    with pytest.raises(reshard.AlreadyExists):
        client.register_job(spec)  # a fresh key: (tenant, name) is taken


def test_aborted_on_stale_generation(client, published):
    with pytest.raises(reshard.Aborted) as e:
        client.resize(published.id, layout.make_layout(2, 2, 2, ["host-0", "host-1", "host-2",
                                                                 "host-3"], 2),
                      expected_generation=7)
    assert "generation" in e.value.message


def test_preview_plan_and_failed_precondition(cluster, client, job_name):
    hosts = cluster.host_ids
    ptc = every_kind_ptc()  # DP_FLAT optimizer state: no replica across dp
    lay = layout.make_layout(2, 2, 2, hosts, 2)
    job = client.register_job(ptc_pb2.JobSpec(name=job_name, tenant="pytest", ptc=ptc, layout=lay))
    stats = client.preview_plan(job.id, layout.make_layout(2, 2, 1, hosts[:2], 2))
    assert stats.bytes_cross_host == stats.lower_bound_cross_host > 0
    assert {h.host for h in stats.hosts} <= set(hosts)
    with pytest.raises(reshard.FailedPrecondition) as e:
        client.preview_plan(job.id, layout.make_layout(2, 2, 1, hosts[:2], 2),
                            lost_hosts=[hosts[3]])
    assert "opt.flat" in e.value.message  # the planner names the lost tensors


def test_watch_wait_and_cancel_final(cluster, client, job_name):
    spec, ptc, lay, sd = small_spec(job_name, cluster.host_ids)
    job = client.register_job(spec)
    publish_all(cluster, job.id, ptc, lay, sd)
    op = client.resize(job.id, layout.make_layout(4, 2, 1, cluster.host_ids, 2))
    assert op.kind == OP.OPERATION_KIND_RESIZE and op.from_generation == 1
    with pytest.raises(reshard.DeadlineExceeded):
        client.wait(op.id, timeout=1e-6)  # bounded by the whole watch's timeout
    updates = list(client.watch_operation(op.id, timeout=120))
    assert updates and updates[-1].state == OP.OPERATION_STATE_COMMITTED
    states = [u.state for u in updates]
    assert states == sorted(states)  # PENDING < PLANNED < TRANSFERRING < COMMITTED
    assert updates[-1].bytes_done == updates[-1].bytes_total > 0
    for first in client.watch_operation(op.id):  # leaving a watch early is fine
        break
    assert first.id == op.id
    seen = []
    final = client.watch_operation(op.id, callback=seen.append)
    assert seen[-1] == final and final.state == OP.OPERATION_STATE_COMMITTED
    # GetOperation adds each host's task (Operation.hosts, docs/coordinator.md
    # "The route of each host's task"); watches and wait do not carry it.
    got = client.get_operation(op.id)
    assert [(h.host_id, h.state, h.route) for h in got.hosts] == [
        (host, agent_pb2.HOST_TASK_STATE_DONE, "host") for host in sorted(cluster.host_ids)]
    got.ClearField("hosts")
    assert client.wait(op, timeout=30) == got
    assert client.get_job(job.id).generation == 2
    with pytest.raises(reshard.FailedPrecondition):
        client.cancel_operation(op.id)


def test_cancel_running_operation(cluster, client, job_name):
    """Cancel right after the resize is accepted (PENDING for about one
    driver tick); should the operation win the race, resize again."""
    spec, ptc, lay, sd = small_spec(job_name, cluster.host_ids)
    job = client.register_job(spec)
    publish_all(cluster, job.id, ptc, lay, sd)
    targets = [layout.make_layout(4, 2, 1, cluster.host_ids, 2), lay]
    for attempt in range(8):
        before = client.get_job(job.id).generation
        op = client.resize(job.id, targets[attempt % 2])
        try:
            cancelled = client.cancel_operation(op.id)
        except reshard.FailedPrecondition:
            assert client.wait(op.id, timeout=60).state == OP.OPERATION_STATE_COMMITTED
            continue
        assert cancelled.state == OP.OPERATION_STATE_ABORTED
        assert "cancelled by client" in cancelled.error
        final = client.wait(op.id, timeout=60)
        assert final.state == OP.OPERATION_STATE_ABORTED
        with pytest.raises(reshard.OperationFailed) as e:
            client.wait(op.id, raise_on_failure=True)
        assert e.value.operation.id == op.id
        deadline = time.monotonic() + 30
        while client.get_job(job.id).state != OP.JOB_STATE_ACTIVE and time.monotonic() < deadline:
            time.sleep(0.1)
        after = client.get_job(job.id)
        assert after.generation == before and after.state == OP.JOB_STATE_ACTIVE
        assert not after.active_operation_id
        return
    pytest.fail("every resize finished before its cancel arrived")


def test_list_hosts(cluster, client):
    hosts = client.list_hosts()
    assert {h.host_id for h in hosts} >= set(cluster.host_ids)
    assert all(h.state == agent_pb2.HOST_STATE_ALIVE for h in hosts
               if h.host_id in cluster.host_ids)


# ------------------------------------------------------------------ retries


def closed_port():
    """A bound socket that does not listen: connections are refused."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


class LateProxy:
    """A TCP forwarder to `target` that refuses connections for `delay`
    seconds (the port is bound but not listening), then serves."""

    def __init__(self, target, delay):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sock = closed_port()
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._server = threading.Timer(delay, self._serve)
        self._server.start()

    def _serve(self):
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        """Stops serving: the serve thread sees `_stop` within one accept
        timeout (0.2 s) and ends before the socket is closed."""
        self._stop = True
        self._server.cancel()  # not serving yet: it never will
        self._server.join(timeout=10)
        assert not self._server.is_alive(), "the proxy's serve thread did not stop"
        self.sock.close()


def test_unavailable_is_retried_then_raised():
    sock = closed_port()
    retries = []
    c = reshard.Client("127.0.0.1:%d" % sock.getsockname()[1], timeout=5, max_attempts=3,
                       initial_backoff=0.05, insecure=True,
                       on_retry=lambda m, a, e, d, k: retries.append((m, a, e.code, k)))
    with pytest.raises(reshard.Unavailable) as e:
        c.register_job({"name": "never", "tenant": "t"})
    c.close()
    sock.close()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert [r[1] for r in retries] == [1, 2]  # 3 attempts, 2 retries
    assert all(r[0] == "RegisterJob" and r[2] == grpc.StatusCode.UNAVAILABLE for r in retries)
    assert len({r[3] for r in retries}) == 1 and retries[0][3]  # one key for every attempt


def test_retry_succeeds_once_the_server_is_back(cluster, job_name):
    spec, _, _, _ = small_spec(job_name, cluster.host_ids)
    proxy = LateProxy(cluster.coordinator, delay=1.0)
    retries = []
    try:
        # gRPC's own reconnect backoff may keep the channel failing for a few
        # seconds after the server is back: allow ~20 s of attempts (the
        # timeout bounds a call's attempts and waits together).
        with reshard.Client(proxy.address, timeout=30, max_attempts=80, initial_backoff=0.05,
                            max_backoff=0.3, **cluster.client_kwargs(),
                            on_retry=lambda m, a, e, d, k: retries.append(k)) as c:
            job = c.register_job(spec)
            assert c.get_job(job.id).name == job_name
    finally:
        proxy.close()
    assert retries and len(set(retries)) == 1  # every attempt sent the same key
    assert proxy.accepted >= 1


def test_other_errors_are_not_retried(cluster, client):
    retries = []
    c = reshard.Client(client.address, max_attempts=5, **cluster.client_kwargs(),
                       on_retry=lambda *a: retries.append(a))
    with pytest.raises(reshard.NotFound):
        c.get_job("missing")
    with pytest.raises(reshard.InvalidArgument):
        c.get_job("")
    c.close()
    assert retries == []


def test_deadline_exceeded_is_not_retried():
    # A server that accepts the TCP connection and never speaks HTTP/2: the
    # call cannot complete, so its deadline expires (gRPC rounds deadlines
    # up to a millisecond, so a tiny timeout against a live coordinator
    # could still be answered in time).
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    retries = []
    c = reshard.Client("127.0.0.1:%d" % silent.getsockname()[1], max_attempts=5, insecure=True,
                       on_retry=lambda *a: retries.append(a))
    try:
        with pytest.raises(reshard.DeadlineExceeded) as e:
            c.list_hosts(timeout=0.3)
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and retries == []
    finally:
        c.close()
        silent.close()


def test_layout_or_placement_arguments():
    from reshard.client import _split_layout
    lay = layout.make_layout(2, 1, 1, ["h"], 2)
    config, placement = _split_layout(lay)
    assert config == lay.config and placement == lay.placement
    assert _split_layout(lay.placement) == (None, lay.placement)
    assert _split_layout({"hosts": ["h"], "devicesPerHost": 2}) == (None, lay.placement)
    assert _split_layout({"placement": {"hosts": ["h"], "devicesPerHost": 2}}) == \
        (None, lay.placement)  # a Layout without config keeps the job's config
    assert _split_layout(reshard.to_dict(lay)) == (lay.config, lay.placement)
    with pytest.raises(TypeError):
        _split_layout(["h"])


def test_every_status_code_has_its_class():
    class FakeRpcError(grpc.RpcError):
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

        def details(self):
            return "what went wrong"

    expected = {grpc.StatusCode.INVALID_ARGUMENT: reshard.InvalidArgument,
                grpc.StatusCode.NOT_FOUND: reshard.NotFound,
                grpc.StatusCode.ALREADY_EXISTS: reshard.AlreadyExists,
                grpc.StatusCode.FAILED_PRECONDITION: reshard.FailedPrecondition,
                grpc.StatusCode.ABORTED: reshard.Aborted,
                grpc.StatusCode.UNAVAILABLE: reshard.Unavailable,
                grpc.StatusCode.DEADLINE_EXCEEDED: reshard.DeadlineExceeded,
                grpc.StatusCode.DATA_LOSS: reshard.DataLoss,
                grpc.StatusCode.RESOURCE_EXHAUSTED: reshard.ResourceExhausted,
                grpc.StatusCode.PERMISSION_DENIED: reshard.PermissionDenied,
                grpc.StatusCode.UNAUTHENTICATED: reshard.Unauthenticated,
                grpc.StatusCode.UNIMPLEMENTED: reshard.ReshardError}
    for code, cls in expected.items():
        err = reshard.errors.from_rpc_error(FakeRpcError(code), "M")
        assert type(err) is cls and err.code == code and err.message == "what went wrong"
        assert str(err) == f"M: {code.name}: what went wrong"


def test_crashed_rank_restarts_in_place_with_its_state(cluster, client, job_name):
    """A rank that crashed on a live host (its agent alive) restarts in place:
    recover(lost_ranks=[rank], layout=the current layout). One copy of
    everything (dp 1), so its state can only come from its own agent's
    buffer: the new generation is every rank's bytes exactly, none crossed
    hosts. Before, the current layout was refused ("the device of a lost
    rank")."""
    hosts = cluster.host_ids[:2]
    spec, ptc, _, sd = small_spec(job_name, cluster.host_ids)
    lay = layout.make_layout(2, 2, 1, hosts, 2)
    spec["layout"] = reshard.to_dict(lay)
    job = client.register_job(spec)
    publish_all(cluster, job.id, ptc, lay, sd)
    op = client.recover(job.id, lost_ranks=[3], layout=client.get_job(job.id).layout)
    final = client.wait(op.id, timeout=120, raise_on_failure=True)
    assert (final.kind, final.from_generation, final.to_generation) == (
        OP.OPERATION_KIND_RECOVER, 1, 2)
    assert layout.slots(final.target_layout) == layout.slots(lay)
    assert final.stats.bytes_cross_host == 0 and final.stats.bytes_zero_filled == 0
    assert check_generation(cluster, job.id, ptc, lay, sd, 2) == []
    after = client.get_job(job.id)
    assert after.state == OP.JOB_STATE_ACTIVE and after.generation == 2


# ----------------------------------------------------- last: loses a host


def test_recover_after_killed_agent(cluster, client, job_name):
    spec, ptc, lay, sd = small_spec(job_name, cluster.host_ids)
    job = client.register_job(spec)
    publish_all(cluster, job.id, ptc, lay, sd)
    lost = cluster.host_ids[3]
    cluster.kill_agent(lost)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if client.get_job(job.id).state == OP.JOB_STATE_DEGRADED:
            break
        time.sleep(0.2)
    degraded = client.get_job(job.id)
    assert degraded.state == OP.JOB_STATE_DEGRADED and list(degraded.lost_hosts) == [lost]
    assert {h.host_id: h.state for h in client.list_hosts()}[lost] == agent_pb2.HOST_STATE_LOST
    op = client.recover(job.id, [lost])  # no target: the coordinator's survivor policy
    final = client.wait(op.id, timeout=120, raise_on_failure=True)
    assert final.kind == OP.OPERATION_KIND_RECOVER
    # tp 2 x pp 2 of the 6 surviving slots: dp 1 on the first four, in rank order
    h = cluster.host_ids
    assert (final.target_layout.config.tp, final.target_layout.config.pp,
            final.target_layout.config.dp) == (2, 2, 1)
    assert layout.slots(final.target_layout) == [(h[0], 0), (h[0], 1), (h[1], 0), (h[1], 1)]
    after = client.get_job(job.id)
    assert after.state == OP.JOB_STATE_ACTIVE and after.generation == 2



# ------------------------------------------------------------ transport security

def test_credentials_are_explicit():
    # No credentials and no insecure=True: refused before any channel exists.
    with pytest.raises(ValueError, match="insecure=True"):
        reshard.Client("127.0.0.1:1")
    with pytest.raises(ValueError, match="tls ca"):
        reshard.tls_credentials("/nonexistent/ca.pem")
    with pytest.raises(ValueError, match="together"):
        reshard.tls_credentials("/nonexistent/ca.pem", cert="/nonexistent/c.pem")


@pytest.fixture(scope="module")
def tls_cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=1, tls=True) as c:
        yield c


def test_mutual_tls_identities(tls_cluster):
    c = tls_cluster
    with c.client(timeout=10.0) as admin:
        assert [h.host_id for h in admin.list_hosts()] == c.host_ids
    # TLS without a client certificate or a token: not authenticated.
    with c.client(identity=None, timeout=10.0, max_attempts=1) as anonymous:
        with pytest.raises(reshard.Unauthenticated) as e:
            anonymous.list_hosts()
        assert "ListHosts" in e.value.message
    # An agent's certificate is for AgentService only.
    with c.client(identity="agent:host-0", timeout=10.0, max_attempts=1) as agent:
        with pytest.raises(reshard.PermissionDenied) as e:
            agent.list_jobs()
        assert "agent:host-0" in e.value.message
    # Plaintext to a TLS port: never connects.
    with reshard.Client(c.coordinator, insecure=True, timeout=2.0, max_attempts=1) as plain:
        with pytest.raises((reshard.Unavailable, reshard.DeadlineExceeded)):
            plain.list_hosts()


def test_bearer_token_scoped_to_its_tenant(tls_cluster):
    from reshard.v1 import coordinator_pb2, coordinator_pb2_grpc
    c = tls_cluster
    cert, key = c.pki.issue(c.ADMIN)
    with grpc.secure_channel(c.coordinator,
                             reshard.tls_credentials(c.pki.ca, cert, key)) as channel:
        created = coordinator_pb2_grpc.AuthServiceStub(channel).CreateToken(
            coordinator_pb2.CreateTokenRequest(name="py", role="viewer", tenants=["team-p"]),
            timeout=10)
    token = created.bearer_token
    with reshard.Client(c.coordinator, credentials=reshard.tls_credentials(c.pki.ca),
                        token=token, timeout=10.0, max_attempts=1) as viewer:
        assert list(viewer.list_jobs(tenant="team-p")) == []
        with pytest.raises(reshard.PermissionDenied) as e:
            viewer.list_jobs(tenant="team-q")
        assert "team-q" in e.value.message and token.split(".")[1] not in e.value.message
        with pytest.raises(reshard.PermissionDenied):
            viewer.register_job({"name": "nope", "tenant": "team-p"})
