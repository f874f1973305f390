"""A Slurm cluster on one machine: munged, one slurmctld and one slurmd per
emulated host, each host in its own network namespace (bench/cluster/netns.py)
with its own hostname (a UTS namespace), all plain processes under a work
directory that close() removes. Nothing on the machine is configured: the
configuration, key, sockets, spool and logs live in the work directory and
the client commands find them through SLURM_CONF (env()).

With `reshard_build_dir`, reshard runs beside Slurm as a site would deploy
it: PostgreSQL and the coordinator on the bridge's address (the controller
host), and a reshard-agent beside each slurmd, in the node's namespace, with
the node's name as its host id (bench/cluster/parts.py's NamespacedCluster
over this cluster's namespaces; `reshard` is that LocalCluster).

  with SlurmCluster(hosts=3).start() as c:
      c.run(["sinfo"])            # the client commands, with SLURM_CONF set
      c.on("host-0", ["sbatch", ...])   # as from a node (a login node)

Needs root, network namespaces, and Debian's slurm-wlm and munge
(scripts/bootstrap.sh installs them); missing_capability() says what is
missing. Not thread-safe; close() is idempotent.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "cluster"))
import netns  # noqa: E402

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scontrol", "squeue")


_instances = 0  # SlurmClusters made by this process: each its own namespace names


class SlurmError(RuntimeError):
    """A daemon did not start, or the cluster did not come up in time."""


def missing_capability():
    """None when a Slurm cluster can run here, else why not."""
    for b in BINARIES:
        if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}"):
            return f"`{b}` not installed (Debian packages slurm-wlm and munge)"
    return netns.missing_capability()


def remove_stale(log=lambda m: None):
    """SIGKILLs the daemons of clusters whose process is gone (munged and
    slurmctld run outside the namespaces: their command lines name the work
    directory rsbc<PID>-slurm-...), then removes their namespaces, links and
    directories (netns.remove_stale)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        m = re.search(r"/rsbc(\d+)-slurm-", cmd)
        if m and not netns._pid_alive(int(m.group(1))):
            log(f"slurm: killing stale {cmd.split(chr(0))[0]} (pid {pid})")
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    netns.remove_stale(log)


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, hosts, log=lambda m: None, slurmd_timeout_s=10, grace_time_s=30,
                 reshard_build_dir=None, reshard_args=None):
        self.hosts = [f"host-{i}" for i in range(hosts)]
        self._log = log
        self._grace_time_s = grace_time_s
        self._reshard_build_dir = reshard_build_dir
        self._reshard_args = dict(reshard_args or {})
        self.reshard = None  # the reshard LocalCluster, with reshard_build_dir
        self._slurmd_timeout_s = slurmd_timeout_s
        global _instances
        self.topology = netns.Topology(hosts, None, storage=False, log=log,
                                       instance=chr(ord("a") + _instances % 26))
        _instances += 1
        self.workdir = tempfile.mkdtemp(prefix=f"{netns.PREFIX}{os.getpid()}-slurm-")
        self.conf = os.path.join(self.workdir, "slurm.conf")
        self.munge_socket = os.path.join(self.workdir, "munge", "munge.socket")
        self.controller = f"rsctl{os.getpid()}"
        self._procs = {}  # name -> Popen
        self._closed = False

    # ---- lifecycle ----

    def start(self, timeout=60):
        remove_stale(self._log)
        try:
            self.topology.start()
            self._start_munged()
            self._write_conf()
            self._start_slurmctld()
            for h in self.hosts:
                self.start_slurmd(h)
            self.wait_nodes("idle", self.hosts, timeout)
            if self._reshard_build_dir:
                self._start_reshard()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stops every daemon (SIGTERM, then SIGKILL), removes the namespaces
        and the work directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.reshard is not None:
            self.reshard.stop()
        for name, p in reversed(list(self._procs.items())):
            self._stop(p)
        for node in self.topology.nodes.values():
            netns._kill_processes_in(node.netns)
        self.topology.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @staticmethod
    def _stop(p, grace=5):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    # ---- the daemons ----

    def _path(self, *parts):
        p = os.path.join(self.workdir, *parts)
        os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
        return p

    def _spawn(self, name, argv):
        log = open(self._path("logs", f"{name}.out"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._procs[name] = p
        return p

    def _start_munged(self):
        # munged wants every directory to its socket searchable by all (its
        # clients may be any user) and writable by its owner only.
        os.chmod(self.workdir, 0o755)
        key = self._path("munge", "munge.key")
        os.chmod(os.path.dirname(key), 0o755)
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        p = self._spawn("munged", [
            "munged", "-F", "--key-file", key, "--socket", self.munge_socket,
            "--pid-file", self._path("munge", "munged.pid"),
            "--log-file", self._path("munge", "munged.log"),
            "--seed-file", self._path("munge", "munged.seed"), "--num-threads", "8"])
        deadline = time.monotonic() + 10
        while not os.path.exists(self.munge_socket):
            if p.poll() is not None:
                raise SlurmError(f"munged exited with {p.returncode}: {self.tail('munged')}")
            if time.monotonic() > deadline:
                raise SlurmError("munged made no socket within 10 s")
            time.sleep(0.02)  # polling for the socket file, not a synchronisation

    def _write_conf(self):
        self.ctl_port = _free_port()
        state = self._path("state", "x")
        spool = os.path.join(self.workdir, "spool")
        for h in self.hosts:
            os.makedirs(os.path.join(spool, h), exist_ok=True)
        lines = [
            "ClusterName=reshard",
            f"SlurmctldHost={self.controller}({self.topology.bridge_address})",
            f"SlurmctldPort={self.ctl_port}",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={os.path.dirname(state)}",
            f"SlurmdSpoolDir={spool}/%n",
            f"SlurmctldPidFile={self.workdir}/slurmctld.pid",
            f"SlurmdPidFile={self.workdir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.workdir}/logs/slurmctld.log",
            f"SlurmdLogFile={self.workdir}/logs/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/linear",
            "MpiDefault=none",
            "ReturnToService=2",
            f"SlurmdTimeout={self._slurmd_timeout_s}",
            "TreeWidth=65533",
            "SchedulerParameters=permit_job_expansion",
            # Preemption by partition: `urgent` preempts `spot` (cancelled
            # after GraceTime); `main` is never preempted.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            # A preempted job's --signal goes out at once (to the batch shell
            # with B:), not SIGTERM to its tasks: they run on through the
            # grace time while reshard moves the job off them.
            "SlurmctldParameters=preempt_send_user_signal",
            "KillWait=5",
            # deploy/slurm/job_submit.lua: an admin's shrink of an elastic
            # job waits for reshard to move its state off first.
            "JobSubmitPlugins=lua",
        ]
        for h in self.hosts:
            lines.append(f"NodeName={h} NodeAddr={self.topology.host(h).address} CPUs=1 "
                         "State=UNKNOWN")
        lines += [
            "PartitionName=main Nodes=ALL Default=YES PriorityTier=5 PreemptMode=OFF "
            "MaxTime=INFINITE State=UP",
            f"PartitionName=spot Nodes=ALL PriorityTier=1 PreemptMode=CANCEL "
            f"GraceTime={self._grace_time_s} MaxTime=INFINITE State=UP",
            "PartitionName=urgent Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE "
            "State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(self.workdir, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\n")
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "job_submit.lua"),
                    os.path.join(self.workdir, "job_submit.lua"))

    def _start_slurmctld(self, clear=True):
        flags = "-c -i" if clear else "-i"  # -c: a fresh cluster forgets old state
        p = self._spawn("slurmctld", [
            "unshare", "--uts", "sh", "-c",
            f'hostname {self.controller} && exec slurmctld -D {flags} -f "$0"', self.conf])
        deadline = time.monotonic() + 30
        while True:
            if p.poll() is not None:
                raise SlurmError(f"slurmctld exited with {p.returncode}: {self.tail('slurmctld')}")
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex((self.topology.bridge_address, self.ctl_port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmctld not accepting within 30 s: {self.tail('slurmctld')}")
            time.sleep(0.05)  # polling for the port, not a synchronisation

    def _start_reshard(self):
        import parts  # bench/cluster/parts.py
        args = dict(heartbeat_ms=200, log=self._log)
        args.update(self._reshard_args)
        self.reshard = parts.NamespacedCluster(self._reshard_build_dir, self.topology, **args)
        self.reshard.start()

    def worker_socket_pattern(self):
        """--worker-socket of `reshard run` on every node: the agents share
        this machine's file system, so each node's socket has its own path
        ({host} is the node's name)."""
        sample = self.reshard.agents[self.hosts[0]].worker_socket
        return sample.replace(f"/{self.hosts[0]}/", "/{host}/")

    def start_slurmd(self, host):
        """Starts (or restarts) the slurmd of `host` in its namespace."""
        node = self.topology.host(host)
        return self._spawn(f"slurmd-{host}", [
            "nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "sh", "-c",
            f'hostname {host} && exec slurmd -D -N {host} -f "$0"', self.conf])

    def kill_host(self, host):
        """SIGKILLs everything running in `host`'s namespace (its slurmd, and
        what runs there): the host fails."""
        netns._kill_processes_in(self.topology.host(host).netns)
        p = self._procs.get(f"slurmd-{host}")
        if p is not None:
            p.wait()
        if self.reshard is not None:
            self.reshard.lose_host(host)  # its agent died with it; its memory goes too

    def wait_state_saved(self, since, timeout=60):
        """Waits until slurmctld saved its jobs' state after `since` (time.time()):
        what a restart recovers (it saves a few seconds after a change)."""
        path = os.path.join(self.workdir, "state", "job_state")
        deadline = time.monotonic() + timeout
        while not (os.path.exists(path) and os.path.getmtime(path) > since):
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmctld saved no job state within {timeout} s")
            time.sleep(0.2)  # polling the state file, not a synchronisation

    def kill_slurmctld(self):
        """A Slurm outage: slurmctld SIGKILLed (jobs and slurmds run on)."""
        p = self._procs["slurmctld"]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def start_slurmctld(self):
        """slurmctld again after an outage, from its saved state."""
        self._start_slurmctld(clear=False)

    def restart_host(self, host, timeout=60):
        """A failed host back: its slurmd (Slurm returns it to service) and
        its agent, afresh; waits until Slurm has it idle."""
        if self._procs.get(f"slurmd-{host}") and self._procs[f"slurmd-{host}"].poll() is None:
            return
        self.start_slurmd(host)
        if self.reshard is not None:
            self.reshard.start_agent(host)
        self.wait_nodes("idle", [host], timeout)

    # ---- the client side ----

    def env(self, extra=None):
        e = dict(os.environ, SLURM_CONF=self.conf)
        e.update(extra or {})
        return e

    def run(self, argv, check=True, timeout=60, **kw):
        """A client command (sinfo, scontrol, ...) from the machine itself."""
        r = subprocess.run(argv, env=self.env(kw.pop("env", None)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: exit {r.returncode}: {r.stdout.decode().strip()}")
        return r.stdout.decode()

    def on(self, host, argv, check=True, timeout=60, **kw):
        """A command run inside `host`'s namespace, as from that node."""
        node = self.topology.host(host)
        return self.run(["nsenter", f"--net=/run/netns/{node.netns}"] + argv, check, timeout,
                        **kw)

    def node_states(self):
        """{node: state} from sinfo (state as Slurm prints it: idle, alloc, down*, ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"])
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_nodes(self, state, hosts, timeout):
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(h) == state for h in hosts):
                return states
            for name, p in self._procs.items():
                if p.poll() is not None and name.startswith("slurm"):
                    raise SlurmError(f"{name} exited with {p.returncode}: {self.tail(name)}")
            if time.monotonic() > deadline:
                raise SlurmError(f"nodes not {state} within {timeout} s: {states}")
            time.sleep(0.2)  # polling sinfo, not a synchronisation

    def tail(self, name, lines=20):
        for path in (os.path.join(self.workdir, "logs", f"{name}.out"),
                     os.path.join(self.workdir, "logs", f"{name}.log")):
            try:
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()[-lines:]
                if text:
                    return "\n".join(text)
            except OSError:
                pass
        return "(no log)"


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        description="Start a Slurm cluster of emulated hosts on this machine, until Ctrl-C.")
    ap.add_argument("--hosts", type=int, default=3, help="emulated hosts (slurmd), default 3")
    ap.add_argument("--reshard", metavar="BUILD_DIR",
                    help="also reshard: PostgreSQL, the coordinator and an agent beside each "
                         "slurmd, from this build directory (e.g. build)")
    args = ap.parse_args(argv)
    missing = missing_capability()
    if missing:
        print(f"slurm_cluster.py: cannot run here: {missing}", file=sys.stderr)
        return 2
    def stop(signum, frame):
        raise KeyboardInterrupt
    # Ctrl-C, and SIGTERM alike (a background job ignores SIGINT).
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with SlurmCluster(args.hosts, log=print, reshard_build_dir=args.reshard).start() as c:
        print(f"Slurm is up: {c.node_states()}\n"
              f"  export SLURM_CONF={c.conf}   # then sinfo, srun, sbatch, scontrol\n"
              f"  a node's shell: nsenter --net=/run/netns/{c.topology.host('host-0').netns}"
              f" bash", flush=True)
        if c.reshard is not None:
            r = c.reshard
            env = " ".join(f"{k}={v}" for k, v in r.ctl_env().items())
            print(f"reshard is up: export RESHARD_COORDINATOR={r.coordinator} {env} "
                  f"RESHARD_WORKER_SOCKET={c.worker_socket_pattern()}", flush=True)
        print("Ctrl-C (or SIGTERM) stops it and removes everything.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
