"""A rank that `reshard run` starts in tests/python/test_launch.py: numpy
state in reshard.elastic's Loop, torch.distributed (gloo, env://) for its
collectives, so it depends on neither reshard.pytorch nor a new loop API.

State: "w" (float64[8], replicated) and "step" (an int64 blob). A step does
w = all_reduce(w) / world + 1, so after s steps from the start w equals
arange(8) + s exactly on every rank. How it starts follows the launcher's
environment (reshard.launch.rank_env): RESHARD_OPERATION_ID set -> warm up
and reshard.elastic.join; RESHARD_GENERATION 0 -> publish generation 1 from
the start; else reshard.elastic.load of that generation.

A collective that fails because a peer died ends it with
launch.EXIT_PEER_LOST: the loop's own (reshard.elastic.PeerLost) or the
step's all_reduce, classified by reshard.pytorch_loop's rule for a user's
step (a gloo transport error). Writes $LAUNCH_TEST_OUT/<pid>.json: its
environment ("env") when it starts, then what it loaded ("loaded": step, w) and how its loop ended ("cut": a
stop-free cut-over or a stop-the-world stop at a step boundary). Its only
credential is the job's worker token.
"""

import datetime
import json
import os
import sys
import time

import numpy as np

import reshard
from reshard import data, elastic, launch, pytorch_loop

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "RESHARD_COORDINATOR", "RESHARD_JOB_ID", "RESHARD_WORKER_TOKEN",
            "RESHARD_WORKER_SOCKET", "RESHARD_GENERATION", "RESHARD_OPERATION_ID",
            "RESHARD_LAYOUT", "RESHARD_TLS_CA", "RESHARD_DEVICE")
SIZE = 8
STEP_S = 0.05


def job_ptc():
    return reshard.as_message({
        "numLayers": 1,
        "tensors": [{"name": "w", "dtype": "DTYPE_FLOAT64", "shape": [SIZE],
                     "partition": {"tp": {"mode": "TP_REPLICATED"},
                                   "pipeline": {"mode": "PIPELINE_EVERY_STAGE"},
                                   "dp": {"mode": "DP_REPLICATED"}}}],
        "blobs": [{"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"}]},
        reshard.ptc_pb2.Ptc)


def dataset_state():
    return data.DatasetState(data.DatasetDescriptor("launch-test", 64, "gen:1"),
                             data.Order(seed=1, shuffle="none"), global_batch=2)


class Record:
    def __init__(self):
        self.path = os.path.join(os.environ["LAUNCH_TEST_OUT"], f"{os.getpid()}.json")
        self.doc = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in ENV_KEYS}}
        self.write()

    def write(self, **fields):
        self.doc.update(fields)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f)
        os.replace(tmp, self.path)


def main():
    record = Record()
    env = launch.rank_env()
    import torch
    import torch.distributed as dist

    def init():
        dist.init_process_group("gloo", init_method="env://", rank=env.rank,
                                world_size=env.world_size, timeout=datetime.timedelta(seconds=60))

    client = env.client()
    worker = env.worker(ptc=job_ptc())
    configured = dataset_state()
    if env.warm_up:
        joined = elastic.join(client, env.job_id, env.operation_id, env.rank, worker, configured,
                              warm_up=init)
        shard, state = joined.shard, joined.state
    elif env.fresh:
        init()
        shard = {"w": np.arange(SIZE, dtype=np.float64),
                 "step": np.zeros(1, dtype=np.int64).tobytes()}
        worker.publish(env.rank, 1, shard)
        state = configured
    else:
        init()
        joined = elastic.load(client, env.job_id, env.rank, worker, configured,
                              generation=env.generation)
        shard, state = joined.shard, joined.state
    w = np.array(shard["w"], dtype=np.float64)
    step = int(np.frombuffer(bytes(shard["step"]), dtype=np.int64)[0])
    record.write(loaded={"step": step, "w": w.tolist(), "dataset_step": state.step})
    loop = elastic.Loop(client, env.job_id, env.rank, worker)
    while True:
        t0 = time.monotonic()
        t = torch.from_numpy(w.copy())
        dist.all_reduce(t)
        w = t.numpy() / env.world_size + 1.0
        step += 1
        state = state.advanced()
        time.sleep(max(0.0, STEP_S - (time.monotonic() - t0)))
        cut = loop.boundary(state, lambda: {"w": w, "step": np.array([step], np.int64).tobytes()})
        if cut is not None:
            record.write(cut={"generation": cut.generation, "step": step,
                              "operation": cut.operation_id, "w": w.tolist()})
            break
    worker.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the loop's watch threads end with the process


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001: only a peer's death is handled
        # A peer died, seen by the loop or by this step's all_reduce
        # (whichever collective ran when it died): say so to the launcher,
        # which then does not report this rank (its own death is not the
        # failure).
        if not isinstance(e, elastic.PeerLost) and not pytorch_loop._peer_failure(e):
            raise
        sys.stderr.write(f"peer lost: {e}\n")
        os._exit(launch.EXIT_PEER_LOST)
