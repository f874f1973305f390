"""The training loop's side of checkpoints and reconfigurations
(docs/pytorch.md, "The loop"; docs/python.md, "The loop API"): a small API
around a PyTorch step loop. reshard.pytorch_loop puts a PyTorch 2 front on
it (an AppState instead of a state dict).

Ranks of the layout that trains now wrap their loop in a Loop: it follows
the job with Client.watch_job (a server stream: no polling) and each of its
operations with Client.watch_operation. At every step boundary
Loop.boundary() agrees with the other ranks (one all-reduce of a few flags
over the process group) on what happens there:
  - a prepared stop-free operation (its new workers are warm): every rank
    publishes the state of that step into the cut-over checkpoint rank 0
    creates (naming the operation, with the step's dataset state); the loop
    ends (a Cut).
  - a stop-the-world operation that asked to stop at the next step boundary
    (at_step_boundary): the same, with a final checkpoint folded into that
    operation; the loop waits for it to commit and ends (a Cut, stopped).
  - a periodic checkpoint is due (every_steps / every_seconds): every rank
    copies its local state into host memory (the snapshot; the only work on
    the step) and a background thread does the rest while training goes
    on: rank 0 creates the checkpoint with that step's dataset state (so
    the data position commits in the same transaction as the model of that
    step, docs/data.md) and hands the answer to the other ranks through the
    process group's store; every rank publishes its snapshot into that
    generation and waits for the commit. The first boundary after every
    rank's thread ended agrees on the outcome; the next checkpoint,
    cut-over or finish() first waits for it.
Loop.finish() publishes the final step the same way and waits for its commit.

Failures are collective: whatever fails on one rank (the checkpoint refused
on rank 0, a publish or seal refused on rank 3, the checkpoint's operation
failing) is agreed on at the next collective point and raised on EVERY rank
as the same reshard error, "rank R: ..." in front of its message. A peer
that died makes the process group's collective fail: that is PeerLost (a
ReshardError, code UNAVAILABLE), not the backend's raw text.

The checkpoint/operation rule (docs/coordinator.md, "Checkpoints and
operations"): a reconfiguration requested during a checkpoint is queued by
the coordinator, a checkpoint requested during a stop-free operation is
folded into its cut-over (answered with that operation: the loop publishes
nothing then and cuts over when it is prepared). Neither side retries.

Ranks of the new layout call join() once warm (the `warm_up` callback
builds their process groups and model): rank 0 marks the operation
prepared, every rank waits for its commit, loads its shard of the new
generation and restores the sampler's state (reshard.data.resume). After a
stop-the-world reconfiguration, cold-started ranks call load() instead.

Every call here needs only the job's worker token on the Client.
torch (torch.distributed, any backend with all_reduce, broadcast and
all_gather_object on CPU, e.g. gloo) is imported when a Loop or join() is
used.
"""

import threading
import time

import grpc

from reshard.core import _proto, _rpc
from reshard.core import data as _data
from reshard.core import errors as _errors

_pb = _proto.coordinator_pb2


class PeerLost(_errors.ReshardError):
    """A rank of the loop's process group is gone (its process died, or its
    host): a collective failed. The job recovers from its last committed
    generation (the launcher restarts the ranks)."""

    code = grpc.StatusCode.UNAVAILABLE


def _error_record(rank, exc):
    """What one rank tells the others about its failure (picklable)."""
    if isinstance(exc, _errors.ReshardError):
        return (rank, type(exc).__name__, exc.message, exc.code.name, exc.method)
    return (rank, type(exc).__name__, str(exc), None, "")


