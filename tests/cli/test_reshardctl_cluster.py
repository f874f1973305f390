"""End-to-end tests of the reshardctl binary against a real local cluster.

One LocalCluster (deploy/local/cluster.py: PostgreSQL, reshard-coordinator,
four reshard-agents) per module. The test plays the training workers through
each agent's WorkerService (generated stubs under <build>/python) and the
operator through reshardctl only; it checks exit statuses, stdout (tables
and proto JSON) and the bytes the agents hold afterwards.

Run by CTest (tests/cli/CMakeLists.txt, labels "cli;integration") with
RESHARD_BUILD_DIR set; by hand:

    RESHARD_BUILD_DIR=build .venv/bin/python -m pytest -v tests/cli/test_reshardctl_cluster.py
"""

import json
import mmap
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("RESHARD_BUILD_DIR", os.path.join(REPO, "build")))
sys.path.insert(0, os.path.join(REPO, "deploy", "local"))
sys.path.insert(0, os.path.join(BUILD, "python"))

import grpc  # noqa: E402
from cluster import LocalCluster  # noqa: E402
from reshard.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402

TIMEOUT_S = 120

# Exit statuses (reshardctl --help).
OK, ERROR, USAGE, OP_FAILED, NOT_FOUND, CONFLICT, UNAVAILABLE = 0, 1, 2, 3, 4, 5, 6


# ------------------------------------------------------------------ helpers


def job_spec(name, tenant, hosts):
    """A small GPT-like job, everything data-parallel replicated (so losing
    one data-parallel replica is recoverable): tp 2, pp 1, dp 2 on 2 hosts x 2."""
    def tensor(name, shape, pipeline, layer=0, split_axis=None):
        t = {"name": name, "dtype": "DTYPE_BFLOAT16", "shape": shape,
             "partition": {"pipeline": {"mode": pipeline, "layer": layer}}}
        if split_axis is not None:
            t["partition"]["tp"] = {"mode": "TP_SPLIT", "axis": split_axis}
        return t

    tensors = [tensor("embedding.weight", [64, 32], "PIPELINE_FIRST_STAGE", split_axis=0)]
    for n in range(2):
        tensors.append(tensor(f"layers.{n}.mlp.weight", [64, 32], "PIPELINE_LAYER", n, 0))
        tensors.append(tensor(f"layers.{n}.norm.weight", [32], "PIPELINE_LAYER", n))
    tensors.append(tensor("output.weight", [64, 32], "PIPELINE_LAST_STAGE", split_axis=0))
    return {
        "name": name, "tenant": tenant,
        "ptc": {"num_layers": 2, "tensors": tensors,
                "blobs": [{"name": "step", "size_bytes": 8}]},
        "layout": layout(2, 1, 2, hosts, 2),
    }


def layout(tp, pp, dp, hosts, per_host):
    return {"config": {"tp": tp, "pp": pp, "dp": dp},
            "placement": {"hosts": hosts, "devices_per_host": per_host}}


def write_json(directory, name, obj):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return path


def rank_hosts(lay):
    p = lay["placement"]
    return [h for h in p["hosts"] for _ in range(p["devices_per_host"])]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ctl:
    """Runs reshardctl against the cluster."""

    def __init__(self, cluster):
        self.cluster = cluster

    def __call__(self, *args, coordinator=True, env=None, timeout=TIMEOUT_S):
        # Mutual TLS with the cluster's admin certificate.
        argv = [self.cluster.reshardctl] + self.cluster.ctl_args()
        if coordinator:
            argv += ["--coordinator", self.cluster.coordinator]
        proc = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
        return proc.returncode, proc.stdout, proc.stderr

    def json(self, *args):
        rc, out, err = self(*args, "--output", "json")
        assert rc == OK, f"reshardctl {' '.join(args)}: exit {rc}\n{err}"
        return json.loads(out)


def worker_stub(cluster, host):
    channel = grpc.insecure_channel("unix:" + cluster.agents[host].worker_socket)
    return worker_pb2_grpc.WorkerServiceStub(channel)


