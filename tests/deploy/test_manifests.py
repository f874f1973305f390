"""deploy/ without a cluster: the Kubernetes manifests, the Dockerfile, the
Prometheus configuration and alert rules (with promtool), and the Grafana
dashboard parse and hang together.

Environment (set by tests/deploy/CMakeLists.txt):
  RESHARD_SOURCE_DIR        the repository
  RESHARD_COORDINATOR_BIN   the built reshard-coordinator
  RESHARD_AGENT_BIN         the built reshard-agent
"""

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile

import pytest
import yaml

SOURCE = os.environ.get("RESHARD_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
DEPLOY = os.path.join(SOURCE, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
PROM = os.path.join(DEPLOY, "prometheus")
RULES = os.path.join(PROM, "rules", "reshard-alerts.yml")
DASHBOARD = os.path.join(DEPLOY, "grafana", "reshard-dashboard.json")
DOCKERFILE = os.path.join(DEPLOY, "docker", "Dockerfile")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _binary(env):
    path = os.environ.get(env)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"{env} must name the built binary (got {path!r})")
    return path


def _manifests():
    """[(file name, document)] of every YAML document under deploy/k8s."""
    docs = []
    for name in sorted(os.listdir(K8S)):
        if not name.endswith((".yaml", ".yml")):
            continue
        with open(os.path.join(K8S, name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((name, doc))
    return docs


def _resources():
    return [(n, d) for n, d in _manifests() if n != "kustomization.yaml"]


def _one(kind, name=None):
    found = [d for _, d in _resources()
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _containers(workload):
    spec = workload["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def _env(container):
    return {e["name"]: e for e in container.get("env", [])}


def _config_maps():
    return {d["metadata"]["name"]: d.get("data", {}) for _, d in _resources()
            if d["kind"] == "ConfigMap"}


def _env_from_names(container):
    """Every variable a container gets: env entries and envFrom ConfigMaps."""
    names = set(_env(container))
    maps = _config_maps()
    for ref in container.get("envFrom", []):
        cm = ref["configMapRef"]["name"]
        assert cm in maps, f"envFrom names ConfigMap {cm!r}, not in deploy/k8s"
        names |= set(maps[cm])
    return names


def _env_value(container, name):
    env = _env(container)
    if name in env and "value" in env[name]:
        return env[name]["value"]
    for ref in container.get("envFrom", []):
        data = _config_maps()[ref["configMapRef"]["name"]]
        if name in data:
            return data[name]
    return None


# --------------------------------------------------------------- Kubernetes


def test_every_manifest_parses_and_names_itself():
    docs = _manifests()
    assert docs, "no manifests under deploy/k8s"
    for name, doc in docs:
        assert isinstance(doc, dict), f"{name}: a document is not a mapping"
        assert doc.get("apiVersion"), f"{name}: no apiVersion"
        assert doc.get("kind"), f"{name}: no kind"
        if doc["kind"] != "Kustomization":
            assert doc.get("metadata", {}).get("name"), f"{name}: {doc['kind']} has no name"


def test_kustomization_lists_every_manifest():
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    assert k["kind"] == "Kustomization"
    assert k["namespace"] == _one("Namespace")["metadata"]["name"]
    listed = set(k["resources"])
    on_disk = {n for n in os.listdir(K8S)
               if n.endswith((".yaml", ".yml")) and n != "kustomization.yaml"}
    assert listed == on_disk
    images = {i["name"] for i in k.get("images", [])}
    for _, d in _resources():
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            for c in _containers(d):
                assert c["image"].split(":")[0] in images, (
                    f"{d['kind']} {d['metadata']['name']}: image {c['image']} is not set by "
                    f"kustomization.yaml")


def test_expected_kinds_are_there():
    kinds = sorted(d["kind"] for _, d in _resources())
    for kind in ("Namespace", "Secret", "ConfigMap", "Deployment", "Service", "DaemonSet",
                 "Job"):
        assert kind in kinds, f"no {kind} in deploy/k8s (have {kinds})"


def _assert_dsn_from_secret(workload):
    c = [c for c in _containers(workload) if "RESHARD_DSN" in _env(c)]
    assert c, f"{workload['metadata']['name']}: no container gets RESHARD_DSN"
    ref = _env(c[0])["RESHARD_DSN"].get("valueFrom", {}).get("secretKeyRef")
    assert ref, f"{workload['metadata']['name']}: RESHARD_DSN is not from a secretKeyRef"
    secret = _one("Secret", ref["name"])
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    assert ref["key"] in keys, f"Secret {ref['name']} has no key {ref['key']!r}"


def test_coordinator_deployment_and_service():
    dep = _one("Deployment", "reshard-coordinator")
    assert dep["spec"]["replicas"] == 2
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.items() <= pod_labels.items()
    _assert_dsn_from_secret(dep)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"][0] == "reshard-coordinator"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert set(ports) == {"grpc", "metrics"}
    # The ports the binary is told to use are the ones the pod declares.
    assert _env_value(c, "RESHARD_LISTEN").endswith(f":{ports['grpc']}")
    assert _env_value(c, "RESHARD_METRICS_LISTEN").endswith(f":{ports['metrics']}")
    assert "livenessProbe" in c and "readinessProbe" in c
    assert c["resources"]["requests"] and c["resources"]["limits"]

    svc = _one("Service", "reshard-coordinator")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(svc_ports) == {"grpc", "metrics"}
    for name, p in svc_ports.items():
        assert p["targetPort"] in (name, ports[name])


def test_migration_job():
    job = _one("Job")
    _assert_dsn_from_secret(job)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["reshard-coordinator", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")


def test_agent_daemonset():
    ds = _one("DaemonSet", "reshard-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec.get("hostNetwork") is True, "UCX needs the node's network"
    (c,) = spec["containers"]
    assert c["command"][0] == "reshard-agent"
    host_id = _env(c)["RESHARD_HOST_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert host_id == "spec.nodeName"
    assert "livenessProbe" in c
    assert c["resources"]["requests"] and c["resources"]["limits"]

    # The worker socket's directory and the shard store are node paths that
    # training pods can mount too.
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    socket = _env_value(c, "RESHARD_WORKER_SOCKET")
    shm = _env_value(c, "RESHARD_SHM_DIR")
    assert socket and shm
    for path in (os.path.dirname(socket), shm):
        assert path in mounts, f"{path} is not mounted in the agent"
        assert mounts[path] in host_paths, f"{path} is not a hostPath volume"

    # The agent's /metrics port is the declared one (and the probe's).
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert _env_value(c, "RESHARD_METRICS_LISTEN").endswith(f":{ports['metrics']}")
    assert c["livenessProbe"]["httpGet"]["port"] in ("metrics", ports["metrics"])
    assert _env_value(c, "RESHARD_COORDINATOR").endswith(
        ":%d" % _one("Service", "reshard-coordinator")["spec"]["ports"][0]["port"])


def test_tls_files_come_from_secrets():
    """Both binaries get their certificate, key and CA from files of a Secret
    volume (docs/security.md); nothing runs --insecure."""
    for kind, name, secret in (("Deployment", "reshard-coordinator", "reshard-coordinator-tls"),
                               ("DaemonSet", "reshard-agent", "reshard-agent-tls")):
        d = _one(kind, name)
        spec = d["spec"]["template"]["spec"]
        (c,) = [c for c in _containers(d) if c["command"][0] == name]
        secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for var in ("RESHARD_TLS_CERT", "RESHARD_TLS_KEY", "RESHARD_TLS_CA"):
            path = _env_value(c, var)
            assert path, f"{name}: {var} is not set"
            assert secrets.get(mounts.get(os.path.dirname(path))) == secret, (name, var, path)
        assert "--insecure" not in c.get("args", []) + c["command"]
        assert _env_value(c, "RESHARD_INSECURE") in (None, "", "false", "0")


def test_non_root_training_pods_can_use_the_agent():
    """The agent gives its sockets a worker group (a number: images need not
    share /etc/group) with group read and write, and an init container hands
    both hostPath directories to that group (0750), so that a pod running as
    any user with the group as a supplemental group can connect and map the
    descriptors it is handed; shard files are the agent's alone
    (docs/security.md, "Workers")."""
    ds = _one("DaemonSet", "reshard-agent")
    spec = ds["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    gid = _env_value(agent, "RESHARD_WORKER_GROUP")
    assert gid and gid.isdigit() and int(gid) > 0, gid
    for var in ("RESHARD_WORKER_SOCKET_MODE",):
        mode = int(_env_value(agent, var), 8)
        assert mode & 0o060 == 0o060, f"{var} {mode:o} does not let the group read and write"
        assert mode & 0o007 == 0, f"{var} {mode:o} lets every user in"
    # Retired (issue 19): shard files are the agent's alone; the agent refuses it.
    assert _env_value(agent, "RESHARD_SHARD_FILE_MODE") is None
    socket_dir = os.path.dirname(_env_value(agent, "RESHARD_WORKER_SOCKET"))
    shm = _env_value(agent, "RESHARD_SHM_DIR")
    agent_mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    (init,) = [c for c in spec.get("initContainers", []) if c["name"] == "worker-dirs"]
    script = " ".join(init["command"])
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    for path in (socket_dir, shm):
        assert init_mounts.get(path) == agent_mounts[path], f"{path}: not the agent's volume"
        assert re.search(r"chgrp \S+ .*" + re.escape(path), script), f"{path} is not regrouped"
        assert re.search(r"chmod 0750 .*" + re.escape(path), script), f"{path} is not 0750"
    ref = _env(init)["WORKER_GID"]["valueFrom"]["configMapKeyRef"]
    assert _config_maps()[ref["name"]][ref["key"]] == gid
    assert "$WORKER_GID" in script


def _help_variables(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"\b(?:RESHARD|UCX)_[A-Z_]+\b", out.stdout))


def test_manifest_variables_are_read_by_the_binaries():
    """Every RESHARD_* variable given to a container is one its binary reads
    (a misspelt variable is silently ignored otherwise)."""
    known = {
        "reshard-coordinator": _help_variables(_binary("RESHARD_COORDINATOR_BIN")),
        "reshard-agent": _help_variables(_binary("RESHARD_AGENT_BIN")),
    }
    assert "RESHARD_DSN" in known["reshard-coordinator"]
    assert "RESHARD_METRICS_LISTEN" in known["reshard-agent"]
    checked = 0
    for _, d in _resources():
        if d["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        for c in _containers(d):
            binary = c["command"][0]
            for name in _env_from_names(c):
                if name.startswith(("RESHARD_", "UCX_")):
                    assert name in known[binary], f"{binary} does not read {name}"
                    checked += 1
    assert checked >= 8


def test_agent_refuses_a_bad_or_busy_metrics_address():
    """--metrics-listen is checked at start-up: a malformed value is a usage
    error (2), a port another process holds a start-up failure (1); both
    name the flag and the value."""
    agent = _binary("RESHARD_AGENT_BIN")
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = "127.0.0.1:%d" % busy.getsockname()[1]
        base = [agent, "--host-id", "h0", "--coordinator", "127.0.0.1:1", "--worker-socket",
                os.path.join(tmp, "w.sock"), "--shm-dir", tmp, "--insecure"]
        env = dict(os.environ, UCX_NET_DEVICES="lo", UCX_TLS="tcp")
        for value, code in (("localhost", 2), ("127.0.0.1:99999", 2), (taken, 1)):
            r = subprocess.run(base + ["--metrics-listen", value], capture_output=True,
                               text=True, timeout=60, env=env)
            assert r.returncode == code, (value, r.returncode, r.stderr)
            assert f'--metrics-listen' in r.stderr and f'"{value}"' in r.stderr, r.stderr
            assert "ready" not in r.stdout


# ------------------------------------------------------------------- Docker


def _needed_packages(binary):
    """Debian packages holding the shared libraries `binary` loads directly."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    assert "not found" not in out, out
    packages = set()
    needed = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                            check=True).stdout
    sonames = set(re.findall(r"\(NEEDED\).*\[(.+)\]", needed))
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m or m.group(1) not in sonames:
            continue
        real = os.path.realpath(m.group(2))
        for path in (real, real.replace("/usr/lib/", "/lib/", 1), m.group(2)):
            r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if r.returncode == 0:
                packages.add(r.stdout.split(":")[0])
                break
        else:
            pytest.fail(f"{binary}: no Debian package owns {m.group(2)}")
    return packages


def test_dockerfile_runtime_has_every_library():
    with open(DOCKERFILE) as f:
        text = f.read()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert stages and all(s.startswith("debian:bookworm") for s in stages), stages
    assert "scripts/build.sh" in text
    runtime = text.split("AS runtime", 1)[1]
    installed = set(re.findall(r"^\s+(lib[\w.+-]+)", runtime, re.M))
    # Always in debian:bookworm-slim (apt needs them).
    base = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
    for env in ("RESHARD_COORDINATOR_BIN", "RESHARD_AGENT_BIN"):
        missing = _needed_packages(_binary(env)) - installed - base
        assert not missing, f"{env}: the runtime stage does not install {sorted(missing)}"
    for b in ("reshard-coordinator", "reshard-agent"):
        assert re.search(rf"COPY --from=build .*{b}", text), f"{b} not copied"


# --------------------------------------------------------------- Prometheus


def _promtool(*args):
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_promtool_check_rules():
    rc, out = _promtool("check", "rules", RULES)
    assert rc == 0, out


def test_promtool_unit_tests_of_the_alerts():
    """tests/deploy/alerts_test.yml feeds synthetic series to every alert."""
    rc, out = _promtool("test", "rules", os.path.join(os.path.dirname(__file__),
                                                      "alerts_test.yml"))
    assert rc == 0, out
    with open(RULES) as f:
        alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                  if "alert" in r}
    with open(os.path.join(os.path.dirname(__file__), "alerts_test.yml")) as f:
        tested = {t["alertname"] for case in yaml.safe_load(f)["tests"]
                  for t in case.get("alert_rule_test", [])}
    assert alerts <= tested, f"alerts without a unit test: {sorted(alerts - tested)}"


def test_promtool_check_local_config():
    rc, out = _promtool("check", "config", os.path.join(PROM, "prometheus-local.yml"))
    assert rc == 0, out


def test_promtool_check_kubernetes_config():
    """prometheus.yml uses kubernetes_sd_configs, which Debian's Prometheus is
    built without. Where promtool knows it, the file is checked as is;
    otherwise a copy with each kubernetes_sd_configs swapped for an empty
    static_configs is (scrape options, relabelling and rule files are still
    checked) and the discovery blocks are checked here."""
    path = os.path.join(PROM, "prometheus.yml")
    rc, out = _promtool("check", "config", path)
    if rc == 0:
        return
    assert "kubernetes_sd_configs" in out, out
    with open(path) as f:
        config = yaml.safe_load(f)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"reshard-coordinator", "reshard-agent"}
    stripped = copy.deepcopy(config)
    for job in stripped["scrape_configs"]:
        (sd,) = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "pod"
        assert sd["namespaces"]["names"] == [_one("Namespace")["metadata"]["name"]]
        job["static_configs"] = [{"targets": []}]
        keep = {r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
        assert job["job_name"] in keep, f"{job['job_name']} keeps other pods"
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "rules"))
        shutil.copy(RULES, os.path.join(tmp, "rules"))
        copy_path = os.path.join(tmp, "prometheus.yml")
        with open(copy_path, "w") as f:
            yaml.safe_dump(stripped, f)
        rc, out = _promtool("check", "config", copy_path)
        assert rc == 0, out


def test_scrape_jobs_match_the_manifests():
    """The k8s scrape jobs keep the pods the manifests label, on the port
    named "metrics" that those pods declare."""
    with open(os.path.join(PROM, "prometheus.yml")) as f:
        jobs = {j["job_name"]: j for j in yaml.safe_load(f)["scrape_configs"]}
    for job_name, kind in (("reshard-coordinator", "Deployment"), ("reshard-agent", "DaemonSet")):
        w = _one(kind, job_name)
        labels = w["spec"]["template"]["metadata"]["labels"]
        keeps = {r["source_labels"][0]: r["regex"] for r in jobs[job_name]["relabel_configs"]
                 if r.get("action") == "keep"}
        assert keeps["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == labels[
            "app.kubernetes.io/name"]
        port_names = {p["name"] for c in _containers(w) for p in c.get("ports", [])}
        assert keeps["__meta_kubernetes_pod_container_port_name"] in port_names


# ------------------------------------------------------------------ Grafana


def dashboard_expressions():
    """[(panel title, PromQL)] of every panel of the dashboard."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out = []
    for p in dash["panels"]:
        for sub in [p] + p.get("panels", []):
            for t in sub.get("targets", []):
                out.append((sub["title"], t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable ${v['name']}", q))
    return out


def metric_names(expr):
    """reshard_* metric names and `up` in a PromQL expression (label matchers
    and strings removed first)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    return set(re.findall(r"\b(reshard_[a-z0-9_]+|up)\b", expr))


def test_dashboard_parses_and_every_panel_queries_reshard():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] and dash["title"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in panels:
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        names = set().union(*(metric_names(t["expr"]) for t in p["targets"]))
        assert names, f"panel {p['title']!r} queries no metric"
    # Panels lie on Grafana's 24-column grid without overlapping.
    cells = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    # Every query goes to the data source the user picks.
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    text = json.dumps(dash)
    # What the issue asks the dashboard to show.
    for metric in ("reshard_coordinator_jobs", "reshard_coordinator_operation_duration_seconds",
                   "reshard_coordinator_planned_bytes_total", "reshard_coordinator_hosts",
                   "reshard_agent_shard_store_used_bytes", "reshard_agent_tasks_started_total",
                   "reshard_coordinator_rpc_duration_seconds", "reshard_agent_task_bytes_written_total",
                   "reshard_agent_worker_rpc_duration_seconds"):
        assert metric in text, f"the dashboard does not show {metric}"
