"""Registration by the product (issue 34, item 2): `reshard run --job-name`
registers a job that does not exist yet from its ranks' own describe() and
the script's DatasetState, then trains it with the same ranks; `reshard
register` does it for a scheduler (from the script, or from a PTC file), and
refuses bad input with the gRPC code and the field.

A real local cluster (PostgreSQL, coordinator, 2 agents of 2 devices, mutual
TLS); the quickstart (tests/python/torch2/train.py) at tp 2 x dp 2 on both
hosts, gloo on CPU. The registering credential is a scheduler token of the
tenant; the ranks only ever hold the job's worker token.
"""

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import time

import grpc
import pytest

import reshard
from reshard import layout

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
TORCH2 = os.path.join(HERE, "torch2")
sys.path.insert(0, TORCH2)
import uninterrupted  # noqa: E402
import tiny_transformer as my  # noqa: E402

TENANT = "training"
STEPS = 4
HOSTS = ["host-0", "host-1"]


dataset = uninterrupted.dataset


def _dataset_at(committed, step):
    """train.py's DatasetState after `step` steps, with the output-only
    fields (when it was committed) of `committed`."""
    return dataclasses.replace(
        dataset(), step=step, cursor=step * my.GLOBAL_BATCH,
        committed_generation=committed.committed_generation,
        committed_unix_ms=committed.committed_unix_ms)


def _without_rng_capacity(ptc):
    out = reshard.ptc_pb2.Ptc()
    out.CopyFrom(ptc)
    for blob in out.blobs:
        if blob.name == "rng":
            blob.size_bytes = 0
    return out


def first_layout():
    return layout.make_layout(2, 1, 2, hosts=HOSTS, devices_per_host=2)


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    from conftest import build_dir
    with LocalCluster(build_dir=build_dir(), hosts=2, devices_per_host=2,
                      heartbeat_ms=200) as c:
        yield c


def _token(cluster, tmp_path, role, tenants=(TENANT,)):
    """A bearer token (CreateToken as the cluster's admin) in a file."""
    from reshard.v1 import coordinator_pb2, coordinator_pb2_grpc
    cert, key = cluster.pki.issue(cluster.ADMIN)
    with grpc.secure_channel(cluster.coordinator,
                             reshard.tls_credentials(cluster.pki.ca, cert, key)) as channel:
        created = coordinator_pb2_grpc.AuthServiceStub(channel).CreateToken(
            coordinator_pb2.CreateTokenRequest(name=f"{role}-{tmp_path.name}", role=role,
                                               tenants=list(tenants)), timeout=10)
    path = tmp_path / f"{role}.token"
    path.write_text(created.bearer_token + "\n")
    return str(path)


def _env(**extra):
    import reshard as pkg
    root = os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__)))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, TORCH2,
                                                      os.environ.get("PYTHONPATH")) if p))
    for name in ("RESHARD_WORKER_TOKEN", "RESHARD_REGISTER_TOKEN", "RESHARD_TOKEN"):
        env.pop(name, None)  # the launcher gets the worker token from RegisterJob
    env.update(extra)
    return env


def _jobs_named(client, name):
    return [j for j in client.iter_jobs(tenant=TENANT) if j.name == name]


def _register_argv(cluster, name, token_file, *extra, hosts=HOSTS, devices=2, tp=2):
    return [sys.executable, "-m", "reshard", "register", "--coordinator", cluster.coordinator,
            "--tenant", TENANT, "--name", name, "--token-file", token_file,
            "--tls-ca", cluster.pki.ca, "--hosts", ",".join(hosts),
            "--devices-per-host", str(devices), "--tp", str(tp), *extra]


def _run(argv, timeout=180):
    return subprocess.run(argv, env=_env(), cwd=TORCH2, capture_output=True, text=True,
                          timeout=timeout)


def _check_registered(job, ptc, name):
    """The job as registered: the PTC, the first layout (generation 1's)."""
    assert job.name == name and job.tenant == TENANT
    assert job.ptc == ptc
    assert job.layout == first_layout() or job.generation > 1


