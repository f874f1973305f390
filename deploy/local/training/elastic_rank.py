"""One rank of the elastic training test (tests/python/test_training.py).

Reads a JSON config from argv[1]; joins a gloo process group of the phase's
world; builds its shard (from the seed at the start, else loaded from the
job's current generation through its host's agent); trains `steps` steps
with the dataset state's shares; prints one JSON line per step on rank 0
({"loss": ...}) and, on every tp-0 rank, the sample ids read; then prints
READY and waits for "PUBLISH <generation>" on stdin, publishes its shard
into that generation through its agent, prints PUBLISHED and exits.
"""

import json
import os
import sys

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reshard  # noqa: E402
from reshard import data, layout  # noqa: E402
import tiny_gpt  # noqa: E402


def main():
    cfg = json.load(open(sys.argv[1]))
    rank, lay = cfg["rank"], reshard.as_message(cfg["layout"], reshard.ptc_pb2.Layout)
    ptc = reshard.as_message(cfg["ptc"], reshard.ptc_pb2.Ptc)
    tp, dp, world = lay.config.tp, lay.config.dp, lay.config.tp * lay.config.dp
    tp_i, dp_i, _ = layout.coords(lay.config, rank)
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank,
                            world_size=world)
    tp_groups = [dist.new_group([layout.rank_of(lay.config, t, d, 0) for t in range(tp)])
                 for d in range(dp)]
    dp_groups = [dist.new_group([layout.rank_of(lay.config, t, d, 0) for d in range(dp)])
                 for t in range(tp)]
    host = layout.slots(lay)[rank][0]
    worker = reshard.Worker(cfg["sockets"][host], cfg["job_id"], ptc=ptc,
                            worker_token=cfg["worker_token"])
    if cfg["load_generation"]:
        shard = worker.load(rank, cfg["load_generation"])
    else:
        shard = layout.shard(ptc, lay, rank, tiny_gpt.init_global(cfg["seed"]))
        worker.publish(rank, 1, shard)
    model = tiny_gpt.Model(shard, tp, tp_i, tp_groups[dp_i])
    state = data.DatasetState.from_dict(cfg["dataset_state"])
    for _ in range(cfg["steps"]):
        loss, ids = tiny_gpt.train_step(model, state, dp, dp_i, dp_groups[tp_i], cfg["seed"])
        out = {"step": state.step + 1, "loss": loss} if rank == 0 else {}
        if tp_i == 0:
            out["ids"] = ids
        if out:
            print(json.dumps(out), flush=True)
        state = state.advanced()
    dist.barrier()
    print("READY", flush=True)
    command = sys.stdin.readline().split()
    if command and command[0] == "PUBLISH":
        worker.publish(rank, int(command[1]), model.shard())
        print("PUBLISHED", flush=True)
    worker.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
