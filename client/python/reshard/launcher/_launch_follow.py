"""The Launcher of `reshard run` (docs/pytorch.md, "The launcher"): the
state machine that follows a job through the coordinator (WatchJob,
WatchOperation: the job's worker token is enough) and decides which of this
host's worlds of ranks run: the current layout's, a stop-free operation's in
warm-up, the ones retiring. It reports a rank that died (ReportRankFailure)
unless it is a casualty of another's death, and ends with an exit status of
reshard._launch_env. Starting and signalling processes is reshard._launch_ranks'.
"""

import json
import os
import queue
import signal
import sys
import threading
import time

from reshard.core import errors
from reshard.core import layout as _layout
from reshard.launcher._launch_env import (EXIT_JOB_FAILED, EXIT_OK, EXIT_PEER_LOST, EXIT_RANK_FAILED,
                                 EXIT_USAGE, LaunchError)
from reshard.launcher._launch_rdzv import DEFAULT_PORT_RANGE, Addresses
from reshard.launcher._launch_ranks import Starter, describe_status, stop_worlds
from reshard.core._proto import coordinator_pb2

_pb = coordinator_pb2
_TERMINAL = (_pb.OPERATION_STATE_COMMITTED, _pb.OPERATION_STATE_ABORTED,
             _pb.OPERATION_STATE_FAILED)


def _layout_key(lay):
    return lay.SerializeToString(deterministic=True) if lay is not None else b""


