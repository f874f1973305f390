"""torchtitan's llama3 (debugmodel, 2 layers) trained with reshard holding its
state and its data loader position, across a change of dp and tp.

    python examples/torchtitan/train.py --build build      # the whole run

starts a local reshard cluster (PostgreSQL, coordinator, 2 agents;
deploy/local/cluster.py) and, as a scheduler would:
  1. layout A, tp 2 x dp 1 on host-0: 2 ranks build and
     parallelize torchtitan's model (titan.py), pytorch.describe() derives the
     PTC from their DTensors; the job is registered with it; the ranks train
     STEPS steps and publish their state after step CUT as generation 1
     (pytorch.publish: each rank's local shards, the optimizer's, the LR
     scheduler's, the data position's and each rank's RNG). Training on to
     STEPS gives the uninterrupted run's losses.
  2. resize the job to layout B, FSDP2 dp_shard 2 x tp 1 on host-1: the
     agents move the bytes (a real reshard of every tensor from Shard-over-tp
     to Shard-over-dp and _StridedShard).
  3. layout B: 2 new ranks build the model with other weights, load the new
     generation into their DTensors in place (pytorch.load) and train steps
     CUT+1..STEPS from the data position they loaded: the global batch of each
     step is the same samples whatever dp reads them (reshard.data).
torchtitan's own data loader refuses this ("dp_degree is inconsistent before
and after checkpoint, dataloader resharding is not supported yet.").

Rank processes are this file with `rank ...` (torchrun's environment: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The run writes run.json: every step's
loss of both runs, the samples each step read, and a SHA-256 of every item's
full tensor at the cut on both layouts.
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

STEPS = 6
CUT = 3
GLOBAL_BATCH = 4
NUM_SAMPLES = 20
LR = 1e-3


class DataPosition:
    """The data loader's position as a Stateful: reshard.data's DatasetState
    (cursor and step of a global sample stream). dp is not part of it: each
    step's global batch is the same samples at any dp."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state.to_dict()

    def load_state_dict(self, d):
        from reshard import data
        self.state = data.DatasetState.from_dict(d)


def dataset():
    from reshard import data
    return data.DatasetState(data.DatasetDescriptor("titan-tokens", NUM_SAMPLES, "v1"),
                             data.Order(seed=7, shuffle="full"), global_batch=GLOBAL_BATCH)


def full_tensors(app):
    """{item name: full tensor} of every model and optimizer tensor (a
    collective: DTensor.full_tensor on every rank)."""
    from torch.distributed.tensor import DTensor
    msd, osd = app.model_and_optim()
    items = [(f"model.{k}", v) for k, v in msd.items()]
    items += [(f"optim.state.{fqn}.{k}", v) for fqn, s in osd["state"].items()
              for k, v in s.items()]
    return {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            for name, t in items}


def full_digests(app):
    """{item name: sha256 of the full tensor's bytes} (a collective)."""
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
            for name, t in full_tensors(app).items()}


