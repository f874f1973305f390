"""The loop API for PyTorch 2 (docs/pytorch.md, "Quickstart" and "The loop"):
reshard.elastic's Loop around an AppState (reshard.pytorch), for a rank that
`reshard run` started.

    run = pytorch_loop.start(app, dataset, mesh=mesh, every_steps=10)
    state = run.state                      # the DatasetState to train from
    while True:
        ... one step on state.share(dp, dp_rank) ...
        state = state.advanced()
        if run.step_end(state):            # a cut-over or a stop: the loop ends
            break

start() reads the launcher's environment (reshard.launch.rank_env(): RANK,
RESHARD_COORDINATOR, RESHARD_JOB_ID, RESHARD_WORKER_TOKEN,
RESHARD_WORKER_SOCKET, RESHARD_GENERATION, RESHARD_OPERATION_ID, ...),
describes the AppState (pytorch.describe: collective) and brings it to the
job's state: a rank of a job that does not exist yet (`reshard run
--job-name`, $RESHARD_REGISTER_DIR) has its launcher register it from this
describe() and `dataset` first (reshard.launcher.register), then goes on as
a fresh job's; a rank started in warm-up of a stop-free operation joins it
(marks it prepared, waits for its commit, loads the new generation); a rank
started after a reconfiguration loads RESHARD_GENERATION; a fresh job's
ranks publish their initial state as its first generation. Then every
step_end() is the Loop's boundary: periodic asynchronous checkpoints, the
stop-free cut-over, the stop-the-world stop, every failure raised on every
rank. It needs only the job's worker token.
"""

import os
import time

from reshard.core import data as _data
from reshard.core import elastic as _elastic
from reshard.launcher import launch as _launch


def device_mesh(device_type="cpu", env=None):
    """init_device_mesh for the layout this rank was started in (after
    torch.distributed.init_process_group); `env`: a reshard.launch.RankEnv
    (None: reshard.launch.rank_env())."""
    from torch.distributed.device_mesh import init_device_mesh
    from reshard.frameworks import pytorch
    dims = pytorch.mesh_dims((env or _launch.rank_env()).layout.config)
    return init_device_mesh(device_type, tuple(s for _, s in dims),
                            mesh_dim_names=tuple(n for n, _ in dims))


def build(make, device="cpu", env=None):
    """The model of this rank: `make()` (build and parallelize it, e.g.
    `lambda: my.parallelize(my.build(), mesh)`), run on the meta device
    and then given empty storage on `device` (Module.to_empty) when
    start() will load the job's state into it (a rank started after a
    reconfiguration or in warm-up of a stop-free operation; `env`, a
    reshard.launch.RankEnv, is not .fresh): a new layout's rank then spends
    nothing on initial weights it would overwrite. A fresh job's first
    layout runs make() as it is (its weights are the job's initial state).
    A stop-free operation's new ranks, whose warm_up steps on the model
    before the load, get zeros rather than whatever the storage held (off
    the pause). Every parameter and persistent buffer is loaded; a
    non-persistent buffer (one not in the state dict) is left uninitialised
    by to_empty, so a model with those must set them itself after build
    (or not use it)."""
    env = env or _launch.rank_env()
    if env.fresh:
        return make()
    import torch
    with torch.device("meta"):
        model = make()
    model = model.to_empty(device=device)
    if env.operation_id:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.zero_()
    return model


def data_parallel(mesh):
    """(dp size, this rank's dp index) of a DeviceMesh: dp_replicate x
    dp_shard row-major (reshard's data-parallel rank, which the dataset's
    shares follow)."""
    names = mesh.mesh_dim_names
    size, index = 1, 0
    for name in ("dp_replicate", "dp_shard", "dp"):
        if name in names:
            n = mesh[name].size()
            size, index = size * n, index * n + mesh.get_local_rank(name)
    return size, index