class Launcher:
    """The launcher's state machine. Not thread-safe: run() drives it from
    one thread; watcher threads only put events on its queue."""

    def __init__(self, client, job_id, host, worker_socket, command, coordinator,
                 worker_token="", tls_ca="", addresses=None, port_range=DEFAULT_PORT_RANGE,
                 retire_timeout=120.0, recovery_timeout=60.0, grace=10.0, settle=1.0,
                 events_path=None,
                 log_dir=None, log=None, spares=0):
        self.client, self.job_id, self.host = client, job_id, host
        self.coordinator, self.tls = coordinator, bool(tls_ca)
        self.retire_timeout, self.recovery_timeout, self.grace = (
            retire_timeout, recovery_timeout, grace)
        self.settle = settle
        self._log = log or (lambda msg: print(f"reshard run [{job_id} {host}]: {msg}",
                                              file=sys.stderr, flush=True))
        self._events = open(events_path, "a", buffering=1) if events_path else None
        self._events_lock = threading.Lock()  # the rank hosts' threads write events too
        self.queue = queue.Queue()
        self.starter = Starter(
            host, command, dict(coordinator=coordinator, job_id=job_id, worker_token=worker_token,
                                worker_socket=worker_socket, tls_ca=tls_ca),
            addresses or Addresses(list_hosts=client.list_hosts), port_range,
            on_exit=lambda world, rank, code: self.queue.put(("exit", (world, rank, code))),
            log=self._log, event=self.event, log_dir=log_dir, spares=spares)
        self.job = None
        self.layout = None        # the job layout the launcher last followed (None: not yet)
        self.current = None       # World of that layout (possibly with no rank here)
        self.warming = None       # World of the stop-free operation being prepared
        self.retiring = []        # Worlds being waited for or stopped
        self.ops = {}             # operation id -> last Operation seen
        self.failure = None       # (deadline, what) of a failure awaiting a recovery
        self._started_ops = set()  # stop-free operations whose ranks were started
        self._handled_ops = set()  # stop-the-world operations whose ranks were started
        self.pending = []          # (deadline, world, rank, what): reports held for --settle
        # The generation the ranks follow now at the least: a job update
        # below it is older than a commit the operation's own stream showed
        # first (the job's stream lags) and says nothing new.
        self._generation_floor = 0
        self._stop = threading.Event()

    # ------------------------------------------------------------- output

    def event(self, kind, **fields):
        with self._events_lock:
            if self._events is not None:
                self._events.write(json.dumps({"t": time.time(), "event": kind, **fields}) +
                                   "\n")

    # ------------------------------------------------------------ watchers

    def _watch_job(self):
        """Follows the job until the launcher stops (Client.watch_job in its
        follow mode: every broken or ended stream reopened with the
        stream_reconnect backoff of reshard._rpc, without limit, the count
        reset by every job received); NotFound means the job is gone."""
        try:
            for job in self.client.watch_job(self.job_id, follow=self._reconnecting,
                                             stop=self._stop):
                self.queue.put(("job", job))
                if self._stop.is_set():
                    return
        except errors.NotFound as e:
            self.queue.put(("job_gone", e))
        except Exception as e:  # noqa: BLE001: the main loop reports it
            self.queue.put(("fatal", e))

    def _reconnecting(self, error, delay):
        if not self._stop.is_set():
            why = "the stream ended" if error is None else str(error)
            self._log(f"WatchJob: {why}; reconnecting in {delay:.1f} s")

    def _watch_operation(self, op_id):
        try:
            for op in self.client.watch_operation(op_id):
                self.queue.put(("op", op))
        except Exception as e:  # noqa: BLE001
            self.queue.put(("op_error", (op_id, e)))

    def _thread(self, target, *args, name):
        t = threading.Thread(target=target, args=args, daemon=True, name=name)
        t.start()
        return t

    # -------------------------------------------------------------- ranks

    def _terminate(self, world, why):
        """SIGTERM to the world's live ranks now, SIGKILL after --grace."""
        alive = world.running()
        if alive and not world.terminated:
            self._log(f"terminating {world.name} ranks {alive}: {why}")
            self.event("terminate", world=world.name, ranks=alive, why=why)
            world.signal(signal.SIGTERM)
        world.terminated = True
        world.deadline = time.monotonic() + self.grace
        if world not in self.retiring:
            self.retiring.append(world)

    def _retire(self, world, wait, why):
        """The world is done: wait up to `wait` seconds for its ranks to end
        by themselves (0: stop them now)."""
        if world is None:
            return
        if world.state == "running":
            world.state = "retiring"
        if not world.alive():
            if world.procs:
                self.event("retired", world=world.name,
                           status={str(r): c for r, c in world.status.items()})
            return
        if wait > 0:
            world.deadline = time.monotonic() + wait
            world.why = f"still running {wait:g} s after {why}"
            self.retiring.append(world)
        else:
            self._terminate(world, why)

    # ------------------------------------------------------------ reactions

    def _op(self, op_id):
        if op_id not in self.ops:
            op = self.client.get_operation(op_id)
            self.ops[op_id] = op
            if op.state not in _TERMINAL:
                self._thread(self._watch_operation, op_id, name=f"watch-{op_id}")
        return self.ops[op_id]

    @staticmethod
    def _reconfigures(op):
        """A stop-the-world reconfiguration (resize, migrate, recover) still
        running: the layout is about to change."""
        return (op.kind != _pb.OPERATION_KIND_CHECKPOINT and not op.stop_free and
                op.state not in _TERMINAL)

    def on_job(self, job):
        if job.generation < self._generation_floor:
            return  # stale: a promoted operation's generation is newer
        self._generation_floor = job.generation
        self.job = job
        self._check_casualties()
        if job.state == _pb.JOB_STATE_FAILED:
            raise _Exit(EXIT_JOB_FAILED, f"job {self.job_id} is FAILED (state lost beyond "
                                         f"recovery)")
        active = self._op(job.active_operation_id) if job.active_operation_id else None
        if active is not None:
            self.on_op(active)
        if self.warming is not None and _layout_key(job.layout) == _layout_key(
                self.warming.layout) and job.active_operation_id != self.warming.operation_id:
            self._promote(self.warming.operation_id)
            return
        made_by = self._committed_reconfiguration(job)
        if _layout_key(job.layout) == _layout_key(self.layout) and made_by is None:
            return  # a checkpoint, or nothing that concerns the ranks
        if active is not None and self._reconfigures(active):
            self.starter.hold_spares()  # the ranks it stops come back to the pool
            return  # start when it is over
        # The first layout, or a generation a stop-the-world operation or a
        # recovery committed (its layout may even be the same): this host's
        # ranks of it start cold.
        if made_by is not None:
            self._handled_ops.add(made_by.id)
        if self.warming is not None:
            self._abandon(self.warming, "the job's layout changed without it")
        # Ranks still running trained past the state the new generation
        # starts from, unless the operation stopped them at a step boundary:
        # those are ending by themselves and get --grace seconds.
        at_boundary = (made_by is not None and
                       made_by.step_boundary == _pb.STEP_BOUNDARY_REACHED)
        self._retire(self.current, self.grace if at_boundary else 0,
                     f"the job moved to generation {job.generation}")
        self.layout = job.layout
        # Generation 1 is the registered layout: nothing to load, its ranks
        # publish it (RESHARD_GENERATION 0). The old ranks ending at the step
        # boundary hand over their warm processes (--grace at most).
        gen = job.generation if job.generation > 1 else 0
        old = self.current
        self.current = self.starter.start(f"g{job.generation}", job.layout, gen, "",
                                         job.layout_epoch,
                                         returning=old if at_boundary else None,
                                         wait=self.grace)
        self.starter.release_spares()
        if self.failure is not None:
            self._log(f"following the recovery to generation {job.generation}")
            self.event("recovered", generation=job.generation)
            self.failure = None

    def _committed_reconfiguration(self, job):
        """The stop-the-world operation (resize, migrate, recover) that
        committed the job's generation, if the launcher saw it and has not
        restarted for it yet; None otherwise. Read again when its watch lags
        the job's."""
        for op_id, op in list(self.ops.items()):
            if (op.stop_free or op.kind == _pb.OPERATION_KIND_CHECKPOINT or
                    op_id in self._handled_ops):
                continue
            if op.state not in _TERMINAL and op_id != job.active_operation_id:
                try:
                    op = self.ops[op_id] = self.client.get_operation(op_id)
                except errors.ReshardError:
                    continue
            if op.state == _pb.OPERATION_STATE_COMMITTED and op.to_generation == job.generation:
                return op
        return None

    def on_op(self, op):
        self.ops[op.id] = op
        if not op.stop_free:
            return
        terminal = op.state in _TERMINAL
        if (op.state == _pb.OPERATION_STATE_PLANNED and self.warming is None and
                not op.cutover_operation_id and op.id not in self._started_ops):
            self._started_ops.add(op.id)
            if self.failure is not None:
                return  # this host's world failed: it cannot cut over
            # The operation is not committed (its new world is not even
            # started), so the job's epoch now is the running world's: read
            # it afresh rather than from a job update that may lag this one.
            epoch = self.client.get_job(self.job_id).layout_epoch + 1
            # The old ranks' processes come back at the cut-over: no spare
            # starts meanwhile (it would take the cores from the warm-up).
            self.starter.hold_spares()
            self.warming = self.starter.start(
                f"op-{op.id}", op.target_layout, op.to_generation, op.id, epoch)
        elif terminal and self.warming is not None and self.warming.operation_id == op.id:
            if op.state == _pb.OPERATION_STATE_COMMITTED:
                self._promote(op.id)
            else:
                self._abandon(self.warming, f"operation {op.id} ended "
                                            f"{_pb.OperationState.Name(op.state)}: {op.error}")

    def _promote(self, op_id):
        world = self.warming
        if world is None or world.operation_id != op_id:
            return
        self.warming = None
        self.starter.release_spares()
        self._generation_floor = max(self._generation_floor, world.generation)
        old = self.current
        self.current, self.layout = world, world.layout
        self._log(f"operation {op_id} committed: {world.name} trains; waiting up to "
                  f"{self.retire_timeout:g} s for the old ranks to end")
        self.event("committed", operation_id=op_id, world=world.name)
        self._retire(old, self.retire_timeout, f"operation {op_id} committed")

    def _abandon(self, world, why):
        world.state = "abandoned"
        if world is self.warming:
            self.warming = None
            self.starter.release_spares()
        self.event("abandoned", world=world.name, why=why)
        self._terminate(world, why)

    def on_exit(self, world, rank, code):
        world.status[rank] = code
        self.event("exit", world=world.name, rank=rank, code=code, state=world.state)
        if code == 0 or world.state != "running":
            if code != 0:
                self._log(f"{world.name} rank {rank}: {describe_status(code)} "
                          f"({world.state})")
            if world.state == "retiring" and not world.alive():
                self.event("retired", world=world.name,
                           status={str(r): c for r, c in world.status.items()})
            return
        what = f"rank {rank} ({world.name}) {describe_status(code)}"
        world.state = "failed"
        self.event("failed", world=world.name, rank=rank, code=code)
        if code == EXIT_PEER_LOST and world.alive():
            # The others lost the same peer: --grace to end by themselves
            # (with their own status) before they are stopped.
            self._retire(world, self.grace, f"rank {rank} of the same world lost a peer")
        else:
            self._terminate(world, f"rank {rank} of the same world failed")
        if world is self.warming:
            # Its ranks are numbered in the operation's target layout, not in
            # the job's current world: nothing to report. The old layout
            # trains on; the operation cannot be prepared (the scheduler
            # cancels it).
            self._log(f"{what} in warm-up: stopped this host's ranks of {world.name}; the "
                      f"current layout trains on")
            self.warming = None
            self.starter.release_spares()
            return
        if code == EXIT_PEER_LOST:
            self._log(f"{what}: a peer died (PeerLost); this host's other ranks of "
                      f"{world.name} get {self.grace:g} s to end")
            self.event("casualty", world=world.name, rank=rank, of=[])
        elif code < 0:
            self._log(f"{what}: reporting it, stopping this host's other ranks of {world.name}")
            self._send_report(world, rank, what)
        else:
            # A non-zero status may be a casualty of another rank's death
            # (PeerLost, gloo's "Connection closed by peer"): report it
            # unless another rank of this world is reported within --settle.
            self._log(f"{what}: stopping this host's other ranks of {world.name}; reporting it "
                      f"unless another rank is reported within {self.settle:g} s")
            self.pending.append((time.monotonic() + self.settle, world, rank, what))
            self._check_casualties()
        if self.failure is None:
            self.failure = (time.monotonic() + self.recovery_timeout, what)

    def _send_report(self, world, rank, what):
        reported = self._report(rank, what)
        self.event("reported", world=world.name, rank=rank, reported=reported)

    def _check_casualties(self):
        """Drops the pending reports of ranks that failed after another rank
        of the job's current generation was reported dead."""
        if not self.pending or self.job is None:
            return
        reported = {f.rank for f in self.job.failed_ranks
                    if f.generation == self.job.generation}
        lost = set(self.job.lost_hosts)
        for item in list(self.pending):
            _, world, rank, what = item
            # Ranks of a lost host count as reported (their launcher is gone).
            on_lost = {r for r, (h, _) in enumerate(_layout.slots(world.layout)) if h in lost}
            others = sorted((reported | on_lost) - {rank})
            if others:
                self.pending.remove(item)
                self._log(f"{what}: not reported, ranks {others} were reported dead first")
                self.event("casualty", world=world.name, rank=rank, of=others)

    def _report(self, rank, reason):
        try:
            self.client.report_rank_failure(self.job_id, rank, reason)
            return True
        except errors.ReshardError as e:
            self._log(f"ReportRankFailure of rank {rank}: {e}")
            return False

    def on_deadlines(self):
        now = time.monotonic()
        for world in list(self.retiring):
            if not world.alive():
                self.retiring.remove(world)
                continue
            if world.deadline is not None and now >= world.deadline:
                if not world.terminated:
                    self._terminate(world, world.why)
                else:
                    if world.running():
                        self._log(f"killing {world.name} ranks {world.running()}: SIGTERM "
                                  f"ignored for {self.grace:g} s")
                        self.event("kill", world=world.name, ranks=world.running())
                        world.signal(signal.SIGKILL)
                    world.deadline = None
        for item in list(self.pending):
            if now >= item[0]:
                self.pending.remove(item)
                self._send_report(*item[1:])
        if self.failure is not None and now >= self.failure[0]:
            raise _Exit(EXIT_RANK_FAILED, f"{self.failure[1]}; no recovery of job {self.job_id} "
                                          f"within {self.recovery_timeout:g} s")

    def _next_deadline(self):
        ds = [w.deadline for w in self.retiring if w.deadline is not None]
        if self.failure is not None:
            ds.append(self.failure[0])
        ds += [item[0] for item in self.pending]
        return min(ds) if ds else None

    # ----------------------------------------------------------------- run

    def worlds(self):
        out = [w for w in (self.current, self.warming) if w is not None]
        return out + [w for w in self.retiring if w not in out]

    def stop_all(self, sig=signal.SIGTERM, why="stopping"):
        """Signals every live rank's process group, waits up to --grace, then
        SIGKILLs; ends the groups' guard once every rank is reaped."""
        stop_worlds(self.worlds(), sig, why, self.grace, self.event)
        self.starter.close()

    def step(self, timeout=None):
        """Handles the next event (a job or operation update, a rank's exit,
        a signal) or the next deadline, waiting at most `timeout` seconds
        (None: until one comes). Raises _Exit when the launcher ends."""
        deadline = self._next_deadline()
        if timeout is not None:
            limit = time.monotonic() + timeout
            deadline = limit if deadline is None else min(deadline, limit)
        try:
            kind, value = self.queue.get(
                timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self.on_deadlines()
            return
        if kind == "job":
            self.on_job(value)
        elif kind == "op":
            self.on_op(value)
        elif kind == "exit":
            self.on_exit(*value)
        elif kind == "op_error":
            # Follow it again while the job still names it.
            self._log(f"WatchOperation {value[0]}: {value[1]}")
            self.ops.pop(value[0], None)
            if self.job is not None and self.job.active_operation_id == value[0]:
                time.sleep(0.5)
                self.on_op(self._op(value[0]))
        elif kind == "job_gone":
            raise _Exit(EXIT_OK, f"job {self.job_id} deleted")
        elif kind == "signal":
            raise _Exit(128 + value, f"{signal.Signals(value).name}: stopping the ranks",
                        sig=value)
        elif kind == "fatal":
            raise value
        self.on_deadlines()

    def _first_job(self):
        """GetJob of the job at start; a coordinator that cannot be reached
        (a closed port, TLS against a plaintext endpoint or the reverse:
        UNAVAILABLE after the client's retries) is a LaunchError naming it."""
        try:
            return self.client.get_job(self.job_id)
        except (errors.Unavailable, errors.DeadlineExceeded) as e:
            raise LaunchError(
                f"coordinator {self.coordinator}: cannot reach it "
                f"({'TLS' if self.tls else 'plaintext'}): {' '.join(str(e).split())}") from None

    def run(self):
        """Follows the job until it is deleted (0), a rank fails without a
        recovery (1), the job FAILED (3), a signal (128 + signal), or it
        cannot go on (2: a coordinator it cannot reach at start, a refused
        credential, an error it cannot act on; said in one line)."""
        previous = {}

        def forward(signum, _frame):
            self.queue.put(("signal", signum))

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.signal(s, forward)
        try:
            self.event("start", job_id=self.job_id, host=self.host, pid=os.getpid())
            self.on_job(self._first_job())
            self._thread(self._watch_job, name=f"watch-job-{self.job_id}")
            while True:
                self.step()
        except _Exit as e:
            self._log(e.message)
            self.stop_all(e.sig, e.message)
            self.event("stop", code=e.code, why=e.message)
            return e.code
        except errors.NotFound as e:
            self._log(str(e))
            self.stop_all(why=str(e))
            self.event("stop", code=EXIT_OK, why=str(e))
            return EXIT_OK
        except (errors.PermissionDenied, errors.Unauthenticated, LaunchError) as e:
            self._log(str(e))
            self.stop_all(why=str(e))
            self.event("stop", code=EXIT_USAGE, why=str(e))
            return EXIT_USAGE
        except errors.ReshardError as e:
            # The coordinator answered something the launcher cannot act on
            # (after the client's own retries): it cannot follow the job.
            why = f"cannot follow job {self.job_id}: " + " ".join(str(e).split())
            self._log(why)
            self.stop_all(why=why)
            self.event("stop", code=EXIT_USAGE, why=why)
            return EXIT_USAGE
        finally:
            self._stop.set()
            self.starter.close()
            for s, h in previous.items():
                signal.signal(s, h)
            with self._events_lock:
                if self._events is not None:
                    self._events.close()
                    self._events = None


class _Exit(Exception):
    def __init__(self, code, message, sig=signal.SIGTERM):
        super().__init__(message)
        self.code, self.message, self.sig = code, message, sig
