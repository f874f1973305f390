"""The docs run as written: the fenced blocks of README.md and docs/pytorch.md
marked runnable are executed in order, as a user would, against the local
cluster started by the docs' own command, and the test fails on the first
block that fails.

A block is runnable when the line right before its fence is a marker:

    <!-- docs-run: cluster -->   starts the session's cluster: the block's
                                 `... deploy/local/cluster.py ...` line runs in
                                 the background; its printed `export ...` line
                                 is pasted into every later block. The block's
                                 other commands may only be ./scripts/build.sh
                                 (ctest runs on a finished build).
    <!-- docs-run: sh -->        bash -euo pipefail
    <!-- docs-run: python -->    the venv's python, the block on stdin
    <!-- docs-run: file NAME --> the block is written to NAME (a layout
                                 file, a script) for the blocks after it

Every block runs in a scratch directory that links every entry of the
checkout (so `deploy/local/cluster.py`, `build`, `.venv`, `tests/...` resolve
as in the checkout, and what a block writes stays out of it), after
`. .venv/bin/activate` and the cluster's export line, with no PYTHONPATH: a
user's terminal as README.md ("Using reshard") sets it up. The whole session
is one module-scoped cluster shared by both pages, in page order (README.md's
blocks first: docs/pytorch.md's use its cluster).
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from helpers import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ("README.md", "docs/pytorch.md")
KINDS = ("cluster", "sh", "python", "file")
BLOCK_TIMEOUT_S = 240
CLUSTER_START_S = 120
MARKER = re.compile(r"^<!--\s*docs-run:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")


def runnable_blocks(page):
    """[(line, kind, args, text)] of the marked blocks of `page` (a path
    relative to the checkout), in page order. A marker not followed by a
    fence, or of an unknown kind, is an error."""
    with open(os.path.join(REPO, page)) as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            words = m.group(1).split()
            where = f"{page}:{i + 1}"
            assert words and words[0] in KINDS, f"{where}: docs-run kind {m.group(1)!r} (known: {KINDS})"
            fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            assert fence, f"{where}: a docs-run marker must be right before a ``` fence"
            end = i + 2
            while end < len(lines) and lines[end].rstrip() != fence.group(1):
                end += 1
            assert end < len(lines), f"{where}: the block never ends"
            out.append((i + 2, words[0], words[1:], "\n".join(lines[i + 2:end]) + "\n"))
            i = end
        i += 1
    return out


class Session:
    """A user's terminal next to a running local cluster."""

    def __init__(self, build_dir):
        self.dir = tempfile.mkdtemp(prefix="reshard-docs-run-")
        for name in os.listdir(REPO):
            if name not in (".git", "build"):
                os.symlink(os.path.join(REPO, name), os.path.join(self.dir, name))
        os.symlink(build_dir, os.path.join(self.dir, "build"))
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("RESHARD_") or k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}
        # The suites' short lease and ticks (tests/python/CMakeLists.txt): a
        # killed host is found LOST in seconds; nothing else of the runner's.
        for k in ("RESHARD_LOCAL_LEASE_MS", "RESHARD_LOCAL_TICK_MS"):
            if os.environ.get(k):
                env[k] = os.environ[k]
        self.env = env
        self.exports = ""
        self.cluster = None
        self.cluster_log = os.path.join(self.dir, "cluster.out")

    def _prelude(self):
        return f". .venv/bin/activate\n{self.exports}\n"

    def start_cluster(self, where, text):
        commands = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        start = [c for c in commands if "deploy/local/cluster.py" in c]
        assert len(start) == 1, f"{where}: one command must start deploy/local/cluster.py: {commands}"
        others = [c for c in commands if c not in start]
        assert all(c.strip() == "./scripts/build.sh" for c in others), \
            f"{where}: a cluster block runs the build and the cluster only: {others}"
        assert self.cluster is None, f"{where}: a second cluster block"
        log = open(self.cluster_log, "wb")
        # The user's first terminal: no venv activated, no PYTHONPATH.
        self.cluster = subprocess.Popen(["bash", "-c", "exec " + start[0]], cwd=self.dir, env=self.env,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + CLUSTER_START_S
        while time.monotonic() < deadline:
            out = self.cluster_output()
            exports = [ln for ln in out.splitlines() if ln.startswith("export RESHARD_COORDINATOR=")]
            if exports:
                self.exports = exports[0]
                return
            if self.cluster.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"{where}: `{start[0]}` printed no `export RESHARD_COORDINATOR=...` line "
                    f"(status {self.cluster.poll()}):\n{self.cluster_output()}")

    def cluster_output(self):
        with open(self.cluster_log, errors="replace") as f:
            return f.read()

    def run(self, page, line, kind, args, text):
        where = f"{page}:{line} ({kind})"
        if kind == "cluster":
            return self.start_cluster(where, text)
        assert self.cluster is not None and self.cluster.poll() is None, \
            f"{where}: no running cluster (README.md's cluster block runs first):\n" \
            + (self.cluster_output() if self.cluster else "")
        if kind == "file":
            assert len(args) == 1, f"{where}: docs-run: file NAME"
            with open(os.path.join(self.dir, args[0]), "w") as f:
                f.write(text)
            return None
        if kind == "sh":
            argv, stdin = ["bash", "-euo", "pipefail", "-c", self._prelude() + text], None
        else:
            argv = ["bash", "-euo", "pipefail", "-c", self._prelude() + "exec python -"]
            stdin = text
        started = time.monotonic()
        try:
            r = subprocess.run(argv, cwd=self.dir, env=self.env, input=stdin, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=BLOCK_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{where}: still running after {BLOCK_TIMEOUT_S} s:\n{e.output}")
        print(f"--- {where}: status {r.returncode} in {time.monotonic() - started:.1f} s\n{r.stdout}")
        if r.returncode != 0:
            pytest.fail(f"{where}: exit status {r.returncode}; block:\n{text}\noutput:\n{r.stdout}"
                        f"\n--- cluster:\n{self.cluster_output()[-4000:]}")
        return r.stdout

    def close(self):
        if self.cluster is not None and self.cluster.poll() is None:
            os.killpg(self.cluster.pid, signal.SIGINT)  # Ctrl-C, as README.md says
            try:
                self.cluster.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.cluster.pid, signal.SIGKILL)
                self.cluster.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def session():
    from conftest import build_dir
    s = Session(os.path.abspath(build_dir()))
    yield s
    s.close()
    assert s.cluster is None or s.cluster.returncode == 0, \
        f"the cluster ended with status {s.cluster.returncode} on Ctrl-C:\n{s.cluster_output()[-4000:]}"


