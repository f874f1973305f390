"""What the two-rank loop scripts of the tests (loop_faults.py,
loop_async_checkpoint.py) share: one rank of a two-rank gloo world on the
job that tests/python/helpers.loop_job_config registered, holding only the
job's worker token."""
import json

import torch.distributed as dist

import reshard
from reshard import data


def connect(rank, cfg_path):
    """Joins the gloo world of the config's file store and connects to the
    coordinator and the agent. Returns (config, client, worker, the job's
    configured DatasetState)."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank,
                            world_size=2)
    client = reshard.Client(cfg["coordinator"], token=cfg["token"],
                            credentials=reshard.tls_credentials(cfg["ca"]))
    worker = reshard.Worker(cfg["socket"], cfg["job_id"], ptc=cfg["ptc"],
                            worker_token=cfg["token"])
    return cfg, client, worker, data.DatasetState.from_dict(cfg["dataset"])
