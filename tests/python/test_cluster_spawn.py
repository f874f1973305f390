"""The local cluster starts its processes without running Python between fork
and exec (issue 31, defect 9).

A process whose gRPC threads run (every test module: its clients and
watches) used to start PostgreSQL, the coordinator and the agents with a
preexec_fn. That makes subprocess fork() it and run Python in the child;
gRPC's fork handlers may start a poller thread there, the child's close_fds
then pulls that thread's epoll descriptor, and the child aborts before its
exec: "reshard-agent host-0 exited with status -6", last line
"Epoll1Poller ... encountered epoll_wait error: Bad file descriptor".
"""

import os
import threading
from concurrent import futures

import grpc

import cluster as local

_forked = {"armed": False, "fd": -1}


def _after_in_child():
    # Runs in a forked child only when Python runs there (a preexec_fn).
    if _forked["armed"]:
        os.write(_forked["fd"], b"x")


os.register_at_fork(after_in_child=_after_in_child)


def _start_and_wait(tmp_path, n, argv):
    """Starts `argv` n times as the cluster starts its processes; the exit
    statuses and the last output of any that failed."""
    failed = []
    for i in range(n):
        p = local._Process(f"child-{i}", argv, str(tmp_path / "child.log"))
        rc = p.proc.wait(timeout=60)
        p.stop()
        if rc != 0:
            failed.append((i, rc, p.tail(3)))
    return failed


def test_no_python_runs_in_a_started_child(tmp_path):
    r, w = os.pipe()
    os.set_blocking(r, False)
    _forked.update(armed=True, fd=w)
    try:
        assert _start_and_wait(tmp_path, 3, ["true"]) == []
    finally:
        _forked.update(armed=False, fd=-1)
        os.close(w)
    try:
        ran = os.read(r, 64)
    except BlockingIOError:
        ran = b""
    os.close(r)
    # Before the fix: b"xxx", the at-fork handler ran in each child.
    assert ran == b""


def test_children_start_while_grpc_calls_run(tmp_path):
    """The abort caused for real: gRPC busy in this process, children started
    back to back. Before the fix one start in a few hundred aborted (status -6)
    on a loaded machine; now none may."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def call():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.unary_unary("/reshard.test.Nothing/Call")
            while not stop.is_set():
                try:
                    method(b"", timeout=0.05)
                except grpc.RpcError:
                    pass
                stop.wait(0.003)  # idle moments: gRPC's fork handlers run then

    callers = [threading.Thread(target=call, daemon=True) for _ in range(3)]
    for t in callers:
        t.start()
    try:
        failed = _start_and_wait(tmp_path, 300, ["true"])
    finally:
        stop.set()
        for t in callers:
            t.join(timeout=10)
        server.stop(0)
    assert failed == []
