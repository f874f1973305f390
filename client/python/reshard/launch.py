"""`reshard run`: the per-host launcher of a reshard job's training ranks
(docs/pytorch.md, "The launcher").

One launcher runs on every host (or as a Kubernetes pod's entrypoint):

    reshard run --coordinator HOST:PORT --job JOB --host HOST_ID \\
        --worker-socket PATH [--token-file F] (--tls-ca F | --insecure) \\
        -- python train.py args...

It follows the job with WatchJob (the job's worker token is enough) and
starts, on its host, one process per rank of the job's current layout with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) plus reshard's (RESHARD_*; rank_env() reads it):

- a stop-free operation, once PLANNED: this host's ranks of its target
  layout start in warm-up (RESHARD_OPERATION_ID set) while the old ranks
  train on; after the cut-over the old ranks' loop ends and they exit by
  themselves; once the operation commits the launcher waits for them
  (--retire-timeout) and then terminates them, saying so;
- a stop-the-world operation or a recovery that commits: the ranks still
  running are stopped and the new layout's ranks on this host start cold
  (RESHARD_GENERATION = the committed generation); none when the host is
  not in the new layout (the launcher then waits for a layout that uses it);
- a rank that exits non-zero or by a signal: this host's other ranks of
  that world are terminated (their collectives would hang or fail with
  gloo's "Connection closed by peer") and the rank is reported
  (ReportRankFailure): at once when a signal killed it, never when it exits
  EXIT_PEER_LOST (a peer died), after --settle seconds for another status
  unless another rank of its world was reported or its host lost first
  (a casualty); the launcher exits 1 unless the job gets a recovery within
  --recovery-timeout (it then follows it);
- the job deleted: the ranks are stopped and the launcher exits 0; the job
  FAILED (state lost): exit 3; SIGTERM / SIGINT: forwarded to every rank,
  exit 128 + the signal.

Rendezvous (no launcher talks to another): MASTER_ADDR is the address of the
host of the world's rank 0 (--rdzv-host / --rdzv-host-pattern, else the
agent address the coordinator lists for it, else 127.0.0.1 when the whole
world is on this host); MASTER_PORT = lo + E mod (hi - lo + 1) over
--rdzv-port-range lo-hi, where E is the world's layout epoch: the job's
Job.layout_epoch (how many reconfigurations it has committed) for the world
that trains its current layout, that + 1 for the world a stop-free operation
warms up meanwhile (rendezvous_port). Only worlds of consecutive epochs are
ever alive at once, so they never share a port however long either lives.
"""

import argparse
import dataclasses
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from reshard import errors
from reshard._proto import as_message, coordinator_pb2, ptc_pb2, to_dict
from reshard import layout as _layout

_pb = coordinator_pb2
_TERMINAL = (_pb.OPERATION_STATE_COMMITTED, _pb.OPERATION_STATE_ABORTED,
             _pb.OPERATION_STATE_FAILED)

DEFAULT_PORT_RANGE = (29500, 30499)

# Exit statuses of `reshard run`.
EXIT_OK = 0            # the job was deleted
EXIT_RANK_FAILED = 1   # a rank failed and no recovery came in time
EXIT_USAGE = 2         # bad arguments or a credential the coordinator refuses
EXIT_JOB_FAILED = 3    # the job's state is lost beyond recovery (JOB_STATE_FAILED)

# A rank that exits with this status says it ended because a peer died (a
# collective failed: reshard.elastic.PeerLost), not by a fault of its own:
# the launcher stops its world's other ranks on this host but does not report
# it. (75 is sysexits' EX_TEMPFAIL.)
EXIT_PEER_LOST = 75


class LaunchError(Exception):
    """A launcher that cannot go on: bad arguments, an address it cannot
    find, a coordinator that refuses it. The message names the thing."""