def publish(cluster, job_id, spec, seed, generation=1, seeds=None):
    """Publishes `generation` of every rank; returns {rank: {item name: bytes}}.
    `seeds` ({item name: seed}) overrides `seed` for some items.
    Every element is data-parallel replicated and pp is 1, so an item's bytes
    depend only on the rank's tensor-parallel index (for split tensors): the
    replicas agree, as a real job's do."""
    import hashlib
    lay = spec["layout"]
    tp = lay["config"]["tp"]
    split = {t["name"] for t in spec["ptc"]["tensors"]
             if t["partition"].get("tp", {}).get("mode") == "TP_SPLIT"}

    def content(name, rank, size):
        piece = rank % tp if name in split else 0
        out = b""
        counter = 0
        while len(out) < size:
            item_seed = (seeds or {}).get(name, seed)
            out += hashlib.sha256(f"{item_seed}/{name}/{piece}/{counter}".encode()).digest()
            counter += 1
        return out[:size]

    written = {}
    for rank, host in enumerate(rank_hosts(lay)):
        stub = worker_stub(cluster, host)
        token = (("authorization", "Bearer " + cluster.worker_token(job_id)),)
        request = worker_pb2.PublishShardRequest(job_id=job_id, generation=generation, rank=rank)
        deadline = time.monotonic() + 30
        while True:
            try:
                resp = stub.PublishShard(request, timeout=30, metadata=token)
                break
            except grpc.RpcError as e:
                # A checkpoint's generation opens on the agent with its task
                # (next heartbeat): UNAVAILABLE until then, as the Worker retries.
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        items = {}
        with open(resp.path, "r+b") as f, mmap.mmap(f.fileno(), resp.size) as m:
            for item in resp.items:
                data = content(item.name, rank, item.bytes)
                m[item.offset:item.offset + item.bytes] = data
                items[item.name] = data
        stub.SealShard(worker_pb2.SealShardRequest(job_id=job_id, generation=generation, rank=rank),
                       timeout=30, metadata=token)
        written[rank] = items
    return written


def load(cluster, host, job_id, generation, rank):
    resp = worker_stub(cluster, host).OpenGeneration(worker_pb2.OpenGenerationRequest(
        job_id=job_id, generation=generation, rank=rank), timeout=30,
        metadata=(("authorization", "Bearer " + cluster.worker_token(job_id)),))
    with open(resp.path, "rb") as f, mmap.mmap(f.fileno(), resp.size, prot=mmap.PROT_READ) as m:
        return {item.name: bytes(m[item.offset:item.offset + item.bytes]) for item in resp.items}


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(build_dir=BUILD, hosts=4, devices_per_host=2) as c:
        yield c


@pytest.fixture(scope="module")
def ctl(cluster):
    return Ctl(cluster)


@pytest.fixture(scope="module")
def files():
    with tempfile.TemporaryDirectory(prefix="reshardctl-test-") as d:
        yield d


@pytest.fixture(scope="module")
def job(cluster, ctl, files):
    """Job "gpt" on host-0, host-1 with its generation 1 published."""
    spec = job_spec("gpt", "cli", ["host-0", "host-1"])
    created = ctl.json("jobs", "register", "--spec", write_json(files, "gpt.json", spec))
    written = publish(cluster, created["id"], spec, seed=1)
    return {"id": created["id"], "spec": spec, "written": written}


# -------------------------------------------------------------------- tests


def test_help_documents_exit_codes(ctl):
    rc, out, _ = ctl("--help", coordinator=False)
    assert rc == OK
    for cmd in ("jobs list", "jobs show", "resize", "migrate", "recover", "preview", "hosts list",
                "ops watch", "plan"):
        assert cmd in out
    for code in ("NOT_FOUND", "FAILED_PRECONDITION", "UNAVAILABLE"):
        assert code in out
    rc, out, _ = ctl("resize", "--help", coordinator=False)
    assert rc == OK and "--no-wait" in out and "--to" in out


def test_usage_errors(ctl):
    rc, out, err = ctl("resize", "some-job")
    assert rc == USAGE and out == ""
    assert re.match(r"^INVALID_ARGUMENT: .*--to", err)
    rc, _, err = ctl("jobs", "frobnicate")
    assert rc == USAGE and "frobnicate" in err
    rc, _, err = ctl("jobs", "list", "--output", "yaml")
    assert rc == USAGE and "yaml" in err


def test_hosts_list(ctl, cluster):
    rc, out, err = ctl("hosts", "list")
    assert rc == OK, err
    for host in cluster.host_ids:
        assert re.search(rf"^{host}\s+ALIVE\s", out, re.MULTILINE), out
    hosts = ctl.json("hosts", "list")["hosts"]
    assert sorted(h["host_id"] for h in hosts) == cluster.host_ids
    assert all(h["state"] == "HOST_STATE_ALIVE" for h in hosts)


