"""deploy/ against a real local cluster (deploy/local/cluster.py): the metric
names the dashboard and the alert rules use are ones the binaries export,
and a real Prometheus server (Debian's /usr/bin/prometheus) scrapes the
coordinator and the agents with deploy/prometheus's configuration and rules,
and answers queries over reshard metrics through its HTTP API.

Environment (set by tests/deploy/CMakeLists.txt):
  RESHARD_SOURCE_DIR   the repository
  RESHARD_BUILD_DIR    the build tree the cluster's binaries come from
  PYTHONPATH           includes <build>/python (generated stubs)
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reshard_traffic  # noqa: E402
import test_manifests  # noqa: E402

SOURCE = test_manifests.SOURCE
BUILD = os.environ.get("RESHARD_BUILD_DIR", os.path.join(SOURCE, "build"))
sys.path.insert(0, os.path.join(SOURCE, "deploy", "local"))
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _wait(what, fn, timeout_s=60.0, period_s=0.25):
    """Calls fn() until it returns something truthy; fails naming `what`
    and the last value."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except (OSError, ValueError) as e:  # not up yet
            last = e
        else:
            if last:
                return last
        time.sleep(period_s)
    pytest.fail(f"{what}: not true after {timeout_s} s (last: {last!r})")


def scrape(address):
    """{series name: [(labels text, value)]} of http://address/metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        out.setdefault(name, []).append(("{" + labels if labels else "", float(value)))
    return out


def total(series, name, contains=""):
    return sum(v for labels, v in series.get(name, []) if contains in labels)


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster  # deploy/local/cluster.py

    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"no Prometheus server at {PROMETHEUS} (Debian package prometheus)")
    # reshard_traffic dials plaintext; this suite is about metrics, not TLS.
    with LocalCluster(build_dir=BUILD, hosts=2, devices_per_host=2, agent_metrics=True,
                      tls=False) as c:
        hosts = list(c.host_ids)
        committed, aborted = reshard_traffic.run(
            c.coordinator, [c.agents[h].worker_socket for h in hosts], hosts)
        c.deploy_test_ops = (committed, aborted)
        yield c


def test_agents_export_what_happened(cluster):
    committed, _ = cluster.deploy_test_ops
    first, second = cluster.host_ids[:2]
    a0 = scrape(cluster.agents[first].metrics)
    a1 = scrape(cluster.agents[second].metrics)
    # Every byte the plan writes was written, on one host or the other.
    written = (total(a0, "reshard_agent_task_bytes_written_total") +
               total(a1, "reshard_agent_task_bytes_written_total"))
    assert committed.bytes_total > 0
    assert written == committed.bytes_total
    for a in (a0, a1):
        assert total(a, "reshard_agent_tasks_started_total") == 1
        assert total(a, "reshard_agent_tasks_finished_total", 'result="done"') == 1
        assert total(a, "reshard_agent_tasks_running") == 0
        assert total(a, "reshard_agent_task_progress_bytes") == 0
        assert total(a, "reshard_agent_coordinator_reachable") == 1
        assert total(a, "reshard_agent_task_duration_seconds_count", 'result="done"') == 1
        assert total(a, "reshard_agent_shard_store_limit_bytes") > 0
        # What the task cost: CPU and wake-ups, and per byte written.
        cpu = total(a, "reshard_agent_task_cpu_seconds_total")
        assert cpu > 0
        assert total(a, "reshard_agent_task_context_switches_total", 'kind="voluntary"') > 0
        mine = total(a, "reshard_agent_task_bytes_written_total")
        per_gb = total(a, "reshard_agent_task_cpu_seconds_per_gb")
        if mine > 0:  # one task, so its period's ratio is the totals'
            assert per_gb == pytest.approx(cpu / (mine / 1e9), rel=1e-6)
        else:
            assert per_gb == 0
    # The second host holds only the new generation's rank 1; its bytes are
    # the tensor's (float32, padded to 64 bytes).
    assert total(a1, "reshard_agent_generations_held") == 1
    assert total(a1, "reshard_agent_rank_buffers_held") == 1
    assert total(a1, "reshard_agent_shard_store_used_bytes") == 4 * reshard_traffic.TENSOR_ELEMENTS
    # The worker published and sealed rank 0 through the first agent.
    for method in ("PublishShard", "SealShard"):
        assert total(a0, "reshard_agent_worker_rpc_duration_seconds_count",
                     f'code="OK",method="{method}"') == 1


def _exported_names(c):
    names = set(scrape(c.coordinator_metrics))
    for h in c.host_ids:
        names |= set(scrape(c.agents[h].metrics))
    return names


def test_dashboard_and_alerts_use_exported_metrics(cluster):
    exported = _exported_names(cluster) | {"up"}
    assert "reshard_coordinator_operations_total" in exported
    assert "reshard_agent_worker_rpc_duration_seconds_bucket" in exported
    missing = {}
    for title, expr in test_manifests.dashboard_expressions():
        for name in test_manifests.metric_names(expr) - exported:
            missing.setdefault(name, []).append(f"panel {title!r}")
    with open(test_manifests.RULES) as f:
        for group in yaml.safe_load(f)["groups"]:
            for rule in group["rules"]:
                for name in test_manifests.metric_names(rule["expr"]) - exported:
                    missing.setdefault(name, []).append(f"alert {rule.get('alert')}")
    assert not missing, f"metrics no binary exports: {missing}"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A throw-away Prometheus server scraping the cluster every second with
    deploy/prometheus/prometheus-local.yml's jobs and the alert rules."""

    def __init__(self, cluster, tmp):
        with open(os.path.join(test_manifests.PROM, "prometheus-local.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [test_manifests.RULES]
        targets = {
            "reshard-coordinator": [{"targets": [cluster.coordinator_metrics]}],
            "reshard-agent": [{"targets": [cluster.agents[h].metrics], "labels": {"host": h}}
                              for h in cluster.host_ids],
        }
        for job in config["scrape_configs"]:
            job["static_configs"] = targets.pop(job["job_name"])
        assert not targets, f"prometheus-local.yml has no job for {sorted(targets)}"
        path = os.path.join(tmp, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self.proc = None
        for _ in range(3):  # another process may take the free port first
            self.address = f"127.0.0.1:{_free_port()}"
            self.log = open(os.path.join(tmp, "prometheus.log"), "w")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
                 f"--web.listen-address={self.address}", "--log.level=warn"],
                stdout=self.log, stderr=subprocess.STDOUT)
            try:
                _wait("Prometheus ready", self._ready, timeout_s=30)
                return
            except BaseException:
                if self.proc.poll() is None:
                    raise
        pytest.fail(f"Prometheus did not start; see {tmp}/prometheus.log")

    def _ready(self):
        if self.proc.poll() is not None:
            raise pytest.fail.Exception(f"prometheus exited with {self.proc.returncode}")
        with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as r:
            return r.status == 200

    def api(self, path, **params):
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        """{frozenset(labels): value} of an instant query."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return {frozenset(s["metric"].items()): float(s["value"][1]) for s in data["result"]}

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(cluster):
    tmp = tempfile.mkdtemp(prefix="reshard-prometheus-")
    p = Prometheus(cluster, tmp)
    try:
        yield p
    finally:
        p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_prometheus_scrapes_every_target(prometheus, cluster):
    want = {cluster.coordinator_metrics} | {cluster.agents[h].metrics for h in cluster.host_ids}

    def all_up():
        up = prometheus.query("up")
        got = {dict(k)["instance"]: v for k, v in up.items()}
        return got if set(got) == want and all(v == 1 for v in got.values()) else None

    got = _wait("up == 1 for the coordinator and every agent", all_up)
    assert len(got) == 1 + len(cluster.host_ids)


def test_prometheus_reads_back_reshard_metrics(prometheus, cluster):
    committed, _ = cluster.deploy_test_ops
    n = len(cluster.host_ids)
    # The coordinator's view of the hosts, through Prometheus.
    alive = _wait("reshard_coordinator_hosts{state=\"alive\"} == hosts",
                  lambda: prometheus.query(f'reshard_coordinator_hosts{{state="alive"}} == {n}'))
    assert list(alive.values()) == [n]
    leader = prometheus.query("reshard_coordinator_leader")
    assert list(leader.values()) == [1.0]
    # Bytes the agents wrote, summed by Prometheus, are the operation's bytes.
    written = prometheus.query("sum(reshard_agent_task_bytes_written_total)")
    assert list(written.values()) == [float(committed.bytes_total)]
    ops = prometheus.query("sum by (result) (reshard_coordinator_operations_total)")
    by_result = {dict(k)["result"]: v for k, v in ops.items()}
    assert by_result.get("committed") == 1
    assert by_result.get("aborted", 0) + by_result.get("failed", 0) == 1
    # The dashboard's agent selector finds every agent.
    limits = prometheus.query("reshard_agent_shard_store_limit_bytes")
    assert {dict(k)["host"] for k in limits} == set(cluster.host_ids)


def test_alert_rules_evaluate_on_real_series(prometheus):
    def rules():
        groups = prometheus.api("rules")["groups"]
        return [r for g in groups for r in g["rules"]]

    def evaluated():
        rs = rules()
        # A rule not evaluated yet has the zero time, 0001-01-01T00:00:00Z.
        done = all(not r.get("lastEvaluation", "0001").startswith("0001") for r in rs)
        return rs if rs and done else None

    _wait("every rule evaluated", evaluated)

    # Nothing is wrong with this cluster: once the first scrapes are in, the
    # operation that was aborted on purpose is the only alert.
    def only_the_aborted_operation():
        rs = rules()
        active = {r["name"] for r in rs if r.get("state") != "inactive"}
        return rs if active == {"ReshardOperationFailed"} else None

    rs = _wait("ReshardOperationFailed the only active alert", only_the_aborted_operation)
    bad = {r["name"]: r.get("lastError") for r in rs if r["health"] != "ok"}
    assert not bad, bad
    (failed,) = [r for r in rs if r["name"] == "ReshardOperationFailed"]
    assert [(a["labels"]["kind"], a["labels"]["result"], float(a["value"]))
            for a in failed["alerts"]] in ([("resize", "aborted", 1.0)],
                                           [("resize", "failed", 1.0)])


def test_a_killed_agent_shows_in_prometheus(prometheus, cluster):
    victim = cluster.host_ids[-1]
    target = cluster.agents[victim].metrics
    cluster.kill_agent(victim)
    _wait(f"up == 0 for the killed agent {target}",
          lambda: prometheus.query(f'up{{instance="{target}"}} == 0'))
    # The rule's `for` has not passed yet: pending, for that agent only.
    pending = _wait("ReshardAgentDown pending",
                    lambda: prometheus.query('ALERTS{alertname="ReshardAgentDown"}'))
    assert {dict(k)["instance"] for k in pending} == {target}
    # The coordinator marks the host LOST when its lease runs out.
    lost = _wait("reshard_coordinator_hosts{state=\"lost\"} == 1",
                 lambda: prometheus.query('reshard_coordinator_hosts{state="lost"} == 1'),
                 timeout_s=90)
    assert list(lost.values()) == [1.0]
