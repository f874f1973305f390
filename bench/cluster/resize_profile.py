"""`--perf DIR`: a perf profile of the agents during each timed resize (issue 22, item 5).

perf attaches to the agents' pids before the resize, disabled, and is enabled
and disabled through its control FIFOs around the resize itself, so the
profile holds the resize and nothing of the publish, the load or the set-up.
Each repetition writes DIR/case<N>-rep<R>.data; `summary` splits the samples
by library (kernel, libxxhash, libcrypto, libc, UCX, the agent) and by the
kernel's biggest symbols, as CPU-seconds per GB written.
"""

import os
import shutil
import signal
import subprocess

# The kernel symbols worth naming, grouped by what the bytes pay for.
_KERNEL_GROUPS = (
    ("TCP copies (send + receive)", ("_copy_from_iter", "_copy_to_iter", "copy_user")),
    ("page zeroing", ("clear_page",)),
)


def available():
    return shutil.which("perf") is not None


class ResizeProfile:
    """perf record -g -p PIDS, enabled only between enable() and stop()."""

    def __init__(self, path, pids, log):
        self.path, self.log = path, log
        base = path + ".ctl"
        self.ctl, self.ack = base, base + ".ack"
        for p in (self.ctl, self.ack):
            if os.path.exists(p):
                os.unlink(p)
            os.mkfifo(p)
        self.proc = subprocess.Popen(
            ["perf", "record", "-F", "999", "-g", "--delay=-1",
             "--control", f"fifo:{self.ctl},{self.ack}",
             "-p", ",".join(str(p) for p in pids), "-o", path],
            stdout=subprocess.DEVNULL, stderr=open(path + ".log", "w"))

    def _command(self, cmd):
        # Opening the FIFO blocks until perf has opened its end: perf is up.
        with open(self.ctl, "w") as f:
            f.write(cmd + "\n")
        with open(self.ack) as f:
            f.readline()

    def enable(self):
        self._command("enable")

    def stop(self):
        try:
            self._command("disable")
        finally:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=120)
            for p in (self.ctl, self.ack):
                if os.path.exists(p):
                    os.unlink(p)


def _report(path, sort):
    out = subprocess.run(["perf", "report", "-i", path, "--sort", sort, "--stdio",
                          "--no-children", "-g", "none", "--percentage", "relative"],
                         capture_output=True, text=True, check=False).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "%" not in line:
            continue
        pct, _, name = line.partition("%")
        try:
            rows.append((float(pct), name.strip()))
        except ValueError:
            continue
    return rows


def summary(path, cpu_s, gb_written):
    """Lines: each library's and each kernel group's share of the agents'
    samples, as a share and as CPU-s per GB written (cpu_s: the agents' CPU
    seconds of the resize, from /proc)."""
    per_gb = cpu_s / gb_written if gb_written else 0.0
    lines = [f"   profile {os.path.basename(path)}: agents {cpu_s:.2f} CPU-s for "
             f"{gb_written:.2f} GB written = {per_gb:.2f} CPU-s/GB"]
    for pct, name in sorted(_report(path, "dso"), reverse=True)[:8]:
        lines.append(f"     {pct:5.1f}%  {per_gb * pct / 100:5.2f} CPU-s/GB  {name}")
    syms = _report(path, "sym")
    for label, needles in _KERNEL_GROUPS:
        pct = sum(p for p, n in syms if n.startswith("[k]") and any(k in n for k in needles))
        lines.append(f"     {pct:5.1f}%  {per_gb * pct / 100:5.2f} CPU-s/GB  kernel: {label}")
    return lines
