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

    Overrides two of LocalCluster's steps: where the coordinator listens (the
    bridge address instead of loopback) and how an agent is started (inside
    its namespace, UCX on the namespace's veth). Agent metrics are off: their
    loopback listeners would be unreachable from the root namespace.
    """

    def __init__(self, build_dir, topology, **kwargs):
        self.topology = topology
        super().__init__(build_dir, hosts=len([n for n in topology.nodes if n.startswith("host-")]),
                         agent_metrics=False, **kwargs)

    def _start_coordinator(self, listen=None, metrics_listen="127.0.0.1:0", timeout=60.0):
        listen = listen or f"{self.topology.bridge_address}:0"
        super()._start_coordinator(listen, metrics_listen, timeout)

    def start_agent(self, host_id):
        agent = self.agents[host_id]
        node = self.topology.host(host_id)
        os.makedirs(agent.shm_dir, exist_ok=True)
        if os.path.exists(agent.worker_socket):
            os.unlink(agent.worker_socket)
        argv = node.exec_prefix() + [
            self.agent_bin, "--host-id", host_id, "--coordinator", self.coordinator,
            "--worker-socket", agent.worker_socket, "--shm-dir", agent.shm_dir,
            "--memory-limit-bytes", str(self.memory_limit_bytes),
            "--spare-bytes", str(self.spare_bytes), "--ucx-net-devices", node.device,
            "--ucx-tls", "tcp", "--heartbeat-ms", str(max(100, self.lease_ms // 3))]
        env = dict(os.environ, UCX_NET_DEVICES=node.device, UCX_TLS="tcp",
                   UCX_WARN_UNUSED_ENV_VARS="n")
        agent.process = local._Process(f"reshard-agent {host_id}", argv,
                                       os.path.join(self.work_dir, f"{host_id}.log"), env=env)
        agent.process.wait_for_line(f"reshard-agent {host_id} ready worker-socket ", 60)
        self._log(f"cluster: reshard-agent {host_id} ready in {node.netns} "
                  f"({node.device} {node.address})")
        return agent


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
                prefix + [sys.executable, os.path.join(HERE, "host_proc.py")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err or subprocess.DEVNULL,
                env=env, start_new_session=True, preexec_fn=local._child_setup())

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
