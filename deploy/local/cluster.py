#!/usr/bin/env python3
"""A throwaway reshard cluster on this machine.

LocalCluster starts a private PostgreSQL (initdb in a temporary directory, a
free loopback port), one reshard-coordinator and N reshard-agent processes,
each agent a "host" with its own shared-memory directory and worker socket,
all talking UCX over TCP on the loopback device. Everything it starts runs in
its own process group, dies with the Python process (PR_SET_PDEATHSIG), and is
stopped and removed by stop() (also on exit, SIGINT and SIGTERM).

By default every gRPC channel is mutual TLS: a throwaway CA (deploy/local/
pki.py, Debian's openssl) in the work directory issues the coordinator's
certificate, one `agent:<host>` certificate per agent and an `admin:local`
certificate for the clients (client_kwargs(), ctl_args(), ctl_env());
LocalCluster(tls=False) runs everything --insecure instead (plaintext, no
authentication), for suites that are not about security.

Used by the main job (deploy/local/main_job.py), the Python and reshardctl
test suites and the Prometheus test. As a program it starts a cluster and
waits until interrupted, printing how to reach it, among that one line to
paste into another shell (`export RESHARD_COORDINATOR=... RESHARD_TLS_CA=...
RESHARD_TLS_CERT=... RESHARD_TLS_KEY=... RESHARD_LOCAL_CLUSTER=WORK_DIR`;
reshardctl and reshard.Client.from_env() read it); --insecure runs it in
plaintext. It imports the reshard package staged under --build itself:

    .venv/bin/python deploy/local/cluster.py --build build --hosts 4 [--insecure]

A host of a running cluster fails on demand (kill_host, stop_host,
continue_host, restart_host: its agent and the processes that use its
worker socket, such as a `reshard run` launcher and its ranks), from Python
or from another shell through the cluster's control socket:

    .venv/bin/python deploy/local/cluster.py kill-host host-1     [--work DIR]
    .venv/bin/python deploy/local/cluster.py stop-host host-1     (SIGSTOP)
    .venv/bin/python deploy/local/cluster.py continue-host host-1 (SIGCONT)
    .venv/bin/python deploy/local/cluster.py restart-host host-1  [--empty]
"""

import argparse
import atexit
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pki import Pki  # noqa: E402


# reshard-coordinator's defaults for --lease-ms and --tick-ms.
DEFAULT_LEASE_MS = 10000
DEFAULT_TICK_MS = 200


class ClusterError(RuntimeError):
    """A part of the local cluster could not be started."""


def free_port():
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bindir():
    explicit = os.environ.get("RESHARD_PG_BINDIR")
    candidates = [explicit] if explicit else []
    root = "/usr/lib/postgresql"
    if os.path.isdir(root):
        versions = sorted(os.listdir(root), key=lambda v: [int(x) for x in v.split(".") if x.isdigit()])
        candidates += [os.path.join(root, v, "bin") for v in reversed(versions)]
    for d in candidates:
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "postgres"), os.X_OK):
            return d
    raise ClusterError("no PostgreSQL server binaries (initdb, postgres) found: install the Debian "
                       "package postgresql or set RESHARD_PG_BINDIR")


def child_argv(argv, uid=None, gid=None):
    """`argv` run through util-linux's setpriv: SIGKILL when the Python thread
    that starts it dies (PR_SET_PDEATHSIG, set after any change of user, which
    would clear it), and `gid` and `uid` with no supplementary groups when
    given.

    Not a preexec_fn: that makes subprocess fork() this process, whose gRPC
    threads run, and run Python in the child; gRPC's fork handlers may then
    start a poller thread in the child that the child's close_fds pulls the
    epoll descriptor from, and the child aborts before its exec ("Epoll1Poller
    ... epoll_wait error: Bad file descriptor", status -6). Without one,
    subprocess uses vfork + exec and no Python runs in the child.
    """
    if shutil.which("setpriv") is None:
        raise ClusterError("setpriv not found: install Debian's util-linux (scripts/bootstrap.sh)")
    prefix = ["setpriv", "--pdeathsig", "KILL"]
    if gid is not None:
        prefix += ["--regid", str(gid), "--clear-groups"]
    if uid is not None:
        prefix += ["--reuid", str(uid)]
    return prefix + ["--", *argv]


