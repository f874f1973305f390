"""This host's rank processes of `reshard run` (docs/pytorch.md, "The
launcher"): a World is the ranks of one layout that run here; Starter starts
them with their environment (reshard._launch_env.rank_environment) through
an exec shim that takes them along when the launcher dies; stop_worlds
signals them, waits and kills. What to start and stop, and when, is the
Launcher's (reshard._launch_follow).

Each rank leads a process group of its own (a new session): what it starts
stays in that group, and the group is what the launcher signals. When a rank
ends, whatever it left in its group is killed before the rank is reaped (its
pid, the group's id, cannot be reused meanwhile); when the launcher itself
dies, even by SIGKILL, a guard process (RankGroups) kills every group it
still knew of.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from reshard.core import layout as _layout
from reshard.launcher._launch_env import LaunchError, rank_environment
from reshard.launcher._launch_rdzv import master_addr, rendezvous_port
from reshard.core._proto import to_dict


# Each rank is started through this shim (the launcher's own python): it
# asks for SIGKILL when the launcher dies (PR_SET_PDEATHSIG, even a SIGKILLed
# launcher takes its ranks along), waits for the launcher's go on a pipe (sent
# once the rank's process group is listed with the guard, so nothing the rank
# starts can outlive a launcher that dies meanwhile) and execs the rank's
# command in place, so the rank keeps the shim's pid. Not a preexec_fn:
# forking the launcher, whose gRPC threads run, to run Python in the child can
# abort the child (gRPC's fork handlers); without one, subprocess uses vfork +
# exec.
_SHIM = ("import ctypes, os, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
         "if os.getppid() != int(sys.argv[1]):\n"                    # the launcher is gone already
         "    os._exit(137)\n"
         "if os.read(int(sys.argv[2]), 1) != b'1':\n"                # no go: the launcher died
         "    os._exit(137)\n"
         "os.close(int(sys.argv[2]))\n"
         "try:\n"
         "    os.execvp(sys.argv[3], sys.argv[3:])\n"
         "except OSError as e:\n"
         "    sys.stderr.write(f'reshard run: cannot start {sys.argv[3]!r}: {e.strerror}\\n')\n"
         "    os._exit(127)\n")

# The guard of the ranks' process groups (RankGroups): it reads "+PGID" and
# "-PGID" lines from the launcher and, once its stdin ends (the launcher
# exited or died: nobody else holds the pipe's write end, which is
# close-on-exec), SIGKILLs every group still listed. The ranks themselves die
# by PR_SET_PDEATHSIG; this takes what they started along.
_GUARD = ("import os, signal, sys\n"
          "groups = set()\n"
          "for line in sys.stdin:\n"
          "    if line[:1] in ('+', '-') and line[1:].strip().isdigit():\n"
          "        (groups.add if line[0] == '+' else groups.discard)(int(line[1:]))\n"
          "for pgid in groups:\n"
          "    try:\n"
          "        os.killpg(pgid, signal.SIGKILL)\n"
          "    except OSError:\n"
          "        pass\n")


class RankGroups:
    """The process groups of this host's live ranks, mirrored to a guard
    process that kills them all when the launcher dies (the ranks' parent-death
    signal reaches only the ranks, not what they started). The guard starts
    with the first group and ends at close(). Thread-safe: reaper threads
    remove groups while the launcher adds them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._guard = None

    @property
    def guard_pid(self):
        """The guard's pid (None: not running)."""
        with self._lock:
            return self._guard.pid if self._guard is not None else None

    def add(self, pgid):
        with self._lock:
            if self._guard is None:
                try:
                    self._guard = subprocess.Popen(
                        [sys.executable, "-S", "-c", _GUARD], stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL, start_new_session=True)
                except OSError as e:
                    raise LaunchError(f"cannot start the ranks' process-group guard: "
                                      f"{e.strerror}") from None
            self._send(f"+{pgid}\n")

    def discard(self, pgid):
        with self._lock:
            if self._guard is not None:
                self._send(f"-{pgid}\n")

    def _send(self, line):
        try:
            self._guard.stdin.write(line.encode())
            self._guard.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the guard is gone (killed by someone): the ranks still die with us

    def close(self):
        """Ends the guard (it kills the groups still listed: none once every
        rank was reaped)."""
        with self._lock:
            guard, self._guard = self._guard, None
        if guard is not None:
            try:
                guard.stdin.close()
            except BrokenPipeError:
                pass
            guard.wait()


def _wait_exited(pid):
    """Waits until process `pid` (a child) has ended, without reaping it: as a
    zombie it keeps its pid, so its process group's id stays its own."""
    if not hasattr(os, "waitid"):
        return
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass


def describe_status(code):
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
        self.reaped = {}    # rank -> threading.Event: set once its process (group) ended
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

    def signal(self, sig):
        """Sends `sig` to the process group of every rank not reaped yet."""
        for rank in self.running():
            try:
                os.killpg(self.procs[rank].pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, rank, timeout=None):
        """Waits until `rank` is reaped (its group killed first); True when it is."""
        return self.reaped[rank].wait(timeout)


