"""One rank of test_pytorch_training's failure test: reshard.elastic.Loop on
a two-rank gloo world with a tiny numpy state, holding only the job's
worker token. argv: rank, config JSON path, out JSON path. Records, per
scenario, the exception every rank raised:
  refused   - rank 0's checkpoint is refused (it carries step 0: no step
              trained): every rank raises InvalidArgument;
  publish   - rank 1's publish is refused (a wrong local shape): every rank
              raises it;
  peer      - rank 1 dies (os._exit) before a step boundary: rank 0 raises
              reshard.elastic.PeerLost; then a bare all_reduce of rank 0,
              uncaught, ends it with status 75.
"""
import json
import os
import sys

import numpy as np
import torch.distributed as dist

from reshard import elastic

import loop_rank


def main():
    rank, out_path = int(sys.argv[1]), sys.argv[3]
    cfg, client, worker, state = loop_rank.connect(rank, sys.argv[2])
    worker.publish(rank, 1, {"w": np.full(4, float(rank == 0))})
    loop = elastic.Loop(client, cfg["job_id"], rank, worker)
    out = {}

    def record(name, fn):
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001: what the test checks
            out[name] = {"type": type(e).__name__, "message": str(e),
                         "code": getattr(getattr(e, "code", None), "name", None)}
        with open(out_path, "w") as f:
            json.dump(out, f)

    good = lambda: {"w": np.ones(4)}  # noqa: E731
    record("refused", lambda: loop.finish(state, good))
    bad = (lambda: {"w": np.ones(3)}) if rank == 1 else good
    record("publish", lambda: loop.finish(state.advanced(), bad))
    if rank == 1:
        os._exit(0)
    record("peer", lambda: loop.boundary(state.advanced(2), good))
    # A collective of the user's own step (here a bare all_reduce) that
    # fails the same way, uncaught: pytorch_loop's hook ends the process as
    # PeerLost with status 75 (the launcher's EXIT_PEER_LOST).
    import torch
    from reshard import pytorch_loop
    pytorch_loop._exit_on_peer_lost(rank, cfg["job_id"])
    dist.all_reduce(torch.zeros(1))
    os._exit(0)


if __name__ == "__main__":
    main()