class _Process:
    """A child in its own process group whose output goes to a log file; it can
    wait for a line that starts with a given prefix."""

    def __init__(self, name, argv, log_path, env=None, uid=None, gid=None, cwd=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._lines = []
        self._cv = threading.Condition()
        self._closed = False
        self._log = open(log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(child_argv(argv, uid, gid), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     cwd=cwd, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self):
        return self.proc.pid

    def _read(self):
        for raw in self.proc.stdout:
            self._log.write(raw)
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cv:
                self._lines.append(line)
                if len(self._lines) > 2000:
                    del self._lines[:1000]
                self._cv.notify_all()
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def wait_for_line(self, prefix, timeout):
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cv:
            while True:
                for line in self._lines[seen:]:
                    if line.startswith(prefix):
                        return line
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    break
                self._cv.wait(left)
        status = self.proc.poll()
        why = f"exited with status {status}" if status is not None else f"no '{prefix}' within {timeout} s"
        raise ClusterError(f"{self.name} {why}; last output:\n{self.tail()}")

    def find_line(self, text):
        """The first line so far that contains `text`, or None."""
        with self._cv:
            return next((line for line in self._lines if text in line), None)

    def tail(self, lines=20):
        with self._cv:
            return "\n".join(self._lines[-lines:])

    def alive(self):
        return self.proc.poll() is None

    def send_signal(self, sig):
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        self.send_signal(sig)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            self.send_signal(signal.SIGCONT)  # a stopped process handles `sig` only once continued
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=2)
        self._log.close()


def _group_id(group):
    """The gid of a group name or number."""
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    import grp
    return grp.getgrnam(group).gr_gid


class Agent:
    """One reshard-agent: a host of the local cluster."""

    def __init__(self, host_id, worker_socket, shm_dir, metrics):
        self.host_id = host_id
        self.worker_socket = worker_socket
        self.shm_dir = shm_dir
        # "127.0.0.1:PORT" or None; "127.0.0.1:0" until the first start,
        # which takes the port the kernel picked from the agent's log.
        self.metrics = metrics
        self.process = None

    @property
    def pid(self):
        return self.process.pid if self.process else None

    def alive(self):
        return self.process is not None and self.process.alive()


class LocalCluster:
    """PostgreSQL + reshard-coordinator + `hosts` reshard-agents on this machine.

    Use as a context manager, or call start() and stop(). Attributes once
    started: coordinator ("127.0.0.1:PORT"), coordinator_metrics, dsn,
    host_ids, agents (host id -> Agent), reshardctl (path), work_dir, tls,
    pki (the CA, when tls).
    """

    ADMIN = "admin:local"

    def __init__(self, build_dir, hosts=4, devices_per_host=2, work_dir=None, agent_metrics=True,
                 memory_limit_bytes=4 << 30, spare_bytes=0, keep_dropped_ms=0, lease_ms=None, tick_ms=None, log=None,
                 tls=True, coordinator_host="127.0.0.1", worker_group=None, heartbeat_ms=None,
                 coordinator_args=(), agent_device=None):
        self.build_dir = os.path.abspath(build_dir)
        # reshard-agent --device: one spec for every agent ("fake:2", "cuda",
        # "none") or {host_id: spec}; None: the agents' default
        # ($RESHARD_DEVICE, else CUDA when it sees a device).
        self.agent_device = agent_device
        # Extra reshard-coordinator flags (e.g. ["--store-statement-timeout-ms",
        # "1000"]), after the cluster's own; kept across restarts.
        self.coordinator_args = list(coordinator_args)
        # reshard-agent --worker-group (a name or gid): its members, not only
        # root, may use the worker sockets and shard files; the cluster's
        # directories then let that group reach them (docs/security.md).
        self.worker_group = worker_group
        self.tls = tls
        self.pki = None
        # The address the coordinator listens on (and its certificate names).
        self.coordinator_host = coordinator_host
        self.hosts = hosts
        self.devices_per_host = devices_per_host
        self.agent_metrics = agent_metrics
        self.memory_limit_bytes = memory_limit_bytes
        # Pre-zeroed shared memory each agent keeps ready (reshard-agent
        # --spare-bytes); off by default so that test clusters stay small;
        # None: the agent's own default (as deployed). Likewise how long a
        # dropped buffer's pages are kept for the next (--keep-dropped-ms).
        self.spare_bytes = spare_bytes
        self.keep_dropped_ms = keep_dropped_ms
        # The coordinator's own defaults (a 10 s lease, 200 ms ticks), as
        # deployed, unless the caller or the environment says otherwise: the
        # test suites set RESHARD_LOCAL_LEASE_MS / RESHARD_LOCAL_TICK_MS (3 s,
        # 100 ms) so that a host they kill is found fast.
        lease_ms = lease_ms or int(os.environ.get("RESHARD_LOCAL_LEASE_MS") or DEFAULT_LEASE_MS)
        tick_ms = tick_ms or int(os.environ.get("RESHARD_LOCAL_TICK_MS") or DEFAULT_TICK_MS)
        self.lease_ms = lease_ms
        # How often an agent heartbeats, which is also how soon it picks up a
        # new task (default: a third of the lease). A training job that
        # reconfigures while it trains wants it short (deploy/local/training).
        self.heartbeat_ms = heartbeat_ms or max(100, lease_ms // 3)
        self.tick_ms = tick_ms
        self._log = log or (lambda msg: None)
        self._requested_work_dir = work_dir
        self.work_dir = None
        self.coordinator = None
        self.coordinator_metrics = None
        self.dsn = None
        self.host_ids = [f"host-{i}" for i in range(hosts)]
        self.agents = {}
        self._pg = None
        self._pg_dir = None
        self._pg_uid = self._pg_gid = None
        self._coordinator_proc = None
        self._stopped = False
        self._lock = threading.Lock()
        self.coordinator_bin = self._binary("services/coordinator/server/reshard-coordinator")
        self.agent_bin = self._binary("agent/process/reshard-agent")
        self.reshardctl = os.path.join(self.build_dir, "client/cli/reshardctl")

    def _binary(self, rel):
        path = os.path.join(self.build_dir, rel)
        if not os.access(path, os.X_OK):
            raise ClusterError(f"{path} not found: build first (scripts/build.sh)")
        return path

    # ----------------------------------------------------------------- start
    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        atexit.register(self.stop)
        try:
            base = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.work_dir = self._requested_work_dir or tempfile.mkdtemp(prefix="reshard-local-", dir=base)
            os.makedirs(self.work_dir, exist_ok=True)
            if self.worker_group is not None:
                os.chmod(self.work_dir, 0o711)  # others may pass, not list
            if self.tls:
                self.pki = Pki(os.path.join(self.work_dir, "tls"))
            self._start_postgres()
            self._start_coordinator()
            for host in self.host_ids:
                self.agents[host] = Agent(
                    host, os.path.join(self.work_dir, host, "worker.sock"),
                    os.path.join(self.work_dir, host, "shm"),
                    "127.0.0.1:0" if self.agent_metrics else None)
                self.start_agent(host)
            self._wait_hosts_registered(60)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_hosts_registered(self, timeout):
        """Waits until the coordinator lists every host: an agent says it is
        ready before its registration is recorded, and callers of start()
        expect a cluster whose hosts the coordinator knows."""
        deadline = time.monotonic() + timeout
        with self.client(timeout=10.0) as c:
            while True:
                listed = {h.host_id for h in c.list_hosts()}
                if set(self.host_ids) <= listed:
                    return
                if time.monotonic() > deadline:
                    raise ClusterError(f"hosts {sorted(set(self.host_ids) - listed)} not registered "
                                       f"within {timeout} s")
                time.sleep(0.05)

    def _start_postgres(self):
        bindir = _pg_bindir()
        uid = gid = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise ClusterError("running as root but there is no `postgres` user to run PostgreSQL as")
            uid, gid = pw.pw_uid, pw.pw_gid
        self._pg_uid, self._pg_gid = uid, gid
        self._pg_dir = tempfile.mkdtemp(prefix="reshard-local-pg-")
        if uid is not None:
            os.chown(self._pg_dir, uid, gid)
        data = os.path.join(self._pg_dir, "data")
        self._log(f"cluster: initdb {data}")
        init = subprocess.run(
            child_argv([os.path.join(bindir, "initdb"), "-D", data, "-U", "reshard", "--auth=trust",
                        "--no-sync", "-E", "UTF8", "--locale=C", "--no-instructions"], uid, gid),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self._pg_dir)
        if init.returncode != 0:
            raise ClusterError(f"initdb failed:\n{init.stdout.decode(errors='replace')}")
        last = ""
        for _ in range(5):  # another process may take the port between probe and bind
            port = free_port()
            self._pg = self._spawn_postgres(port)
            try:
                self._pg.wait_for_line("", 0.1)  # any output at all
            except ClusterError:
                pass
            if self._wait_postgres(port):
                self.dsn = f"host=127.0.0.1 port={port} user=reshard dbname=postgres"
                self._log(f"cluster: postgresql on 127.0.0.1:{port}")
                return
            last = self._pg.tail()
            self._pg.stop(signal.SIGKILL)
            self._pg = None
        raise ClusterError(f"postgres did not start:\n{last}")

    def _spawn_postgres(self, port):
        data = os.path.join(self._pg_dir, "data")
        return _Process(
            "postgres",
            [os.path.join(_pg_bindir(), "postgres"), "-D", data, "-p", str(port), "-k", self._pg_dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
             "-c", "max_connections=200", "-c", "shared_buffers=32MB"],
            os.path.join(self._pg_dir, "postgres.log"), uid=self._pg_uid, gid=self._pg_gid,
            cwd=self._pg_dir)

    def _wait_postgres(self, port, timeout=30.0):
        pg_isready = os.path.join(_pg_bindir(), "pg_isready")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._pg.alive():
                return False
            r = subprocess.run([pg_isready, "-q", "-h", "127.0.0.1", "-p", str(port)])
            if r.returncode == 0:
                return True
            time.sleep(0.1)
        return False

    def _start_coordinator(self, listen=None, metrics_listen="127.0.0.1:0", timeout=60.0):
        listen = listen or f"{self.coordinator_host}:0"
        argv = [self.coordinator_bin, "serve", "--dsn", self.dsn, "--listen", listen,
                "--metrics-listen", metrics_listen, "--lease-ms", str(self.lease_ms), "--tick-ms",
                str(self.tick_ms), "--leader-retry-ms", "200", "--replica-id", "local-0"]
        argv += (self.pki.coordinator_flags("coordinator", ips=[self.coordinator_host])
                 if self.tls else ["--insecure"])
        argv += self.coordinator_args
        self._coordinator_proc = _Process("reshard-coordinator", argv,
                                          os.path.join(self.work_dir, "coordinator.log"))
        line = self._coordinator_proc.wait_for_line("reshard-coordinator listening on ", timeout)
        # "reshard-coordinator listening on H:P metrics on H:M replica ID"
        words = line.split()
        self.coordinator = words[3]
        self.coordinator_metrics = words[6]
        self._log(f"cluster: reshard-coordinator on {self.coordinator} (metrics {self.coordinator_metrics})")

    # ------------------------------------------------------------- clients
    def client_kwargs(self, identity=ADMIN):
        """Keyword arguments of reshard.Client for `identity` (a certificate
        common name; None: TLS without a client certificate)."""
        if not self.tls:
            return {"insecure": True}
        import reshard
        if identity is None:
            return {"credentials": reshard.tls_credentials(self.pki.ca)}
        cert, key = self.pki.issue(identity)
        return {"credentials": reshard.tls_credentials(self.pki.ca, cert, key)}

    def client(self, identity=ADMIN, **kwargs):
        """A reshard.Client of this cluster's coordinator as `identity`."""
        import reshard
        return reshard.Client(self.coordinator, **self.client_kwargs(identity), **kwargs)

    def worker_token(self, job_id):
        """The worker token of `job_id` (fetched as the admin, then cached):
        what the job's workers present to their agent (docs/security.md)."""
        tokens = self.__dict__.setdefault("_worker_tokens", {})
        if job_id not in tokens:
            with self.client() as c:
                tokens[job_id] = c.worker_token(job_id)
        return tokens[job_id]

    def worker(self, host_id, job_id, **kwargs):
        """A reshard.Worker of `job_id` on `host_id`'s agent, with the job's
        worker token."""
        import reshard
        kwargs.setdefault("worker_token", self.worker_token(job_id))
        return reshard.Worker(self.agents[host_id].worker_socket, job_id, **kwargs)

    def ctl_args(self, identity=ADMIN):
        """reshardctl's global flags for `identity`."""
        if not self.tls:
            return ["--insecure"]
        cert, key = self.pki.issue(identity)
        return ["--tls-ca", self.pki.ca, "--tls-cert", cert, "--tls-key", key]

    def ctl_env(self, identity=ADMIN):
        """reshardctl's RESHARD_TLS_* variables (or RESHARD_INSECURE) for `identity`."""
        return self.pki.env(identity) if self.tls else {"RESHARD_INSECURE": "1"}

    # ------------------------------------------------------ fault injection
    # For tests that cause faults for real (tests/fault): kill, stop and
    # restart the coordinator, an agent or PostgreSQL, keeping their
    # addresses, so that the rest of the cluster finds them again.

    @property
    def coordinator_pid(self):
        return self._coordinator_proc.pid if self._coordinator_proc else None

    def coordinator_alive(self):
        return self._coordinator_proc is not None and self._coordinator_proc.alive()

    def kill_coordinator(self, sig=signal.SIGKILL):
        """Stops the coordinator with `sig` (default SIGKILL: no cleanup at
        all) and reaps it. Its address stays in `coordinator`."""
        if self._coordinator_proc:
            self._coordinator_proc.stop(sig)
        self._log(f"cluster: reshard-coordinator stopped ({signal.Signals(sig).name})")

    def start_coordinator(self, timeout=60.0):
        """Starts the coordinator again on the port (and metrics port) it had
        before, so that agents and clients reconnect to the same address.
        Retries the bind for `timeout` seconds (the old sockets may linger)."""
        if self.coordinator_alive():
            raise ClusterError("reshard-coordinator is still running")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._start_coordinator(self.coordinator, self.coordinator_metrics,
                                        timeout=max(1.0, deadline - time.monotonic()))
                return self.coordinator
            except ClusterError:
                if self._coordinator_proc.alive() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)  # the port is still taken: try the bind again

    def restart_coordinator(self, sig=signal.SIGKILL, timeout=60.0):
        """kill_coordinator(sig), then start_coordinator() on the same port."""
        self.kill_coordinator(sig)
        return self.start_coordinator(timeout)

    def signal_agent(self, host_id, sig):
        """Sends `sig` to the agent of `host_id` (SIGSTOP and SIGCONT freeze
        and thaw it; a stopped agent misses its heartbeats)."""
        self.agents[host_id].process.send_signal(sig)
        self._log(f"cluster: reshard-agent {host_id} sent {signal.Signals(sig).name}")

    def stop_agent(self, host_id):
        """SIGSTOP: the agent is frozen, its sockets stay open."""
        self.signal_agent(host_id, signal.SIGSTOP)

    def continue_agent(self, host_id):
        """SIGCONT after stop_agent."""
        self.signal_agent(host_id, signal.SIGCONT)

    def restart_agent(self, host_id, keep_shm=True, sig=signal.SIGKILL):
        """Kills the agent of `host_id` with `sig` and starts it again with
        the same host id, worker socket, metrics port and shm_dir. With
        keep_shm=False its shared-memory files are deleted in between (the
        host came back empty)."""
        agent = self.agents[host_id]
        if agent.process:
            agent.process.stop(sig)
        if not keep_shm:
            shutil.rmtree(agent.shm_dir, ignore_errors=True)
        self._log(f"cluster: reshard-agent {host_id} killed ({signal.Signals(sig).name}), "
                  f"{'shm kept' if keep_shm else 'shm removed'}; restarting")
        deadline = time.monotonic() + 60.0
        while True:
            try:
                return self.start_agent(host_id)
            except ClusterError:
                # The metrics port of the killed agent may not be free yet.
                if agent.process.alive() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def shm_files(self, host_id):
        """{file name: size in bytes} of everything in the agent's shm_dir."""
        out = {}
        d = self.agents[host_id].shm_dir
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return out
        for name in names:
            try:
                out[name] = os.stat(os.path.join(d, name)).st_size
            except FileNotFoundError:
                pass
        return out

    def metrics_of(self, host_id, timeout=5.0):
        """The agent's Prometheus metrics as {"name{labels}": value}."""
        return scrape_metrics(self.agents[host_id].metrics, timeout)

    def processes(self):
        """{name: pid} of every process the cluster runs now (PostgreSQL's
        postmaster, the coordinator, each agent), live ones only."""
        out = {}
        if self._pg and self._pg.alive():
            out["postgres"] = self._pg.pid
        if self.coordinator_alive():
            out["reshard-coordinator"] = self._coordinator_proc.pid
        for host, agent in self.agents.items():
            if agent.alive():
                out[f"reshard-agent {host}"] = agent.pid
        return out

    def process_tree(self):
        """{pid: command name} of every live process the cluster runs and their
        descendants (PostgreSQL's backends included): what a process-leak
        check compares before and after."""
        parent = {}
        comm = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            # pid (comm) state ppid ...
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z":
                continue
            comm[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parent[int(entry)] = int(fields[1])
        out = {}
        for pid in comm:
            p = pid
            roots = set(self.processes().values())
            while p > 1:
                if p in roots:
                    out[pid] = comm[pid]
                    break
                p = parent.get(p, 0)
        return out

    @staticmethod
    def rss_bytes(pid):
        """Resident set size of `pid` in bytes (VmRSS), None if it is gone."""
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def kill_postgres(self, sig=signal.SIGKILL):
        """Stops PostgreSQL (default SIGKILL of the whole process group: the
        coordinator's connections break). Its data directory stays."""
        if self._pg:
            self._pg.stop(sig)
        self._log(f"cluster: postgresql stopped ({signal.Signals(sig).name})")

    def start_postgres(self, timeout=60.0):
        """Starts PostgreSQL again on the same port and data directory
        (crash recovery runs if it was killed)."""
        if self._pg and self._pg.alive():
            raise ClusterError("postgres is still running")
        port = int(self.dsn.split("port=")[1].split()[0])
        deadline = time.monotonic() + timeout
        while True:
            self._pg = self._spawn_postgres(port)
            if self._wait_postgres(port, timeout=max(1.0, deadline - time.monotonic())):
                self._log(f"cluster: postgresql restarted on 127.0.0.1:{port}")
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"postgres did not restart:\n{self._pg.tail()}")
            time.sleep(0.2)  # the port may still be taken

    def restart_postgres(self, sig=signal.SIGKILL, timeout=60.0):
        """kill_postgres(sig), then start_postgres() on the same port."""
        self.kill_postgres(sig)
        self.start_postgres(timeout)

    def _postgres_pids(self):
        """The postmaster's pid, then its children's (backends, checkpointer,
        ...): each child is a process group of its own, so a signal to the
        postmaster's group does not reach them."""
        if not (self._pg and self._pg.alive()):
            return []
        parent = self._pg.pid
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue  # gone meanwhile
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                children.append(int(entry))
        return [parent] + children

    def stop_postgres(self):
        """Freezes PostgreSQL: SIGSTOP to the postmaster and every process it
        forked, as a stuck failover or a frozen disk would. Connections stay
        open and the kernel still ACKs TCP, but nothing answers and no new
        backend starts. continue_postgres() resumes it."""
        stopped = set()
        for _ in range(2):  # the postmaster first: then it forks no more
            for pid in self._postgres_pids():
                if pid not in stopped:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.add(pid)
                    except ProcessLookupError:
                        pass
        self._log(f"cluster: postgresql frozen (SIGSTOP to {len(stopped)} processes)")

    def continue_postgres(self):
        """Resumes a PostgreSQL frozen by stop_postgres() (SIGCONT)."""
        for pid in reversed(self._postgres_pids()):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._log("cluster: postgresql continued (SIGCONT)")

    def agent_command(self, host_id):
        """(argv, env) that start the agent of `host_id`."""
        agent = self.agents[host_id]
        argv = [self.agent_bin, "--host-id", host_id, "--coordinator", self.coordinator,
                "--worker-socket", agent.worker_socket, "--shm-dir", agent.shm_dir,
                "--memory-limit-bytes", str(self.memory_limit_bytes), "--ucx-net-devices", "lo",
                "--ucx-tls", "tcp", "--heartbeat-ms", str(self.heartbeat_ms)]
        if self.spare_bytes is not None:
            argv += ["--spare-bytes", str(self.spare_bytes)]
        if self.keep_dropped_ms is not None:
            argv += ["--keep-dropped-ms", str(self.keep_dropped_ms)]
        if agent.metrics:
            argv += ["--metrics-listen", agent.metrics]
        if self.worker_group is not None:
            argv += ["--worker-group", str(self.worker_group)]
        device = (self.agent_device.get(host_id) if isinstance(self.agent_device, dict)
                  else self.agent_device)
        if device is not None:
            argv += ["--device", device]
        # The agent's certificate binds it to its host (docs/security.md).
        argv += self.pki.coordinator_flags(f"agent:{host_id}") if self.tls else ["--insecure"]
        env = dict(os.environ, UCX_NET_DEVICES="lo", UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
        return argv, env

    def start_agent(self, host_id):
        """Starts (or restarts) the agent of `host_id` and waits until it serves workers."""
        agent = self.agents[host_id]
        os.makedirs(agent.shm_dir, exist_ok=True)
        if self.worker_group is not None:
            gid = _group_id(self.worker_group)
            for d in (os.path.dirname(agent.worker_socket), agent.shm_dir):
                os.chown(d, -1, gid)
                os.chmod(d, 0o750)
        if os.path.exists(agent.worker_socket):
            os.unlink(agent.worker_socket)
        argv, env = self.agent_command(host_id)
        agent.process = _Process(f"reshard-agent {host_id}", argv,
                                 os.path.join(self.work_dir, f"{host_id}.log"), env=env)
        agent.process.wait_for_line(f"reshard-agent {host_id} ready worker-socket ", 60)
        if agent.metrics and agent.metrics.endswith(":0"):
            # Logged before the ready line. Restarts keep this port.
            said = agent.process.find_line(f"host {host_id}: /metrics on port ")
            port = said.rsplit(" ", 1)[-1] if said else "0"
            if not port.isdigit() or port == "0":
                raise ClusterError(f"reshard-agent {host_id} logged no /metrics port; "
                                   f"last output:\n{agent.process.tail()}")
            agent.metrics = f"127.0.0.1:{port}"
        self._log(f"cluster: reshard-agent {host_id} ready (worker socket {agent.worker_socket})")
        return agent

    def kill_agent(self, host_id):
        """SIGKILLs the agent of `host_id` (its shared memory stays, as on a crashed host)."""
        agent = self.agents[host_id]
        if agent.process:
            agent.process.stop(signal.SIGKILL)
        self._log(f"cluster: reshard-agent {host_id} killed")

    def lose_host(self, host_id):
        """The host is gone: its agent is killed and its shared memory removed."""
        self.kill_agent(host_id)
        shutil.rmtree(self.agents[host_id].shm_dir, ignore_errors=True)

    # ------------------------------------------------------- host failures
    # A whole host fails: its agent and every process that uses the host's
    # worker socket (a `reshard run` launcher names it in --worker-socket,
    # its ranks have it in $RESHARD_WORKER_SOCKET) with their descendants,
    # found in /proc. The cluster starts none of them; restart_host() starts
    # the launchers it killed again, with their command line, directory and
    # environment, as the host's init system would.

    def host_processes(self, host_id):
        """[pid] of the live processes that use `host_id`'s worker socket
        and of their descendants, launchers first (the agent not included)."""
        sock = os.path.realpath(self.agents[host_id].worker_socket)
        table = _proc_table()
        skip = {os.getpid(), self.agents[host_id].pid}
        users = [pid for pid, p in table.items() if pid not in skip and _uses_socket(pid, p, sock)]
        out, seen = [], set()
        todo = sorted(users, key=lambda pid: table[pid]["ppid"] in users)  # launchers first
        while todo:
            pid = todo.pop(0)
            if pid in seen:
                continue
            seen.add(pid)
            out.append(pid)
            todo += sorted(c for c, p in table.items() if p["ppid"] == pid and c not in skip)
        return out

    def _launchers(self, host_id, pids):
        """(argv, cwd, env) of each launcher among `pids`: a process that
        names the worker socket on its command line and whose parent is none
        of `pids`."""
        sock = os.path.realpath(self.agents[host_id].worker_socket)
        table = _proc_table()
        out = []
        for pid in pids:
            p = table.get(pid)
            if p and p["ppid"] not in pids and _socket_arg(p["argv"], p["cwd"]) == sock:
                out.append((p["argv"], p["cwd"], p["env"]))
        return out

    def _signal_pids(self, pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_host(self, host_id, keep_shm=True):
        """The host crashes: SIGKILL to its agent and every process of the
        host (host_processes), frozen first so that none reacts to another's
        death. Its shared memory stays (keep_shm=False deletes it: the host
        is lost for good, as lose_host). Returns the pids killed, agent
        first; the launchers among them are remembered for restart_host."""
        agent = self.agents[host_id]
        pids = self.host_processes(host_id)
        self._signal_pids(pids, signal.SIGSTOP)
        launchers = self._launchers(host_id, pids)
        if launchers:
            self.__dict__.setdefault("_killed_launchers", {})[host_id] = launchers
        killed = [agent.pid] if agent.alive() else []
        self.kill_agent(host_id)
        self._signal_pids(pids, signal.SIGKILL)
        for pid in pids:
            _wait_gone(pid, 10.0)
        if not keep_shm:
            shutil.rmtree(agent.shm_dir, ignore_errors=True)
        self._log(f"cluster: host {host_id} killed (agent and {len(pids)} processes, "
                  f"{'shm kept' if keep_shm else 'shm removed'})")
        return killed + pids

    def stop_host(self, host_id):
        """The host freezes: SIGSTOP to its agent and every process of the
        host, returning once they are all stopped; its sockets stay open and
        it misses its heartbeats. Returns the pids stopped, agent first."""
        pids = self.host_processes(host_id)
        self._signal_pids(pids, signal.SIGSTOP)
        self.stop_agent(host_id)
        everything = [self.agents[host_id].pid] + pids
        for pid in everything:  # a signal takes effect when its process next runs
            _wait_state(pid, lambda state: state in ("T", "t", "Z", "X", None), 10.0)
        self._log(f"cluster: host {host_id} stopped (agent and {len(pids)} processes)")
        return everything

    def continue_host(self, host_id):
        """SIGCONT after stop_host, agent first. Returns the pids continued."""
        self.continue_agent(host_id)
        pids = self.host_processes(host_id)
        self._signal_pids(pids, signal.SIGCONT)
        everything = [self.agents[host_id].pid] + pids
        for pid in everything:
            _wait_state(pid, lambda state: state != "T", 10.0)
        self._log(f"cluster: host {host_id} continued (agent and {len(pids)} processes)")
        return everything

    def restart_host(self, host_id, keep_shm=True):
        """The host reboots: kill_host (if anything of it still runs), its
        agent started again (same host id, worker socket and shm_dir; with
        keep_shm=False the host comes back empty), then every launcher the
        kill found, with its command line, directory and environment; their
        output goes to WORK_DIR/<host>-launcher-<n>.log. Returns the new
        Agent."""
        if self.agents[host_id].alive() or self.host_processes(host_id):
            self.kill_host(host_id, keep_shm=keep_shm)
        elif not keep_shm:
            shutil.rmtree(self.agents[host_id].shm_dir, ignore_errors=True)
        agent = self.restart_agent(host_id, keep_shm=keep_shm)
        relaunched = self.__dict__.setdefault("_relaunched", {}).setdefault(host_id, [])
        for argv, cwd, env in self.__dict__.get("_killed_launchers", {}).pop(host_id, []):
            n = len(relaunched)
            relaunched.append(_Process(f"{host_id} launcher {n}", argv,
                                       os.path.join(self.work_dir, f"{host_id}-launcher-{n}.log"),
                                       env=env, cwd=cwd))
        self._log(f"cluster: host {host_id} restarted ({len(relaunched)} launchers started again)")
        return agent

    # ------------------------------------------------------------------ stop
    def stop(self):
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for launchers in self.__dict__.get("_relaunched", {}).values():
            for p in launchers:
                p.stop()
        for agent in self.agents.values():
            if agent.process:
                agent.process.stop()
        if self._coordinator_proc:
            self._coordinator_proc.stop()
        if self._pg:
            self._pg.stop(signal.SIGINT)  # fast shutdown
        for d in (self.work_dir if not self._requested_work_dir else None, self._pg_dir):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        if self.work_dir and self._requested_work_dir:
            for agent in self.agents.values():
                shutil.rmtree(agent.shm_dir, ignore_errors=True)

    def logs(self, lines=20):
        """The last lines of every process's output, for error reports."""
        parts = []
        procs = [self._coordinator_proc] + [a.process for a in self.agents.values()]
        for p in procs:
            if p:
                parts.append(f"--- {p.name} ---\n{p.tail(lines)}")
        return "\n".join(parts)


def _proc_table():
    """{pid: {"ppid", "argv", "cwd", "env"}} of the live processes this
    process may inspect (zombies and unreadable ones left out)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        base = f"/proc/{entry}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z":
                continue
            with open(f"{base}/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
            with open(f"{base}/environ", "rb") as f:
                env = dict(kv.decode("utf-8", "surrogateescape").partition("=")[::2]
                           for kv in f.read().split(b"\0") if b"=" in kv)
            cwd = os.readlink(f"{base}/cwd")
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours
        out[int(entry)] = {"ppid": int(fields[1]), "argv": argv, "cwd": cwd, "env": env}
    return out


def _socket_arg(argv, cwd):
    """The real path of the --worker-socket argument on a command line, or None."""
    for i, a in enumerate(argv):
        if a == "--worker-socket" and i + 1 < len(argv):
            return os.path.realpath(os.path.join(cwd, argv[i + 1]))
        if a.startswith("--worker-socket="):
            return os.path.realpath(os.path.join(cwd, a.split("=", 1)[1]))
    return None


def _uses_socket(pid, p, sock):
    """Whether process `p` (from _proc_table) uses the worker socket `sock`:
    names it on its command line or in $RESHARD_WORKER_SOCKET."""
    named = p["env"].get("RESHARD_WORKER_SOCKET")
    if named and os.path.realpath(os.path.join(p["cwd"], named)) == sock:
        return True
    return _socket_arg(p["argv"], p["cwd"]) == sock


def _proc_state(pid):
    """The state letter of `pid` in /proc (R, S, T, Z, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def _wait_state(pid, wanted, timeout):
    """Waits until wanted(state of `pid`) holds (None: gone); False after `timeout`."""
    deadline = time.monotonic() + timeout
    while not wanted(_proc_state(pid)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _wait_gone(pid, timeout):
    """Waits until `pid` is gone or a zombie (its parent reaps it, not us)."""
    _wait_state(pid, lambda state: state in (None, "Z", "X"), timeout)


def scrape_metrics(address, timeout=5.0):
    """GET http://ADDRESS/metrics, parsed into {"name{labels}": float}
    (comments skipped)."""
    import urllib.request
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers():
    """SIGTERM and SIGHUP unwind like Ctrl-C, so `with LocalCluster(...)` cleans up."""
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGHUP, _raise_keyboard_interrupt)


# ------------------------------------------------------------ the program
# `cluster.py [--build B] [--hosts N] ...` runs a cluster until interrupted;
# `cluster.py kill-host|stop-host|continue-host|restart-host HOST [--work DIR]`
# asks a running one, through WORK_DIR/control.sock (one JSON line each way).

CONTROL_SOCKET = "control.sock"
HOST_COMMANDS = {
    "kill-host": "SIGKILL the host's agent and the processes using its worker socket "
                 "(launcher, ranks); its shared memory stays unless --empty",
    "stop-host": "SIGSTOP the host's agent and processes (it misses its heartbeats)",
    "continue-host": "SIGCONT after stop-host",
    "restart-host": "kill-host (what still runs), then start its agent and the launchers "
                    "killed again; --empty: its shared memory is deleted in between",
}


def use_staged_package(build_dir):
    """Puts <build_dir>/python (the staged reshard package) first on sys.path,
    so that the program needs no PYTHONPATH."""
    staged = os.path.join(os.path.abspath(build_dir), "python")
    if os.path.isdir(os.path.join(staged, "reshard")) and staged not in sys.path:
        sys.path.insert(0, staged)


def export_line(cluster, identity=LocalCluster.ADMIN):
    """The shell line that points reshardctl, reshard.Client.from_env() and
    `cluster.py kill-host` at `cluster` (credentials of `identity`)."""
    env = {"RESHARD_COORDINATOR": cluster.coordinator}
    env.update(cluster.ctl_env(identity))
    env["RESHARD_LOCAL_CLUSTER"] = cluster.work_dir
    return "export " + " ".join(f"{k}={v}" for k, v in env.items())


def _serve_control(cluster, server):
    """Answers control requests in this (the main) thread until interrupted:
    agents and launchers it restarts die with this thread (PR_SET_PDEATHSIG)."""
    actions = {"kill-host": lambda h, empty: cluster.kill_host(h, keep_shm=not empty),
               "stop-host": lambda h, empty: cluster.stop_host(h),
               "continue-host": lambda h, empty: cluster.continue_host(h),
               "restart-host": lambda h, empty: cluster.restart_host(h, keep_shm=not empty).pid}
    while True:
        conn, _ = server.accept()
        with conn:
            req = None
            try:
                req = json.loads(conn.makefile("r").readline())
                command, host = req["command"], req["host"]
                if command not in actions:
                    raise ClusterError(f"unknown command {command!r} (known: {', '.join(actions)})")
                if host not in cluster.agents:
                    raise ClusterError(f"unknown host {host!r} (hosts: {', '.join(cluster.host_ids)})")
                result = actions[command](host, bool(req.get("empty")))
                reply = {"ok": True, "pids": result if isinstance(result, list) else [result]}
            except Exception as e:  # the cluster keeps serving whatever a request did
                reply = {"ok": False, "error": str(e)}
            print(f"cluster: {req.get('command') if isinstance(req, dict) else '?'} -> {reply}",
                  flush=True)
            try:
                conn.sendall((json.dumps(reply) + "\n").encode())
            except OSError:
                pass


def control(work_dir, command, host, empty=False, timeout=120.0):
    """Sends `command` for `host` to the cluster running in `work_dir`;
    returns its reply {"ok", "pids"} or {"ok": False, "error"}."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(os.path.join(work_dir, CONTROL_SOCKET))
        s.sendall((json.dumps({"command": command, "host": host, "empty": empty}) + "\n").encode())
        return json.loads(s.makefile("r").readline())


def _control_main(argv):
    parser = argparse.ArgumentParser(prog=f"cluster.py {argv[0]}", description=HOST_COMMANDS[argv[0]])
    parser.add_argument("host", help="the host id, e.g. host-1")
    parser.add_argument("--work", default=os.environ.get("RESHARD_LOCAL_CLUSTER"),
                        help="the running cluster's work directory (default $RESHARD_LOCAL_CLUSTER, "
                             "as the cluster's export line sets it)")
    if argv[0] in ("kill-host", "restart-host"):
        parser.add_argument("--empty", action="store_true", help="delete the host's shared memory")
    args = parser.parse_args(argv[1:])
    if not args.work:
        parser.error("--work DIR or $RESHARD_LOCAL_CLUSTER: which cluster")
    try:
        reply = control(args.work, argv[0], args.host, getattr(args, "empty", False))
    except OSError as e:
        print(f"cluster.py {argv[0]}: no cluster answers at {args.work}/{CONTROL_SOCKET}: {e}",
              file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"cluster.py {argv[0]}: {reply.get('error')}", file=sys.stderr)
        return 1
    print(f"{argv[0]} {args.host}: pids {' '.join(str(p) for p in reply['pids'])}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HOST_COMMANDS:
        return _control_main(argv)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="commands for a running cluster: " + ", ".join(HOST_COMMANDS) +
               " (cluster.py kill-host --help)")
    parser.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "../../build"))
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--devices-per-host", type=int, default=2)
    parser.add_argument("--worker-group", default=None,
                        help="group (name or gid) whose processes may use the agents")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext gRPC everywhere, no certificates (default: mutual TLS)")
    parser.add_argument("--work", default=None,
                        help="work directory (default: a new /dev/shm/reshard-local-XXXX, removed "
                             "at the end)")
    args = parser.parse_args(argv)
    use_staged_package(args.build)
    install_signal_handlers()
    try:
        with LocalCluster(args.build, hosts=args.hosts, devices_per_host=args.devices_per_host,
                          log=print, worker_group=args.worker_group, tls=not args.insecure,
                          work_dir=args.work) as c:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            control_path = os.path.join(c.work_dir, CONTROL_SOCKET)
            if os.path.exists(control_path):
                os.unlink(control_path)
            server.bind(control_path)
            os.chmod(control_path, 0o600)
            server.listen(8)
            print(f"coordinator {c.coordinator}  metrics http://{c.coordinator_metrics}/metrics")
            for a in c.agents.values():
                print(f"{a.host_id}: worker socket {a.worker_socket}"
                      + (f"  metrics http://{a.metrics}/metrics" if a.metrics else ""))
            print(f"work directory {c.work_dir}")
            print("in another shell (reshardctl, reshard.Client.from_env(), cluster.py kill-host ...):")
            print(export_line(c))
            print(f"try: {c.reshardctl} --coordinator {c.coordinator} "
                  f"{' '.join(c.ctl_args())} hosts list")
            print("Ctrl-C stops and removes everything.", flush=True)
            with server:
                _serve_control(c, server)
    except KeyboardInterrupt:
        print("\ncluster: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