class Starter:
    """Starts this host's ranks of a world: one process per rank of the
    layout on `host`, each with torchrun's and reshard's environment (`job_env`:
    rank_environment's arguments that are the same for every rank of the job:
    coordinator, job_id, worker_token, worker_socket, tls_ca). A thread per
    rank waits for it, kills what it left in its process group, and calls
    on_exit(world, rank, returncode). close() ends the groups' guard."""

    def __init__(self, host, command, job_env, addresses, port_range, on_exit, log, event,
                 log_dir=None):
        self.host, self.command, self.job_env = host, list(command), dict(job_env)
        self.addresses, self.port_range = addresses, port_range
        self.on_exit, self._log, self._event = on_exit, log, event
        self.log_dir = log_dir
        self.groups = RankGroups()

    def close(self):
        self.groups.close()

    def start(self, name, lay, generation, operation_id, epoch):
        """The World `name` of layout `lay` (generation to load, the stop-free
        operation it warms up for or "", its layout epoch), its ranks on
        this host started. LaunchError when the command cannot start."""
        world = World(name, lay, generation, operation_id, epoch)
        mine = _layout.ranks_on_host(lay, self.host)
        if not mine:
            self._event("world", world=name, ranks=[], generation=generation,
                        operation_id=operation_id)
            return world
        world_size = len(_layout.slots(lay))
        addr = master_addr(lay, self.host, self.addresses)
        port = rendezvous_port(epoch, self.port_range)
        layout_json = json.dumps(to_dict(lay), sort_keys=True)
        for local, (rank, device) in enumerate(mine):
            env = rank_environment(
                os.environ, rank=rank, world_size=world_size, local_rank=local,
                local_world_size=len(mine), master_addr=addr, master_port=port,
                generation=generation, layout_json=layout_json, device=device,
                operation_id=operation_id, **self.job_env)
            world.procs[rank] = self._spawn(name, rank, env)
            world.reaped[rank] = threading.Event()
            threading.Thread(target=self._reap, args=(world, rank, world.procs[rank]),
                             daemon=True, name=f"reap-{name}-{rank}").start()
        self._log(f"started {name}: ranks {[r for r, _ in mine]} of {world_size} "
                  f"(generation {generation}{', operation ' + operation_id if operation_id else ''}"
                  f", MASTER_ADDR {addr} MASTER_PORT {port})")
        self._event("world", world=name, ranks=[r for r, _ in mine], generation=generation,
                    operation_id=operation_id, master_addr=addr, master_port=port,
                    pids={str(r): p.pid for r, p in world.procs.items()})
        return world

    def _spawn(self, name, rank, env):
        """The rank's process, leader of a new session (process group) that
        the guard lists before the rank's command runs."""
        out = None
        if self.log_dir:
            log = os.path.join(self.log_dir, f"{name}-rank{rank}.log")
            try:
                os.makedirs(self.log_dir, exist_ok=True)
                out = open(log, "ab")
            except OSError as e:
                raise LaunchError(f"--log-dir: cannot write \"{log}\": {e.strerror}") from None
        linux = sys.platform.startswith("linux")
        go_r, go_w = os.pipe() if linux else (None, None)
        try:
            argv = ([sys.executable, "-S", "-c", _SHIM, str(os.getpid()), str(go_r)] +
                    self.command if linux else self.command)
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT if out else None,
                                    start_new_session=True, pass_fds=(go_r,) if linux else ())
        except OSError as e:
            if linux:
                os.close(go_w)
            raise LaunchError(f"rank {rank}: cannot start {self.command[0]!r}: "
                              f"{e.strerror}") from None
        finally:
            if out is not None:
                out.close()
            if linux:
                os.close(go_r)
        if not linux:
            self.groups.add(proc.pid)
            return proc
        try:
            self.groups.add(proc.pid)
            os.write(go_w, b"1")
        except LaunchError:
            proc.wait()  # no go: the shim exits 137 without running the command
            raise
        finally:
            os.close(go_w)
        return proc

    def _reap(self, world, rank, proc):
        _wait_exited(proc.pid)
        # Whatever the rank started and left running (a data loader worker,
        # a sleeping grandchild) is in its group: end it with the rank.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.groups.discard(proc.pid)
        proc.wait()
        world.reaped[rank].set()
        self.on_exit(world, rank, proc.returncode)


def stop_worlds(worlds, sig, why, grace, event):
    """Signals every live rank of `worlds`, waits up to `grace` seconds, then
    SIGKILLs the ones left and waits for them."""
    for w in worlds:
        if w.running():
            event("terminate", world=w.name, ranks=w.running(), why=why)
            w.signal(sig)
    # Each rank is reaped by its own thread (Starter._reap), which kills its
    # group first: wait for that, never reap here.
    end = time.monotonic() + grace
    for w in worlds:
        for r in w.running():
            w.wait(r, max(0.0, end - time.monotonic()))
    for w in worlds:
        if w.running():
            event("kill", world=w.name, ranks=w.running())
            w.signal(signal.SIGKILL)
            for r in w.running():
                w.wait(r)
