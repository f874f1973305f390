"""reshard._rpc, how the SDK speaks gRPC, without a cluster: the shared test
vectors (tests/data/rpc_vectors.json, also checked by the C++
rpc_vectors_test against common/rpc), and the call sites that follow the
table, each against a real gRPC server on port 0 (or a unix socket) that
answers what the test scripts: the Client's retries within one overall
deadline and their jitter, the Worker's publish retries within the time left,
watch_job's follow mode (the launcher's)."""

import random
import threading
import time
from concurrent import futures

import grpc
import pytest
from google.protobuf import descriptor_pool

import reshard
from reshard import _rpc, errors, launch
from reshard.v1 import (agent_pb2, coordinator_pb2, coordinator_pb2_grpc, ptc_pb2,  # noqa: F401
                        worker_pb2, worker_pb2_grpc)
from helpers import check_vectors_reproduce, read_vectors


@pytest.fixture(scope="module")
def vectors():
    return read_vectors("rpc_vectors.json")


# ------------------------------------------------------------ the vectors


def test_vectors_codes(vectors):
    assert [c["number"] for c in vectors["codes"]] == list(range(17)) + [17, -1]
    for case in vectors["codes"]:
        n = case["number"]
        assert _rpc.code_name(n) == case["name"], case
        assert _rpc.exception_name(n) == case["python_class"], case
        assert _rpc.code_name(_rpc.wire_code(n)) == case["wire"], case
        assert _rpc.is_watch_refusal(n) == case["watch_refusal"], case
        assert _rpc.is_silence(n) == case["silence"], case
        # The names and numbers are gRPC's own.
        if 0 <= n <= 16:
            assert getattr(grpc.StatusCode, case["name"]).value[0] == n
        # The error a number on the wire becomes (WorkerFdResponse.code).
        err = errors.from_code(n, "what went wrong", "M")
        assert type(err).__name__ == case["python_class"]
        assert err.code.name == case["wire"] and err.code.value[0] == _rpc.wire_code(n)
        assert str(err) == f"M: {case['wire']}: what went wrong"
    assert {c["name"] for c in vectors["codes"] if c["silence"]} == {"UNAVAILABLE",
                                                                     "DEADLINE_EXCEEDED"}


def test_every_exception_class_of_the_table_exists():
    for code, cls in _rpc.EXCEPTION_FOR_CODE.items():
        assert issubclass(getattr(errors, cls), errors.ReshardError)
        assert getattr(errors, cls).code == getattr(grpc.StatusCode, code)
        assert getattr(reshard, cls) is getattr(errors, cls)
        assert errors._BY_CODE[getattr(grpc.StatusCode, code)] is getattr(errors, cls)
    assert len(errors._BY_CODE) == len(_rpc.EXCEPTION_FOR_CODE) == 13


def test_vectors_policies(vectors):
    assert [p["kind"] for p in vectors["policies"]] == list(_rpc.CALL_KINDS)
    for case in vectors["policies"]:
        p = _rpc.POLICIES[case["kind"]]
        assert p["max_attempts"] == case["max_attempts"]
        assert round(p["initial_backoff_s"] * 1e6) == case["initial_backoff_us"]
        assert round(p["max_backoff_s"] * 1e6) == case["max_backoff_us"]
        assert (p["multiplier"], p["jitter"]) == (case["multiplier"], case["jitter"]) == (2, 0.5)
    # The table of docs/python.md ("Retries").
    got = {c["kind"]: (c["max_attempts"], c["initial_backoff_us"], c["max_backoff_us"])
           for c in vectors["policies"]}
    assert got == {"client_call": (5, 100000, 5000000),
                   "unkeyed_mutation": (1, 100000, 5000000),
                   "agent_call": (0, 100000, 2000000),
                   "stream_reconnect": (5, 100000, 5000000),
                   "worker_publish": (0, 20000, 500000)}