def test_jobs_list_and_show(ctl, job):
    rc, out, err = ctl("jobs", "list")
    assert rc == OK, err
    assert re.search(rf"^{job['id']}\s+gpt\s+cli\s+ACTIVE\s+1\s", out, re.MULTILINE), out
    listed = ctl.json("jobs", "list")["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]
    shown = ctl.json("jobs", "show", job["id"])
    assert shown["id"] == job["id"] and shown["name"] == "gpt"
    assert shown["state"] == "JOB_STATE_ACTIVE"
    assert int(shown["generation"]) == 1
    assert shown["layout"]["config"]["dp"] == 2
    rc, out, err = ctl("jobs", "show", job["id"])
    assert rc == OK, err
    assert re.search(r"^layout:\s+tp 2, pp 1, dp 2 \(4 ranks\) on host-0, host-1 x 2", out,
                     re.MULTILINE), out
    # A filter that matches nothing.
    assert ctl.json("jobs", "list", "--tenant", "nobody").get("jobs", []) == []


def test_preview(ctl, job, files):
    target = write_json(files, "preview.json", layout(2, 1, 2, ["host-2", "host-3"], 2))
    rc, out, err = ctl("preview", job["id"], "--to", target)
    assert rc == OK, err
    assert re.search(r"cross / lower bound:\s+1\.000", out), out
    stats = ctl.json("preview", job["id"], "--to", target)["stats"]
    assert int(stats["bytes_cross_host"]) > 0
    assert int(stats["bytes_cross_host"]) == int(stats["lower_bound_cross_host"])


def test_unknown_job_is_exit_4(ctl, files):
    missing = "0123456789abcdef0123456789abcdef"
    rc, out, err = ctl("jobs", "show", missing)
    assert rc == NOT_FOUND and out == ""
    assert re.match(rf'^NOT_FOUND: .*{missing}', err), err
    target = write_json(files, "any.json", layout(2, 1, 1, ["host-2"], 2))
    rc, _, err = ctl("resize", missing, "--to", target)
    assert rc == NOT_FOUND and err.startswith("NOT_FOUND: "), err
    rc, _, err = ctl("ops", "watch", "no-such-operation")
    assert rc == NOT_FOUND, err


def test_coordinator_down_is_exit_6(ctl):
    dead = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    rc, out, err = ctl("jobs", "list", "--coordinator", dead, coordinator=False)
    assert rc == UNAVAILABLE and out == "", err
    assert re.match(r"^(UNAVAILABLE|DEADLINE_EXCEEDED): ", err), err
    assert time.monotonic() - start < 30
    # The same through $RESHARD_COORDINATOR.
    rc, _, err = ctl("hosts", "list", coordinator=False, env={"RESHARD_COORDINATOR": dead})
    assert rc == UNAVAILABLE, err


def test_resize_waits_and_prints_json(ctl, cluster, job, files):
    # tp 2, dp 1 on host-2: new ranks 0 and 1 are old ranks 0 and 1.
    target = write_json(files, "to-host-2.json", layout(2, 1, 1, ["host-2"], 2))
    rc, out, err = ctl("resize", job["id"], "--to", target, "--output", "json")
    assert rc == OK, err
    op = json.loads(out)
    assert op["state"] == "OPERATION_STATE_COMMITTED", op
    assert int(op["to_generation"]) == 2
    assert int(op["bytes_done"]) == int(op["bytes_total"]) > 0
    # Not a terminal: plain progress lines on stderr, the last one final.
    assert re.search(rf"operation {op['id']}: COMMITTED", err), err
    for rank in (0, 1):
        assert load(cluster, "host-2", job["id"], 2, rank) == job["written"][rank]
    shown = ctl.json("jobs", "show", job["id"])
    assert int(shown["generation"]) == 2 and shown["state"] == "JOB_STATE_ACTIVE"


def test_second_resize_conflicts_then_watch(ctl, cluster, job, files):
    # host-3's agent is paused (shorter than the lease), so the first
    # operation cannot finish before the second request arrives.
    target = write_json(files, "to-host-3.json", layout(2, 1, 1, ["host-3"], 2))
    other = write_json(files, "to-host-0.json", layout(2, 1, 1, ["host-0"], 2))
    agent_pid = cluster.agents["host-3"].pid
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        rc, out, err = ctl("resize", job["id"], "--to", target, "--no-wait")
        assert rc == OK, err
        op_id = out.strip()
        assert re.fullmatch(r"[0-9a-zA-Z_-]+", op_id), out
        rc, out, err = ctl("resize", job["id"], "--to", other, "--no-wait")
        assert rc == CONFLICT and out == "", err
        assert err.startswith("FAILED_PRECONDITION: ") and op_id in err, err
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    rc, out, err = ctl("ops", "watch", op_id)
    assert rc == OK, err
    assert re.search(r"^state:\s+COMMITTED", out, re.MULTILINE), out
    for rank in (0, 1):
        assert load(cluster, "host-3", job["id"], 3, rank) == job["written"][rank]

    # Watching a finished operation returns at once, in JSON too.
    op = ctl.json("ops", "watch", op_id)
    assert op["id"] == op_id and op["state"] == "OPERATION_STATE_COMMITTED"


def test_progress_bar_on_a_terminal(ctl, cluster, job):
    # A --no-wait resize back to host-2, then `ops watch` with stderr on a pty.
    target = write_json(tempfile.mkdtemp(), "back.json", layout(2, 1, 1, ["host-2"], 2))
    rc, out, err = ctl("resize", job["id"], "--to", target, "--no-wait")
    assert rc == OK, err
    op_id = out.strip()
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([cluster.reshardctl, "--coordinator", cluster.coordinator,
                                 *cluster.ctl_args(), "ops", "watch", op_id],
                                stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        slave = None
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        tty = b""
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            tty += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert proc.returncode == OK, tty
    text = tty.decode(errors="replace")
    assert "\r" in text and re.search(r"COMMITTED \[#+\]\s+100\.0%", text), repr(text)


def test_operation_aborted_is_exit_3(ctl, job, files):
    # A host without an agent: the coordinator accepts, then aborts.
    target = write_json(files, "to-nowhere.json", layout(2, 1, 1, ["host-99"], 2))
    rc, out, err = ctl("resize", job["id"], "--to", target, "--output", "json")
    assert rc == OP_FAILED, err
    op = json.loads(out)
    assert op["state"] in ("OPERATION_STATE_ABORTED", "OPERATION_STATE_FAILED")
    assert "host-99" in op["error"]
    assert re.search(r"operation \S+ (ABORTED|FAILED): .*host-99", err), err


def test_lost_host_and_recover(ctl, cluster, files):
    spec = job_spec("gpt-recover", "cli", ["host-0", "host-1"])
    created = ctl.json("jobs", "register", "--spec", write_json(files, "recover.json", spec))
    job_id = created["id"]
    written = publish(cluster, job_id, spec, seed=2)

    cluster.kill_agent("host-1")
    deadline = time.monotonic() + 30
    while True:
        hosts = {h["host_id"]: h["state"] for h in ctl.json("hosts", "list")["hosts"]}
        if hosts["host-1"] == "HOST_STATE_LOST":
            break
        assert time.monotonic() < deadline, f"host-1 not LOST: {hosts}"
        time.sleep(0.5)
    rc, out, err = ctl("hosts", "list")
    assert rc == OK and re.search(r"^host-1\s+LOST\s", out, re.MULTILINE), out
    shown = ctl.json("jobs", "show", job_id)
    assert shown["lost_hosts"] == ["host-1"]
    assert shown["state"] == "JOB_STATE_DEGRADED"

    # Without --to: the same config with dp shrunk onto the survivors
    # (host-0), one copy where the job had a replica on each host: refused
    # (exit 5, FAILED_PRECONDITION naming what is lost) unless accepted.
    rc, out, err = ctl("recover", job_id, "--lost", "host-1", "--output", "json")
    assert rc == CONFLICT, (rc, out, err)
    assert ("the recovery to tp 2 pp 1 dp 1 on host-0:0 host-0:1 loses its ability to survive "
            "the loss of any one host") in err, err
    assert "set accept_degraded to recover anyway" in err, err
    assert int(ctl.json("jobs", "show", job_id)["generation"]) == 1
    rc, out, err = ctl("recover", job_id, "--lost", "host-1", "--accept-degraded", "--output",
                       "json")
    assert rc == OK, err
    op = json.loads(out)
    assert op["state"] == "OPERATION_STATE_COMMITTED", op
    assert op["kind"] == "OPERATION_KIND_RECOVER"
    shown = ctl.json("jobs", "show", job_id)
    assert int(shown["generation"]) == 2 and shown["state"] == "JOB_STATE_ACTIVE"
    assert shown["layout"]["config"]["dp"] == 1
    for rank in (0, 1):
        assert load(cluster, "host-0", job_id, 2, rank) == written[rank]


def test_auth_tokens_create_use_revoke(ctl, cluster):
    # An admin (the cluster's admin certificate) creates a viewer token of one tenant.
    created = ctl.json("auth", "create", "--name", "ci-viewer", "--role", "viewer",
                       "--tenants", "team-x", "--ttl", "1h")
    token, token_id = created["bearer_token"], created["token"]["id"]
    assert token.startswith(token_id + ".")
    secret = token.split(".", 1)[1]

    def as_token(*args):
        # TLS without a client certificate: the token alone identifies.
        proc = subprocess.run([cluster.reshardctl, "--coordinator", cluster.coordinator,
                               "--tls-ca", cluster.pki.ca, *args], capture_output=True,
                              text=True, timeout=TIMEOUT_S,
                              env=dict(os.environ, RESHARD_TOKEN=token))
        return proc.returncode, proc.stdout, proc.stderr

    rc, out, err = as_token("jobs", "list", "--tenant", "team-x")
    assert rc == OK, err
    rc, _, err = as_token("jobs", "list", "--tenant", "team-y")
    assert rc == ERROR and err.startswith("PERMISSION_DENIED: "), err
    assert "team-y" in err and secret not in err
    listed = ctl.json("auth", "list")
    assert [t["id"] for t in listed["tokens"]] == [token_id]
    assert secret not in json.dumps(listed)

    rc, out, err = ctl("auth", "revoke", token_id)
    assert rc == OK, err
    rc, _, err = as_token("jobs", "list", "--tenant", "team-x")
    assert rc == ERROR and err.startswith("UNAUTHENTICATED: "), err
    assert "revoked" in err and secret not in err
    # Only an admin manages tokens.
    rc, _, err = as_token("auth", "list")
    assert rc == ERROR and err.startswith("UNAUTHENTICATED: "), err


def test_audit_lists_who_did_what(ctl, cluster, files):
    spec = job_spec("audited", "aud", ["host-0", "host-1"])
    created = ctl.json("jobs", "register", "--spec", write_json(files, "audited.json", spec))
    job_id = created["id"]
    rc, _, err = ctl("jobs", "delete", job_id)
    assert rc == OK, err

    token = ctl.json("auth", "create", "--name", "aud-viewer", "--role", "viewer",
                     "--tenants", "aud", "--ttl", "1h")["bearer_token"]
    secret = token.split(".", 1)[1]

    def as_viewer(*args):
        proc = subprocess.run([cluster.reshardctl, "--coordinator", cluster.coordinator,
                               "--tls-ca", cluster.pki.ca, *args], capture_output=True,
                              text=True, timeout=TIMEOUT_S,
                              env=dict(os.environ, RESHARD_TOKEN=token))
        return proc.returncode, proc.stdout, proc.stderr

    # A viewer may not register: refused, and recorded.
    rc, _, err = as_viewer("jobs", "register", "--spec", write_json(files, "audited.json", spec))
    assert rc == ERROR and err.startswith("PERMISSION_DENIED: "), err

    rc, out, err = as_viewer("audit", "--tenant", "aud", "--json")
    assert rc == OK, err
    entries = json.loads(out)["entries"]
    assert [(e["method"], e["code"]) for e in entries] == [
        ("RegisterJob", "PERMISSION_DENIED"), ("DeleteJob", "OK"), ("RegisterJob", "OK")]
    assert entries[0]["identity"].startswith("token:") and entries[0]["role"] == "viewer"
    assert entries[1]["job_id"] == entries[2]["job_id"] == job_id
    assert entries[2]["identity"] == entries[1]["identity"] != ""
    assert secret not in out

    # The table, filtered by job, limited, and since a time.
    rc, out, err = ctl("audit", "--job", job_id)
    assert rc == OK, err
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["TIME", "IDENTITY", "ROLE", "TENANT", "METHOD"]
    assert [line.split()[4] for line in lines[1:]] == ["DeleteJob", "RegisterJob"]
    assert len(ctl.json("audit", "--job", job_id, "--limit", "1")["entries"]) == 1
    assert len(ctl.json("audit", "--job", job_id, "--since", "1h")["entries"]) == 2
    rc, out, err = ctl("audit", "--job", job_id, "--since", "2099-01-01T00:00:00Z")
    assert rc == OK and "(no audit entries)" in out, err

    # A viewer sees only its tenants; bad flags are usage errors naming the flag.
    rc, _, err = as_viewer("audit", "--tenant", "cli")
    assert rc == ERROR and err.startswith("PERMISSION_DENIED: ") and "cli" in err, err
    rc, _, err = ctl("audit", "--since", "yesterday")
    assert rc == USAGE and "--since" in err, err
    rc, _, err = ctl("audit", "--limit", "0")
    assert rc == USAGE and "--limit" in err, err


def test_python_client_audit_matches_reshardctl(ctl, cluster, files):
    # The Python SDK's audit() reads the same trail (newest first, limited,
    # filtered), and a refusal of the Python client is recorded too.
    import reshard
    spec = job_spec("audited-py", "aud-py", ["host-0", "host-1"])
    job_id = ctl.json("jobs", "register", "--spec", write_json(files, "audited-py.json", spec))["id"]
    with cluster.client() as client:
        client.delete_job(job_id)
        with pytest.raises(reshard.NotFound):
            client.delete_job(job_id)
        entries = client.audit(job_id=job_id)
        assert [(e.method, e.code) for e in entries] == [
            ("DeleteJob", "NOT_FOUND"), ("DeleteJob", "OK"), ("RegisterJob", "OK")]
        assert entries[0].id > entries[1].id > entries[2].id
        assert all(e.tenant == "aud-py" for e in entries[1:])
        assert len(client.audit(job_id=job_id, limit=2)) == 2
        assert [e.job_id for e in client.audit(tenant="aud-py")] == [job_id] * 2
        with pytest.raises(ValueError):
            client.audit(limit=0)
    listed = ctl.json("audit", "--job", job_id)["entries"]
    assert [int(e["id"]) for e in listed] == [e.id for e in entries]  # int64: JSON strings


def test_stop_free_migrate_prepares_then_cuts_over(ctl, cluster, files):
    # A job with a dataset state, so that its old layout can cut over at a
    # step; on hosts whose agents the other tests leave running (not host-1).
    import types
    spec = job_spec("gpt-stop-free", "cli", ["host-2", "host-3"])
    data = {"dataset": {"id": "tokens", "num_samples": 1000, "fingerprint": "sha1:abc"},
            "order": {"seed": 7, "shuffle": "SHUFFLE_FULL"}, "global_batch": 8}
    with cluster.client() as client:
        job_id = client.register_job(spec, dataset_state=data).id
        publish(cluster, job_id, spec, seed=3)
        target = write_json(files, "stop-free.json", layout(2, 1, 2, ["host-0", "host-2"], 2))
        rc, out, err = ctl("migrate", job_id, "--to", target, "--stop-free", "--no-wait")
        assert rc == OK, err
        op_id = out.strip()

        # Planned, then it waits (the job trains on); the table says for what.
        deadline = time.monotonic() + 30
        while ctl.json("ops", "show", op_id)["state"] != "OPERATION_STATE_PLANNED":
            assert time.monotonic() < deadline, ctl.json("ops", "show", op_id)
            time.sleep(0.1)
        rc, out, err = ctl("ops", "show", op_id)
        assert rc == OK, err
        assert re.search(r"^stop-free:\s+yes$", out, re.MULTILINE), out
        assert re.search(r"^prepared:\s+- \(waiting for mark-prepared( and the agents)?\)$",
                         out, re.MULTILINE), out
        assert re.search(r"^pause:\s+-$", out, re.MULTILINE), out

        # The agents prepare on their own (a pre-copy from generation 1);
        # then the workers' mark-prepared makes the operation prepared.
        wait_op(ctl, op_id, lambda o: int(o.get("agents_prepared_unix_ms", 0)) > 0,
                "agents prepared")
        rc, out, err = ctl("ops", "show", op_id)
        assert rc == OK, err
        assert re.search(r"^prepared:\s+- \(waiting for mark-prepared\)$", out, re.MULTILINE), out
        assert re.search(r"^pre-copied:\s+.* from generation 1$", out, re.MULTILINE), out
        rc, out, err = ctl("ops", "mark-prepared", op_id)
        assert rc == OK, err
        assert re.search(r"^prepare:\s+\d+\.\d{3}s \(created -> prepared\)$", out,
                         re.MULTILINE), out
        assert re.search(r"^cut over:\s+- \(waiting", out, re.MULTILINE), out

        # The old layout cuts over at step 3: a checkpoint naming the
        # operation, which its ranks publish (other bytes than generation 1's).
        fingerprint = client.get_job(job_id).dataset_state.layout_fingerprint
        step = types.SimpleNamespace(step=3, cursor=3 * 8, layout_fingerprint=fingerprint)
        cut = client.checkpoint(job_id, dataset_state=step, cut_over_operation_id=op_id)
        written = publish(cluster, job_id, spec, seed=4, generation=cut.to_generation)

    rc, out, err = ctl("ops", "watch", op_id, "--output", "json")
    assert rc == OK, err
    op = json.loads(out)
    assert op["state"] == "OPERATION_STATE_COMMITTED", op
    assert op["stop_free"] is True and op["cutover_operation_id"] == cut.id, op
    assert (int(op["from_generation"]), int(op["to_generation"])) == (2, 3), op
    assert op["prepare_seconds"] > 0 and op["pause_seconds"] > 0, op
    rc, out, err = ctl("ops", "show", op_id)
    assert rc == OK, err
    assert re.search(rf"^cut over:\s+.* by checkpoint {cut.id}$", out, re.MULTILINE), out
    assert re.search(r"^pause:\s+\d+\.\d{3}s \(cut-over -> commit\)$", out, re.MULTILINE), out
    # Same config: each new rank holds what the old rank published at step 3.
    for rank, host in enumerate(rank_hosts(layout(2, 1, 2, ["host-0", "host-2"], 2))):
        assert load(cluster, host, job_id, 3, rank) == written[rank], rank
    assert int(ctl.json("jobs", "show", job_id)["dataset_state"]["step"]) == 3

    # Only a stop-free operation in PLANNED can be marked prepared.
    rc, out, err = ctl("ops", "mark-prepared", op_id)
    assert rc == CONFLICT and out == "", err
    assert err.startswith("FAILED_PRECONDITION: ") and op_id in err, err


def wait_op(ctl, op_id, ready, what, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        op = ctl.json("ops", "show", op_id)
        if ready(op):
            return op
        assert time.monotonic() < deadline, (what, op)
        time.sleep(0.05)


def open_code(cluster, host, job_id, generation, rank):
    try:
        load(cluster, host, job_id, generation, rank)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def generation_files(cluster, host, job_id, generation):
    """The agent's shared-memory rank buffer files of one generation."""
    prefix = f"reshard-{host}-{job_id}-g{generation}-r"
    return sorted(f for f in os.listdir(cluster.agents[host].shm_dir)
                  if f.startswith(prefix) and not f.endswith(".meta"))


def test_stop_free_agents_precopy_and_move_only_what_changed(ctl, cluster, files):
    # The agents prepare a stop-free migrate while the old layout trains: the
    # new buffers are allocated and pre-copied from generation 1, unsealed.
    # At the cut-over only the shards the checkpoint changed move again, and
    # the result is the checkpoint's state exactly (docs/coordinator.md,
    # "Agents prepare").
    import types
    spec = job_spec("gpt-precopy", "cli", ["host-2", "host-3"])
    data = {"dataset": {"id": "tokens", "num_samples": 1000, "fingerprint": "sha1:abc"},
            "order": {"seed": 7, "shuffle": "SHUFFLE_FULL"}, "global_batch": 8}
    target_layout = layout(2, 1, 2, ["host-0", "host-2"], 2)
    with cluster.client() as client:
        job_id = client.register_job(spec, dataset_state=data).id
        publish(cluster, job_id, spec, seed=3)
        target = write_json(files, "precopy.json", target_layout)
        rc, out, err = ctl("migrate", job_id, "--to", target, "--stop-free", "--no-wait")
        assert rc == OK, err
        op_id = out.strip()

        # Generation 2 is reserved for the cut-over checkpoint: the agents
        # prepare generation 3 and are done before any worker is.
        op = wait_op(ctl, op_id, lambda o: int(o.get("agents_prepared_unix_ms", 0)) > 0,
                     "agents prepared")
        assert op["state"] == "OPERATION_STATE_PLANNED", op
        assert int(op["to_generation"]) == 3 and int(op["prepared_from_generation"]) == 1, op
        assert int(op.get("prepared_unix_ms", 0)) == 0, op  # no MarkPrepared yet
        # host-0 is new: every byte it holds at generation 3 was pre-copied.
        spec_path = write_json(files, "precopy-spec.json", spec)
        rc, out, err = ctl("plan", "--spec", spec_path, "--to", target, "--format", "json")
        assert rc == OK, err
        plan = json.loads(out)
        assert not plan.get("zero_fills"), plan.get("zero_fills")
        step_bytes = [int(s["bytes"]) * len(s["dsts"]) for s in plan["steps"]]
        assert int(op["bytes_precopied"]) == sum(step_bytes), op
        # The prepared buffers exist on the new host, and they are not a
        # generation a worker may open (unsealed).
        assert len(generation_files(cluster, "host-0", job_id, 3)) == 2
        assert open_code(cluster, "host-2", job_id, 3, 2) == grpc.StatusCode.FAILED_PRECONDITION

        # A cut-over before MarkPrepared is refused, naming it.
        fingerprint = client.get_job(job_id).dataset_state.layout_fingerprint
        step = types.SimpleNamespace(step=5, cursor=5 * 8, layout_fingerprint=fingerprint)
        with pytest.raises(Exception) as refused:
            client.checkpoint(job_id, dataset_state=step, cut_over_operation_id=op_id)
        assert "MarkPrepared" in str(refused.value), refused.value
        client.mark_prepared(op_id)
        op = ctl.json("ops", "show", op_id)
        assert int(op["prepared_unix_ms"]) >= max(int(op["agents_prepared_unix_ms"]),
                                                  int(op["workers_prepared_unix_ms"])), op

        # The old layout trained on: at step 5 two tensors changed, the rest
        # (and the blob) did not.
        changed = {"layers.0.mlp.weight", "output.weight"}
        cut = client.checkpoint(job_id, dataset_state=step, cut_over_operation_id=op_id)
        assert cut.to_generation == 2, cut
        written = publish(cluster, job_id, spec, seed=3, generation=2,
                          seeds={name: 4 for name in changed})

    rc, out, err = ctl("ops", "watch", op_id, "--output", "json")
    assert rc == OK, err
    op = json.loads(out)
    assert op["state"] == "OPERATION_STATE_COMMITTED", op
    assert (int(op["from_generation"]), int(op["to_generation"])) == (2, 3), op
    names = [item["name"] for item in plan["items"]]
    unchanged = sum(b for s, b in zip(plan["steps"], step_bytes)
                    if names[int(s.get("item", 0))] not in changed)
    assert 0 < unchanged < sum(step_bytes)
    assert int(op["bytes_skipped_unchanged"]) == unchanged, op
    assert int(op["bytes_total"]) == sum(step_bytes) - unchanged, op
    # Every new rank holds the checkpoint's bytes, changed and unchanged alike.
    for rank, host in enumerate(rank_hosts(target_layout)):
        assert load(cluster, host, job_id, 3, rank) == written[rank], rank


def test_stop_free_cancelled_while_prepared_drops_the_prepared_buffers(ctl, cluster, files):
    # An operation cancelled after its agents prepared: the pre-copied
    # generation is discarded on every host and the job stays where it was.
    spec = job_spec("gpt-precopy-cancel", "cli", ["host-2", "host-3"])
    data = {"dataset": {"id": "tokens", "num_samples": 1000, "fingerprint": "sha1:abc"},
            "order": {"seed": 7, "shuffle": "SHUFFLE_FULL"}, "global_batch": 8}
    with cluster.client() as client:
        job_id = client.register_job(spec, dataset_state=data).id
        written = publish(cluster, job_id, spec, seed=5)
    target = write_json(files, "precopy-cancel.json", layout(2, 1, 2, ["host-0", "host-2"], 2))
    rc, out, err = ctl("migrate", job_id, "--to", target, "--stop-free", "--no-wait")
    assert rc == OK, err
    op_id = out.strip()
    wait_op(ctl, op_id, lambda o: int(o.get("agents_prepared_unix_ms", 0)) > 0, "agents prepared")
    assert len(generation_files(cluster, "host-0", job_id, 3)) == 2
    assert len(generation_files(cluster, "host-2", job_id, 3)) == 2
    assert open_code(cluster, "host-2", job_id, 3, 2) == grpc.StatusCode.FAILED_PRECONDITION
    rc, out, err = ctl("ops", "cancel", op_id)
    assert rc == OK, err
    op = wait_op(ctl, op_id, lambda o: o["state"] == "OPERATION_STATE_ABORTED", "aborted")
    # The agents drop the prepared buffers on their next heartbeat.
    deadline = time.monotonic() + 30
    for host in ("host-0", "host-2"):
        while generation_files(cluster, host, job_id, 3):
            assert time.monotonic() < deadline, (host, generation_files(cluster, host, job_id, 3))
            time.sleep(0.05)
    assert open_code(cluster, "host-2", job_id, 3, 2) == grpc.StatusCode.NOT_FOUND
    assert int(ctl.json("jobs", "show", job_id)["generation"]) == 1
    for rank, host in enumerate(rank_hosts(spec["layout"])):
        assert load(cluster, host, job_id, 1, rank) == written[rank], rank