class Run:
    """One rank's run on the current layout: `state` (the DatasetState to
    train from), `spec` (pytorch.describe's), `started` ("fresh", "loaded"
    or "joined"), `regenerated` (item names load() left for the rank to
    regenerate), `loop` (the reshard.elastic.Loop), `cut` once it ended,
    `phases` ([(name, time.time())] of start()'s parts, in order: "warmed
    up" (the warm_up callable ended), "prepared" (this rank was ready for
    the cut-over), "committed" (it saw the operation commit), "loaded"
    (the generation is in the AppState), "started" (start() returns); a
    rank has those its start went through). Not thread-safe: the training
    thread calls it."""

    def __init__(self, app, spec, env, client, worker, loop, state, started, regenerated,
                 generation, phases):
        self.app, self.spec, self.env = app, spec, env
        self.phases = phases
        self.generation, self.start_step = generation, state.step
        self.client, self.worker, self.loop = client, worker, loop
        self.state, self.started, self.regenerated = state, started, regenerated
        self.cut = None

    @property
    def rank(self):
        return self.env.rank

    def _items(self):
        from reshard.frameworks import pytorch
        return pytorch.local_items(self.app, self.spec, self.env.rank)

    def step_end(self, state):
        """Call on every rank after every step with the DatasetState after it.
        Collective. False: train on (a periodic checkpoint may be on its
        way). True: the loop ends here (self.cut says how: a stop-free
        cut-over, or a stop-the-world stop)."""
        self.state = state
        self.cut = self.loop.boundary(state, self._items)
        return self.cut is not None

    def finish(self, state=None):
        """The last step: publishes it with a checkpoint and waits for the
        commit (collective). Returns the Cut. A run that trained no step
        (it started at the step budget) has nothing to publish: its Cut is
        the generation it started from."""
        state = self.state if state is None else state
        if state.step == self.start_step:
            self.loop.wait()
            self.cut = _elastic.Cut(None, self.generation, state.step, None)
        else:
            self.cut = self.loop.finish(state, self._items)
        return self.cut

    def close(self):
        """Waits for a checkpoint in flight (collective) and closes the
        connections."""
        try:
            self.loop.wait()
        finally:
            self.worker.close()
            self.client.close()


def _peer_failure(exc):
    """Whether an exception is a collective failing because a peer is gone:
    torch.distributed's network/backend errors, or the RuntimeError gloo
    raises from its TCP transport ("Connection reset/closed by peer")."""
    import torch.distributed as dist
    if isinstance(exc, (dist.DistNetworkError, dist.DistBackendError)):
        return True
    return isinstance(exc, RuntimeError) and "gloo/transport/" in str(exc)


def _exit_on_peer_lost(rank, job_id):
    """An uncaught reshard.elastic.PeerLost, or a collective of the user's own
    step that failed because a peer is gone (raised by FSDP's or the
    optimizer's collectives, outside the loop), ends the process as
    PeerLost (the backend's error as its cause) with status
    reshard.launch.EXIT_PEER_LOST (75): the launcher then knows this rank
    did not fail by itself and does not report it. In a warm rank process of
    `reshard run` ($RESHARD_RANK_HOST, reshard.launcher._rank_host, which
    runs the script with runpy and hands its uncaught exception to
    sys.excepthook itself) the hook is installed afresh for each rank the
    process runs and returns EXIT_PEER_LOST instead of ending the process,
    which may then serve the next layout's rank."""
    import sys
    previous = sys.excepthook
    in_host = os.environ.get("RESHARD_RANK_HOST") == "1"
    if getattr(previous, "_reshard_peer_lost", False):
        if not in_host:
            return
        previous = previous._reshard_previous

    def hook(kind, value, tb):
        if not isinstance(value, _elastic.PeerLost) and _peer_failure(value):
            lost = _elastic.PeerLost(
                f"rank {rank} of job {job_id!r}: a collective of the training step failed: "
                f"a rank of the process group is gone ({type(value).__name__})")
            lost.__cause__ = value
            kind, value, tb = _elastic.PeerLost, lost, None
        previous(kind, value, tb)
        if isinstance(value, _elastic.PeerLost):
            sys.stderr.flush()
            sys.stdout.flush()
            if in_host:
                return _launch.EXIT_PEER_LOST
            os._exit(_launch.EXIT_PEER_LOST)
        return None
    hook._reshard_peer_lost = True
    hook._reshard_previous = previous
    sys.excepthook = hook