def _raise_record(rec, others=0):
    """Raises the error `rec` describes with "rank R: " in front: a reshard
    error as the class of its code (reshard.errors.from_code, the table of
    reshard._rpc), PeerLost as PeerLost, OperationFailed as ReshardError
    ABORTED (its Operation stayed on the rank that saw it), anything else as
    ReshardError INTERNAL naming its class."""
    rank, cls_name, message, code, method = rec
    more = f" (and {others} more rank{'s' if others > 1 else ''} failed)" if others else ""
    text = f"rank {rank}: {message}{more}"
    if cls_name == "PeerLost":
        raise PeerLost(text, method=method)
    if code is None:
        raise _errors.ReshardError(f"rank {rank}: {cls_name}: {message}{more}",
                                   code=grpc.StatusCode.INTERNAL)
    number = _rpc.CODE_NUMBERS.get(code, _rpc.UNKNOWN)
    if cls_name == "OperationFailed":
        raise _errors.ReshardError(text, code=getattr(grpc.StatusCode, _rpc.code_name(number)),
                                   method=method)
    raise _errors.from_code(number, text, method)


def _is_terminal(op):
    return op.state in (_pb.OPERATION_STATE_COMMITTED, _pb.OPERATION_STATE_ABORTED,
                        _pb.OPERATION_STATE_FAILED)


def _folded(op):
    """Whether a Checkpoint answer is another operation that the checkpoint
    folded into (docs/coordinator.md, "Checkpoints and operations")."""
    return op.checkpoint_folded or op.kind != _pb.OPERATION_KIND_CHECKPOINT


def at_step_boundary(op):
    """Whether an Operation is a stop-the-world one that stops the job at its
    next step boundary (the loop publishes a final checkpoint folded into it)."""
    return op.at_step_boundary and not op.stop_free


class _Watch(threading.Thread):
    """Follows the job and its operations: `prepared` is set to a stop-free
    operation once it is prepared and not cut over yet, `stop` to a
    stop-the-world operation that waits for the next step boundary. Daemon:
    it ends with the process (its streams with the client)."""

    def __init__(self, client, job_id):
        super().__init__(daemon=True, name=f"reshard-watch-{job_id}")
        self._client, self._job_id = client, job_id
        self._lock = threading.Condition()
        self._prepared = None
        self._stop = None
        self._seen = set()
        self.error = None

    @property
    def prepared(self):
        with self._lock:
            return self._prepared

    @property
    def stop(self):
        with self._lock:
            return self._stop

    def wait_for(self, what, timeout):
        """Waits until `prepared` or `stop` (what) is set; returns it (None
        after `timeout` seconds or on a watch error)."""
        with self._lock:
            self._lock.wait_for(lambda: getattr(self, "_" + what) is not None or self.error,
                                timeout)
            return getattr(self, "_" + what)

    def run(self):
        try:
            for job in self._client.watch_job(self._job_id):
                op_id = job.active_operation_id
                if op_id and op_id not in self._seen:
                    self._seen.add(op_id)
                    threading.Thread(target=self._follow_guarded, args=(op_id,), daemon=True,
                                     name=f"reshard-watch-{op_id}").start()
        except Exception as e:  # noqa: BLE001: reported through boundary()
            self._fail(e)

    def _fail(self, e):
        with self._lock:
            if self.error is None:
                self.error = e
            self._lock.notify_all()

    def _follow_guarded(self, op_id):
        try:
            self._follow(op_id)
        except Exception as e:  # noqa: BLE001: reported through boundary()
            self._fail(e)

    def _follow(self, op_id):
        for op in self._client.watch_operation(op_id):
            if op.kind == _pb.OPERATION_KIND_CHECKPOINT:
                return  # ours (or another layout's): nothing to cut over
            if at_step_boundary(op):
                if not _is_terminal(op) and not op.cutover_operation_id:
                    with self._lock:
                        self._stop = op
                        self._lock.notify_all()
                return
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
    """How a Loop ended: the operation it cut over or stopped for (None for
    finish()), the generation this rank published into, the step boundary it
    holds and the checkpoint's operation id. `stopped`: a stop-the-world
    operation stopped the loop (the launcher restarts the ranks on the new
    layout once it commits)."""

    def __init__(self, operation_id, generation, step, checkpoint_id, stopped=False):
        self.operation_id, self.generation, self.step = operation_id, generation, step
        self.checkpoint_id, self.stopped = checkpoint_id, stopped
        self.at = time.monotonic()  # the last step on this layout ended here

    def __repr__(self):
        return (f"Cut(operation_id={self.operation_id!r}, generation={self.generation}, "
                f"step={self.step}, stopped={self.stopped})")