def test_the_markers_are_well_formed():
    kinds = {page: [b[1] for b in runnable_blocks(page)] for page in PAGES}
    assert kinds["README.md"][:1] == ["cluster"], kinds
    assert all(k != "cluster" for k in kinds["README.md"][1:] + kinds["docs/pytorch.md"]), kinds
    assert {"python", "sh", "file"} <= set(kinds["README.md"]), kinds
    assert "sh" in kinds["docs/pytorch.md"], kinds


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(session, page):
    for line, kind, args, text in runnable_blocks(page):
        session.run(page, line, kind, args, text)


FAKE_LAUNCHER = """
import os, subprocess, sys, time
# A stand-in for `reshard run ... --worker-socket SOCK` and one rank of it.
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                        env=dict(os.environ, RESHARD_WORKER_SOCKET=sys.argv[2]))
time.sleep(600)
"""


def _state(pid):
    """The /proc state letter of `pid`, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _children(pid):
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                           text=True).stdout.split()]


def _with_argv_tail(tail):
    """Pids of the live processes whose command line ends with `tail`."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline") as f:
                argv = f.read().split("\0")[:-1]
        except OSError:
            continue
        if entry.isdigit() and argv[-len(tail):] == tail and _state(entry) not in (None, "Z"):
            out.append(int(entry))
    return out


def _host_command(session, *args):
    """`python deploy/local/cluster.py ARGS` in the user's terminal; its pids."""
    out = session.run("(host command)", 0, "sh", [],
                      "python deploy/local/cluster.py " + " ".join(map(shlex.quote, args)))
    line = [ln for ln in out.splitlines() if ln.startswith(f"{args[0]} {args[1]}: pids ")]
    assert len(line) == 1, out
    return [int(p) for p in line[0].split("pids ", 1)[1].split()]