def start(app, dataset, mesh=None, group=None, every_steps=None, every_seconds=None,
          env=None, timeout=120.0, warm_up=None):
    """Describes `app` (a reshard.pytorch.AppState) and brings it to the job's
    state (see the module doc); `dataset` is the run's configured
    reshard.data.DatasetState (checked against the committed one). Collective
    over `group` (None: every rank); `env`: a reshard.launch.RankEnv (None:
    reshard.launch.rank_env()). Returns a Run.

    `warm_up`: a callable of no arguments, run (collectively: every rank
    calls it) only by the ranks of a stop-free operation's new layout,
    while the old layout still trains and before they tell the coordinator
    they are prepared: one training step on any samples, so that the first
    step after the cut-over pays none of torch's first-step costs
    (DTensor's sharding propagation, FSDP2's lazy initialization, the
    optimizer's state) inside the pause. What it changes in the AppState
    (parameters, optimizer state and hyperparameters, Stateful extras) the
    load then replaces; it runs under torch.random.fork_rng and the
    gradients it leaves are dropped. State outside the AppState (an LR
    scheduler not given as a Stateful extra, the user's own counters) it
    must leave alone. It fails as a training step does: the rank ends, its
    peers lose a peer, the launcher stops the warm-up's ranks and the old
    layout trains on (the operation cannot be prepared)."""
    from reshard.frameworks import pytorch
    phases = []
    env = env or _launch.rank_env()
    if os.environ.get("RESHARD_REGISTER_DIR") and not env.job_id:
        env = _register(app, dataset, mesh, group, env, timeout)
    _exit_on_peer_lost(env.rank, env.job_id)
    client = env.client()  # the job's worker token only
    # The job's own PTC (registered from pytorch.describe of this model:
    # its blob capacities and item order), not a fresh describe() of this
    # rank's objects, whose blob sizes differ from rank to rank and run to run.
    spec = pytorch.spec_from_ptc(client.get_job(env.job_id, include_ptc=True).ptc,
                                 env.layout)
    worker = env.worker(ptc=spec.ptc)
    rank = env.rank
    probe = _elastic.Collectives(rank, env.job_id, group)
    regenerated = frozenset()
    if env.operation_id:
        # Warm-up of a stop-free operation: our model is built; make it
        # ready to step and to load, tell the coordinator (rank 0, once
        # every rank got here) and wait for the old layout's cut-over and
        # the transfer.
        if warm_up is not None:
            # A failure ends this rank as a failed training step would (its
            # peers, maybe inside a collective of it, then lose a peer).
            _warm_up(app, warm_up)
            phases.append(("warmed up", time.time()))
        error, target = None, None
        try:
            target = pytorch.prepare_load(app, spec)
        except Exception as e:  # noqa: BLE001: agreed on below
            error = e
        probe.agree(error)
        phases.append(("prepared", time.time()))
        if rank == 0:
            client.mark_prepared(env.operation_id)
        op = client.wait(env.operation_id, timeout=max(timeout, 600.0), raise_on_failure=True)
        phases.append(("committed", time.time()))
        generation = op.to_generation
        regenerated = _load(probe, pytorch, worker, app, spec, rank, generation, target)
        phases.append(("loaded", time.time()))
        started = "joined"
    elif env.generation > 0:
        generation = env.generation
        regenerated = _load(probe, pytorch, worker, app, spec, rank, generation)
        phases.append(("loaded", time.time()))
        started = "loaded"
    else:
        generation = client.get_job(env.job_id).generation
        error = None
        try:
            pytorch.publish(worker, app, spec, rank, generation)
        except Exception as e:  # noqa: BLE001: agreed on below
            error = e
        probe.agree(error)
        started = "fresh"
    state = _data.resume(client.dataset_state(env.job_id), dataset)
    loop = _elastic.Loop(client, env.job_id, rank, worker, group=group, timeout=timeout,
                         every_steps=every_steps, every_seconds=every_seconds)
    phases.append(("started", time.time()))
    return Run(app, spec, env, client, worker, loop, state, started, regenerated, generation,
               phases)


def _warm_up(app, fn):
    """Runs start()'s warm_up callable with the RNG left as it was and drops
    the gradients it left."""
    import torch
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        fn()
    app.model.zero_grad(set_to_none=True)
    if app.optimizer is not None:
        app.optimizer.zero_grad(set_to_none=True)


def _register(app, dataset, mesh, group, env, timeout):
    """The ranks of a job that does not exist yet (`reshard run --job-name`
    set $RESHARD_REGISTER_DIR and no job id): describe `app` (collective),
    rank 0 hands the PTC and `dataset` to its launcher, which registers the
    job, and broadcasts the answer: the job id and worker token, which this
    rank then uses (RankEnv and os.environ), or the refusal, raised on every
    rank. `reshard register -- COMMAND` ($RESHARD_REGISTER_DESCRIBE) only
    wants the description: the rank ends (status 0) once it is written."""
    import dataclasses
    import torch.distributed as dist
    from reshard.frameworks import pytorch
    from reshard.launcher import register
    directory = os.environ["RESHARD_REGISTER_DIR"]
    spec = pytorch.describe(app, mesh=mesh, group=group)
    describe_only = bool(os.environ.get("RESHARD_REGISTER_DESCRIBE"))
    reply = [None]
    if env.rank == 0:
        try:
            register.request(directory, spec, env.layout, dataset)
            reply[0] = {} if describe_only else register.answer(directory, max(timeout, 600.0))
        except ValueError as e:
            reply[0] = {"code": _errors.InvalidArgument.code.value[0], "message": str(e)}
    dist.broadcast_object_list(reply, src=0, group=group)
    got = reply[0]
    if "code" in got:
        raise register.error_of(got)
    if describe_only:
        raise SystemExit(0)
    os.environ.update(RESHARD_JOB_ID=got["job_id"], RESHARD_WORKER_TOKEN=got["worker_token"])
    os.environ.pop("RESHARD_REGISTER_DIR", None)
    return dataclasses.replace(env, job_id=got["job_id"], worker_token=got["worker_token"])


def _load(probe, pytorch, worker, app, spec, rank, generation, target=None):
    error, regenerated = None, frozenset()
    try:
        regenerated = pytorch.load(worker, app, spec, rank, generation, target)
    except Exception as e:  # noqa: BLE001: agreed on below
        error = e
    probe.agree(error)
    return regenerated
