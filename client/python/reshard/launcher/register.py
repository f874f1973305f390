"""Registering a job from its ranks' own describe() (docs/pytorch.md,
"Quickstart" and "The launcher", "Registration"): `reshard run --job-name`
registers the job it is asked to run when it does not exist yet, and
`reshard register` does the same for a scheduler that prefers to.

The PTC comes from reshard.pytorch.describe() of the training script itself
(collective: the ranks of the job's first layout), the DatasetState from the
`dataset` the script gives pytorch_loop.start(); the first layout from the
launcher's flags (--hosts, --devices-per-host, --tp, --pp, --dp, --dp-shard),
which every launcher of the job is given alike. Registering needs a
credential allowed to (a scheduler token of the job's tenant, or an admin's:
--register-token-file, else $RESHARD_REGISTER_TOKEN); the ranks never see
it: they get the job's worker token that RegisterJob returns.

The hand-off between a rank 0 and the launcher that started it is a private
directory ($RESHARD_REGISTER_DIR, mode 0700): rank 0 writes `request.json`
(the PTC and the DatasetState), the launcher registers and writes
`answer.json` (the job id and worker token, or the refusal's gRPC code and
message), rank 0 broadcasts it to every rank. Files appear by rename, whole.

Exactly one launcher registers: the one on the first layout's rank 0 host.
The others find the job by (tenant, name) once it exists (ListJobs) and
follow it; their ranks of the first layout are already running and get the
job id and worker token from rank 0. A RegisterJob retried by the client
keeps its idempotency key (the coordinator returns the first call's job);
(tenant, name) is unique, so a job registered by someone else meanwhile is
AlreadyExists, which stops this registration (run the launchers again: they
then follow that job).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from reshard.core import errors
from reshard.core import layout as _layout
from reshard.core._proto import agent_pb2, as_message, ptc_pb2, to_dict
from reshard.launcher._launch_env import EXIT_OK, EXIT_USAGE, LaunchError, rank_environment

REQUEST, ANSWER = "request.json", "answer.json"
_POLL_S = 0.05


# ------------------------------------------------------------ the layout


def add_layout_flags(p):
    """The first layout's flags (shared by `reshard run` and `reshard register`)."""
    p.add_argument("--hosts", default="", metavar="H0,H1,...",
                   help="the first layout's hosts, in rank order (registration)")
    p.add_argument("--devices-per-host", type=int, default=0, metavar="N",
                   help="ranks per host of the first layout (registration)")
    for flag, what in (("--tp", "tensor-parallel size (default 1)"),
                       ("--pp", "pipeline stages (default 1)"),
                       ("--dp", "data-parallel size (default: the rest of the world)"),
                       ("--dp-shard", "HSDP: data-parallel ranks per shard group (default: "
                                      "dp, no replicas)")):
        p.add_argument(flag, type=int, default=0, metavar="N", help=f"the first layout's {what}")
    p.add_argument("--state-memory", choices=("host", "device"), default="host",
                   help="where the job's workers keep its state between steps (JobSpec."
                        "state_memory, fixed at registration; default %(default)s)")
    p.add_argument("--policy", default="", metavar="JSON|@FILE",
                   help="the job's elastic policy at registration, an ElasticPolicy as JSON "
                        "(e.g. '{\"heal\": true, \"grow\": true}'; docs/scheduler.md, "
                        "\"Elastic policies\")")


def read_policy(text):
    """The --policy flag as a dict of ElasticPolicy's JSON fields, or None
    when not given; LaunchError names what is wrong."""
    if not text:
        return None
    where = "--policy"
    if text.startswith("@"):
        where = f"--policy \"{text[1:]}\""
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as e:
            raise LaunchError(f"{where}: cannot read it: {e.strerror}") from None
    try:
        value = json.loads(text)
        as_message(value, ptc_pb2.ElasticPolicy, "policy")
    except (ValueError, TypeError) as e:
        raise LaunchError(f"{where}: not an ElasticPolicy: {' '.join(str(e).split())}") from None
    return value