def test_a_host_fails_and_comes_back_from_the_command_line(session):
    """kill-host / stop-host / continue-host / restart-host (README.md, "Using
    reshard") reach the agent and every process using the host's worker
    socket: a launcher (named on its command line) and its rank ($RESHARD_
    WORKER_SOCKET); restart-host starts the agent and the launcher again."""
    assert session.cluster is not None and session.cluster.poll() is None, \
        "README.md's cluster block did not leave a running cluster"
    work = dict(kv.split("=", 1) for kv in session.exports.split()[1:])["RESHARD_LOCAL_CLUSTER"]
    sock = f"{work}/host-2/worker.sock"
    launcher = subprocess.Popen([sys.executable, "-c", FAKE_LAUNCHER, "--worker-socket", sock],
                                cwd=session.dir, env=session.env, start_new_session=True)
    try:
        rank = wait_for("the rank starts", lambda: _children(launcher.pid))[0]
        stopped = _host_command(session, "stop-host", "host-2")
        agent = stopped[0]
        with open(f"/proc/{agent}/cmdline") as f:
            argv = f.read().split("\0")
        assert argv[0].endswith("/reshard-agent") and argv[1:3] == ["--host-id", "host-2"], argv
        assert stopped == [agent, launcher.pid, rank]
        assert [_state(p) for p in stopped] == ["T", "T", "T"]
        assert _host_command(session, "continue-host", "host-2") == stopped
        assert all(_state(p) not in ("T", None) for p in stopped)

        assert _host_command(session, "kill-host", "host-2") == stopped
        assert launcher.wait(10) == -signal.SIGKILL
        wait_for("the rank is gone", lambda: _state(rank) in (None, "Z"))
        assert _state(agent) in (None, "Z")

        new_agent = _host_command(session, "restart-host", "host-2")[0]
        assert new_agent not in stopped and _state(new_agent) not in (None, "Z", "T")
        relaunched = wait_for("the launcher is started again",
                           lambda: _with_argv_tail(["--worker-socket", sock]))
        assert len(relaunched) == 1 and relaunched[0] != launcher.pid
        wait_for("its rank starts again", lambda: _children(relaunched[0]))
        with open(f"/proc/{relaunched[0]}/cmdline") as f:
            assert f.read().split("\0")[:-1] == [sys.executable, "-c", FAKE_LAUNCHER,
                                                 "--worker-socket", sock]
        out = session.run("(host command)", 0, "sh", [], "reshardctl hosts list")
        assert re.search(r"^host-2\s+ALIVE\s", out, re.M), out

        # --empty: the host comes back without its shared memory (README.md's
        # job left ranks 4 and 5 there).
        shm = f"{work}/host-2/shm"
        assert any(n.startswith("reshard-host-2-") for n in os.listdir(shm)), os.listdir(shm)
        killed = _host_command(session, "kill-host", "host-2", "--empty")
        assert killed[0] == new_agent and relaunched[0] in killed, (killed, relaunched)
        assert not os.path.exists(shm)
        _host_command(session, "restart-host", "host-2")
        assert os.listdir(shm) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_insecure_cluster_and_from_env_without_a_worker_token(tmp_path):
    """`cluster.py --insecure` prints RESHARD_INSECURE=1 in its export line,
    and Client.from_env() of that line reaches it in plaintext; mutual TLS
    variables without the CA are refused naming it."""
    import reshard
    from conftest import build_dir
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = tmp_path / "cluster.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen([os.path.join(REPO, ".venv", "bin", "python"),
                                 os.path.join(REPO, "deploy", "local", "cluster.py"), "--build",
                                 build_dir(), "--hosts", "1", "--insecure"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        line = wait_for("the export line", lambda: [ln for ln in out.read_text().splitlines()
                                                 if ln.startswith("export ")], CLUSTER_START_S)[0]
        exported = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert sorted(exported) == ["RESHARD_COORDINATOR", "RESHARD_INSECURE",
                                    "RESHARD_LOCAL_CLUSTER"], line
        assert exported["RESHARD_INSECURE"] == "1"
        with reshard.Client.from_env(env=exported, timeout=30.0) as c:
            assert [h.host_id for h in c.list_hosts()] == ["host-0"]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, out.read_text()
    with pytest.raises(ValueError, match="RESHARD_TLS_CA not set"):
        reshard.Client.from_env(env={"RESHARD_COORDINATOR": "127.0.0.1:1",
                                     "RESHARD_TLS_CERT": "c.pem", "RESHARD_TLS_KEY": "c.key"})
