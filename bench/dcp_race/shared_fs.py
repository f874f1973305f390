"""A shared file system served from the storage namespace: SFTP, mounted with sshfs.

The kernel here has neither `nfs` nor `nfsd` (/proc/filesystems) and no
modules to load, so the shared file system is the nearest real one that this
kernel can mount: FUSE. SftpStorage serves a tmpfs of its own from the
storage namespace of a bench/cluster netns.Topology with OpenSSH's
sftp-server, one per connection (sftp_listen.py: no ssh, no encryption, as
NFS runs without Kerberos), and mounts it once per host with sshfs
(`-o directport`). Each mount lives in the root mount namespace, so that
processes started with `ip netns exec` see it, but its connections are made
inside the host's network namespace (sshfs runs there, under nsenter --net), so every byte a host's ranks
write or read crosses that host's shaped link and the storage node's.

sshfs runs with its defaults except 4 connections per mount (max_conns).
Reads are not served from the page cache across opens (sshfs's default, no
kernel_cache): what a rank reads crosses the link, as after a host loss.
Nothing here starts a system service: the packages are sshfs and
openssh-sftp-server.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time


class SharedFsError(RuntimeError):
    pass


HERE = os.path.dirname(os.path.abspath(__file__))
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def missing():
    """None when sftp-server, sshfs and FUSE are usable here, else why not."""
    if not os.path.exists(SFTP_SERVER):
        return ("sftp-server missing (Debian package openssh-sftp-server; scripts/bootstrap.sh "
                "installs it)")
    if not shutil.which("sshfs"):
        return "sshfs missing (Debian package sshfs; scripts/bootstrap.sh installs it)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing: this kernel or container has no FUSE"
    return None


def _children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except FileNotFoundError:
        pass
    return out


class SftpStorage:
    """sftp-server in the storage namespace, one sshfs mount per host. Idempotent close()."""

    PORT = 2222

    def __init__(self, topology, size_bytes, tag, log=lambda m: None):
        self.topology = topology
        self.node = topology.nodes["storage"]
        self.size_bytes = size_bytes
        self.log = log
        self.dir = tempfile.mkdtemp(prefix=f"{tag}-sftp-")
        self.export = os.path.join(self.dir, "export")
        self._exported = False
        self._server = None
        self._mounts = {}   # host id -> (mount point, sshfs process)
        self._logs = []     # open log files, closed by close()

    def start(self, timeout=30.0):
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def mount_point(self, host_id):
        return self._mounts[host_id][0]

    def _start(self, timeout):
        os.makedirs(self.export)
        _run(["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs", self.export])
        self._exported = True
        self._server_log = self._log_file("server.log")
        self._server = subprocess.Popen(
            self.node.exec_prefix() + [sys.executable, os.path.join(HERE, "sftp_listen.py"),
                                       self.node.address, str(self.PORT), self.export],
            stdout=self._server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        try:
            self.node.wait_accepting(self.PORT, self._server, timeout, "sftp_listen.py")
        except Exception as e:
            raise SharedFsError(f"{e}: {self._tail('server.log')}") from None
        for host_id, node in self.topology.nodes.items():
            if host_id.startswith("host-"):
                self._mount(host_id, node, timeout)
        self.log(f"storage: sftp-server on {self.node.address}:{self.PORT}, tmpfs "
                 f"{self.size_bytes >> 20} MiB, one sshfs mount per host")

    def _mount(self, host_id, node, timeout):
        point = os.path.join(self.dir, f"mnt-{host_id}")
        os.makedirs(point)
        # nsenter --net, not `ip netns exec`: the connections in the host's
        # network namespace, the mount in the root mount namespace.
        argv = ["nsenter", f"--net=/run/netns/{node.netns}",
            "sshfs", "-f", f"{self.node.address}:{self.export}", point,
            "-o", f"directport={self.PORT}", "-o", "max_conns=4"]
        log = self._log_file(f"sshfs-{host_id}.log")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self._mounts[host_id] = (point, proc)
        deadline = time.monotonic() + timeout
        while not os.path.ismount(point):   # sshfs -f prints nothing once mounted
            if proc.poll() is not None:
                raise SharedFsError(f"sshfs for {host_id} exited with {proc.poll()}: "
                                    f"{self._tail(f'sshfs-{host_id}.log')}")
            if time.monotonic() > deadline:
                raise SharedFsError(f"sshfs for {host_id}: not mounted within {timeout} s")
            time.sleep(0.05)  # poll interval of the mount check, not a synchronisation

    def _log_file(self, name):
        f = open(os.path.join(self.dir, name), "wb")
        self._logs.append(f)
        return f

    def _tail(self, name):
        try:
            with open(os.path.join(self.dir, name), errors="replace") as f:
                return f.read()[-1000:]
        except FileNotFoundError:
            return ""

    def service_pids(self):
        """The listener and its sftp-servers, the sshfs processes."""
        pids = []
        todo = [p.pid for _, p in self._mounts.values()] + ([self._server.pid] if self._server else [])
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += _children(pid)
        return pids

    def close(self):
        for host_id, (point, proc) in list(self._mounts.items()):
            subprocess.run(["fusermount3", "-u", "-z", point], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._mounts = {}
        if self._server and self._server.poll() is None:
            # its sftp-servers are in its process group (start_new_session)
            try:
                os.killpg(self._server.pid, 15)
            except ProcessLookupError:
                pass
            self._server.wait()
        self._server = None
        if self._exported:
            subprocess.run(["umount", "-l", self.export], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            self._exported = False
        for f in self._logs:
            f.close()
        self._logs = []
        shutil.rmtree(self.dir, ignore_errors=True)


def _run(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SharedFsError(f"{' '.join(argv)}: exit {r.returncode}: "
                            f"{r.stdout.decode(errors='replace').strip()}")
