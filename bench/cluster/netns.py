"""An emulated cluster network: one Linux network namespace per host.

Topology(hosts, rate_gbit) creates a bridge in the root namespace with an
address the hosts reach (the coordinator and PostgreSQL listen there), and one
namespace per host plus one for the storage server, each joined to the bridge
by a veth pair. Every link is shaped with tc tbf in both directions: egress of
the namespace side (what the host sends) and egress of the bridge side (what
it receives). rate_gbit=None leaves the links unshaped.

Every name starts with "rsbc" and carries the owning process id, so that
stale objects of a dead run are found and removed (remove_stale()) and the
objects of a live run, or of the test suites, are never touched.
Not thread-safe; close() is idempotent.
"""

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

PREFIX = "rsbc"
_NAME = re.compile(r"^rsbc(\d+)")


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be created."""


def run(argv, check=True):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {r.returncode}: "
                         f"{r.stdout.decode(errors='replace').strip()}")
    return r


def missing_capability():
    """None when namespaces, veth and tbf work here, else why not."""
    for tool in ("ip", "tc"):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "/usr/sbin:/usr/bin").split(":") + ["/usr/sbin"]):
            return f"`{tool}` not installed (Debian package iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root)"
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        r = run(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return f"ip netns add failed: {r.stdout.decode(errors='replace').strip()}"
        r = run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
                check=False)
        if r.returncode != 0:
            return f"veth not available: {r.stdout.decode(errors='replace').strip()}"
        r = run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "tbf",
                 "rate", "1gbit", "burst", "1mb", "latency", "10ms"], check=False)
        if r.returncode != 0:
            return f"tc tbf not available: {r.stdout.decode(errors='replace').strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_processes_in(netns):
    """SIGKILLs what still runs in a stale namespace (an agent, nginx)."""
    for pid in run(["ip", "netns", "pids", netns], check=False).stdout.decode().split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


def remove_stale(log=lambda m: None):
    """Deletes namespaces (killing what runs in them), links, tmpfs mounts
    and directories (in /dev/shm and the temporary directory) named
    rsbc<PID>... whose PID is no longer alive (left by a run that was
    SIGKILLed)."""
    for name in run(["ip", "netns", "list"]).stdout.decode().split():
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            log(f"netns: removing stale namespace {name}")
            _kill_processes_in(name)
            run(["ip", "netns", "del", name], check=False)
    for line in run(["ip", "-o", "link", "show"]).stdout.decode().splitlines():
        dev = line.split(":")[1].strip().split("@")[0]
        m = _NAME.match(dev)
        if m and not _pid_alive(int(m.group(1))):
            log(f"netns: removing stale link {dev}")
            run(["ip", "link", "del", dev], check=False)
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f]
    for mnt in mounts:
        m = re.search(r"/rsbc(\d+)[-/]", mnt + "/")
        if m and not _pid_alive(int(m.group(1))):
            log(f"netns: unmounting stale tmpfs {mnt}")
            run(["umount", "-l", mnt], check=False)
    remove_stale_directories(log)


def remove_stale_directories(log=lambda m: None):
    """Removes directories in /dev/shm and the temporary directory named
    rsbc<PID>... of a dead PID (work directories, agents' shared memory)."""
    for base in ("/dev/shm", tempfile.gettempdir()):
        for entry in os.listdir(base):
            m = _NAME.match(entry)
            if m and not _pid_alive(int(m.group(1))):
                log(f"netns: removing stale directory {base}/{entry}")
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


def _free_subnet():
    """A /24 in 10.213.0.0/16 that no interface uses."""
    used = run(["ip", "-4", "-o", "addr", "show"]).stdout.decode()
    for k in range(os.getpid() % 200, os.getpid() % 200 + 250):
        net = ipaddress.ip_network(f"10.213.{k % 250}.0/24")
        if f" 10.213.{k % 250}." not in used:
            return net
    raise NetnsError("no free /24 in 10.213.0.0/16")


class Node:
    """One namespace: a host or the storage server."""

    def __init__(self, name, netns, address, device, bridge_port):
        self.name = name            # "host-0", "storage"
        self.netns = netns          # namespace name
        self.address = address      # its IPv4 address on the bridge
        self.device = device        # the veth inside the namespace
        self.bridge_port = bridge_port  # the veth on the bridge side

    def exec_prefix(self):
        """argv prefix that runs a command inside this namespace."""
        return ["ip", "netns", "exec", self.netns]

    def wait_accepting(self, port, proc, timeout, what):
        """Waits until a server (`proc`, printing nothing when ready) accepts
        connections on this node's address and `port`; NetnsError at once if
        it exits, or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        probe = [sys.executable, "-c", "import socket; socket.create_connection("
                 f"('{self.address}', {port}), 1)"]
        while True:
            if proc.poll() is not None:
                raise NetnsError(f"{what} exited with {proc.returncode}")
            if subprocess.run(self.exec_prefix() + probe, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise NetnsError(f"{what} not accepting on {self.address}:{port} within "
                                 f"{timeout} s")
            time.sleep(0.05)  # poll interval of the readiness check, not a synchronisation


class Topology:
    """Bridge + one namespace per host (+ storage), links shaped to rate_gbit."""

    def __init__(self, hosts, rate_gbit, storage=True, log=lambda m: None, instance=""):
        # `instance` (a letter) tells apart several Topologies of one process.
        self.rate_gbit = rate_gbit
        self._log = log
        self._tag = f"{PREFIX}{os.getpid()}{instance}"
        self.bridge = f"{self._tag}br"
        self.nodes = {}
        self._created_ns = []
        self._created_links = []
        self._closed = False
        self._net = _free_subnet()
        addrs = list(self._net.hosts())
        self.bridge_address = str(addrs[0])
        names = [f"host-{i}" for i in range(hosts)] + (["storage"] if storage else [])
        for i, name in enumerate(names):
            short = "s" if name == "storage" else f"h{i}"
            self.nodes[name] = Node(name, f"{self._tag}-{name}", str(addrs[10 + i]), "eth0",
                                    f"{self._tag}{short}")

    def host(self, host_id):
        return self.nodes[host_id]

    def start(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self):
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._created_links.append(self.bridge)
        run(["ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for node in self.nodes.values():
            self._add_node(node)
        shaped = f"shaped to {self.rate_gbit} Gbit/s each way" if self.rate_gbit else "unshaped"
        self._log(f"netns: bridge {self.bridge} {self.bridge_address}/24, "
                  f"{len(self.nodes)} namespaces, links {shaped}")

    def _add_node(self, node):
        run(["ip", "netns", "add", node.netns])
        self._created_ns.append(node.netns)
        run(["ip", "link", "add", node.bridge_port, "type", "veth", "peer", "name", node.device,
             "netns", node.netns])
        self._created_links.append(node.bridge_port)
        run(["ip", "link", "set", node.bridge_port, "master", self.bridge])
        run(["ip", "link", "set", node.bridge_port, "up"])
        ns = ["ip", "-n", node.netns]
        run(ns + ["link", "set", "lo", "up"])
        run(ns + ["addr", "add", f"{node.address}/24", "dev", node.device])
        run(ns + ["link", "set", node.device, "up"])
        run(ns + ["route", "add", "default", "via", self.bridge_address])
        if self.rate_gbit:
            self._shape(node.exec_prefix(), node.device)   # host -> bridge
            self._shape([], node.bridge_port)              # bridge -> host

    def _shape(self, prefix, device):
        rate_bytes = self.rate_gbit * 1e9 / 8
        # Burst: 4 ms at the rate (at least 1 MB, enough for the kernel's
        # timer granularity at 10 Gbit/s); queue: 20 ms more.
        burst = max(1 << 20, int(rate_bytes * 0.004))
        run(prefix + ["tc", "qdisc", "add", "dev", device, "root", "tbf", "rate",
                      f"{int(self.rate_gbit * 1000)}mbit", "burst", str(burst), "latency", "20ms"])

    def close(self):
        """Deletes every namespace and link this Topology created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for ns in reversed(self._created_ns):
            run(["ip", "netns", "del", ns], check=False)
        for link in reversed(self._created_links):
            if run(["ip", "link", "show", link], check=False).returncode == 0:
                run(["ip", "link", "del", link], check=False)
