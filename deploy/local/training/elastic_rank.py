"""One rank of the elastic training job (deploy/local/training/elastic.py),
written against the loop API (reshard.elastic).

Reads a JSON config from argv[1]. How it starts ("start"):
  seed  - the registered layout: shard cut from the seed, published as
          generation 1;
  join  - a new rank of a stop-free operation: warms up (process groups,
          model) while the old layout trains, then reshard.elastic.join
          marks the operation prepared, waits for its commit and loads;
  load  - a cold start after a stop-the-world reconfiguration.
How it ends ("end"): "cut" trains until a prepared stop-free operation
cuts over (reshard.elastic.Loop.boundary); "finish" trains `steps` steps
and publishes them with a checkpoint (Loop.finish). Steps take at least
`min_step_s` (a real job's cadence; the tiny model's step is a few ms).
Prints one JSON line per step on rank 0 ({"step", "loss", "t0", "t1"}), the
sample ids on every tp-0 rank, "WARM" once warm, and at the end
{"cut": generation, "step", "operation", "checkpoint", "t"}.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def emit(out):
    print(json.dumps(out), flush=True)


def main():
    cfg = json.load(open(sys.argv[1]))
    import torch.distributed as dist

    import reshard
    from reshard import data, elastic, layout
    import tiny_gpt
    rank, lay = cfg["rank"], reshard.as_message(cfg["layout"], reshard.ptc_pb2.Layout)
    ptc = reshard.as_message(cfg["ptc"], reshard.ptc_pb2.Ptc)
    tp, dp, world = lay.config.tp, lay.config.dp, lay.config.tp * lay.config.dp
    tp_i, dp_i, _ = layout.coords(lay.config, rank)
    host = layout.slots(lay)[rank][0]
    client = reshard.Client(cfg["coordinator"]["address"],
                            **elastic_client_kwargs(cfg["coordinator"]))
    worker = reshard.Worker(cfg["sockets"][host], cfg["job_id"], ptc=ptc,
                            worker_token=cfg["worker_token"])
    configured = data.DatasetState.from_dict(cfg["dataset_state"])

    def warm_up():
        dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank,
                                world_size=world)
        tp_groups = [dist.new_group([layout.rank_of(lay.config, t, d, 0) for t in range(tp)])
                     for d in range(dp)]
        dp_groups = [dist.new_group([layout.rank_of(lay.config, t, d, 0) for d in range(dp)])
                     for t in range(tp)]
        return tp_groups[dp_i], dp_groups[tp_i]

    if cfg["start"] == "join":
        joined = elastic.join(client, cfg["job_id"], cfg["operation_id"], rank, worker,
                              configured, warm_up=lambda: (emit_warm(), warm_up())[1])
        (tp_group, dp_group), shard, state = joined.warm, joined.shard, joined.state
    else:
        tp_group, dp_group = warm_up()
        if cfg["start"] == "seed":
            shard, state = layout.shard(ptc, lay, rank, tiny_gpt.init_global(cfg["seed"])), configured
            worker.publish(rank, 1, shard)
        else:
            loaded = elastic.load(client, cfg["job_id"], rank, worker, configured,
                                  generation=cfg["generation"])
            shard, state = loaded.shard, loaded.state
    model = tiny_gpt.Model(shard, tp, tp_i, tp_group)
    loop = elastic.Loop(client, cfg["job_id"], rank, worker)
    cut = None
    for n in range(cfg["max_steps"]):
        t0 = time.monotonic()
        loss, ids = tiny_gpt.train_step(model, state, dp, dp_i, dp_group, cfg["seed"])
        state = state.advanced()
        t1 = time.monotonic()
        out = {"step": state.step, "loss": loss, "t0": t0, "t1": t1} if rank == 0 else {}
        if tp_i == 0:
            out.update(step=state.step, ids=ids)
        if out:
            emit(out)
        time.sleep(max(0.0, cfg["min_step_s"] - (time.monotonic() - t0)))
        if cfg["end"] == "finish" and n + 1 == cfg["steps"]:
            cut = loop.finish(state, model.shard)
            break
        if cfg["end"] == "cut":
            cut = loop.boundary(state, model.shard)
            if cut is not None:
                break
    if cut is None:
        raise SystemExit(f"rank {rank}: no cut-over within {cfg['max_steps']} steps")
    if rank == 0:
        emit({"cut": cut.generation, "step": cut.step, "operation": cut.operation_id,
              "checkpoint": cut.checkpoint_id, "t": t1})
    worker.close()
    dist.destroy_process_group()
    os._exit(0)  # the loop's watch streams end with the process


def emit_warm():
    print("WARM", flush=True)


def elastic_client_kwargs(c):
    import reshard
    if c.get("insecure"):
        return {"insecure": True}
    return {"credentials": reshard.tls_credentials(c["ca"], c["cert"], c["key"])}


if __name__ == "__main__":
    main()