def snapshot(state_dict):
    """A copy of a state dict (torch tensors, numpy arrays, bytes) that later
    steps do not change: what an asynchronous checkpoint publishes."""
    return _Staging().copy(state_dict)[0]


class _Staging:
    """The snapshot of an asynchronous checkpoint: a copy of one rank's state
    in host memory, taken at the step boundary, into buffers that are kept
    for the next checkpoint (one checkpoint is in flight at a time, so the
    copy of the last one is free again by then). CUDA tensors are copied
    into pinned host buffers without waiting: the copy is ordered before the
    next step's kernels on the tensor's stream, and the returned events are
    waited for (off the training thread) before the bytes are published."""

    def __init__(self):
        self._buffers = {}

    def copy(self, state_dict):
        """Returns ({name: copy}, [CUDA events to wait for before reading it])."""
        out, devices = {}, {}
        for name, v in state_dict.items():
            if v is None or isinstance(v, bytes):
                out[name] = v  # immutable
            elif isinstance(v, (bytearray, memoryview)):
                out[name] = bytes(v)
            elif type(v).__module__.startswith("torch"):
                out[name] = self._copy_tensor(name, v.detach(), devices)
            else:
                out[name] = self._copy_array(name, v)
        events = []
        for device in devices.values():
            import torch
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return out, events

    def _copy_tensor(self, name, t, devices):
        import torch
        buf = self._buffers.get(name)
        if (not isinstance(buf, torch.Tensor) or buf.shape != t.shape or buf.dtype != t.dtype
                or buf.is_pinned() != t.is_cuda):
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self._buffers[name] = buf
        if t.is_cuda:
            devices[t.device] = t.device
            buf.copy_(t, non_blocking=True)
        else:
            buf.copy_(t)
        return buf

    def _copy_array(self, name, v):
        import numpy as np
        a = np.asarray(v)
        buf = self._buffers.get(name)
        if not isinstance(buf, np.ndarray) or buf.shape != a.shape or buf.dtype != a.dtype:
            buf = np.empty(a.shape, a.dtype)
            self._buffers[name] = buf
        np.copyto(buf, a, casting="no")
        return buf


