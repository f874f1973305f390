"""`--perf DIR`: a perf profile of the agents during each timed resize (issue 22, item 5).

perf attaches to the agents' pids before the resize, disabled, and is enabled
and disabled through its control FIFOs around the resize itself, so the
profile holds the resize and nothing of the publish, the load or the set-up.
Each repetition writes DIR/case<N>-rep<R>.data; `summary` splits the samples
by library (kernel, libxxhash, libcrypto, libc, UCX, the agent) and by what
the bytes pay for (groups of symbols: TCP copies, page zeroing, page faults and
mapping, XXH3, memmove, locks and wake-ups), as CPU-seconds per GB written.
"""

import os
import shutil
import signal
import subprocess

# What the bytes pay for, by symbol (the first group a symbol matches counts
# it); what matches none is "other".
_GROUPS = (
    ("TCP copies in the kernel (send + receive)", ("_copy_from_iter", "_copy_to_iter",
                                                   "copy_user")),
    ("page zeroing", ("clear_page",)),
    ("page faults, mapping, allocation", ("fault", "folio", "shmem", "pte", "filemap",
                                          "get_user_pages", "page", "mmap", "lru", "memcg",
                                          "xas_", "mtree", "vm_", "tlb", "madvise")),
    ("XXH3 (item checksums)", ("xxh3", "XXH3", "libxxhash")),
    ("Poly1305, SHA-256 (step seals: libcrypto)", ("libcrypto",)),
    ("memmove (local copies, UCX buffers)", ("memmove", "memcpy", "LocalCopier")),
    ("locks, wake-ups, scheduling", ("spin_", "finish_task_switch", "futex", "schedule",
                                     "wake", "softirq", "rcu_read")),
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
    syms = _report(path, "dso,sym")
    counted = [0.0] * (len(_GROUPS) + 1)
    for pct, name in syms:
        for i, (_, needles) in enumerate(_GROUPS):
            if any(k in name for k in needles):
                counted[i] += pct
                break
        else:
            counted[-1] += pct
    for (label, _), pct in zip(_GROUPS + (("other", ()),), counted):
        lines.append(f"     {pct:5.1f}%  {per_gb * pct / 100:5.2f} CPU-s/GB  {label}")
    return lines