def test_run_registers_and_trains_the_quickstart(cluster, tmp_path):
    """Two launchers started at once on a job that does not exist: the one
    on rank 0's host registers it from rank 0's describe() (the other finds
    it), the same ranks then publish generation 1 and train to the end;
    the job has the describe()'s PTC, the flags' layout, train.py's
    DatasetState at its last step, and every loss is the one-process run's."""
    name = f"quickstart-{os.getpid()}"
    sched = _token(cluster, tmp_path, "scheduler")
    log = str(tmp_path / "train.jsonl")
    env = _env(TRAIN_LOG=log, STEPS=str(STEPS), CKPT_EVERY="2")
    launchers, ports = {}, _port_range()
    for host in HOSTS:
        argv = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
                "--job-name", name, "--tenant", TENANT, "--register-token-file", sched,
                "--hosts", ",".join(HOSTS), "--devices-per-host", "2", "--tp", "2",
                "--host", host, "--worker-socket", cluster.agents[host].worker_socket,
                "--tls-ca", cluster.pki.ca, "--rdzv-host-pattern", "127.0.0.1",
                "--rdzv-port-range", ports,
                "--log-dir", str(tmp_path / "logs"),
                "--events", str(tmp_path / f"events-{host}.jsonl"),
                "--", sys.executable, os.path.join(TORCH2, "train.py")]
        with open(tmp_path / f"launcher-{host}.log", "w") as out:
            launchers[host] = subprocess.Popen(argv, env=env, cwd=TORCH2, stdout=out,
                                               stderr=subprocess.STDOUT,
                                               start_new_session=True)
    try:
        t0 = time.monotonic()
        recs = _wait(launchers, log, lambda rs: len([r for r in rs if "end" in r]) == 4,
                     tmp_path, timeout=120)
        print(f"reshard run: registered and trained in {time.monotonic() - t0:.1f} s")
        with cluster.client() as admin:
            jobs = _jobs_named(admin, name)
            assert len(jobs) == 1, jobs
            job = admin.get_job(jobs[0].id, include_ptc=True)
            # Generation 1 at the flags' layout, then checkpoints only.
            assert job.layout == first_layout()
            assert job.layout_epoch == 0
            # Its PTC is describe()'s of the quickstart's model: the one
            # `reshard register -- train.py` derives too (at one rank: every
            # field equal but the capacity of the per-rank `rng` blob, the
            # largest pickled RNG state of the world's ranks, times 2).
            described = admin.get_job(_register_from_script(cluster, tmp_path, sched),
                                      include_ptc=True).ptc
            assert _without_rng_capacity(job.ptc) == _without_rng_capacity(described)
            rng = [b for b in job.ptc.blobs if b.name == "rng"]
            assert len(rng) == 1 and rng[0].scope == reshard.ptc_pb2.BLOB_PER_RANK
            assert rng[0].regenerable and rng[0].size_bytes > 0
            # train.py's DatasetState, committed at its last step.
            committed = admin.dataset_state(job.id)
            assert committed == _dataset_at(committed, STEPS)
        # The same ranks trained: each started fresh (published generation
        # 1), one world per host (no restart after the registration), every
        # loss the one-process run's.
        ends = [r for r in recs if "end" in r]
        assert sorted(r["rank"] for r in ends) == [0, 1, 2, 3]
        assert {r["started"] for r in ends} == {"fresh"}
        reference = uninterrupted.run(STEPS)[0]
        for r in recs:
            if "loss" in r:
                assert r["loss"] == pytest.approx(reference[r["step"] - 1], rel=1e-9), r
        assert {r["step"] for r in recs if "loss" in r} == set(range(1, STEPS + 1))
        for host in HOSTS:
            with open(tmp_path / f"events-{host}.jsonl") as f:
                worlds = [e for e in map(json.loads, f) if e["event"] == "world"]
            assert [(w["world"], w["ranks"]) for w in worlds] == [
                ("g1", [0, 1] if host == "host-0" else [2, 3])], worlds
        # Deleting the job ends both launchers (exit 0), as for any job.
        with cluster.client() as admin:
            admin.delete_job(job.id)
        for host, p in launchers.items():
            assert p.wait(timeout=60) == 0, f"{host}: {p.returncode}\n{_tails(tmp_path)}"
    finally:
        for p in launchers.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def _port_range():
    import random
    import socket
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - 10)
        try:
            for port in range(base, base + 10):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return f"{base}-{base + 9}"
        except OSError:
            continue
    raise RuntimeError("no 10 free consecutive ports in 20000-32000")