class _Checkpoint(threading.Thread):
    """One rank's share of a periodic asynchronous checkpoint, after the
    step boundary that took its snapshot (the only part on the training
    thread). Rank 0 asks the coordinator for it (the Checkpoint RPC, with
    the step's dataset state) and leaves the answer under `key` in the
    process group's store; the other ranks wait there for it, so no
    collective runs off the training thread. Then every rank publishes its
    snapshot into the checkpoint's generation and waits for its commit. A
    checkpoint folded into an operation's cut-over publishes nothing.
    Whatever fails is kept in `error` (rank 0: a refused Checkpoint) and
    agreed on at the next collective point (Loop.wait)."""

    def __init__(self, loop, state, snapshot, events, store, key, stale_key):
        super().__init__(daemon=True, name=f"reshard-checkpoint-{state.step}")
        self.loop, self.state, self.step = loop, state, state.step
        self._snapshot, self._events = snapshot, events
        self._store, self._key, self._stale_key = store, key, stale_key
        self.checkpoint_id, self.generation, self.folded = None, None, False
        self.error = None

    def run(self):
        try:
            answer = self._answer()
            if answer is None:
                return  # rank 0's Checkpoint failed: rank 0 reports it
            self.checkpoint_id, self.generation, own = answer
            if not own:
                # Folded into an active operation's cut-over: that cut-over
                # publishes this layout's state (docs/coordinator.md).
                self.folded = True
                return
            for event in self._events:
                event.synchronize()
            loop = self.loop
            loop.worker.publish(loop.rank, self.generation, self._snapshot)
            loop.client.wait(self.checkpoint_id, timeout=loop.timeout, raise_on_failure=True)
        except Exception as e:  # noqa: BLE001: agreed on at the next collective point
            self.error = e
        finally:
            self._snapshot = None

    def _answer(self):
        """(operation id, generation, own) of this checkpoint, or None when
        rank 0's Checkpoint failed."""
        import pickle
        loop = self.loop
        if loop.rank == 0:
            try:
                op = loop.client.checkpoint(loop.job_id, dataset_state=self.state)
                answer = (op.id, op.to_generation, not _folded(op))
            except Exception as e:  # noqa: BLE001: agreed on at the next collective point
                self.error, answer = e, None
            if self._store is not None:
                if self._stale_key is not None:
                    # Every rank read the last answer before this checkpoint
                    # began (Loop.wait joined them all).
                    self._store.delete_key(self._stale_key)
                self._store.set(self._key, pickle.dumps(answer))
            return answer
        import datetime
        try:
            self._store.wait([self._key], datetime.timedelta(seconds=loop.timeout))
        except Exception as e:  # noqa: BLE001: the store's own error types vary
            import torch.distributed as dist
            if isinstance(e, getattr(dist, "DistNetworkError", ())):
                # Rank 0's store closed: rank 0 is gone (it lost a peer, or died).
                raise PeerLost(f"rank {loop.rank} of job {loop.job_id!r}: rank 0's store closed "
                               f"while this rank waited for its answer to the checkpoint of "
                               f"step {self.step} ({type(e).__name__})") from e
            raise _errors.DeadlineExceeded(
                f"rank {loop.rank} of job {loop.job_id!r}: rank 0's answer to the checkpoint of "
                f"step {self.step} did not come within {loop.timeout} s "
                f"({type(e).__name__}: {e})", method="Checkpoint") from None
        return pickle.loads(self._store.get(self._key))


class Collectives:
    """Agreement among the ranks of a process group (`group`, None: the
    default one) that turns a failure on any rank into the same error on
    every rank, and a failed collective (a peer died) into PeerLost."""

    def __init__(self, rank, job_id, group=None):
        self.rank, self.job_id, self.group = rank, job_id, group

    def agree(self, error):
        """Collective: every rank passes its own failure (None: none); if any
        rank failed, every rank raises the lowest failed rank's error."""
        self._agree(error)

    def _collective(self, what, fn, *args, **kwargs):
        """Runs one torch.distributed collective; a failure (a peer died) is
        PeerLost naming the rank and the collective."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001: the backend's own error types vary
            raise PeerLost(f"rank {self.rank} of job {self.job_id!r}: {what} failed: a rank "
                           f"of the process group is gone ({type(e).__name__})") from e

    def _agree(self, error):
        """Every rank passes its own failure (None: none); if any rank failed
        every rank raises the lowest failed rank's error."""
        torch, dist = _dist()
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
        self._collective("agreeing on an outcome", dist.all_reduce, flag,
                         op=dist.ReduceOp.MAX, group=self.group)
        if not int(flag.item()):
            return
        size = dist.get_world_size(self.group)
        records = [None] * size
        mine = None if error is None else _error_record(self.rank, error)
        self._collective("sharing a failure", dist.all_gather_object, records, mine,
                         group=self.group)
        failed = [r for r in records if r is not None]
        _raise_record(failed[0], len(failed) - 1)

    def _from_rank0(self, fn):
        """Runs fn() on rank 0 and gives every rank its result; its failure
        is raised on every rank."""
        _, dist = _dist()
        box = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", fn())
            except Exception as e:  # noqa: BLE001: raised on every rank below
                box[0] = ("error", _error_record(0, e))
        self._collective("broadcast from rank 0", dist.broadcast_object_list, box,
                         src=self._src(), group=self.group)
        kind, value = box[0]
        if kind == "error":
            _raise_record(value)
        return value

    def _src(self):
        _, dist = _dist()
        if self.group is None:
            return 0
        return dist.get_global_rank(self.group, 0) if hasattr(dist, "get_global_rank") else 0