def first_layout(args):
    """The reshard.v1.Layout the flags describe; LaunchError names the flag."""
    hosts = [h for h in args.hosts.split(",") if h] if args.hosts else []
    if not hosts:
        raise LaunchError("--hosts: the first layout's hosts are required to register a job "
                          "(e.g. --hosts host-0,host-1)")
    if len(set(hosts)) != len(hosts):
        raise LaunchError(f"--hosts {args.hosts!r}: a host is listed twice")
    if args.devices_per_host <= 0:
        raise LaunchError(f"--devices-per-host {args.devices_per_host}: must be at least 1")
    world = len(hosts) * args.devices_per_host
    tp, pp = args.tp or 1, args.pp or 1
    for flag, value in (("--tp", args.tp), ("--pp", args.pp), ("--dp", args.dp),
                        ("--dp-shard", args.dp_shard)):
        if value < 0:
            raise LaunchError(f"{flag} {value}: must be positive")
    if world % (tp * pp):
        raise LaunchError(f"--tp {tp} x --pp {pp} does not divide the {world} ranks of "
                          f"--hosts ({len(hosts)}) x --devices-per-host {args.devices_per_host}")
    dp = args.dp or world // (tp * pp)
    try:
        return _layout.make_layout(tp, pp, dp, hosts=hosts,
                                   devices_per_host=args.devices_per_host,
                                   dp_shard=args.dp_shard)
    except ValueError as e:
        raise LaunchError(f"the first layout (--hosts, --devices-per-host, --tp, --pp, --dp, "
                          f"--dp-shard): {e}") from None


def _config_text(c):
    return (f"tp {c.tp} x pp {c.pp} x dp {c.dp}" + (f" (dp_shard {c.dp_shard})"
                                                  if c.dp_shard and c.dp_shard != c.dp else "") +
            (f" x cp {c.cp}" if c.cp > 1 else ""))


def _same_config(a, b):
    return ((a.tp, a.pp, a.dp, max(a.cp, 1), a.dp_shard or a.dp) ==
            (b.tp, b.pp, b.dp, max(b.cp, 1), b.dp_shard or b.dp))


def read_token(path, flag):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise LaunchError(f"{flag} \"{path}\": cannot read it: {e.strerror}") from None


# The coordinator connection of `reshard register` and `reshard slurm`: the
# same flags (--coordinator, --tls-ca or --insecure, --tls-cert/--tls-key,
# --token-file, $RESHARD_TOKEN), read the same way.
def check_transport(args):
    if bool(args.tls_ca) == bool(args.insecure):
        raise LaunchError("give --tls-ca FILE (TLS) or --insecure (plaintext), one of them")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise LaunchError("--tls-cert and --tls-key go together")


def token_of(args, missing):
    """--token-file's token, else $RESHARD_TOKEN's; LaunchError(`missing`)
    when neither gives one and there is no client certificate either."""
    token = (read_token(args.token_file, "--token-file") if args.token_file
             else os.environ.get("RESHARD_TOKEN", ""))
    if not token and not args.tls_cert:
        raise LaunchError(missing)
    return token


def connect(args, token):
    from reshard.core.client import Client, tls_credentials
    kwargs = {"insecure": True} if args.insecure else {"credentials": tls_credentials(
        os.path.abspath(args.tls_ca), args.tls_cert, args.tls_key)}
    return Client(args.coordinator, token=token or None, **kwargs)


# ---------------------------------------------------- the rank's side


def _write(path, value, mode=0o600):
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
    os.rename(tmp, path)


def _read(path):
    with open(path) as f:
        return json.load(f)