def _wait(launchers, log, until, tmp_path, timeout):
    end = time.monotonic() + timeout
    while True:
        recs = []
        if os.path.exists(log):
            with open(log) as f:
                recs = [json.loads(line) for line in f if line.endswith("\n")]
        if until(recs):
            return recs
        for host, p in launchers.items():
            if p.poll() is not None:
                raise AssertionError(f"the launcher of {host} exited {p.returncode}\n"
                                     f"{_tails(tmp_path)}")
        if time.monotonic() > end:
            raise AssertionError(f"not trained after {timeout} s\n{_tails(tmp_path)}")
        time.sleep(0.1)


def _tails(tmp_path):
    logs = tmp_path / "logs"
    out = []
    for host in HOSTS:
        path = tmp_path / f"launcher-{host}.log"
        if path.exists():
            out.append(f"--- launcher {host}\n" + "".join(path.read_text().splitlines(True)[-15:]))
    for name in sorted(os.listdir(logs)) if logs.is_dir() else []:
        with open(logs / name, errors="replace") as f:
            out.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
    return "\n".join(out)


def _register_from_script(cluster, tmp_path, sched):
    """`reshard register -- python train.py`: the scheduler's way, the
    script's first-layout ranks run here only to describe the job; at one
    rank (the quickstart's PTC does not depend on the layout)."""
    name = f"scheduler-{os.getpid()}"
    out = tmp_path / "wt"
    t0 = time.monotonic()
    p = _run(_register_argv(cluster, name, sched, "--worker-token-file", str(out), "--",
                            sys.executable, os.path.join(TORCH2, "train.py"),
                            hosts=["host-0"], devices=1, tp=1))
    assert p.returncode == 0, p.stderr
    print(f"reshard register -- train.py: {time.monotonic() - t0:.1f} s")
    job_id = p.stdout.strip()
    with cluster.client() as admin:
        job = admin.get_job(job_id)
        assert (job.name, job.tenant, job.generation) == (name, TENANT, 1)
        assert job.layout == layout.make_layout(1, 1, 1, hosts=["host-0"], devices_per_host=1)
        committed = admin.dataset_state(job_id)
        assert committed == _dataset_at(committed, 0)
    assert out.read_text() == cluster.worker_token(job_id) + "\n"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    return job_id


def _small_ptc():
    """A synthetic GPT's PTC (tp 2 x pp 2) and the layout of the flags below."""
    from reshard import megatron
    sd = megatron.synthetic_gpt(2, 32, 4, 64, 8, "float16", world=4, seed=3)
    return (megatron.build_ptc(sd, megatron.synthetic_config(2, 4)),
            layout.make_layout(2, 2, 1, hosts=HOSTS, devices_per_host=2))