def rank_main(args):
    import torch
    import torch.distributed as dist

    from reshard import Worker, pytorch
    from reshard._proto import ptc_pb2
    import titan

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = titan.parallel_dims(args.dp, args.tp, world)
    model, cfg = titan.build(dims, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4)
    position = DataPosition(dataset())
    app = pytorch.AppState(model, opt, stateful={"lr_scheduler": sched, "data": position})
    out = {"rank": rank, "losses": {}, "samples": {}}

    if args.generation == 0:
        # Fresh job: describe (collective); rank 0 hands the PTC to the
        # scheduler (the driver) and gets the job back on stdin.
        spec = pytorch.describe(app)
        job = [None]
        if rank == 0:
            print("PTC " + base64.b64encode(spec.ptc.SerializeToString()).decode(), flush=True)
            job = [json.loads(sys.stdin.readline())]
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the pipe carried only that
        dist.broadcast_object_list(job, src=0)
        job = job[0]
    else:
        with open(args.job) as f:
            job = json.load(f)  # the job's id, PTC and the ranks' agent sockets
        ptc = ptc_pb2.Ptc.FromString(base64.b64decode(job["ptc"]))
        spec = pytorch.spec_from_ptc(ptc, spec_config(args))
    # The job's worker token: from the handshake, or $RESHARD_WORKER_TOKEN.
    worker = Worker(job["sockets"][rank], job["job_id"], ptc=spec.ptc,
                    worker_token=job.get("token"))
    if args.generation:
        pytorch.load(worker, app, spec, rank, args.generation)
        out["loaded_digests"] = full_digests(app)

    dp_rank = dims.get_mesh("batch").get_local_rank() if args.dp > 1 else 0
    loss_of = titan.loss_fn(cfg)
    ctx = titan.context(dims)
    while position.state.step < args.steps:
        state = position.state
        share = state.share(args.dp, dp_rank)
        ids = state.samples(share.begin, share.end)
        tokens = torch.stack([titan.sample_tokens(i, cfg.vocab_size) for i in ids])
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        with ctx():
            pred = model(inputs)
            loss, _ = loss_of(pred, labels, torch.tensor(GLOBAL_BATCH * titan.SEQ_LEN))
            loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)  # sum over dp of (local sum / global tokens); tp ranks equal
        position.state = state.advanced()
        step = position.state.step
        out["losses"][step] = total.item() / args.tp
        out["samples"][step] = sorted(dist_gather(ids, world))
        if step == args.publish_after:
            pytorch.publish(worker, app, spec, rank, 1)
            out["published_digests"] = full_digests(app)
    worker.close()
    final = full_tensors(app)
    if rank == 0:
        torch.save(final, args.out + ".final.pt")
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def end_rank():
    """Ends a rank whose work is done and written without finalizing the
    interpreter. torch keeps gloo's run-loop threads and the autograd
    engine's threads past destroy_process_group (their names in
    /proc/self/task); one of them that needs the GIL while CPython finalizes
    is ended with pthread_exit, which in C++ code is std::terminate
    ("terminate called without an active exception", SIGABRT). CI saw that
    once, in a layout B rank whose outputs were complete."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def dist_gather(ids, world):
    """Every sample id read this step, over all ranks (each dp group once)."""
    import torch.distributed as dist
    got = [None] * world
    dist.all_gather_object(got, [int(i) for i in ids])
    seen = {}
    for r, g in enumerate(got):
        seen.setdefault(tuple(g), r)
    return [i for g in seen for i in g]


def spec_config(args):
    from reshard._proto import ptc_pb2
    return ptc_pb2.ParallelConfig(tp=args.tp, pp=1, dp=args.dp,
                                  order=ptc_pb2.RANK_ORDER_TP_DP_PP)


# ----------------------------------------------------------------- driver


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world, argv, env, pipe_rank0=False):
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True} \
            if (pipe_rank0 and r == 0) else {}
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank"] + argv,
                                      env=e, cwd=HERE, **pipes))
    return procs


def wait_all(procs, what, timeout):
    """Waits for every rank; kills the rest when one fails or time runs out."""
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise RuntimeError(f"{what}: rank exit codes {codes}")


def drive(build_dir, work_dir, timeout=600.0):
    """The whole run (module doc); returns run.json's content."""
    sys.path.insert(0, os.path.join(REPO, "deploy", "local"))
    from cluster import LocalCluster

    from reshard import layout
    from reshard._proto import ptc_pb2

    import reshard
    # The ranks import titan.py (here) and the reshard this process imported.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE, os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))] +
        [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs(work_dir, exist_ok=True)
    a_out, b_out = os.path.join(work_dir, "a.json"), os.path.join(work_dir, "b.json")
    with LocalCluster(build_dir=build_dir, hosts=2, devices_per_host=2,
                      work_dir=os.path.join(work_dir, "cluster")) as cluster, \
            cluster.client(timeout=60.0) as client:
        sockets = {h: cluster.agents[h].worker_socket for h in cluster.host_ids}
        # 1. layout A: tp 2 x dp_shard 1 on host-0.
        lay_a = layout.make_layout(2, 1, 1, hosts=["host-0"], devices_per_host=2)
        procs = start_ranks(2, ["--dp", "1", "--tp", "2", "--steps", str(STEPS),
                                "--publish-after", str(CUT), "--out", a_out], env,
                            pipe_rank0=True)
        try:
            line = procs[0].stdout.readline()
            if not line.startswith("PTC "):
                raise RuntimeError(f"rank 0 of layout A: expected its PTC, got {line!r}")
            ptc_b64 = line[4:].strip()
            ptc = ptc_pb2.Ptc.FromString(base64.b64decode(ptc_b64))
            job, token = client.register_job(
                ptc_pb2.JobSpec(name=f"torchtitan-{os.getpid()}", tenant="demo", ptc=ptc,
                                layout=lay_a), with_token=True)
            procs[0].stdin.write(json.dumps({"job_id": job.id, "token": token,
                                             "sockets": [sockets["host-0"]] * 2}) + "\n")
            procs[0].stdin.flush()
        except BaseException:
            for p in procs:
                p.kill()
                p.wait()
            raise
        procs[0].stdout.close()
        wait_all(procs, "layout A", timeout)
        # 2. resize to layout B: dp_shard 2 x tp 1 on host-1.
        lay_b = layout.make_layout(1, 1, 2, hosts=["host-1"], devices_per_host=2)
        op = client.resize(job.id, lay_b)
        done = client.wait(op.id, timeout=timeout, raise_on_failure=True)
        # 3. layout B loads the new generation and trains on.
        job_file = os.path.join(work_dir, "job.json")
        with open(job_file, "w") as f:
            json.dump({"job_id": job.id, "ptc": ptc_b64, "sockets": [sockets["host-1"]] * 2}, f)
        procs = start_ranks(2, ["--dp", "2", "--tp", "1", "--steps", str(STEPS),
                                "--generation", str(done.to_generation), "--seed", "99",
                                "--job", job_file, "--out", b_out],
                            dict(env, RESHARD_WORKER_TOKEN=token))
        wait_all(procs, "layout B", timeout)
    with open(a_out) as f:
        a = json.load(f)
    with open(b_out) as f:
        b = json.load(f)
    run = {"uninterrupted": a, "resumed": b, "cut": CUT, "steps": STEPS,
           "generation": done.to_generation,
           "final_state": {"uninterrupted": a_out + ".final.pt", "resumed": b_out + ".final.pt"}}
    with open(os.path.join(work_dir, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    d = sub.add_parser("drive")
    d.add_argument("--build", default=os.path.join(REPO, "build"))
    d.add_argument("--work-dir", default="/tmp/reshard-torchtitan")
    r = sub.add_parser("rank")
    r.add_argument("--dp", type=int, required=True)
    r.add_argument("--tp", type=int, required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--publish-after", type=int, default=-1)
    r.add_argument("--generation", type=int, default=0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--job", default="", help="the job file of a rank that loads")
    r.add_argument("--out", required=True)
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("drive", "rank", "-h", "--help"):
        argv = ["drive"] + argv
    args = p.parse_args(argv)
    if args.cmd == "rank":
        rank_main(args)
        end_rank()
    run = drive(args.build, args.work_dir)
    a, b = run["uninterrupted"], run["resumed"]
    print("step  uninterrupted (tp 2 x dp 1)   resumed (dp 2 x tp 1 after step "
          f"{run['cut']})")
    for s in range(1, run["steps"] + 1):
        resumed = repr(b["losses"][str(s)]) if str(s) in b["losses"] else ""
        print(f"{s:4d}  {a['losses'][str(s)]!r:28}  {resumed}")


if __name__ == "__main__":
    main()
