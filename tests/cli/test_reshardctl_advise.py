"""`reshardctl advise` and `reshardctl resize --choose` against a real local
cluster (deploy/local/cluster.py: PostgreSQL, coordinator, four agents):
the table and the JSON agree, the flags reach the coordinator, errors exit
with the documented statuses, and a chosen resize commits the layout that
advise marked best.

Run by CTest (tests/cli/CMakeLists.txt, labels "cli;integration"); by hand:

    RESHARD_BUILD_DIR=build .venv/bin/python -m pytest -v tests/cli/test_reshardctl_advise.py
"""

import json
import os
import re
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The cluster and ctl fixtures are the cluster suite's (one module-scoped
# cluster per module that uses them).
from test_reshardctl_cluster import (  # noqa: E402,F401
    CONFLICT, ERROR, OK, USAGE, cluster, ctl, job_spec, publish, write_json)

# The model behind job_spec: 2 layers, hidden 32, vocabulary 64.
MODEL = ["--heads", "4", "--hidden", "32", "--vocab", "64", "--seq", "16", "--batch", "8"]


@pytest.fixture(scope="module")
def job(cluster, ctl):
    """Job "advised" (tp 2, pp 1, dp 2 on host-0, host-1 x 2), published."""
    with tempfile.TemporaryDirectory(prefix="reshardctl-advise-") as d:
        spec = job_spec("advised", "cli", ["host-0", "host-1"])
        created = ctl.json("jobs", "register", "--spec", write_json(d, "job.json", spec))
    publish(cluster, created["id"], spec, seed=7)
    return created["id"]


def test_help_lists_advise(ctl):
    rc, out, _ = ctl("--help", coordinator=False)
    assert rc == OK and "advise JOB --gpus N" in out and "--choose" in out
    rc, out, _ = ctl("advise", "--help", coordinator=False)
    assert rc == OK and "--horizon" in out and "--heads" in out and "--inter-bw" in out


def test_advise_table_and_json_agree(ctl, job):
    advice = ctl.json("advise", job, "--gpus", "8", *MODEL)
    assert advice["hosts"] == ["host-0", "host-1", "host-2", "host-3"]
    assert advice["host_devices"] == [2, 2, 2, 2]
    assert advice["gpu_type"] == "A100" and advice["horizon_s"] == 3600
    cands = advice["candidates"]
    assert cands, advice
    steps = [c["step_seconds"] for c in cands]
    mems = [c["memory_bytes"] for c in cands]
    assert steps == sorted(steps) and all(a > b for a, b in zip(mems, mems[1:])), cands
    best = advice["best"]
    assert 0 <= best < len(cands) and cands[best]["reconfig_priced"]
    assert all(c["steps_in_horizon"] <= cands[best]["steps_in_horizon"] for c in cands)

    rc, out, err = ctl("advise", job, "--gpus", "8", *MODEL)
    assert rc == OK, err
    assert "offer: host-0 x 2, host-1 x 2, host-2 x 2, host-3 x 2 (A100)" in out, out
    assert re.search(r"TP\s+PP\s+DP\s+MB\s+RECOMPUTE\s+STEP\s+MEMORY/DEV\s+CROSS-HOST\s+MOVE",
                     out), out
    rows = re.findall(r"^([ *])\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(none|selective|full)\s", out,
                      re.MULTILINE)
    assert len(rows) == len(cands), out
    marked = [i for i, r in enumerate(rows) if r[0] == "*"]
    assert marked == [best], out
    c = cands[best]
    assert tuple(int(x) for x in rows[best][1:5]) == (c["tp"], c["pp"], c["dp"], c["micro_batch"])


def test_advise_named_hosts_and_horizon(ctl, job):
    advice = ctl.json("advise", job, "--gpus", "4", "--hosts", "host-3,host-2",
                      "--horizon", "10m", *MODEL)
    assert advice["hosts"] == ["host-3", "host-2"] and advice["horizon_s"] == 600
    for c in advice["candidates"]:
        assert set(c["layout"]["placement"].get("hosts", [])) <= {"host-2", "host-3"}, c


def test_advise_errors(ctl, job):
    rc, out, err = ctl("advise", job, *MODEL)
    assert rc == USAGE and out == "" and "--gpus" in err
    rc, _, err = ctl("advise", job, "--gpus", "0", *MODEL)
    assert rc == USAGE and '--gpus "0"' in err, err
    rc, _, err = ctl("advise", job, "--gpus", "8", "--horizon", "soon", *MODEL)
    assert rc == USAGE and '--horizon "soon"' in err, err
    # The coordinator's refusals: INVALID_ARGUMENT naming the field (exit 1),
    # FAILED_PRECONDITION when the cluster cannot offer it (exit 5).
    rc, _, err = ctl("advise", job, "--gpus", "8", *MODEL[2:])  # no --heads
    assert rc == ERROR and re.match(r"^INVALID_ARGUMENT: .*model\.heads", err), err
    rc, _, err = ctl("advise", job, "--gpus", "8", "--hosts", "host-9", *MODEL)
    assert rc == ERROR and 'hosts[0] "host-9"' in err, err
    rc, _, err = ctl("advise", job, "--gpus", "100", *MODEL)
    assert rc == CONFLICT and re.match(r"^FAILED_PRECONDITION: gpus 100", err), err
    rc, _, err = ctl("resize", job, "--choose", *MODEL)
    assert rc == USAGE and "--gpus" in err, err


def test_resize_choose_commits_the_best_layout(ctl, job):
    advice = ctl.json("advise", job, "--gpus", "8", *MODEL)
    best = advice["candidates"][advice["best"]]
    assert int(best["cross_host_bytes"]) > 0  # a real move, onto host-2 and host-3
    rc, out, err = ctl("resize", job, "--choose", "--gpus", "8", *MODEL, "--output", "json")
    assert rc == OK, err
    op = json.loads(out)
    assert op["state"] == "OPERATION_STATE_COMMITTED", op
    assert op["target_layout"] == best["layout"], (op["target_layout"], best["layout"])
    shown = ctl.json("jobs", "show", job)
    assert int(shown["generation"]) == 2 and shown["layout"] == best["layout"]