def test_register_from_files_and_its_refusals(cluster, tmp_path):
    """`reshard register --ptc F --dataset-state F`: the job as given, its
    worker token written 0600, a retry with the same key the same job; bad
    input exits 2 with one line naming the gRPC code and the field/value."""
    ptc, lay = _small_ptc()
    sched = _token(cluster, tmp_path, "scheduler")
    ptc_file, ds_file = tmp_path / "ptc.json", tmp_path / "ds.json"
    ptc_file.write_text(json.dumps(reshard.to_dict(ptc)))
    ds_file.write_text(json.dumps(reshard.to_dict(dataset().to_proto())))
    name = f"files-{os.getpid()}"
    files = ["--ptc", str(ptc_file), "--dataset-state", str(ds_file)]
    argv = _register_argv(cluster, name, sched, *files, "--pp", "2",
                          "--idempotency-key", f"key-{name}", "--worker-token-file",
                          str(tmp_path / "wt"))
    first = _run(argv, timeout=60)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    with cluster.client() as admin:
        job = admin.get_job(job_id, include_ptc=True)
        assert (job.name, job.tenant, job.generation) == (name, TENANT, 1)
        assert job.ptc == ptc and job.layout == lay
        assert job.state_memory == reshard.ptc_pb2.STATE_MEMORY_HOST
        committed = admin.dataset_state(job_id)
        assert committed == _dataset_at(committed, 0)
    assert (tmp_path / "wt").read_text() == cluster.worker_token(job_id) + "\n"
    assert stat.S_IMODE(os.stat(tmp_path / "wt").st_mode) == 0o600
    # The same request and key again: the first call's job (idempotent).
    again = _run(argv, timeout=60)
    assert (again.returncode, again.stdout.strip()) == (0, job_id), again.stderr

    def refused(*extra, token=sched, job=name, contains=()):
        p = _run(_register_argv(cluster, job, token, *extra), timeout=60)
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
        for text in contains:
            assert text in p.stderr, (text, p.stderr)
        return p.stderr

    # (tenant, name) taken, by another request (a fresh key).
    refused(*files, "--pp", "2", contains=("ALREADY_EXISTS", name))
    # A PTC the coordinator refuses: the tensor and the value named.
    bad = reshard.to_dict(ptc)
    bad["tensors"][0]["partition"]["tp"] = {"mode": "TP_SPLIT", "axis": 5}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    refused("--ptc", str(tmp_path / "bad.json"), "--pp", "2", job=name + "-bad",
            contains=("INVALID_ARGUMENT", bad["tensors"][0]["name"]))
    # A DatasetState the coordinator refuses.
    (tmp_path / "bad-ds.json").write_text(json.dumps(
        dict(reshard.to_dict(dataset().to_proto()), globalBatch="0")))
    refused("--ptc", str(ptc_file), "--dataset-state", str(tmp_path / "bad-ds.json"),
            "--pp", "2", job=name + "-ds", contains=("INVALID_ARGUMENT", "global_batch"))
    # A credential not allowed to register.
    refused(*files, "--pp", "2", token=_token(cluster, tmp_path, "viewer"),
            job=name + "-viewer", contains=("PERMISSION_DENIED",))
    # Bad flags and files, caught before any call.
    refused(*files, "--tp", "3", contains=("--tp 3",))
    (tmp_path / "garbage.json").write_text("{not json")
    refused("--ptc", str(tmp_path / "garbage.json"), contains=("--ptc", "garbage.json",
                                                               "not JSON"))
    (tmp_path / "other.json").write_text('{"noSuchField": 1}')
    refused("--ptc", str(tmp_path / "other.json"), contains=("--ptc", "other.json",
                                                             "not a Ptc", "noSuchField"))
    refused(contains=("--ptc FILE, or -- COMMAND",))
    refused(*files, "--pp", "2", "--policy", '{"heal": true, "noSuchField": 1}',
            job=name + "-policy", contains=("--policy: not an ElasticPolicy", "noSuchField"))
    refused(*files, "--pp", "2", "--policy", f"@{tmp_path / 'none.json'}", job=name + "-policy",
            contains=(f"--policy \"{tmp_path / 'none.json'}\": cannot read it",))
    with cluster.client() as admin:
        assert [j.name for j in admin.iter_jobs(tenant=TENANT) if j.name.startswith(name)] == [
            name]
    # The job's elastic policy at registration (--policy JSON or @FILE).
    (tmp_path / "policy.json").write_text('{"heal": true, "spareHosts": ["host-1"]}')
    p = _run(_register_argv(cluster, name + "-policy", sched, *files, "--pp", "2",
                            "--policy", f"@{tmp_path / 'policy.json'}"), timeout=60)
    assert p.returncode == 0, p.stderr
    with cluster.client() as admin:
        policy = admin.get_job(p.stdout.strip()).policy
    assert (policy.heal, list(policy.spare_hosts)) == (True, ["host-1"])


