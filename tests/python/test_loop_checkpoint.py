"""Periodic checkpoints off the training step (issue 34, item 4):
reshard.elastic.Loop's step end on a checkpoint step waits for no
coordinator call. Two gloo ranks (tests/python/torch2/loop_async_checkpoint.py)
on a real local cluster (PostgreSQL, coordinator, one agent) with a 60 s
lease, so that the coordinator can be stopped (SIGSTOP) for real while the
ranks train, without their host being found lost.

Asserted: with the coordinator stopped, the step ends of the checkpoint step
and of the step after it return on both ranks (the Checkpoint RPC is still
unanswered); once it runs again the checkpoint commits the state and the
dataset state of its own step (the ranks hold a later step's by then), and
the final checkpoint commits after it, on top of its generation. A
periodic checkpoint the coordinator refuses does not fail its own step end
but the next one, on both ranks, with the same error.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import reshard
from reshard import data

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch2", "loop_async_checkpoint.py")
HELD_DEADLINE_S = 15.0  # the held step ends return within this (they take milliseconds)


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=2, lease_ms=60000,
                      heartbeat_ms=200) as c:
        yield c


def _dataset():
    return data.DatasetState(data.DatasetDescriptor("tokens", 1000, "v1"), data.Order(seed=3),
                             global_batch=4)


def _env():
    import reshard as pkg
    root = os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__)))
    return dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


def _wait(what, cond, procs, timeout):
    """Waits (deadline `timeout` s) until cond() holds; fails at once when a
    rank exited with an error."""
    end = time.monotonic() + timeout
    while not cond():
        bad = [p.returncode for p in procs if p.poll() not in (None, 0)]
        assert not bad, f"{what}: a rank exited with {bad}"
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def _stopped(pid):
    """Whether every thread of process `pid` is stopped (a SIGSTOP takes
    effect on each thread when it next runs)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return set(states) == {"T"}


def test_checkpoint_step_end_waits_for_no_coordinator_call(cluster, client, job_name, tmp_path):
    from helpers import loop_job_config
    job, cfg_path = loop_job_config(cluster, client, job_name, tmp_path, _dataset())
    talk = tmp_path / "talk"
    talk.mkdir()
    procs = [subprocess.Popen([sys.executable, SCRIPT, str(r), cfg_path,
                               str(talk)], env=_env()) for r in range(2)]
    pid = cluster.coordinator_pid
    held = [talk / f"held-{step}-{r}.json" for step in (2, 3) for r in range(2)]
    try:
        _wait("both ranks before the checkpoint step",
              lambda: all((talk / f"ready-{r}.json").exists() for r in range(2)), procs, 120)
        os.kill(pid, signal.SIGSTOP)
        try:
            _wait("the coordinator stopped", lambda: _stopped(pid), procs, 10)
            (talk / "held").touch()
            _wait("the step ends of steps 2 (a checkpoint) and 3 with the coordinator stopped",
                  lambda: all(p.exists() for p in held), procs, HELD_DEADLINE_S)
            # Still stopped: nothing the coordinator answers was waited for.
            assert _stopped(pid)
        finally:
            os.kill(pid, signal.SIGCONT)
        (talk / "resumed").touch()
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    took = [json.loads(p.read_text()) for p in held]
    print("step ends with the coordinator stopped (s):", took)
    outs = [json.loads((talk / f"out-{r}.json").read_text()) for r in range(2)]
    for out in outs:
        # refused: not at its own step end, at the next one, on every rank.
        assert out["refused_first"] == {"returned": "None"}
        assert out["refused_second"] == {
            "type": "InvalidArgument",
            "message": "Checkpoint: INVALID_ARGUMENT: rank 0: step: 0 must be >= 1"}
        assert out["refused_recorded"] == [[], []]
        # held: nothing recorded before the outcome was agreed on.
        assert out["before_wait"] == []
        (step, generation, checkpoint_id), = out["checkpoints"]
        assert (step, generation) == (2, 2)
        # The generation holds step 2's w while the rank holds step 3's,
        # and the dataset state of step 2 came with it.
        assert out["loaded_w"] == [2.0] * 4 and out["w_now"] == [3.0] * 4
        assert out["dataset_state"] == [2, 2]
        assert out["final"][:2] == [3, 3]
    assert outs[0]["checkpoints"] == outs[1]["checkpoints"]
    assert outs[0]["final"] == outs[1]["final"]
    periodic = client.get_operation(outs[0]["checkpoints"][0][2])
    final = client.get_operation(outs[0]["final"][2])
    assert periodic.state == final.state == reshard.coordinator_pb2.OPERATION_STATE_COMMITTED
    assert (periodic.from_generation, periodic.to_generation) == (1, 2)
    assert (final.from_generation, final.to_generation) == (2, 3)
    committed = client.dataset_state(job.id)
    assert (committed.step, committed.committed_generation) == (3, 3)


def test_snapshot_buffers_are_copies_kept_for_the_next_checkpoint():
    """The snapshot a checkpoint step takes: copies that the next steps'
    in-place updates do not reach, into buffers the next checkpoint reuses
    (one checkpoint is in flight at a time)."""
    import numpy as np
    from reshard import elastic
    staging = elastic._Staging()
    w, t = np.arange(6.0).reshape(2, 3), torch.arange(4, dtype=torch.float32)
    blob = bytearray(b"rng")
    first, events = staging.copy({"w": w.T, "t": t, "blob": blob, "step": b"\x01", "none": None})
    assert events == []
    w += 10
    t += 10
    blob[0] = 0
    assert first["w"].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert first["t"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (first["blob"], first["step"], first["none"]) == (b"rng", b"\x01", None)
    second, _ = staging.copy({"w": w.T, "t": t, "blob": blob, "step": b"\x02", "none": None})
    assert second["w"] is first["w"] and second["t"] is first["t"]
    assert second["w"].tolist() == [[10.0, 13.0], [11.0, 14.0], [12.0, 15.0]]
    assert second["t"].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert (second["blob"], second["step"]) == (b"\x00ng", b"\x02")
    # Another shape or dtype gets a new buffer.
    third, _ = staging.copy({"w": np.zeros(2, np.float32), "t": t.double()})
    assert third["w"] is not first["w"] and third["w"].dtype == np.float32
    assert third["t"] is not first["t"] and third["t"].dtype == torch.float64
