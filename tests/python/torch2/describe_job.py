"""Writes the PTC of the quickstart's model + optimizer (reshard.pytorch.describe
in a one-rank world: the PTC does not depend on the sizes) as JSON to argv[1]:
what the test registers the job with."""
import json
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import reshard
from reshard import pytorch
import tiny_transformer as my

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}.store", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
model = my.parallelize(my.build(), mesh)
opt = my.optimizer(model)
my.train_step(model, opt, [0])  # Adam's state exists after a step
spec = pytorch.describe(pytorch.AppState(model, opt), mesh=mesh)
with open(sys.argv[1], "w") as f:
    json.dump(reshard.to_dict(spec.ptc), f)
dist.destroy_process_group()
os.remove(f"{sys.argv[1]}.store") if os.path.exists(f"{sys.argv[1]}.store") else None
