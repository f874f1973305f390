"""Who may use an agent's worker socket (docs/security.md, "Workers"): agents
started with --worker-group serve non-root training processes of that group,
which publish and load through descriptors the agent hands them (the shard
files are the agent's alone: test_worker_isolation.py); a process outside
the group cannot connect. Needs root (to run workers as uid nobody)."""

import os
import stat
import subprocess
import sys

import pytest

from helpers import NOBODY, WORKER_GID, every_kind_ptc, register, worker_group_cluster
from reshard import layout

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs workers as another uid")

# Run as the worker: publishes (or loads) every rank of host-0, one line per
# rank: the checksums it got ({"sums": ...}) or the items that differ
# ({"bad": [...]}).
_WORKER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from helpers import print_publish_or_load, worker_process
socket, job_id, mode = sys.argv[2], sys.argv[3], sys.argv[4]
worker_process(socket, job_id, lambda w: print_publish_or_load(w, mode))
"""


@pytest.fixture(scope="module")
def cluster():  # conftest's client fixture connects to this one
    with worker_group_cluster() as c:
        yield c


def run_as(cluster, groups, job_id, mode):
    """Runs _WORKER as uid/gid nobody with supplementary `groups` (a list)."""
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}"]
    setpriv += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, HOME="/tmp", RESHARD_WORKER_TOKEN=cluster.worker_token(job_id))
    return subprocess.run(
        setpriv + [sys.executable, "-c", _WORKER, here, cluster.agents["host-0"].worker_socket,
                   job_id, mode], capture_output=True, text=True, timeout=120, env=env)


def test_socket_and_files_belong_to_the_worker_group(cluster, client):
    st = os.stat(cluster.agents["host-0"].worker_socket)
    assert st.st_gid == WORKER_GID and stat.S_IMODE(st.st_mode) == 0o660


def test_member_of_the_group_publishes_and_loads(cluster, client):
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 1, 1, ["host-0"], 2)
    j = register(client, cluster, "access-member", ptc, lay)
    r = run_as(cluster, [WORKER_GID], j.id, "publish")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2
    files = [os.path.join(cluster.agents["host-0"].shm_dir, f)
             for f in os.listdir(cluster.agents["host-0"].shm_dir) if j.id in f
             and not f.endswith(".meta")]
    assert files
    for f in files:  # sealed: read-only, the agent's alone (workers get descriptors)
        st = os.stat(f)
        assert st.st_gid == os.getegid() and stat.S_IMODE(st.st_mode) == 0o400, f
    r = run_as(cluster, [WORKER_GID], j.id, "load")
    assert r.returncode == 0, r.stderr
    assert all('"bad": []' in line for line in r.stdout.splitlines()), r.stdout


def test_uid_outside_the_group_cannot_connect(cluster, client):
    ptc = every_kind_ptc()
    lay = layout.make_layout(2, 1, 1, ["host-0"], 2)
    j = register(client, cluster, "access-outsider", ptc, lay)
    r = run_as(cluster, [], j.id, "publish")
    assert r.returncode == 3 and r.stdout.strip() == "Unavailable", (r.stdout, r.stderr)
    assert not [f for f in os.listdir(cluster.agents["host-0"].shm_dir) if j.id in f]