def request(directory, spec, lay, dataset):
    """Rank 0: writes the registration request (the PTC of `spec`, the
    DatasetState `dataset` or None) to `directory`. ValueError when
    describe()'s parallel config is not the launcher's first layout's."""
    if not _same_config(spec.config, lay.config):
        raise ValueError(
            f"describe() found {_config_text(spec.config)}, but the launcher's first layout "
            f"(--tp, --pp, --dp, --dp-shard) is {_config_text(lay.config)}: build the model "
            f"at pytorch_loop.device_mesh()")
    state = None
    if dataset is not None:
        from reshard.core.client import _dataset_message
        state = to_dict(_dataset_message(dataset))
    _write(os.path.join(directory, REQUEST), {"ptc": to_dict(spec.ptc), "dataset_state": state})


def answer(directory, timeout):
    """Rank 0: the launcher's answer {job_id, worker_token} or {code,
    message}, waited for up to `timeout` seconds."""
    path = os.path.join(directory, ANSWER)
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            return {"code": errors.DeadlineExceeded.code.value[0],
                    "message": f"no registration answer from the launcher within {timeout:g} s"}
        time.sleep(_POLL_S)
    reply = _read(path)
    os.remove(path)  # it may hold the worker token: read once
    return reply


def error_of(reply):
    """The ReshardError of a refused registration's answer."""
    return errors.from_code(reply["code"], f"registering the job: {reply['message']}")


# ------------------------------------------------- the launcher's side


def find_job(client, tenant, name):
    """The Job named `name` in `tenant`, or None."""
    for job in client.iter_jobs(tenant=tenant):
        if job.name == name:
            return job
    return None


def register(client, tenant, name, lay, req, idempotency_key=None, state_memory="host",
             policy=None):
    """RegisterJob of a request.json (with the job's elastic policy, a dict
    of ElasticPolicy's JSON fields, when given); returns (Job, worker token)."""
    spec = {"name": name, "tenant": tenant, "ptc": req["ptc"], "layout": to_dict(lay),
            "stateMemory": f"STATE_MEMORY_{state_memory.upper()}"}
    if policy is not None:
        spec["policy"] = policy
    return client.register_job(spec, dataset_state=req.get("dataset_state"),
                               idempotency_key=idempotency_key, with_token=True)