def test_run_registration_flags_refused(cluster, tmp_path):
    """`reshard run --job-name` without a registering credential, or with a
    first layout that does not fit: exit 2 naming the flag, nothing started."""
    base = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
            "--host", "host-0", "--worker-socket", cluster.agents["host-0"].worker_socket,
            "--tls-ca", cluster.pki.ca, "--job-name", f"flags-{os.getpid()}"]
    cmd = ["--", sys.executable, "-c", "pass"]
    for extra, text in (
            (["--tenant", TENANT], "--register-token-file"),
            ([], "--job-name needs --tenant"),
            (["--tenant", TENANT, "--token-file", "/dev/null"], "--register-token-file instead"),
            (["--tenant", TENANT, "--register-token-file", _token(cluster, tmp_path, "scheduler"),
              "--hosts", "host-0,host-1", "--devices-per-host", "2", "--tp", "3"], "--tp 3")):
        p = subprocess.run(base + extra + cmd, env=_env(), capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and text in p.stderr, (extra, p.returncode, p.stderr)


def test_run_follows_a_job_that_exists(cluster, tmp_path):
    """`reshard run --job-name` of a job registered already (by `reshard
    register`): found by name, nothing registered, its ranks started as
    with --job (here a stand-in command), the launcher ends with the job."""
    ptc, lay = _small_ptc()
    sched = _token(cluster, tmp_path, "scheduler")
    (tmp_path / "ptc.json").write_text(json.dumps(reshard.to_dict(ptc)))
    name = f"exists-{os.getpid()}"
    p = _run(_register_argv(cluster, name, sched, "--ptc", str(tmp_path / "ptc.json"),
                            "--pp", "2", "--state-memory", "device"), timeout=60)
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    with cluster.client() as admin:
        assert admin.get_job(job_id).state_memory == reshard.ptc_pb2.STATE_MEMORY_DEVICE
    events = tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
            "--job-name", name, "--tenant", TENANT, "--register-token-file", sched,
            "--host", "host-1", "--worker-socket", cluster.agents["host-1"].worker_socket,
            "--tls-ca", cluster.pki.ca, "--events", str(events), "--rdzv-host-pattern", "127.0.0.1",
            "--", "sh", "-c", "sleep 60"]
    with open(tmp_path / "launcher.log", "w") as out:
        launcher = subprocess.Popen(argv, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    try:
        end = time.monotonic() + 60
        while True:
            recs = [json.loads(line) for line in events.read_text().splitlines()] \
                if events.exists() else []
            worlds = [r for r in recs if r["event"] == "world"]
            if worlds:
                break
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()
            assert time.monotonic() < end, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        assert [(r["event"], r.get("job_id")) for r in recs if r["event"] in (
            "found", "registered", "start")] == [("found", job_id), ("start", job_id)]
        assert [(w["world"], w["ranks"], w["generation"]) for w in worlds] == [
            ("g1", [2, 3], 0)]
        with cluster.client() as admin:
            assert [j.id for j in _jobs_named(admin, name)] == [job_id]
            admin.delete_job(job_id)
        assert launcher.wait(timeout=60) == 0, (tmp_path / "launcher.log").read_text()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()


@pytest.mark.parametrize("same_layout", [True, False])
def test_run_on_another_host_waits_for_the_registration(cluster, tmp_path, same_layout):
    """A launcher not on rank 0's host starts its ranks of the first layout
    (here a stand-in command) and waits for the job to appear: registered at
    its flags' layout, it follows those same ranks (no second world); at
    another layout, it exits 2 naming both and stops them."""
    ptc, lay = _small_ptc()  # tp 2 x pp 2 on host-0, host-1
    sched = _token(cluster, tmp_path, "scheduler")
    (tmp_path / "ptc.json").write_text(json.dumps(reshard.to_dict(ptc)))
    name = f"wait-{same_layout}-{os.getpid()}"
    events = tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
            "--job-name", name, "--tenant", TENANT, "--register-token-file", sched,
            "--hosts", ",".join(HOSTS), "--devices-per-host", "2", "--tp", "2",
            "--pp" if same_layout else "--dp", "2",
            "--host", "host-1", "--worker-socket", cluster.agents["host-1"].worker_socket,
            "--tls-ca", cluster.pki.ca, "--events", str(events),
            "--rdzv-host-pattern", "127.0.0.1", "--", "sh", "-c", "sleep 60"]
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(argv, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def records(until):
        end = time.monotonic() + 60
        while True:
            recs = [json.loads(line) for line in events.read_text().splitlines()] \
                if events.exists() else []
            if until(recs):
                return recs
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.1)

    try:
        worlds = [r for r in records(lambda rs: any(r["event"] == "world" for r in rs))
                  if r["event"] == "world"]
        assert [(w["world"], w["ranks"]) for w in worlds] == [("g1", [2, 3])]
        assert launcher.poll() is None, log.read_text()
        p = _run(_register_argv(cluster, name, sched, "--ptc", str(tmp_path / "ptc.json"),
                                "--pp", "2"), timeout=60)
        assert p.returncode == 0, p.stderr
        job_id = p.stdout.strip()
        if not same_layout:
            assert launcher.wait(timeout=60) == 2, log.read_text()
            text = log.read_text()
            assert "tp 2 x pp 2 x dp 1" in text and "tp 2 x pp 1 x dp 2" in text, text
            for pid in worlds[0]["pids"].values():
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
            return
        recs = records(lambda rs: any(r["event"] == "start" for r in rs))
        assert [(r["event"], r.get("job_id")) for r in recs if r["event"] in (
            "found", "registered", "start")] == [("found", job_id), ("start", job_id)]
        assert launcher.poll() is None, log.read_text()
        with cluster.client() as admin:
            admin.delete_job(job_id)
        assert launcher.wait(timeout=60) == 0, log.read_text()
        assert [r["event"] for r in map(json.loads, events.read_text().splitlines())].count(
            "world") == 1
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()


