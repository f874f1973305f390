"""The training loop's side of a reconfiguration (docs/python.md, "The loop
API"): a small API around a PyTorch step loop.

Ranks of the layout that trains now wrap their loop in a Loop: it follows
the job with Client.watch_job (a server stream: no polling of the
scheduler) and, while the job has a stop-free operation, that operation
with Client.watch_operation. At every step boundary Loop.boundary() agrees
with the other ranks (one all-reduce over the process group) whether to cut
over there; when the operation is prepared (its new workers are warm) every
rank publishes the state of that step into the cut-over checkpoint that
rank 0 creates (a Checkpoint naming the operation, with the step's dataset
state), and the loop ends. Loop.finish() publishes the final step the same
way with a plain checkpoint (the end of a step budget, or before a host is
taken away).

Ranks of the new layout call join() once warm (the `warm_up` callback
builds their process groups and model): rank 0 marks the operation
prepared, every rank waits for its commit, loads its shard of the new
generation and restores the sampler's state (reshard.data.resume). After a
stop-the-world reconfiguration, cold-started ranks call load() instead.

torch (torch.distributed, any backend with all_reduce and broadcast of
int64 CPU tensors, e.g. gloo) is imported when a Loop or join() is used.
"""

import threading
import time

from . import _proto
from . import data as _data

_pb = _proto.coordinator_pb2


class _Watch(threading.Thread):
    """Follows the job and its stop-free operation; `prepared` is set to the
    operation once it is prepared and not cut over yet. Daemon: it ends
    with the process (its streams with the client)."""

    def __init__(self, client, job_id):
        super().__init__(daemon=True, name=f"reshard-watch-{job_id}")
        self._client, self._job_id = client, job_id
        self._lock = threading.Condition()
        self._prepared = None
        self._seen = set()
        self.error = None

    @property
    def prepared(self):
        with self._lock:
            return self._prepared

    def wait_prepared(self, timeout):
        with self._lock:
            self._lock.wait_for(lambda: self._prepared is not None or self.error, timeout)
            return self._prepared

    def run(self):
        try:
            for job in self._client.watch_job(self._job_id):
                op_id = job.active_operation_id
                if op_id and op_id not in self._seen:
                    self._seen.add(op_id)
                    self._follow(op_id)
        except Exception as e:  # noqa: BLE001: reported through boundary()
            with self._lock:
                self.error = e
                self._lock.notify_all()

    def _follow(self, op_id):
        for op in self._client.watch_operation(op_id):
            if not op.stop_free:
                return
            if op.prepared_unix_ms and not op.cutover_operation_id:
                with self._lock:
                    self._prepared = op
                    self._lock.notify_all()
                return


def _dist():
    import torch
    import torch.distributed as dist
    return torch, dist


class Cut:
    """How a Loop ended: the operation it cut over (None for finish()), the
    generation this rank published into and the step boundary it holds."""

    def __init__(self, operation_id, generation, step, checkpoint_id):
        self.operation_id, self.generation, self.step = operation_id, generation, step
        self.checkpoint_id = checkpoint_id
        self.at = time.monotonic()  # the last step on this layout ended here

    def __repr__(self):
        return (f"Cut(operation_id={self.operation_id!r}, generation={self.generation}, "
                f"step={self.step})")


class Loop:
    """One rank's step loop on the current layout. `worker` is this rank's
    reshard.Worker (its host's agent), `group` the process group of every
    rank of the layout (None: the default group). Not thread-safe: call
    from the training thread."""

    def __init__(self, client, job_id, rank, worker, group=None, timeout=120.0):
        self.client, self.job_id, self.rank, self.worker = client, job_id, rank, worker
        self.group, self.timeout = group, timeout
        self._watch = _Watch(client, job_id)
        self._watch.start()

    def boundary(self, state, shard):
        """Call on every rank after every step, with the reshard.data
        DatasetState after it and a callable returning this rank's state
        (the dict Worker.publish takes). Collective. None: train on. A Cut:
        a prepared stop-free reconfiguration cuts over at this boundary;
        this rank published `shard()` into the cut-over generation and its
        loop ends here."""
        torch, dist = _dist()
        flag = torch.tensor([1 if self._watch.prepared is not None else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if not int(flag.item()):
            if self._watch.error is not None:
                raise self._watch.error
            return None
        op = None
        if self.rank == 0:
            # Another rank may have seen it first: ours follows shortly.
            op = self._watch.wait_prepared(self.timeout)
            if op is None:
                raise RuntimeError(f"job {self.job_id!r}: a rank saw a prepared stop-free "
                                   f"operation that rank 0 did not see in {self.timeout} s")
        return self._publish(state, shard, op)

    def finish(self, state, shard):
        """Publishes the state after the last step with a plain checkpoint
        (rank 0 creates it; collective). Returns a Cut (operation_id None)."""
        return self._publish(state, shard, None)

    def _publish(self, state, shard, op):
        torch, dist = _dist()
        generation = torch.zeros(2, dtype=torch.int64)
        checkpoint = None
        if self.rank == 0:
            checkpoint = self.client.checkpoint(
                self.job_id, dataset_state=state,
                cut_over_operation_id=op.id if op is not None else None)
            generation[0] = checkpoint.to_generation
        dist.broadcast(generation, src=self._src(), group=self.group)
        self.worker.publish(self.rank, int(generation[0]), shard())
        return Cut(op.id if op is not None else None, int(generation[0]), state.step,
                   checkpoint.id if checkpoint is not None else None)

    def _src(self):
        _, dist = _dist()
        if self.group is None:
            return 0
        return dist.get_global_rank(self.group, 0) if hasattr(dist, "get_global_rank") else 0


class Joined:
    """What a rank of the new layout continues from: its shard (as
    Worker.load returns it), the dataset state (the sampler's), the
    generation and the operation that made it. `regenerated`: the names of
    the shard's items that hold zeros for this rank to regenerate before it
    restores them (an RNG state no surviving rank held; empty as a rule)."""

    def __init__(self, shard, state, generation, operation):
        self.shard, self.state, self.generation, self.operation = shard, state, generation, operation
        self.regenerated = frozenset(getattr(shard, "regenerated", ()))


def join(client, job_id, operation_id, rank, worker, configured, group=None, warm_up=None,
         timeout=600.0):
    """A new layout's rank of the stop-free operation `operation_id`:
    calls warm_up() (build process groups, the model; its result is
    returned as .warm), waits on every rank of `group` (a barrier), then
    rank 0 marks the operation prepared; waits (watch_operation) until it
    commits, loads this rank's shard of its new generation and restores the
    dataset state (reshard.data.resume against `configured`, the run's own
    DatasetState). Raises reshard.OperationFailed when it does not commit."""
    _, dist = _dist()
    warm = warm_up() if warm_up is not None else None
    dist.barrier(group=group)
    if rank == 0:
        client.mark_prepared(operation_id)
    op = client.wait(operation_id, timeout=timeout, raise_on_failure=True)
    out = load(client, job_id, rank, worker, configured, generation=op.to_generation)
    out.operation, out.warm = op, warm
    return out


def load(client, job_id, rank, worker, configured, generation=None):
    """A cold-started rank: its shard of `generation` (None: the job's
    current one) and the committed dataset state checked against
    `configured`."""
    if generation is None:
        generation = client.get_job(job_id).generation
    shard = worker.load(rank, generation)
    state = _data.resume(client.dataset_state(job_id), configured)
    return Joined(shard, state, generation, None)


def is_stop_free(operation):
    """Whether an Operation is a two-phase (stop-free) one."""
    return bool(getattr(operation, "stop_free", False))
