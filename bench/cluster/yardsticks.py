"""Yardsticks of the --unshaped mode: process CPU time and ucx_perftest.

cpu_seconds(pids): utime + stime of each process from /proc/<pid>/stat.
ucx_tag_bandwidth(): bytes/s of ucx_perftest tag_bw between a server and a
client on this machine over the transport the local agents use
(UCX_NET_DEVICES=lo, UCX_TLS=tcp), large messages.
"""

import os
import re
import socket
import subprocess
import threading

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of `pid` (all its threads) in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14 and 15 of proc(5)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ucx_tag_bandwidth(message_bytes=64 << 20, iterations=40, timeout=60):
    """Measured tag_bw in bytes/s (the "Final:" line's overall MB/s, which
    ucx_perftest counts in MiB/s)."""
    env = dict(os.environ, UCX_NET_DEVICES="lo", UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    port = str(_free_port())
    args = ["-p", port, "-t", "tag_bw", "-s", str(message_bytes), "-n", str(iterations)]
    # Line-buffered, so that "Waiting for connection" arrives when it is printed.
    server = subprocess.Popen(["stdbuf", "-oL", "ucx_perftest"] + args, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    ready = threading.Event()
    lines = []

    def read():
        for raw in server.stdout:
            lines.append(raw.decode(errors="replace"))
            if "Waiting for connection" in lines[-1]:
                ready.set()
        ready.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        if not ready.wait(timeout) or server.poll() is not None:
            raise RuntimeError(f"ucx_perftest server did not start: {''.join(lines)[-500:]}")
        client = subprocess.run(["ucx_perftest", "127.0.0.1"] + args, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        out = client.stdout.decode(errors="replace")
        m = re.search(r"^Final:\s+\d+\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)", out, re.M)
        if client.returncode != 0 or not m:
            raise RuntimeError(f"ucx_perftest client failed: {out[-800:]}")
        return float(m.group(1)) * (1 << 20)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        t.join(5)