@pytest.mark.parametrize("status", [3, 0])
def test_run_registration_world_that_ends_first(cluster, tmp_path, status):
    """Ranks of the first layout that end before the job is registered (a
    failure, or a script that never calls pytorch_loop.start): the launcher
    exits 2 naming the rank and its status, and registers nothing."""
    name = f"ends-{status}-{os.getpid()}"
    argv = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
            "--job-name", name, "--tenant", TENANT,
            "--register-token-file", _token(cluster, tmp_path, "scheduler"),
            "--hosts", "host-0", "--devices-per-host", "2", "--tp", "2",
            "--host", "host-0", "--worker-socket", cluster.agents["host-0"].worker_socket,
            "--tls-ca", cluster.pki.ca, "--rdzv-host-pattern", "127.0.0.1",
            "--", "sh", "-c", f"exit {status}"]
    p = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert re.search(rf"rank [01] ended \(exit status {status}\) before the job was registered",
                     p.stderr), p.stderr
    with cluster.client() as admin:
        assert _jobs_named(admin, name) == []


# A stand-in rank 0 of `reshard run --job-name` (no torch): once the test
# creates argv[1] it hands its launcher the PTC in argv[3] as describe()
# would, and writes the launcher's answer to argv[2]. It ignores SIGTERM so
# that the answer is written before the launcher's --grace SIGKILL.
_STAND_IN_RANK = """
import json, os, signal, sys, time
from reshard.launcher import register
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
d = os.environ["RESHARD_REGISTER_DIR"]
register._write(os.path.join(d, register.REQUEST),
                {"ptc": json.load(open(sys.argv[3])), "dataset_state": None})
with open(sys.argv[2], "w") as f:
    json.dump(register.answer(d, 60), f)
"""


def test_run_registration_lost_to_another_registrant(cluster, tmp_path):
    """The job's name taken between the launcher's look-up and its
    RegisterJob (a scheduler registered it meanwhile): ALREADY_EXISTS, which
    the launcher hands its rank 0 (code and message) and prints, exit 2;
    the job is the other registrant's."""
    from helpers import tensor
    ptc = {"numLayers": 1, "tensors": [tensor("w", "DTYPE_FLOAT64", [4],
                                              pipeline="PIPELINE_EVERY_STAGE")]}
    (tmp_path / "ptc.json").write_text(json.dumps(ptc))
    sched = _token(cluster, tmp_path, "scheduler")
    name = f"lost-{os.getpid()}"
    go, answer = tmp_path / "go", tmp_path / "answer.json"
    argv = [sys.executable, "-m", "reshard", "run", "--coordinator", cluster.coordinator,
            "--job-name", name, "--tenant", TENANT, "--register-token-file", sched,
            "--hosts", "host-0", "--devices-per-host", "1",
            "--host", "host-0", "--worker-socket", cluster.agents["host-0"].worker_socket,
            "--tls-ca", cluster.pki.ca, "--rdzv-host-pattern", "127.0.0.1", "--grace", "5",
            "--", sys.executable, "-c", _STAND_IN_RANK, str(go), str(answer),
            str(tmp_path / "ptc.json")]
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(argv, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    try:
        end = time.monotonic() + 60
        while "registering it at" not in log.read_text():
            assert launcher.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        other = _run(_register_argv(cluster, name, sched, "--ptc", str(tmp_path / "ptc.json"),
                                    hosts=["host-0"], devices=1, tp=1), timeout=60)
        assert other.returncode == 0, other.stderr
        go.write_text("")
        assert launcher.wait(timeout=60) == 2, log.read_text()
        assert "ALREADY_EXISTS" in log.read_text() and name in log.read_text()
        got = json.loads(answer.read_text())
        assert got["code"] == grpc.StatusCode.ALREADY_EXISTS.value[0] and name in got["message"]
        from reshard.launcher import register
        error = register.error_of(got)
        assert isinstance(error, reshard.AlreadyExists) and name in str(error)
        with cluster.client() as admin:
            assert [j.id for j in _jobs_named(admin, name)] == [other.stdout.strip()]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()