# ------------------------------------------------------------ rank side


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What `reshard run` told a rank (rank_env() reads it)."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    coordinator: str
    job_id: str
    worker_token: str
    worker_socket: str
    generation: int        # the generation to load; 0 = a fresh start (publish generation 1)
    operation_id: str      # "" unless started in warm-up of a stop-free operation
    layout: object         # reshard.v1.Layout of this rank's world
    tls_ca: str = ""       # "" = the coordinator is plaintext (--insecure)
    device: int = 0        # the layout's device slot of this rank on its host

    @property
    def warm_up(self):
        """True for a rank of a stop-free operation's new layout: it warms
        up, then joins (reshard.elastic.join) instead of loading."""
        return bool(self.operation_id)

    @property
    def fresh(self):
        """True when there is nothing to load: the job's first ranks, which
        publish generation 1."""
        return self.generation == 0 and not self.operation_id

    def client(self, token=None, **kwargs):
        """A reshard.Client of the job's coordinator presenting `token`
        (default: the worker token), TLS with $RESHARD_TLS_CA when set."""
        from reshard.client import Client, tls_credentials
        if self.tls_ca:
            kwargs.setdefault("credentials", tls_credentials(self.tls_ca))
        else:
            kwargs.setdefault("insecure", True)
        return Client(self.coordinator, token=(token or self.worker_token) or None, **kwargs)

    def worker(self, ptc=None, **kwargs):
        """This rank's reshard.Worker (its host agent's worker socket)."""
        from reshard.worker import Worker
        return Worker(self.worker_socket, self.job_id, ptc=ptc, worker_token=self.worker_token,
                      **kwargs)


def _env_int(env, name):
    value = env.get(name)
    if value is None:
        raise LaunchError(f"${name} is not set: start the rank with `reshard run`")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"${name} {value!r}: not an integer") from None


def _env_str(env, name):
    value = env.get(name)
    if value is None:
        raise LaunchError(f"${name} is not set: start the rank with `reshard run`")
    return value


def rank_env(env=None):
    """The RankEnv of this process (from os.environ, or `env`). LaunchError
    names a variable that is missing or malformed."""
    env = os.environ if env is None else env
    try:
        lay = as_message(json.loads(_env_str(env, "RESHARD_LAYOUT")), ptc_pb2.Layout,
                         "RESHARD_LAYOUT")
    except (ValueError, TypeError) as e:
        raise LaunchError(f"$RESHARD_LAYOUT: not a layout: {e}") from None
    return RankEnv(
        rank=_env_int(env, "RANK"), world_size=_env_int(env, "WORLD_SIZE"),
        local_rank=_env_int(env, "LOCAL_RANK"), local_world_size=_env_int(env, "LOCAL_WORLD_SIZE"),
        master_addr=_env_str(env, "MASTER_ADDR"), master_port=_env_int(env, "MASTER_PORT"),
        coordinator=_env_str(env, "RESHARD_COORDINATOR"), job_id=_env_str(env, "RESHARD_JOB_ID"),
        worker_token=env.get("RESHARD_WORKER_TOKEN", ""),
        worker_socket=_env_str(env, "RESHARD_WORKER_SOCKET"),
        generation=_env_int(env, "RESHARD_GENERATION"),
        operation_id=env.get("RESHARD_OPERATION_ID", ""), layout=lay,
        tls_ca=env.get("RESHARD_TLS_CA", ""),
        device=int(env.get("RESHARD_DEVICE", "0") or 0))


# ------------------------------------------------------------ rendezvous