class Registration:
    """`reshard run --job-name`: the job found or registered before the
    Launcher follows it. job_id and worker_token once prepare() returned;
    `world` the first layout's ranks on this host when this launcher started
    them (hand_over() gives them to the Launcher, which follows them as the
    job's generation-1 world)."""

    def __init__(self, args, command, client, coordinator, worker_socket, tls_ca, addresses,
                 port_range, log):
        self.args, self.command, self.client = args, command, client
        self.coordinator, self.worker_socket, self.tls_ca = coordinator, worker_socket, tls_ca
        self.addresses, self.port_range, self._log = addresses, port_range, log
        self.job_id, self.worker_token, self.job = "", "", None
        self.world, self.starter = None, None
        self._exits, self._sink, self._lock = [], None, threading.Lock()
        self._dir = None

    def event(self, kind, **fields):
        """As the Launcher's --events (appended to the same file)."""
        if self.args.events:
            try:
                with open(self.args.events, "a") as f:
                    f.write(json.dumps({"t": time.time(), "event": kind, **fields}) + "\n")
            except OSError as e:
                raise LaunchError(f"--events \"{self.args.events}\": cannot write it: "
                                  f"{e.strerror}") from None

    def _on_exit(self, world, rank, code):
        with self._lock:
            if self._sink is None:
                self._exits.append((world, rank, code))
                return
        self._sink(("exit", (world, rank, code)))

    def _failed(self):
        """[(rank, status)] of the registration world's ranks that ended
        before the job existed: those that failed, or all of them when every
        one ended (status 0: a script that never called pytorch_loop.start)."""
        with self._lock:
            failed = [(r, c) for _, r, c in self._exits if c != 0]
            if not failed and self.world is not None and len(self._exits) == len(
                    self.world.procs):
                failed = [(r, c) for _, r, c in self._exits]
            return failed

    def prepare(self):
        """Finds the job (tenant, name) or registers it (see the module doc)."""
        a = self.args
        job = find_job(self.client, a.tenant, a.job_name)
        if job is not None:
            self._log(f"job {job.id} ({a.tenant}/{a.job_name}) exists: following it")
            return self._found(job)
        lay = first_layout(a)
        registrar = _layout.slots(lay)[0][0] == a.host
        if getattr(a, "slurm", False):
            self._check_agents(lay)
        self._start_world(lay, registrar)
        end = time.monotonic() + a.register_timeout
        if registrar:
            self._log(f"job {a.tenant}/{a.job_name} does not exist: registering it at "
                      f"{_config_text(lay.config)} once rank 0 described it")
            req = self._wait(lambda: _exists(os.path.join(self._dir, REQUEST)), end,
                             "rank 0's describe()")
            req = _read(os.path.join(self._dir, REQUEST))
            try:
                job, token = register(self.client, a.tenant, a.job_name, lay, req,
                                      state_memory=a.state_memory, policy=read_policy(a.policy))
            except errors.ReshardError as e:
                _write(os.path.join(self._dir, ANSWER),
                       {"code": e.code.value[0], "message": e.message})
                raise LaunchError(f"registering job {a.tenant}/{a.job_name}: {e}") from None
            _write(os.path.join(self._dir, ANSWER), {"job_id": job.id, "worker_token": token})
            self._log(f"registered job {job.id} ({a.tenant}/{a.job_name})")
            self.event("registered", job_id=job.id, tenant=a.tenant, name=a.job_name)
            self.job, self.job_id, self.worker_token = job, job.id, token
            return self
        self._log(f"job {a.tenant}/{a.job_name} does not exist: waiting for the launcher of "
                  f"host {_layout.slots(lay)[0][0]} (rank 0) to register it")
        job = self._wait(lambda: find_job(self.client, a.tenant, a.job_name), end,
                         "the job's registration", poll=0.25)
        if job.layout.SerializeToString(deterministic=True) != lay.SerializeToString(
                deterministic=True):
            raise LaunchError(
                f"job {job.id} ({a.tenant}/{a.job_name}) was registered at "
                f"{_config_text(job.layout.config)} on {list(_layout.hosts_of(job.layout))}, "
                f"not at this launcher's first layout {_config_text(lay.config)} on "
                f"{list(_layout.hosts_of(lay))}: give every launcher the same --hosts, "
                f"--devices-per-host, --tp, --pp, --dp, --dp-shard")
        return self._found(job)

    def _check_agents(self, lay):
        """Under Slurm (--slurm: the allocation chose the hosts), before the
        first layout's ranks start: this host's agent answers at
        --worker-socket, and every host of the layout is a registered, live
        agent. A node list that does not match the agents (a node whose
        agent is down) would otherwise leave the ranks waiting for peers
        that never start."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(self.worker_socket)
        except OSError as e:
            raise LaunchError(f"--worker-socket \"{self.worker_socket}\": no agent answers "
                              f"there ({e.strerror or e}): start host {self.args.host}'s "
                              "reshard-agent with that --worker-socket first") from None
        try:
            hosts = {h.host_id: h for h in self.client.list_hosts()}
        except errors.PermissionDenied:
            return  # a credential that may not list hosts: the registration checks what it can
        for host in _layout.hosts_of(lay):
            h = hosts.get(host)
            if h is None or h.state != agent_pb2.HOST_STATE_ALIVE:
                said = "no agent registered" if h is None else "its agent's lease expired (LOST)"
                live = sorted(k for k, v in hosts.items() if v.state == agent_pb2.HOST_STATE_ALIVE)
                raise LaunchError(f"the first layout's host {host!r}: {said}, so its ranks "
                                  f"cannot start (live hosts: {', '.join(live) or 'none'})")

    def _found(self, job):
        self.job, self.job_id = job, job.id
        self.event("found", job_id=job.id, tenant=self.args.tenant, name=self.args.job_name)
        self.worker_token = self.client.worker_token(job.id)
        return self

    def _wait(self, ready, end, what, poll=_POLL_S):
        while True:
            got = ready()
            if got:
                return got
            failed = self._failed()
            if failed:
                raise LaunchError(
                    f"the first layout's rank {failed[0][0]} ended ({_status(failed[0][1])}) "
                    f"before the job was registered: see its output")
            if time.monotonic() > end:
                raise LaunchError(f"{what}: not within --register-timeout "
                                  f"{self.args.register_timeout:g} s")
            time.sleep(poll)

    def _start_world(self, lay, registrar):
        from reshard.launcher._launch_ranks import Starter
        a = self.args
        if not _layout.ranks_on_host(lay, a.host):
            return
        self._dir = tempfile.mkdtemp(prefix="reshard-register-")
        env_before = os.environ.get("RESHARD_REGISTER_DIR")
        self.starter = Starter(
            a.host, self.command, dict(coordinator=self.coordinator, job_id="", worker_token="",
                                       worker_socket=self.worker_socket, tls_ca=self.tls_ca),
            self.addresses, self.port_range, on_exit=self._on_exit, log=self._log,
            event=self.event, log_dir=a.log_dir)
        os.environ["RESHARD_REGISTER_DIR"] = self._dir
        try:
            self.world = self.starter.start("g1", lay, 0, "", 0)
        finally:
            if env_before is None:
                os.environ.pop("RESHARD_REGISTER_DIR", None)
            else:
                os.environ["RESHARD_REGISTER_DIR"] = env_before
        self._log(f"started the first layout's ranks {sorted(self.world.procs)} to describe "
                  f"the job{' (this host has rank 0: it registers)' if registrar else ''}")

    def hand_over(self, launcher):
        """The Launcher follows this host's first-layout ranks as the job's
        generation-1 world (they publish it themselves); exits seen before go
        to its queue."""
        if self.world is None:
            return
        launcher.current, launcher.layout = self.world, self.job.layout
        with self._lock:
            self._sink = launcher.queue.put
            exits, self._exits = self._exits, []
        for item in exits:
            launcher.queue.put(("exit", item))

    def abort(self):
        """Stops this host's registration ranks (a registration that failed)."""
        if self.world is not None and self._sink is None:
            from reshard.launcher._launch_ranks import stop_worlds
            stop_worlds([self.world], signal.SIGTERM, "registration failed", self.args.grace,
                        lambda *_, **__: None)

    def close(self):
        if self.starter is not None:
            self.starter.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def _exists(path):
    return os.path.exists(path)


