"""The quickstart of docs/pytorch.md (the test checks that the page shows this
file): a PyTorch 2 FSDP2 + tensor-parallel job, run by
`reshard run ... -- python train.py`. Everything reshard is marked # reshard."""
import os

import torch.distributed as dist

from reshard import data, pytorch, pytorch_loop                     # reshard
import tiny_transformer as my  # your model, parallel plan and step

dist.init_process_group("gloo")
mesh = pytorch_loop.device_mesh("cpu")  # the job's layout as a DeviceMesh  # reshard
# on the meta device when the job's state will be loaded into it  # reshard
model = pytorch_loop.build(lambda: my.parallelize(my.build(), mesh))   # reshard
opt = my.optimizer(model)
app = pytorch.AppState(model, opt)                                     # reshard
dataset = data.DatasetState(                                           # reshard
    data.DatasetDescriptor("tokens", my.NUM_SAMPLES, "v1"),            # reshard
    data.Order(seed=5, shuffle="full"), global_batch=my.GLOBAL_BATCH)  # reshard
dp, dp_rank = pytorch_loop.data_parallel(mesh)                         # reshard


def warm_up():  # a stop-free resize's new ranks step once before the cut-over  # reshard
    my.train_step(model, opt, range(my.GLOBAL_BATCH // dp), dp, mesh["tp"].size())


run = pytorch_loop.start(app, dataset, mesh=mesh, warm_up=warm_up,     # reshard
                         every_steps=int(os.environ.get("CKPT_EVERY", "2")))  # reshard
state = run.state  # where the job's data stands (committed with the model)  # reshard
while state.step < int(os.environ.get("STEPS", "8")):
    share = state.share(dp, dp_rank)                                   # reshard
    ids = state.samples(share.begin, share.end)                        # reshard
    loss = my.train_step(model, opt, ids, dp, mesh["tp"].size())
    state = state.advanced()                                           # reshard
    my.report(rank=dist.get_rank(), step=state.step, loss=loss, ids=ids, dp_rank=dp_rank,
              world=dist.get_world_size())
    if run.step_end(state):  # checkpoint / stop-free cut-over / stop  # reshard
        break
else:
    run.finish(state)  # the last step, committed                     # reshard
my.report(rank=dist.get_rank(), end=repr(run.cut), started=run.started,
          checkpoints=run.loop.checkpoints, phases=run.phases)
run.close()                                                            # reshard
dist.destroy_process_group()