class Loop(Collectives):
    """One rank's step loop on the current layout. `worker` is this rank's
    reshard.Worker (its host's agent), `group` the process group of every
    rank of the layout (None: the default group). every_steps /
    every_seconds: take a periodic asynchronous checkpoint at the first
    boundary where that many steps / seconds passed since the last one (None:
    none). Not thread-safe: call from the training thread."""

    def __init__(self, client, job_id, rank, worker, group=None, timeout=120.0,
                 every_steps=None, every_seconds=None):
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps: {every_steps} must be >= 1")
        if every_seconds is not None and every_seconds <= 0:
            raise ValueError(f"every_seconds: {every_seconds} must be > 0")
        super().__init__(rank, job_id, group)
        self.client, self.worker, self.timeout = client, worker, timeout
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.checkpoints = []   # (step, generation, operation id) of each committed periodic one
        self.folded = []        # (step, operation id): periodic checkpoints folded into a cut-over
        self._pending = None    # the _Checkpoint in flight
        self._staging = _Staging()
        # Rank 0's answers go through the process group's store under keys
        # of this loop: a number rank 0 draws, learnt at the first boundary.
        import random
        self._nonce = random.randrange(1, 1 << 62) if rank == 0 else 0
        self._started = 0       # periodic checkpoints started
        self._steps_since, self._last_t = 0, time.monotonic()
        self._watch = _Watch(client, job_id)
        self._watch.start()

    # ------------------------------------------------------------- the loop

    def boundary(self, state, shard):
        """Call on every rank after every step, with the reshard.data
        DatasetState after it and a callable returning this rank's state
        (the dict Worker.publish takes). Collective. None: train on (a
        periodic checkpoint may have started). A Cut: the loop ends here (a
        prepared stop-free operation cut over, or a stop-the-world operation
        stopped it); this rank published `shard()` into that generation.

        The only collective of an ordinary boundary is one all-reduce of a
        few flags. A periodic checkpoint adds, on the training thread, the
        copy of `shard()` (its snapshot) and nothing else: no coordinator
        call is waited for. Its Checkpoint RPC, publish and commit run on a
        background thread; the first boundary after every rank's thread
        ended agrees on its outcome (one more all-reduce) and raises its
        failure on every rank. A checkpoint due while the last one is still
        in flight waits for it (one at a time, in order)."""
        torch, dist = _dist()
        self._steps_since += 1
        due = ((self.every_steps is not None and self._steps_since >= self.every_steps) or
               (self.every_seconds is not None and
                time.monotonic() - self._last_t >= self.every_seconds))
        busy = self._pending is not None and self._pending.is_alive()
        flags = torch.tensor([self._watch.prepared is not None, self._watch.stop is not None,
                              due, self._watch.error is not None, busy, self._nonce],
                             dtype=torch.int64)
        self._collective("the step-boundary all-reduce", dist.all_reduce, flags,
                         op=dist.ReduceOp.MAX, group=self.group)
        prepared, stop, due, watch_error, busy = (bool(int(x)) for x in flags[:5])
        self._nonce = int(flags[5])
        if watch_error:
            self._agree(self._watch.error)
        if stop or prepared:
            what = "stop" if stop else "prepared"
            op = None
            if self.rank == 0:
                # Another rank may have seen it first: ours follows shortly.
                op = self._watch.wait_for(what, self.timeout)
            self.wait()
            return self._publish(state, shard, op, what, stop)
        if self._pending is not None and not busy:
            self.wait()  # every rank's share ended: its outcome, raised on every rank
        if due:
            self.wait()
            self._start_checkpoint(state, shard)
        return None

    def _start_checkpoint(self, state, shard):
        _, dist = _dist()
        self._steps_since, self._last_t = 0, time.monotonic()
        copy, events = self._staging.copy(shard())
        store = None
        if dist.get_world_size(self.group) > 1:
            store = dist.distributed_c10d._get_default_store()
        prefix = f"reshard/loop/{self.job_id}/{self._nonce:x}/"
        stale = prefix + str(self._started - 1) if self._started else None
        self._pending = _Checkpoint(self, state, copy, events, store,
                                    prefix + str(self._started), stale)
        self._started += 1
        self._pending.start()

    def wait(self):
        """Waits for the asynchronous checkpoint in flight (if any) to be
        published and committed. Collective: a failure on any rank raises on
        every rank."""
        if self._pending is None:
            return
        ck, self._pending = self._pending, None
        ck.join()
        self._agree(ck.error)
        if ck.folded:
            self.folded.append((ck.step, ck.checkpoint_id))
        else:
            self.checkpoints.append((ck.step, ck.generation, ck.checkpoint_id))

    def finish(self, state, shard):
        """Publishes the state after the last step with a plain checkpoint
        (rank 0 creates it; collective) and waits for its commit. Returns a
        Cut (operation_id None)."""
        self.wait()
        if self.checkpoints and self.checkpoints[-1][0] == state.step:
            # The periodic checkpoint of this very boundary holds it already.
            step, generation, checkpoint_id = self.checkpoints[-1]
            return Cut(None, generation, step, checkpoint_id)
        return self._publish(state, shard, None, None, True)

    def _publish(self, state, shard, op, what, wait_commit):
        if what is not None:
            def have_op():
                if op is None:
                    raise _errors.FailedPrecondition(
                        f"job {self.job_id!r}: a rank saw a {what} operation that rank 0 did "
                        f"not see in {self.timeout} s")
                return op.id
            op_id = self._from_rank0(have_op)
        else:
            op_id = None

        def create():
            ck = self.client.checkpoint(self.job_id, dataset_state=state,
                                        cut_over_operation_id=op_id)
            if not _folded(ck):
                return ck.id, ck.to_generation, op_id, False
            if at_step_boundary(ck):
                # finish() while a stop-the-world operation waits for the
                # step boundary: this one is it.
                cut = self.client.checkpoint(self.job_id, dataset_state=state,
                                             cut_over_operation_id=ck.id)
                return cut.id, cut.to_generation, ck.id, False
            # finish() while a stop-free operation prepares: the checkpoint
            # folded into its cut-over, so the last step is published there
            # once the new layout is warm (the loop ends as a cut-over).
            prepared = self._watch.wait_for("prepared", self.timeout)
            if prepared is None or prepared.id != ck.id:
                raise _errors.FailedPrecondition(
                    f"job {self.job_id!r}: the final checkpoint folded into operation "
                    f"\"{ck.id}\", which was not prepared within {self.timeout} s")
            cut = self.client.checkpoint(self.job_id, dataset_state=state,
                                         cut_over_operation_id=ck.id)
            return cut.id, cut.to_generation, ck.id, True
        checkpoint_id, generation, op_id, folded = self._from_rank0(create)
        if folded:
            wait_commit = False  # the operation's new ranks go on from it
        error = None
        try:
            self.worker.publish(self.rank, generation, shard())
        except Exception as e:  # noqa: BLE001: agreed on below
            error = e
        self._agree(error)  # a refused publish first: it is why a commit would never come
        if wait_commit:
            try:
                self.client.wait(checkpoint_id, timeout=self.timeout, raise_on_failure=True)
            except Exception as e:  # noqa: BLE001: agreed on below
                error = e
            self._agree(error)
        return Cut(op_id, generation, state.step, checkpoint_id, stopped=what == "stop")

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
    DatasetState). Raises reshard.OperationFailed when it does not commit;
    a refused mark_prepared is raised on every rank, a dead peer is
    PeerLost."""
    warm = warm_up() if warm_up is not None else None
    group_of = Collectives(rank, job_id, group)
    group_of.agree(None)  # every rank is warm
    group_of._from_rank0(lambda: client.mark_prepared(operation_id).id)
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
    return operation.stop_free