def test_vectors_retryable(vectors):
    assert len(vectors["retryable"]) == 17 * 5
    retried = {}
    for case in vectors["retryable"]:
        assert _rpc.retryable(case["kind"], case["code"]) == case["retryable"], case
        if case["retryable"]:
            retried.setdefault(case["kind"], set()).add(_rpc.code_name(case["code"]))
    assert retried == {
        "client_call": {"UNAVAILABLE"},
        "agent_call": {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
        "stream_reconnect": {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
        "worker_publish": {"UNAVAILABLE"}}  # unkeyed_mutation: none


def test_vectors_backoff(vectors):
    assert len(vectors["backoff"]) == 5 * 12 * 4
    for case in vectors["backoff"]:
        kind, attempt, u = case["kind"], case["attempt"], case["u"]
        assert _rpc.base_backoff_us(kind, attempt) == case["base_micros"], case
        assert _rpc.backoff_at_us(kind, attempt, u) == case["micros"], case
        assert _rpc.backoff_at(kind, attempt, u) == case["micros"] / 1e6
    # What the rows show: doubling from the initial wait up to the cap, and
    # jitter that only shortens a wait (never above the cap, never on it
    # for u > 0).
    rows = {(c["kind"], c["attempt"], c["u"]): c for c in vectors["backoff"]}
    assert [rows["client_call", n, 0.0]["micros"] for n in range(1, 9)] == [
        100000, 200000, 400000, 800000, 1600000, 3200000, 5000000, 5000000]
    assert rows["worker_publish", 12, 0.5]["micros"] == 375000
    assert rows["agent_call", 12, 0.999]["micros"] == 1000999


def test_backoff_stays_between_half_the_base_and_the_base():
    rng = random.Random(7)
    for kind in _rpc.CALL_KINDS:
        cap = round(_rpc.POLICIES[kind]["max_backoff_s"] * 1e6)
        for attempt in range(1, 60):
            base = _rpc.base_backoff_us(kind, attempt)
            assert base <= cap
            for _ in range(20):
                got = _rpc.backoff_at_us(kind, attempt, rng.random())
                assert base // 2 <= got <= base
    with pytest.raises(ValueError):
        _rpc.backoff_at_us(_rpc.CLIENT_CALL, 1, 1.0)
    with pytest.raises(ValueError):
        _rpc.base_backoff_us(_rpc.CLIENT_CALL, 0)
    with pytest.raises(KeyError):
        _rpc.retryable("no_such_kind", _rpc.UNAVAILABLE)
    with pytest.raises(KeyError):
        _rpc.policy(_rpc.CLIENT_CALL, initial_backoff=1)


def test_vectors_enum_names(vectors):
    pool = descriptor_pool.Default()
    enums = set()
    for case in vectors["enum_names"]:
        desc = pool.FindEnumTypeByName(case["enum"])
        enums.add(desc.name)
        assert _rpc.short_name(desc, case["value"]) == case["upper"], case
        assert _rpc.short_name(desc, case["value"], lower=True) == case["lower"], case
    assert enums == {"OperationState", "OperationKind", "JobState", "HostState",
                     "HostTaskState", "StepBoundary", "TpMode"}
    # Every value of every enum, and one the enum lacks.
    for name in enums:
        desc = pool.FindEnumTypeByName("reshard.v1." + name)
        got = sorted(c["value"] for c in vectors["enum_names"] if c["enum"] == desc.full_name)
        assert got == sorted([v.number for v in desc.values] + [999])
    # The generated enum wrapper works as well as its descriptor.
    assert _rpc.short_name(coordinator_pb2.OperationState, 4) == "COMMITTED"
    assert _rpc.short_name(agent_pb2.HostTaskState, 5, lower=True) == "prepared"
    assert _rpc.short_name(ptc_pb2.TpMode, 1) == "TP_SPLIT"  # no common TP_MODE_ prefix
    assert _rpc.short_name(coordinator_pb2.JobState, -3, lower=True) == "unknown_-3"


def test_a_ranks_error_record_comes_back_as_the_class_of_its_code():
    # reshard.elastic shares one rank's failure with the others as a record
    # (class name, message, code name, method) and raises it again there.
    from reshard import elastic
    op = coordinator_pb2.Operation(id="op-1", state=coordinator_pb2.OPERATION_STATE_FAILED)
    cases = [(getattr(errors, cls)("what went wrong", method="M"), getattr(errors, cls),
              code) for code, cls in _rpc.EXCEPTION_FOR_CODE.items()]
    cases += [
        (errors.ReshardError("odd", code=grpc.StatusCode.OUT_OF_RANGE, method="M"),
         errors.ReshardError, "OUT_OF_RANGE"),
        # UnsafeBlob's constructor takes other arguments: its code's class.
        (errors.UnsafeBlob("b", "names os.system", "os.system"), errors.InvalidArgument,
         "INVALID_ARGUMENT"),
        (errors.OperationFailed(op), errors.ReshardError, "ABORTED"),
        (elastic.PeerLost("gone", method="M"), elastic.PeerLost, "UNAVAILABLE"),
        (ValueError("bad"), errors.ReshardError, "INTERNAL")]
    for exc, cls, code in cases:
        with pytest.raises(errors.ReshardError) as e:
            elastic._raise_record(elastic._error_record(3, exc), others=2)
        assert type(e.value) is cls and e.value.code.name == code, exc
        assert e.value.message.startswith("rank 3: ") and e.value.message.endswith(
            " (and 2 more ranks failed)"), e.value.message
    with pytest.raises(errors.ReshardError) as e:
        elastic._raise_record(elastic._error_record(1, ValueError("bad")))
    assert e.value.message == "rank 1: ValueError: bad"


def test_vector_file_is_what_the_generator_writes(tmp_path):
    # The checked-in file is reproducible from _rpc.py (no hand edits).
    check_vectors_reproduce("gen_rpc_vectors.py", "rpc_vectors.json", tmp_path)


# ------------------------------------------------------- the call sites


class _Coordinator(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """A CoordinatorService that answers GetJob and WatchJob as scripted:
    `get_job(n)` for the n-th GetJob (a Job, or a grpc.StatusCode to
    answer); `watch` a list, one entry per WatchJob stream: the Jobs it
    sends, then how it ends (None: cleanly, or a grpc.StatusCode)."""

    def __init__(self, get_job=None, watch=()):
        self.get_job, self.watch = get_job, list(watch)
        self.calls = []  # (method, monotonic time)

    def GetJob(self, request, context):
        self.calls.append(("GetJob", time.monotonic()))
        got = self.get_job(sum(1 for m, _ in self.calls if m == "GetJob"))
        if isinstance(got, grpc.StatusCode):
            context.abort(got, f"scripted {got.name}")
        return got

    def WatchJob(self, request, context):
        self.calls.append(("WatchJob", time.monotonic()))
        if not self.watch:
            context.abort(grpc.StatusCode.UNAVAILABLE, "script over")
        jobs, end = self.watch.pop(0)
        for job in jobs:
            if job.version > request.from_version:
                yield job
        if end is not None:
            context.abort(end, f"scripted {end.name}")


@pytest.fixture
def coordinator():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"
    yield start
    for server in servers:
        server.stop(0)


def _slow_unavailable(seconds):
    def answer(n):
        time.sleep(seconds)
        return grpc.StatusCode.UNAVAILABLE
    return answer


def test_a_call_and_its_retries_share_one_deadline(coordinator):
    # Every attempt is answered UNAVAILABLE after 0.6 s: five attempts would
    # take 3 s and more, but the call's timeout (1.5 s) bounds the whole
    # call, each attempt getting the time left.
    server = _Coordinator(get_job=_slow_unavailable(0.6))
    retries = []
    with reshard.Client(coordinator(server), timeout=1.5, max_attempts=5, initial_backoff=0.05,
                        insecure=True, on_retry=lambda m, a, e, d, k: retries.append(a)) as c:
        start = time.monotonic()
        with pytest.raises(reshard.DeadlineExceeded) as e:
            c.get_job("job-1")
        took = time.monotonic() - start
    assert e.value.method == "GetJob"
    assert 1.5 <= took < 2.4, took
    assert 2 <= len(server.calls) <= 3 and retries == list(range(1, len(retries) + 1))


def test_a_wait_past_the_deadline_is_not_slept(coordinator):
    # A 1 s wait after the first UNAVAILABLE would pass the 0.5 s deadline:
    # the call ends at once, DeadlineExceeded naming the attempts and the
    # last error.
    server = _Coordinator(get_job=lambda n: grpc.StatusCode.UNAVAILABLE)
    with reshard.Client(coordinator(server), timeout=0.5, initial_backoff=1.0, max_backoff=1.0,
                        insecure=True) as c:
        start = time.monotonic()
        with pytest.raises(reshard.DeadlineExceeded) as e:
            c.get_job("job-1")
        assert time.monotonic() - start < 0.45
    assert len(server.calls) == 1
    assert "after 1 attempt; the last: UNAVAILABLE: scripted UNAVAILABLE" in e.value.message


def test_retry_waits_are_the_tables_jittered_backoff(coordinator, monkeypatch):
    # u = 0.999 is the longest draw's opposite: the shortest wait, half the
    # base; u = 0 the base itself. No wait is ever above the capped base.
    server = _Coordinator(get_job=lambda n: grpc.StatusCode.UNAVAILABLE)
    address = coordinator(server)
    for u in (0.999, 0.0):
        delays = []
        monkeypatch.setattr(random, "random", lambda: u)
        with reshard.Client(address, timeout=30, max_attempts=5, initial_backoff=0.01,
                            max_backoff=0.03, insecure=True,
                            on_retry=lambda m, a, e, d, k: delays.append(d)) as c:
            with pytest.raises(reshard.Unavailable):
                c.get_job("job-1")
        policy = _rpc.policy(_rpc.CLIENT_CALL, initial_backoff_s=0.01, max_backoff_s=0.03)
        assert delays == [_rpc.backoff_at(policy, n, u) for n in range(1, 5)]
        assert max(delays) <= 0.03
    assert delays == [0.01, 0.02, 0.03, 0.03]


def _job(version):
    return coordinator_pb2.Job(id="job-1", version=version)


def test_watch_job_follow_reopens_on_every_break_until_the_job_is_gone(coordinator):
    # More broken streams in a row than max_attempts, of every code a follow
    # reopens on; each job received starts the count again; a stream that
    # ends cleanly is read (GetJob): NotFound ends the follow.
    S = grpc.StatusCode
    server = _Coordinator(
        get_job=lambda n: _job(2) if n == 1 else S.NOT_FOUND,
        watch=[([_job(1)], S.INTERNAL), ([], S.ABORTED), ([], S.CANCELLED),
               ([], S.DEADLINE_EXCEEDED), ([], S.UNAVAILABLE), ([_job(1), _job(2)], None),
               ([_job(2)], None)])
    reopened = []
    with reshard.Client(coordinator(server), timeout=10, max_attempts=2, initial_backoff=0.01,
                        max_backoff=0.05, insecure=True) as c:
        got = []
        with pytest.raises(reshard.NotFound):
            for job in c.watch_job("job-1", follow=lambda e, d: reopened.append(e)):
                got.append(job.version)
    assert got == [1, 2]  # resumed from the last version seen: nothing twice
    assert [None if e is None else e.code.name for e in reopened] == [
        "INTERNAL", "ABORTED", "CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE", None]
    # Without follow the same break is the watch's end.
    server.watch = [([_job(1)], S.INTERNAL)]
    with reshard.Client(coordinator(server), insecure=True) as c:
        with pytest.raises(reshard.Internal):
            list(c.watch_job("job-1"))


def test_watch_job_follow_ends_when_stopped(coordinator):
    server = _Coordinator(watch=[([], grpc.StatusCode.UNAVAILABLE)] * 1000)
    stop = threading.Event()
    with reshard.Client(coordinator(server), initial_backoff=0.05, max_backoff=0.05,
                        insecure=True) as c:
        updates = c.watch_job("job-1", follow=True, stop=stop)
        t = threading.Thread(target=lambda: list(updates))
        t.start()
        end = time.monotonic() + 30
        while sum(1 for m, _ in server.calls if m == "WatchJob") < 8:  # past max_attempts
            assert t.is_alive() and time.monotonic() < end
            time.sleep(0.01)
        stop.set()
        t.join(timeout=10)
        assert not t.is_alive()


def test_the_launcher_follows_the_job_through_broken_streams(coordinator, tmp_path):
    S = grpc.StatusCode
    server = _Coordinator(get_job=lambda n: S.NOT_FOUND,
                          watch=[([_job(1)], S.UNAVAILABLE)] * 7 + [([_job(1), _job(3)], None)])
    logged = []
    with reshard.Client(coordinator(server), max_attempts=2, initial_backoff=0.01,
                        max_backoff=0.02, insecure=True) as c:
        L = launch.Launcher(c, "job-1", "h0", "/run/worker.sock", ["true"], "coord:1",
                            log=logged.append, events_path=str(tmp_path / "events.jsonl"))
        t = threading.Thread(target=L._watch_job)
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "the launcher still follows a deleted job"
    events = []
    while not L.queue.empty():
        events.append(L.queue.get_nowait())
    assert [k for k, _ in events] == ["job", "job", "job_gone"]
    assert [v.version for k, v in events if k == "job"] == [1, 3]
    # Seven broken streams in a row (more than max_attempts), each reopened once.
    assert len([m for m in logged if "reconnecting" in m]) == 7


# ------------------------------------------------------------- the worker


class _Agent(worker_pb2_grpc.WorkerServiceServicer):
    """PublishShard answers UNAVAILABLE ("generation not open") after
    `first` seconds the first time, after `later` seconds every other time."""

    def __init__(self, first, later):
        self.first, self.later, self.calls = first, later, []

    def PublishShard(self, request, context):
        self.calls.append(time.monotonic())
        time.sleep(self.first if len(self.calls) == 1 else self.later)
        context.abort(grpc.StatusCode.UNAVAILABLE, "generation 2 is not open on this host")


def test_a_publish_and_its_retries_share_the_workers_timeout(tmp_path):
    # The second attempt would hang for 5 s: it gets the time left of the
    # 1.5 s timeout, not 1.5 s of its own.
    agent = _Agent(first=1.0, later=5.0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(agent, server)
    socket_path = str(tmp_path / "worker.sock")
    server.add_insecure_port("unix:" + socket_path)
    server.start()
    try:
        with reshard.Worker(socket_path, "job-1", timeout=1.5, worker_token="wt") as w:
            start = time.monotonic()
            with pytest.raises(reshard.DeadlineExceeded):
                w._call_retrying_unavailable("PublishShard", worker_pb2.PublishShardRequest())
            took = time.monotonic() - start
    finally:
        server.stop(0)
    assert 1.5 <= took < 2.2, took
    assert len(agent.calls) == 2
    # The wait between the attempts is the worker_publish row's first one.
    assert agent.calls[1] - agent.calls[0] >= 1.0 + _rpc.backoff_at(_rpc.WORKER_PUBLISH, 1, 0.999)