def _status(code):
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def add_run_flags(p):
    """`reshard run`'s registration flags."""
    g = p.add_argument_group(
        "registration", "the job by (--tenant, --job-name) instead of --job, registered from the "
                        "ranks' own describe() when it does not exist yet (docs/pytorch.md, "
                        "\"The launcher\")")
    g.add_argument("--job-name", default="", metavar="NAME",
                   help="the job's name; registered when its tenant has no job of that name")
    g.add_argument("--tenant", default="", help="the job's tenant (with --job-name)")
    g.add_argument("--register-token-file", metavar="F",
                   help="a credential allowed to register (a scheduler token of the tenant or "
                        "an admin's; default $RESHARD_REGISTER_TOKEN); the ranks get the job's "
                        "worker token instead")
    g.add_argument("--register-timeout", type=float, default=600.0, metavar="S",
                   help="how long to wait for rank 0's describe() or, on another host, for "
                        "the job to be registered (default %(default)s)")
    add_layout_flags(g)


def prepare_run(args, command, kwargs, addresses_of, port_range, log=None):
    """`reshard run --job-name`: the Registration (job_id, worker_token set)
    or LaunchError. `kwargs`: the Client's channel arguments; addresses_of(
    list_hosts) the Addresses."""
    from reshard.core.client import Client
    if not args.tenant:
        raise LaunchError("--job-name needs --tenant (the job's tenant)")
    if args.job:
        raise LaunchError("give --job ID or --job-name NAME, not both")
    read_policy(args.policy)  # a bad --policy is said before any rank starts
    if args.token_file:
        raise LaunchError("--token-file is the job's worker token, which --job-name gets from "
                          "the coordinator: give --register-token-file instead")
    token = (read_token(args.register_token_file, "--register-token-file")
             if args.register_token_file else os.environ.get("RESHARD_REGISTER_TOKEN", ""))
    if not token:
        raise LaunchError("--job-name: registering needs --register-token-file (a scheduler "
                          "token of the tenant, or an admin's) or $RESHARD_REGISTER_TOKEN")
    log = log or (lambda msg: print(f"reshard run [{args.tenant}/{args.job_name} {args.host}]: "
                                    f"{msg}", file=sys.stderr, flush=True))
    client = Client(args.coordinator, token=token, **kwargs)
    reg = Registration(args, command, client, args.coordinator,
                       os.path.abspath(args.worker_socket),
                       os.path.abspath(args.tls_ca) if args.tls_ca else "",
                       addresses_of(client.list_hosts), port_range, log)
    try:
        reg.prepare()
    except (errors.Unavailable, errors.DeadlineExceeded) as e:
        reg.abort()
        reg.close()
        client.close()
        raise LaunchError(f"coordinator {args.coordinator}: cannot reach it: "
                          f"{' '.join(str(e).split())}") from None
    except (errors.ReshardError, LaunchError) as e:
        reg.abort()
        reg.close()
        client.close()
        raise LaunchError(str(e) if isinstance(e, LaunchError) else
                          f"job {args.tenant}/{args.job_name}: {e}") from None
    client.close()
    return reg


