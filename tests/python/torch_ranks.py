"""One gloo process per rank for the PyTorch 2 tests (test_pytorch_state,
test_dcp): spawn(fn, out_dir, *args, world=N) runs fn(rank, N, *args) in N
processes that meet through a file in out_dir (a FileStore rendezvous: no
port to pick and race for) and returns their results, by rank."""

import os
import pickle
import uuid

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, store, fn, out_dir, args):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"{fn.__name__}.{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


def spawn(fn, out_dir, *args, world):
    """fn(rank, world, *args) in `world` gloo processes; their results by rank."""
    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    store = os.path.join(out_dir, f"rendezvous-{uuid.uuid4().hex}")
    mp.spawn(_entry, args=(world, store, fn, out_dir, args), nprocs=world, join=True)
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"{fn.__name__}.{r}.pkl"), "rb") as f:
            out.append(pickle.load(f))
    return out
