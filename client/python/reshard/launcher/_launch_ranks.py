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

Warm rank processes (--spares): when the rank's command is `python
script.py ...` or `python -m module ...`, the Starter keeps a pool of rank
hosts (reshard.launcher._rank_host: an interpreter with torch and reshard
imported, waiting for a rank) and runs each rank in one of them instead of a
fresh interpreter; a rank that ends with status 0 or EXIT_PEER_LOST hands
its process back to the pool, so the next layout's rank on this host starts
in it. The pool keeps --spares idle processes (more are ended at once); a
rank host that cannot take a rank leaves it to a cold start.
"""

import json
import os
import queue
import re
import shutil
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


# A rank host (reshard.launcher._rank_host) started with the rank's own
# python: argv STATUS_FD ASSIGN_FD and the directory of the launcher's reshard
# package, used only when that python cannot import reshard by itself.
_BOOT = ("import sys\n"
         "try:\n"
         "    import reshard.launcher._rank_host as h\n"
         "except ImportError:\n"
         "    sys.path.append(sys.argv[3])\n"
         "    import reshard.launcher._rank_host as h\n"
         "h.main(int(sys.argv[1]), int(sys.argv[2]))\n")


def hosted_command(command):
    """What a rank host runs of `command`: ("path", script, args) for `PYTHON
    script args...`, ("module", name, args) for `PYTHON -m name args...`
    (PYTHON: python, python3, python3.12, ... or this interpreter); None
    for anything else (interpreter options, a shell script: a cold start)."""
    if len(command) < 2 or shutil.which(command[0]) is None:
        return None
    exe = os.path.basename(command[0])
    if not (re.fullmatch(r"python[0-9.]*", exe) or
            os.path.realpath(shutil.which(command[0])) == os.path.realpath(sys.executable)):
        return None
    if command[1] == "-m" and len(command) > 2:
        return ("module", command[2], list(command[3:]))
    if command[1].startswith("-"):
        return None
    return ("path", command[1], list(command[2:]))


QUIET_S = 10.0  # no new rank host for this long after a world starts (its ranks go first)


class _SpawnThread:
    """Runs every process start of the launcher on one thread that lives as
    long as the launcher. The exec shim's PR_SET_PDEATHSIG fires when the
    *thread* that started the process ends (Linux), not the process: a rank
    or rank host started from a short-lived thread (a timer, the status
    reader of a rank host that then ended) was SIGKILLed when that thread
    ended, a live rank killed under its launcher."""

    def __init__(self):
        self._requests = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="reshard-spawn")
        self._thread.start()

    def call(self, fn):
        """fn() on the spawn thread; its value, or its exception raised here."""
        if threading.current_thread() is self._thread:
            return fn()
        box, done = {}, threading.Event()
        self._requests.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _run(self):
        while True:
            fn, box, done = self._requests.get()
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001: raised in the caller's thread
                box["error"] = e
            finally:
                done.set()


class HostedRank:
    """A rank that runs in a rank host: like a Popen, its pid (the rank
    host's, a process group leader) and its returncode (None while it
    runs); `warm`: the process had torch imported when it got the rank;
    `served`: how many ranks it ran before."""

    def __init__(self, pid, warm, served):
        self.pid, self.warm, self.served = pid, warm, served
        self.returncode = None


class _Spare:
    """A rank host of the pool: its Popen, the write end of its assignment
    pipe, its status pipe (a file), whether it said ready, the device of the
    last rank it ran, the (world, rank, HostedRank) it runs now."""

    def __init__(self, proc, assign_w, status_r):
        self.proc, self.pid, self.assign_w, self.status_r = proc, proc.pid, assign_w, status_r
        self.ready, self.served, self.device, self.busy = False, 0, None, None
        self.last_used = 0.0
        self.ended = False


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
    on_exit(world, rank, returncode). close() ends the groups' guard.

    `spares`: 0 starts every rank cold (a fresh `command`); N > 0 (None:
    as many as this host had ranks in one layout so far, at least 1) runs
    the ranks in warm rank hosts and keeps N idle ones ready (see the
    module doc), when the command is a python script or module."""

    def __init__(self, host, command, job_env, addresses, port_range, on_exit, log, event,
                 log_dir=None, spares=0):
        self.host, self.command, self.job_env = host, list(command), dict(job_env)
        self.addresses, self.port_range = addresses, port_range
        self.on_exit, self._log, self._event = on_exit, log, event
        self.log_dir = log_dir
        self.groups = RankGroups()
        self._spawner = _SpawnThread()
        self.hosted = hosted_command(self.command) if spares != 0 else None
        if spares and self.hosted is None:  # asked for explicitly
            self._log(f"{self.command[0]!r} is not `python script.py ...` or `python -m module "
                      f"...`: every rank starts cold")
        self.spares = spares
        self._most = 0           # the most ranks of one layout on this host so far
        self._pool = []          # live rank hosts (_Spare), idle or busy
        self._pool_lock = threading.Lock()
        self._changed = threading.Condition(self._pool_lock)  # a rank host got ready or idle
        self._closed = False
        self._held = False       # hold_spares(): no new rank host until release_spares()
        self._quiet_until = 0.0  # nor before this (time.monotonic()): a world just started

    def close(self):
        with self._pool_lock:
            self._closed = True
            pool = list(self._pool)
        for spare in pool:
            self._kill(spare)
        for spare in pool:
            spare.proc.wait()
        self.groups.close()

    # ------------------------------------------------------------ the pool

    def _target(self):
        """How many idle rank hosts the pool keeps."""
        return self.spares if self.spares is not None else max(self._most, 1)

    def _kill(self, spare):
        try:
            os.killpg(spare.pid, signal.SIGKILL)
        except OSError:
            pass

    def _spawn_spare(self):
        """A new rank host in the pool (not ready yet); None when it cannot
        start (the ranks then start cold)."""
        import reshard
        root = os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))
        status_r, status_w = os.pipe()
        assign_r, assign_w = os.pipe()
        argv = [self.command[0], "-c", _BOOT, str(status_w), str(assign_r), root]
        mode, target, _ = self.hosted
        env = dict(os.environ, RESHARD_RANK_HOST="1", RESHARD_RANK_HOST_SCRIPT=json.dumps(
            {"mode": mode, "target": target, "cwd": os.getcwd()}))
        try:
            proc = self._spawn_argv(argv, env, os.path.join(self.log_dir, "spares.log")
                                    if self.log_dir else None, (status_w, assign_r), "a rank host")
        except LaunchError as e:
            for fd in (status_r, status_w, assign_r, assign_w):
                os.close(fd)
            self._log(f"{e}: ranks start cold")
            return None
        os.close(status_w)
        os.close(assign_r)
        spare = _Spare(proc, assign_w, os.fdopen(status_r, "r"))
        self._pool.append(spare)
        self._event("spare", pid=proc.pid)
        threading.Thread(target=self._serve, args=(spare,), daemon=True,
                         name=f"rank-host-{proc.pid}").start()
        return spare

    def _refill(self):
        """Starts the rank hosts missing to the target of idle ones once
        none is starting (the ranks just started import first: each import
        of torch takes the cores); ends idle ones beyond the target, the
        least useful first. Holds the pool lock."""
        if self._closed or self.hosted is None:
            return
        idle = sorted((s for s in self._pool if s.busy is None and not s.ended),
                      key=self._preference(None))
        for spare in idle[self._target():]:
            spare.ended = True
            self._event("spare_end", pid=spare.pid, why="more idle rank hosts than --spares")
            self._kill(spare)
        if self._held or time.monotonic() < self._quiet_until:
            return
        if all(s.ready for s in self._pool if not s.ended):
            for _ in range(self._target() - len(idle)):
                self._spawn_spare()

    def hold_spares(self):
        """No new rank host until release_spares(): a reconfiguration is
        under way (the ranks it needs are started; the processes of the
        ranks it retires come back to the pool), importing torch now would
        only slow it down."""
        with self._pool_lock:
            self._held = True

    def release_spares(self, after=QUIET_S):
        """New rank hosts may start again, `after` seconds from now (the new
        layout's first steps go first)."""
        with self._pool_lock:
            self._held = False
            self._quiet(after)

    def _quiet(self, seconds):
        """No new rank host for `seconds`; the pool is refilled then. Holds the
        pool lock."""
        self._quiet_until = max(self._quiet_until, time.monotonic() + seconds)
        timer = threading.Timer(seconds + 0.05, self._refill_now)
        timer.daemon = True
        timer.start()

    def _refill_now(self):
        with self._pool_lock:
            self._refill()

    @staticmethod
    def _preference(device):
        """Sort key, best first: ready, ran this device, ran a rank (its
        process holds the user's modules), most recently used."""
        return lambda s: (not s.ready, device is None or s.device != device, s.served == 0,
                          -s.last_used)

    def _take(self, device, returning, deadline):
        """The best idle rank host for a rank on `device`; while none is
        ready and a rank of the `returning` world (ending by itself) still
        runs in a rank host, until `deadline`, waits for one of them to
        come back; else a warming one, else a new one. None when none can
        start. Holds the pool lock."""
        while True:
            idle = [s for s in self._pool if s.busy is None and not s.ended]
            if any(s.ready for s in idle) or returning is None:
                break
            coming = [s for s in self._pool if s.busy is not None and s.busy[0] is returning]
            left = deadline - time.monotonic()
            if not coming or left <= 0:
                break
            self._changed.wait(left)
        if idle:
            return min(idle, key=self._preference(device))
        return self._spawn_spare()

    def _assign(self, world, name, rank, env, device, returning=None, deadline=0.0):
        """Runs `rank` of `world` in a rank host; None when none takes it."""
        with self._pool_lock:
            for _ in range(3):
                spare = self._take(device, returning, deadline)
                if spare is None:
                    return None
                handle = HostedRank(spare.pid, spare.ready, spare.served)
                log = os.path.join(self.log_dir, f"{name}-rank{rank}.log") if self.log_dir \
                    else None
                mode, target, args = self.hosted
                job = {"env": env, "mode": mode, "target": target, "args": args,
                       "cwd": os.getcwd(), "log": log}
                try:
                    os.write(spare.assign_w, (json.dumps(job) + "\n").encode())
                except OSError:
                    spare.ended = True  # it died meanwhile: its thread removes it
                    continue
                spare.busy, spare.device = (world, rank, handle), device
                self._event("assign", world=name, rank=rank, pid=spare.pid, warm=spare.ready,
                            served=spare.served)
                return handle
        return None

    def _serve(self, spare):
        """Follows a rank host's status pipe: "ready", "done STATUS" (its
        rank ended, the process is idle again), its end (the process ended:
        reaped like a cold rank)."""
        for line in spare.status_r:
            word, _, arg = line.strip().partition(" ")
            if word == "ready":
                try:
                    modules = json.loads(arg) if arg else []
                except ValueError:
                    modules = []
                with self._pool_lock:
                    spare.ready = True
                    self._event("spare_ready", pid=spare.pid, modules=modules)
                    self._refill()
                    self._changed.notify_all()
            elif word == "done" and arg.isdigit() and spare.busy is not None:
                with self._pool_lock:
                    world, rank, handle = spare.busy
                    spare.busy, spare.served = None, spare.served + 1
                    spare.last_used = time.monotonic()
                    handle.returncode = int(arg)
                    self._event("rank_host_idle", pid=spare.pid, world=world.name, rank=rank,
                                code=int(arg))
                    self._refill()
                    self._changed.notify_all()
                world.reaped[rank].set()
                self.on_exit(world, rank, int(arg))
        spare.status_r.close()
        self._end_group(spare.pid)
        spare.proc.wait()
        with self._pool_lock:
            os.close(spare.assign_w)
            unexpected = not spare.ended and not self._closed
            spare.ended = True
            self._pool.remove(spare)
            busy, spare.busy = spare.busy, None
            if busy is not None:
                busy[2].returncode = spare.proc.returncode
            elif not self._closed:
                self._event("spare_exit", pid=spare.pid, code=spare.proc.returncode)
            if unexpected and not spare.ready and busy is None and self.hosted is not None:
                # It could not even import: no more rank hosts (no restart
                # loop); every rank from now on starts cold.
                self.hosted = None
                self._log(f"rank host {spare.pid} ended ({describe_status(spare.proc.returncode)}) "
                          f"before it was ready: ranks start cold from now on")
                self._event("spares_off", pid=spare.pid, code=spare.proc.returncode)
            self._refill()
            self._changed.notify_all()
        if busy is not None:
            busy[0].reaped[busy[1]].set()
            self.on_exit(busy[0], busy[1], spare.proc.returncode)

    # --------------------------------------------------------------- ranks

    def start(self, name, lay, generation, operation_id, epoch, returning=None, wait=0.0):
        """The World `name` of layout `lay` (generation to load, the stop-free
        operation it warms up for or "", its layout epoch), its ranks on
        this host started. `returning`: a World whose ranks end by
        themselves now (stopped at a step boundary): a rank with no warm
        process idle waits up to `wait` seconds for one of theirs.
        LaunchError when the command cannot start."""
        world = World(name, lay, generation, operation_id, epoch)
        mine = _layout.ranks_on_host(lay, self.host)
        if not mine:
            self._event("world", world=name, ranks=[], generation=generation,
                        operation_id=operation_id)
            if self.hosted:
                with self._pool_lock:
                    self._refill()  # a spare for a layout that uses this host later
            return world
        self._most = max(self._most, len(mine))
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
            world.reaped[rank] = threading.Event()
            hosted = self._assign(world, name, rank, env, device, returning,
                                  time.monotonic() + wait) if self.hosted else None
            if hosted is not None:
                world.procs[rank] = hosted
                continue
            world.procs[rank] = self._spawn(name, rank, env)
            threading.Thread(target=self._reap, args=(world, rank, world.procs[rank]),
                             daemon=True, name=f"reap-{name}-{rank}").start()
        if self.hosted:
            with self._pool_lock:
                self._quiet(QUIET_S)
                self._refill()
        self._log(f"started {name}: ranks {[r for r, _ in mine]} of {world_size} "
                  f"(generation {generation}{', operation ' + operation_id if operation_id else ''}"
                  f", MASTER_ADDR {addr} MASTER_PORT {port})")
        self._event("world", world=name, ranks=[r for r, _ in mine], generation=generation,
                    operation_id=operation_id, master_addr=addr, master_port=port,
                    pids={str(r): p.pid for r, p in world.procs.items()},
                    warm={str(r): getattr(p, "warm", False) for r, p in world.procs.items()})
        return world

    def _spawn(self, name, rank, env):
        """The rank's process (cold), leader of a new session (process group)
        that the guard lists before the rank's command runs."""
        log = os.path.join(self.log_dir, f"{name}-rank{rank}.log") if self.log_dir else None
        return self._spawn_argv(self.command, env, log, (), f"rank {rank}")

    def _spawn_argv(self, command, env, log, fds, what):
        """`command` through the exec shim, leader of a new session that the
        guard lists before the command runs; `fds` are passed to it."""
        out = None
        if log:
            try:
                os.makedirs(self.log_dir, exist_ok=True)
                out = open(log, "ab")
            except OSError as e:
                raise LaunchError(f"--log-dir: cannot write \"{log}\": {e.strerror}") from None
        linux = sys.platform.startswith("linux")
        go_r, go_w = os.pipe() if linux else (None, None)
        try:
            argv = ([sys.executable, "-S", "-c", _SHIM, str(os.getpid()), str(go_r)] +
                    command if linux else command)
            proc = self._spawner.call(lambda: subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT if out else None, start_new_session=True,
                pass_fds=((go_r,) if linux else ()) + tuple(fds)))
        except OSError as e:
            if linux:
                os.close(go_w)
            raise LaunchError(f"{what}: cannot start {command[0]!r}: "
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

    def _end_group(self, pid):
        """Once process `pid` has exited: whatever it started and left
        running (a data loader worker, a sleeping grandchild) is in its
        process group; ends it with the process."""
        _wait_exited(pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        self.groups.discard(pid)

    def _reap(self, world, rank, proc):
        self._end_group(proc.pid)
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