def parse_port_range(text):
    """(lo, hi) from "lo-hi" (inclusive, 1 <= lo <= hi <= 65535)."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise LaunchError(f"--rdzv-port-range {text!r}: expected LO-HI, e.g. 29500-30499") from None
    if not 1 <= lo <= hi <= 65535:
        raise LaunchError(f"--rdzv-port-range {text!r}: need 1 <= LO <= HI <= 65535")
    return lo, hi


def rendezvous_port(epoch, port_range=DEFAULT_PORT_RANGE):
    """MASTER_PORT of the world of layout epoch `epoch` (Job.layout_epoch for
    the world of the job's current layout, + 1 for a stop-free operation's
    new world): the same on every host. Worlds alive at once have
    consecutive epochs, hence different ports (a range of at least 2)."""
    lo, hi = port_range
    return lo + int(epoch) % (hi - lo + 1)


def _host_part(address):
    """"host" of "host:port" / "[v6]:port"."""
    if address.startswith("["):
        return address[1:address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address


class Addresses:
    """MASTER_ADDR of a host id, the same answer on every launcher: an
    explicit --rdzv-host HOST=ADDR, else --rdzv-host-pattern with {host}
    (e.g. a StatefulSet's "{host}.trainers.ns.svc"), else the host part of
    the agent address the coordinator lists (ListHosts: a scheduler or
    viewer credential; a worker token may not list hosts)."""

    def __init__(self, explicit=None, pattern="", list_hosts=None):
        self.explicit = dict(explicit or {})
        self.pattern = pattern
        self._list_hosts = list_hosts
        self._listed = {}

    def of(self, host):
        if host in self.explicit:
            return self.explicit[host]
        if self.pattern:
            return self.pattern.format(host=host)
        if self._list_hosts is not None and host not in self._listed:
            try:
                self._listed = {h.host_id: _host_part(h.address) for h in self._list_hosts()
                                if h.address}
            except errors.PermissionDenied as e:
                raise LaunchError(
                    f"host \"{host}\": no --rdzv-host {host}=ADDR or --rdzv-host-pattern, and the "
                    f"coordinator does not list hosts to this credential ({e.message})") from None
        if host in self._listed:
            return self._listed[host]
        raise LaunchError(f"host \"{host}\": no address (give --rdzv-host {host}=ADDR or "
                          f"--rdzv-host-pattern)")


# --------------------------------------------------------------- worlds


def _layout_key(lay):
    return lay.SerializeToString(deterministic=True) if lay is not None else b""


# Each rank is started through this shim (the launcher's own python): it
# asks for SIGKILL when the launcher dies (PR_SET_PDEATHSIG, even a SIGKILLed
# launcher takes its ranks along) and execs the rank's command in place, so
# the rank keeps the shim's pid. Not a preexec_fn: forking the launcher, whose
# gRPC threads run, to run Python in the child can abort the child (gRPC's
# fork handlers); without one, subprocess uses vfork + exec.
_SHIM = ("import ctypes, os, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
         "if os.getppid() != int(sys.argv[1]):\n"                    # the launcher is gone already
         "    os._exit(137)\n"
         "try:\n"
         "    os.execvp(sys.argv[2], sys.argv[2:])\n"
         "except OSError as e:\n"
         "    sys.stderr.write(f'reshard run: cannot start {sys.argv[2]!r}: {e.strerror}\\n')\n"
         "    os._exit(127)\n")


def _describe_status(code):
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class World:
    """The ranks of one layout (a generation started cold, or a stop-free
    operation's target) that run on this host. state: "running", "retiring"
    (the launcher stops them or waits for them to end), "failed" (a rank
    failed; the others are being stopped), "abandoned" (the operation that
    started them ended without committing)."""

    def __init__(self, name, lay, generation, operation_id, epoch):
        self.name, self.layout, self.generation = name, lay, generation
        self.operation_id, self.epoch = operation_id, epoch
        self.procs = {}     # rank -> Popen
        self.status = {}    # rank -> returncode, once it ended
        self.state = "running"
        self.deadline = None  # retiring: when to terminate; terminated: when to SIGKILL
        self.terminated = False
        self.why = ""         # why it retires

    def alive(self):
        """Ranks whose exit the launcher has not handled yet."""
        return [r for r in self.procs if r not in self.status]

    def running(self):
        """Ranks not reaped yet (returncode is set by whichever thread
        reaped the process): the ones that may still be signalled."""
        return [r for r, p in self.procs.items() if p.returncode is None]


class Launcher:
    """The launcher's state machine. Not thread-safe: run() drives it from
    one thread; watcher threads only put events on its queue."""

    def __init__(self, client, job_id, host, worker_socket, command, coordinator,
                 worker_token="", tls_ca="", addresses=None, port_range=DEFAULT_PORT_RANGE,
                 retire_timeout=120.0, recovery_timeout=60.0, grace=10.0, settle=1.0,
                 events_path=None,
                 log_dir=None, log=None):
        self.client, self.job_id, self.host = client, job_id, host
        self.worker_socket, self.command = worker_socket, list(command)
        self.coordinator, self.worker_token, self.tls_ca = coordinator, worker_token, tls_ca
        self.addresses = addresses or Addresses(list_hosts=client.list_hosts)
        self.port_range = port_range
        self.retire_timeout, self.recovery_timeout, self.grace = (
            retire_timeout, recovery_timeout, grace)
        self.settle = settle
        self.log_dir = log_dir
        self._log = log or (lambda msg: print(f"reshard run [{job_id} {host}]: {msg}",
                                              file=sys.stderr, flush=True))
        self._events = open(events_path, "a", buffering=1) if events_path else None
        self.queue = queue.Queue()
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
        self._stop = threading.Event()

    # ------------------------------------------------------------- output

    def event(self, kind, **fields):
        if self._events is not None:
            self._events.write(json.dumps({"t": time.time(), "event": kind, **fields}) + "\n")

    # ------------------------------------------------------------ watchers

    def _watch_job(self):
        backoff = 0.1
        while not self._stop.is_set():
            try:
                for job in self.client.watch_job(self.job_id):
                    backoff = 0.1
                    self.queue.put(("job", job))
                    if self._stop.is_set():
                        return
                # The stream ended without an error: a deleted job, or a
                # coordinator that went away cleanly (then follow it again).
                self.client.get_job(self.job_id)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except errors.NotFound as e:
                self.queue.put(("job_gone", e))
                return
            except (errors.Unavailable, errors.DeadlineExceeded, errors.Internal,
                    errors.Aborted, errors.Cancelled) as e:
                if self._stop.is_set():
                    return
                self._log(f"WatchJob: {e}; reconnecting")
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as e:  # noqa: BLE001: the main loop reports it
                self.queue.put(("fatal", e))
                return

    def _watch_operation(self, op_id):
        try:
            for op in self.client.watch_operation(op_id):
                self.queue.put(("op", op))
        except Exception as e:  # noqa: BLE001
            self.queue.put(("op_error", (op_id, e)))

    def _reap(self, world, rank, proc):
        proc.wait()
        self.queue.put(("exit", (world, rank, proc.returncode)))

    def _thread(self, target, *args, name):
        t = threading.Thread(target=target, args=args, daemon=True, name=name)
        t.start()
        return t

    # -------------------------------------------------------------- ranks

    def _start_world(self, name, lay, generation, operation_id, epoch):
        world = World(name, lay, generation, operation_id, epoch)
        mine = _layout.ranks_on_host(lay, self.host)
        if not mine:
            self.event("world", world=name, ranks=[], generation=generation,
                       operation_id=operation_id)
            return world
        slots = _layout.slots(lay)
        rank0_host = slots[0][0]
        if all(h == self.host for h, _ in slots):
            addr = "127.0.0.1"  # the whole world is here: no other launcher needs to agree
        else:
            addr = self.addresses.of(rank0_host)
        port = rendezvous_port(epoch, self.port_range)
        layout_json = json.dumps(to_dict(lay), sort_keys=True)
        for local, (rank, device) in enumerate(mine):
            env = dict(os.environ)
            env.pop("RESHARD_OPERATION_ID", None)
            env.update({
                "RANK": str(rank), "WORLD_SIZE": str(len(slots)),
                "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(len(mine)),
                "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                "RESHARD_COORDINATOR": self.coordinator, "RESHARD_JOB_ID": self.job_id,
                "RESHARD_WORKER_TOKEN": self.worker_token,
                "RESHARD_WORKER_SOCKET": self.worker_socket,
                "RESHARD_GENERATION": str(generation), "RESHARD_LAYOUT": layout_json,
                "RESHARD_DEVICE": str(device),
            })
            if operation_id:
                env["RESHARD_OPERATION_ID"] = operation_id
            if self.tls_ca:
                env["RESHARD_TLS_CA"] = self.tls_ca
            else:
                env.pop("RESHARD_TLS_CA", None)
            if len(mine) > 1:
                env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does
            out = None
            if self.log_dir:
                os.makedirs(self.log_dir, exist_ok=True)
                out = open(os.path.join(self.log_dir, f"{name}-rank{rank}.log"), "ab")
            try:
                argv = [sys.executable, "-S", "-c", _SHIM, str(os.getpid())] + self.command
                if not sys.platform.startswith("linux"):
                    argv = self.command
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT if out else None,
                                        start_new_session=True)
            except OSError as e:
                raise LaunchError(f"rank {rank}: cannot start {self.command[0]!r}: "
                                  f"{e.strerror}") from None
            finally:
                if out is not None:
                    out.close()
            world.procs[rank] = proc
            self._thread(self._reap, world, rank, proc, name=f"reap-{name}-{rank}")
        self._log(f"started {name}: ranks {[r for r, _ in mine]} of {len(slots)} "
                  f"(generation {generation}{', operation ' + operation_id if operation_id else ''}"
                  f", MASTER_ADDR {addr} MASTER_PORT {port})")
        self.event("world", world=name, ranks=[r for r, _ in mine], generation=generation,
                   operation_id=operation_id, master_addr=addr, master_port=port,
                   pids={str(r): p.pid for r, p in world.procs.items()})
        return world

    def _signal(self, world, sig):
        for rank in world.running():
            try:
                os.killpg(world.procs[rank].pid, sig)
            except ProcessLookupError:
                pass

    def _terminate(self, world, why):
        """SIGTERM to the world's live ranks now, SIGKILL after --grace."""
        alive = world.running()
        if alive and not world.terminated:
            self._log(f"terminating {world.name} ranks {alive}: {why}")
            self.event("terminate", world=world.name, ranks=alive, why=why)
            self._signal(world, signal.SIGTERM)
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
        # publish it (RESHARD_GENERATION 0).
        gen = job.generation if job.generation > 1 else 0
        self.current = self._start_world(f"g{job.generation}", job.layout, gen, "",
                                         job.layout_epoch)
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
            self.warming = self._start_world(
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
        self.event("abandoned", world=world.name, why=why)
        self._terminate(world, why)

    def on_exit(self, world, rank, code):
        world.status[rank] = code
        self.event("exit", world=world.name, rank=rank, code=code, state=world.state)
        if code == 0 or world.state != "running":
            if code != 0:
                self._log(f"{world.name} rank {rank}: {_describe_status(code)} "
                          f"({world.state})")
            if world.state == "retiring" and not world.alive():
                self.event("retired", world=world.name,
                           status={str(r): c for r, c in world.status.items()})
            return
        what = f"rank {rank} ({world.name}) {_describe_status(code)}"
        world.state = "failed"
        self.event("failed", world=world.name, rank=rank, code=code)
        self._terminate(world, f"rank {rank} of the same world failed")
        if world is self.warming:
            # Its ranks are numbered in the operation's target layout, not in
            # the job's current world: nothing to report. The old layout
            # trains on; the operation cannot be prepared (the scheduler
            # cancels it).
            self._log(f"{what} in warm-up: stopped this host's ranks of {world.name}; the "
                      f"current layout trains on")
            self.warming = None
            return
        if code == EXIT_PEER_LOST:
            self._log(f"{what}: a peer died (PeerLost); stopping this host's other ranks of "
                      f"{world.name}")
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
                        self._signal(world, signal.SIGKILL)
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
        """Signals every live rank, waits up to --grace, then SIGKILLs."""
        worlds = self.worlds()
        for w in worlds:
            if w.running():
                self.event("terminate", world=w.name, ranks=w.running(), why=why)
                self._signal(w, sig)
        end = time.monotonic() + self.grace
        for w in worlds:
            for r in w.running():
                try:
                    w.procs[r].wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for w in worlds:
            if w.running():
                self.event("kill", world=w.name, ranks=w.running())
                self._signal(w, signal.SIGKILL)
                for r in w.running():
                    w.procs[r].wait()

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

    def run(self):
        """Follows the job until it is deleted (0), a rank fails without a
        recovery (1), the job FAILED (3) or a signal (128 + signal)."""
        previous = {}

        def forward(signum, _frame):
            self.queue.put(("signal", signum))

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.signal(s, forward)
        try:
            self.event("start", job_id=self.job_id, host=self.host, pid=os.getpid())
            self.on_job(self.client.get_job(self.job_id))
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
        finally:
            self._stop.set()
            for s, h in previous.items():
                signal.signal(s, h)
            if self._events is not None:
                self._events.close()
                self._events = None


class _Exit(Exception):
    def __init__(self, code, message, sig=signal.SIGTERM):
        super().__init__(message)
        self.code, self.message, self.sig = code, message, sig


# ------------------------------------------------------------------- CLI


def _parser():
    p = argparse.ArgumentParser(
        prog="reshard run",
        description="Start this host's ranks of a reshard job and follow its reconfigurations "
                    "(docs/pytorch.md, \"The launcher\").")
    p.add_argument("--coordinator", required=True, help="HOST:PORT of a reshard-coordinator")
    p.add_argument("--job", required=True, help="the job id")
    p.add_argument("--host", required=True, help="this host's id (its agent's --host-id)")
    p.add_argument("--worker-socket", required=True, help="this host agent's --worker-socket")
    p.add_argument("--token-file", help="the credential for the coordinator, normally the job's "
                   "worker token (default $RESHARD_WORKER_TOKEN)")
    p.add_argument("--tls-ca", help="PEM CA of the coordinator's certificate (TLS)")
    p.add_argument("--insecure", action="store_true", help="plaintext (a coordinator run with "
                   "--insecure)")
    p.add_argument("--rdzv-host", action="append", default=[], metavar="HOST=ADDR",
                   help="the address of a host's ranks for MASTER_ADDR (repeatable)")
    p.add_argument("--rdzv-host-pattern", default="", metavar="PATTERN",
                   help="MASTER_ADDR of a host from its id, e.g. '{host}.trainers.ns.svc'")
    p.add_argument("--rdzv-port-range", default=f"{DEFAULT_PORT_RANGE[0]}-{DEFAULT_PORT_RANGE[1]}",
                   metavar="LO-HI", help="MASTER_PORTs of the job's worlds (default %(default)s)")
    p.add_argument("--retire-timeout", type=float, default=120.0, metavar="S",
                   help="after a stop-free cut-over commits, how long the old ranks may take to "
                        "end before they are terminated (default %(default)s)")
    p.add_argument("--recovery-timeout", type=float, default=60.0, metavar="S",
                   help="after a rank failed, how long to wait for the job's recovery before "
                        "exiting 1 (default %(default)s)")
    p.add_argument("--grace", type=float, default=10.0, metavar="S",
                   help="SIGTERM -> SIGKILL of a rank being stopped (default %(default)s)")
    p.add_argument("--settle", type=float, default=1.0, metavar="S",
                   help="a rank that exits with a non-zero status is reported unless another "
                        "rank of its world is reported dead within S seconds (it is then a "
                        "casualty); one killed by a signal is reported at once (default "
                        "%(default)s)")
    p.add_argument("--log-dir", help="each rank's output to DIR/<world>-rank<R>.log instead of "
                   "the launcher's")
    p.add_argument("--events", help="append what the launcher does as JSON lines to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the rank's command line")
    return p


def _read_token(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise LaunchError(f"--token-file \"{path}\": cannot read it: {e.strerror}") from None


def run(argv):
    """`reshard run ARGS -- COMMAND...`; returns the exit status."""
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if not command:
            raise LaunchError("no command: reshard run [options] -- python train.py ...")
        if shutil.which(command[0]) is None:
            raise LaunchError(f"command {command[0]!r}: not found or not executable")
        if bool(args.tls_ca) == bool(args.insecure):
            raise LaunchError("give --tls-ca FILE (TLS) or --insecure (plaintext), one of them")
        token = _read_token(args.token_file) if args.token_file else os.environ.get(
            "RESHARD_WORKER_TOKEN", "")
        # The ranks present the worker token to their agent; it is the
        # launcher's own credential unless $RESHARD_WORKER_TOKEN says another.
        worker_token = os.environ.get("RESHARD_WORKER_TOKEN") or token
        explicit = {}
        for item in args.rdzv_host:
            host, sep, addr = item.partition("=")
            if not sep or not host or not addr:
                raise LaunchError(f"--rdzv-host {item!r}: expected HOST=ADDR")
            explicit[host] = addr
        port_range = parse_port_range(args.rdzv_port_range)
        from reshard.client import Client, tls_credentials
        kwargs = {"insecure": True} if args.insecure else {
            "credentials": tls_credentials(os.path.abspath(args.tls_ca))}
        client = Client(args.coordinator, token=token or None, **kwargs)
    except (LaunchError, ValueError) as e:
        print(f"reshard run: {e}", file=sys.stderr)
        return EXIT_USAGE
    launcher = Launcher(
        client, args.job, args.host, os.path.abspath(args.worker_socket), command,
        args.coordinator, worker_token=worker_token,
        tls_ca=os.path.abspath(args.tls_ca) if args.tls_ca else "",
        addresses=Addresses(explicit, args.rdzv_host_pattern, client.list_hosts),
        port_range=port_range, retire_timeout=args.retire_timeout,
        recovery_timeout=args.recovery_timeout, grace=args.grace, settle=args.settle,
        events_path=args.events,
        log_dir=args.log_dir)
    try:
        return launcher.run()
    finally:
        client.close()


def main(argv=None):
    """The `reshard` console script: `reshard run ...`, `reshard dcp
    import|export ...` (reshard.dcp)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: reshard run [options] -- COMMAND ...   (reshard run --help)\n"
              "       reshard dcp import|export DIR ...     (reshard dcp import --help)")
        return 0 if argv else EXIT_USAGE
    if argv[0] == "dcp":
        from reshard import dcp  # torch.distributed.checkpoint: only when asked for
        return dcp.main(argv[1:])
    if argv[0] != "run":
        print(f"reshard: unknown command {argv[0]!r} (known: run, dcp)", file=sys.stderr)
        return EXIT_USAGE
    return run(argv[1:])
