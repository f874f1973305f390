"""Driver-side parts: the reshard cluster in namespaces and the host workers.

NamespacedCluster is deploy/local/cluster.py's LocalCluster with the
coordinator listening on the bridge address and every agent started inside
its host's namespace with UCX on that namespace's veth. HostWorkers runs
host_proc.py once per host (inside the host's namespace when there is one)
and sends every host one command at a time, all hosts at once.
"""

import json
import os
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "deploy", "local"))

import cluster as local  # noqa: E402  (deploy/local/cluster.py)


class NamespacedCluster(local.LocalCluster):
    """LocalCluster whose agents run in the namespaces of a netns.Topology.

    Differs from LocalCluster in two steps: the coordinator listens on the
    bridge address instead of loopback, and an agent starts inside its
    namespace with UCX on the namespace's veth. Agent metrics are off: their
    loopback listeners would be unreachable from the root namespace.
    """

    def __init__(self, build_dir, topology, **kwargs):
        self.topology = topology
        super().__init__(build_dir, hosts=len([n for n in topology.nodes if n.startswith("host-")]),
                         agent_metrics=False, coordinator_host=topology.bridge_address, **kwargs)

    def agent_command(self, host_id):
        node = self.topology.host(host_id)
        argv, env = super().agent_command(host_id)
        argv[argv.index("--ucx-net-devices") + 1] = node.device
        env["UCX_NET_DEVICES"] = node.device
        return node.exec_prefix() + argv, env


class HostError(RuntimeError):
    pass


class HostWorkers:
    """One host_proc.py per host; all() sends a command to every host at once
    and returns {host: reply} once all have answered. Not thread-safe."""

    def __init__(self, host_ids, python_path, topology=None, log_dir=None):
        self.procs = {}
        env = dict(os.environ, PYTHONPATH=python_path, PYTHONDONTWRITEBYTECODE="1")
        for h in host_ids:
            prefix = topology.host(h).exec_prefix() if topology else []
            err = open(os.path.join(log_dir, f"{h}.workers.log"), "wb") if log_dir else None
            self.procs[h] = subprocess.Popen(
                local.child_argv(prefix + [sys.executable, os.path.join(HERE, "host_proc.py")]),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err or subprocess.DEVNULL,
                env=env, start_new_session=True)

    def all(self, op, per_host=None, **common):
        """Sends {"op": op, **common, **per_host[host]} to every host."""
        for h, p in self.procs.items():
            cmd = dict(common, op=op, **((per_host or {}).get(h, {})))
            p.stdin.write((json.dumps(cmd) + "\n").encode())
            p.stdin.flush()
        replies, threads = {}, []
        for h, p in self.procs.items():
            t = threading.Thread(target=lambda h=h, p=p: replies.__setitem__(h, p.stdout.readline()))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        out = {}
        for h, raw in replies.items():
            if not raw:
                raise HostError(f"{h} workers exited during {op} (status "
                                f"{self.procs[h].poll()})")
            reply = json.loads(raw)
            if not reply["ok"]:
                raise HostError(f"{h} {op}: {reply['error']}\n{reply.get('trace', '')}")
            out[h] = reply
        return out

    def close(self):
        """Stops every host process. Idempotent."""
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.stdin.write(b'{"op": "quit"}\n')
                    p.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = {}
