"""README command one's main job (deploy/local/main_job.py) against the real
binaries: it must verify every step, and clean up after itself when it
finishes and when it is interrupted (SIGTERM, as from a terminal closing or a
CI timeout; Ctrl-C takes the same path)."""

import os
import re
import signal
import subprocess
import sys
import time

SOURCE = os.environ["RESHARD_SOURCE_DIR"]
BUILD = os.environ["RESHARD_BUILD_DIR"]
MAIN_JOB = os.path.join(SOURCE, "deploy", "local", "main_job.py")


def start(*extra):
    return subprocess.Popen([sys.executable, MAIN_JOB, "--build", BUILD, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def work_dirs(output):
    """The cluster's temporary directories, from its start-up lines."""
    dirs = set(re.findall(r"initdb (/\S+)/data", output))
    dirs |= {os.path.dirname(os.path.dirname(p))
             for p in re.findall(r"worker socket (/\S+/worker\.sock)", output)}
    return dirs


def processes_using(paths):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(p in cmd for p in paths):
            found.append(f"{pid}: {cmd}")
    return found


def assert_cleaned(output):
    dirs = work_dirs(output)
    assert len(dirs) == 2, f"expected a PostgreSQL and a cluster directory in:\n{output}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and processes_using(dirs):
        time.sleep(0.2)
    assert processes_using(dirs) == []
    for d in dirs:
        assert not os.path.exists(d), f"{d} left behind"


def test_main_job_verifies_every_step_and_cleans_up():
    p = start()
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    assert "main job: every step verified byte for byte" in out
    steps = ["register + publish", "grow data parallelism",
             "change tensor and pipeline parallelism", "migrate off host-3 onto host-4",
             "lose host-1, recover onto host-3"]
    summary = out[out.index("== summary"):]
    for step in steps:
        row = [line for line in summary.splitlines() if line.strip().startswith(step)]
        assert len(row) == 1 and row[0].rstrip().endswith("ok"), (step, summary)
    # Cross-host bytes equal the lower bound in every resharding row.
    rows = summary.split("\n\n")[0].splitlines()[3:]
    assert len(rows) == len(steps), summary
    for line in rows:
        cols = re.split(r"\s{2,}", line.strip())
        assert cols[3] == cols[4], line
    assert out.count("byte for byte") >= 5
    assert_cleaned(out)


def test_interrupted_main_job_stops_and_removes_the_cluster():
    p = start()
    out = []
    deadline = time.monotonic() + 300
    for line in p.stdout:
        out.append(line)
        if line.startswith("== grow data parallelism") or time.monotonic() > deadline:
            break
    assert any(l.startswith("== grow data parallelism") for l in out), "".join(out)
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=120)
    output = "".join(out) + rest
    assert p.returncode == 130, output
    assert "interrupted; the cluster was stopped and removed" in output
    assert_cleaned(output)
