"""One rank of test_loop_checkpoint: reshard.elastic.Loop on a two-rank gloo
world with a tiny numpy state ("w", changed in place by every step), holding
only the job's worker token. argv: rank, config JSON path, directory of the
files the rank and the test hand each other. Scenarios, in order:

  refused - a periodic checkpoint that rank 0's coordinator refuses (its
            step is 0): the step end of that step returns (the refusal
            comes later), the next step end raises it on every rank;
  held    - the coordinator is stopped (SIGSTOP, by the test) before the
            checkpoint step 2: steps 2 and 3 end while it is stopped (each
            writes held-<step>-<rank>.json with its step end's seconds);
            once it runs again, Loop.wait() records the checkpoint of step 2,
            whose generation holds w of step 2 (the rank holds step 3's by
            then) and the dataset state of step 2; finish() then commits
            step 3 on top of it.

Waits for the test's files have deadlines; out.json gets what was seen.
"""
import json
import os
import sys
import time

import numpy as np
import torch.distributed as dist

import reshard
from reshard import elastic

import loop_rank

DEADLINE_S = 60.0


def wait_file(path):
    end = time.monotonic() + DEADLINE_S
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"{path}: not written within {DEADLINE_S} s")
        time.sleep(0.01)


def write(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def outcome(fn):
    """What fn() returned (its repr), or the reshard error it raised."""
    try:
        return {"returned": repr(fn())}
    except reshard.ReshardError as e:
        return {"type": type(e).__name__, "message": str(e)}


def main():
    rank, talk = int(sys.argv[1]), sys.argv[3]
    cfg, client, worker, start = loop_rank.connect(rank, sys.argv[2])
    w = np.zeros(4)
    shard = lambda: {"w": w}  # noqa: E731
    worker.publish(rank, 1, shard())
    out = {}

    # refused: the Checkpoint of step 0 is InvalidArgument on rank 0.
    loop = elastic.Loop(client, cfg["job_id"], rank, worker, every_steps=1, timeout=60.0)
    out["refused_first"] = outcome(lambda: loop.boundary(start, shard))
    out["refused_second"] = outcome(lambda: loop.boundary(start, shard))
    out["refused_recorded"] = [loop.checkpoints, loop.folded]

    # held: the coordinator stopped across the checkpoint step 2.
    loop = elastic.Loop(client, cfg["job_id"], rank, worker, every_steps=2, timeout=60.0)
    state = start
    for step in (1, 2, 3):
        w[:] = step
        state = state.advanced()
        if step == 2:
            write(os.path.join(talk, f"ready-{rank}.json"), step)
            wait_file(os.path.join(talk, "held"))
        t0 = time.monotonic()
        cut = loop.boundary(state, shard)
        took = time.monotonic() - t0
        assert cut is None, cut
        if step >= 2:
            write(os.path.join(talk, f"held-{step}-{rank}.json"), took)
    wait_file(os.path.join(talk, "resumed"))
    out["before_wait"] = [list(c) for c in loop.checkpoints]
    loop.wait()
    out["checkpoints"] = [list(c) for c in loop.checkpoints]
    step, generation, checkpoint_id = loop.checkpoints[0]
    out["loaded_w"] = worker.load(rank, generation)["w"].tolist()
    committed = client.dataset_state(cfg["job_id"])
    out["dataset_state"] = [committed.step, committed.committed_generation]
    out["w_now"] = w.tolist()
    cut = loop.finish(state, shard)
    out["final"] = [cut.generation, cut.step, cut.checkpoint_id]
    write(os.path.join(talk, f"out-{rank}.json"), out)
    worker.close()
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