# ------------------------------------------------- `reshard register`


def _parser():
    p = argparse.ArgumentParser(
        prog="reshard register",
        description="Register a job from the PTC of its training script's describe() "
                    "(docs/pytorch.md, \"The launcher\", registration).")
    p.add_argument("--coordinator", required=True, help="HOST:PORT of a reshard-coordinator")
    p.add_argument("--tenant", required=True)
    p.add_argument("--name", required=True, help="the job's name (unique in its tenant)")
    p.add_argument("--token-file", help="a scheduler token of the tenant or an admin's "
                   "(default $RESHARD_TOKEN); or --tls-cert/--tls-key")
    p.add_argument("--tls-ca", help="PEM CA of the coordinator's certificate (TLS)")
    p.add_argument("--tls-cert", help="a client certificate (mutual TLS)")
    p.add_argument("--tls-key", help="its key")
    p.add_argument("--insecure", action="store_true", help="plaintext")
    add_layout_flags(p)
    p.add_argument("--ptc", metavar="FILE", help="the PTC as JSON (instead of a command)")
    p.add_argument("--dataset-state", metavar="FILE",
                   help="the DatasetState as JSON (with --ptc)")
    p.add_argument("--idempotency-key", default=None,
                   help="RegisterJob's key (a retry with the same key and request returns the "
                        "first job)")
    p.add_argument("--worker-token-file", metavar="OUT",
                   help="write the job's worker token here (mode 0600)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="how long the describe world may take (default %(default)s)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- the training script: its first layout's ranks run on this machine "
                        "until pytorch_loop.start() described the job, then end")
    return p


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_locally(command, lay, coordinator, tls_ca, timeout):
    """Runs the first layout's ranks of `command` on this machine until rank
    0 wrote its request (pytorch_loop.start() ends them, status 0); returns
    the request. LaunchError names a rank that failed."""
    directory = tempfile.mkdtemp(prefix="reshard-register-")
    slots = _layout.slots(lay)
    layout_json = json.dumps(to_dict(lay), sort_keys=True)
    port = _free_port()
    procs = {}
    try:
        base = dict(os.environ, RESHARD_REGISTER_DIR=directory, RESHARD_REGISTER_DESCRIBE="1")
        for rank, (_, device) in enumerate(slots):
            env = rank_environment(
                base, rank=rank, world_size=len(slots), local_rank=rank,
                local_world_size=len(slots), master_addr="127.0.0.1", master_port=port,
                coordinator=coordinator, job_id="", worker_token="", worker_socket="",
                generation=0, layout_json=layout_json, device=device, tls_ca=tls_ca)
            try:
                procs[rank] = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
            except OSError as e:
                raise LaunchError(f"cannot start {command[0]!r}: {e.strerror}") from None
        end = time.monotonic() + timeout
        for rank, p in procs.items():
            try:
                code = p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LaunchError(f"rank {rank} of the describe world: still running after "
                                  f"--timeout {timeout:g} s") from None
            if code != 0:
                raise LaunchError(f"rank {rank} of the describe world ended ({_status(code)}) "
                                  f"before describing the job: see its output")
        path = os.path.join(directory, REQUEST)
        if not os.path.exists(path):
            raise LaunchError("the describe world ended without a description: does the "
                              "script call reshard.pytorch_loop.start()?")
        return _read(path)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _read_json(path, flag):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise LaunchError(f"{flag} \"{path}\": cannot read it: {e.strerror}") from None
    except ValueError as e:
        raise LaunchError(f"{flag} \"{path}\": not JSON: {e}") from None


def main(argv):
    """`reshard register ...`; returns the exit status (0: registered, the
    job id on stdout; 2: bad arguments or refused, one line on stderr naming
    the gRPC code)."""
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    client = None
    try:
        if bool(args.ptc) == bool(command):
            raise LaunchError("give --ptc FILE, or -- COMMAND (the training script), one of them")
        if args.dataset_state and not args.ptc:
            raise LaunchError("--dataset-state goes with --ptc (a script gives its own dataset)")
        check_transport(args)
        lay = first_layout(args)
        policy = read_policy(args.policy)
        token = token_of(args, "a credential allowed to register: --token-file (a scheduler "
                               "token of the tenant or an admin's), $RESHARD_TOKEN, or "
                               "--tls-cert/--tls-key")
        if args.ptc:
            req = {"ptc": _read_json(args.ptc, "--ptc"), "dataset_state": (
                _read_json(args.dataset_state, "--dataset-state")
                if args.dataset_state else None)}
            for key, cls, flag, path in (("ptc", ptc_pb2.Ptc, "--ptc", args.ptc),
                                         ("dataset_state", ptc_pb2.DatasetState,
                                          "--dataset-state", args.dataset_state)):
                try:
                    if req[key] is not None:
                        as_message(req[key], cls, flag)
                except (ValueError, TypeError) as e:
                    raise LaunchError(f"{flag} \"{path}\": not a {cls.DESCRIPTOR.name}: "
                                      f"{' '.join(str(e).split())}") from None
        else:
            if shutil.which(command[0]) is None:
                raise LaunchError(f"command {command[0]!r}: not found or not executable")
            req = describe_locally(command, lay, args.coordinator,
                                   os.path.abspath(args.tls_ca) if args.tls_ca else "",
                                   args.timeout)
        client = connect(args, token)
        job, worker_token = register(client, args.tenant, args.name, lay, req,
                                     args.idempotency_key, args.state_memory, policy)
        if args.worker_token_file:
            fd = os.open(args.worker_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(worker_token + "\n")
    except (LaunchError, ValueError) as e:
        print(f"reshard register: {e}", file=sys.stderr)
        return EXIT_USAGE
    except errors.ReshardError as e:
        print(f"reshard register: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if client is not None:
            client.close()
    print(job.id)
    return EXIT_OK
