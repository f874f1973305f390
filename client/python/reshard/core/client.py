"""reshard.Client: the scheduler-facing API of reshard-coordinator.

Thread contract: a Client may be shared by threads (gRPC channels and stubs
are thread-safe); close() is idempotent. Every call has a deadline (`timeout`
seconds for the whole call, its retries included: each attempt gets the time
left); calls that fail with UNAVAILABLE are retried with exponential backoff
and jitter up to `max_attempts` attempts, and nothing else is retried (the
table of reshard._rpc, kind "client_call"; watches reopen as
"stream_reconnect"). A mutating call draws one idempotency key and sends it
on every attempt, so a retry after a lost reply returns the first attempt's
result instead of doing the work twice. Results are the proto messages of
reshard.v1 (`reshard.to_dict` turns one into a dict).
"""

import os
import time
import uuid

import grpc

from reshard.core import _rpc, errors
from reshard.core._proto import as_message, coordinator_pb2, coordinator_pb2_grpc, ptc_pb2

_pb = coordinator_pb2

TERMINAL_STATES = frozenset(
    (_pb.OPERATION_STATE_COMMITTED, _pb.OPERATION_STATE_ABORTED, _pb.OPERATION_STATE_FAILED))

_CALL = _rpc.POLICIES[_rpc.CLIENT_CALL]

# A follow (watch_job(follow=...)) reopens its stream on these codes too: a
# replica failing or stopping mid-stream, not an answer about the job.
_FOLLOW_CODES = frozenset((_rpc.DEADLINE_EXCEEDED, _rpc.INTERNAL, _rpc.ABORTED,
                           _rpc.CANCELLED))

# What a watch's at_end answers when the watch is over with nothing more to
# yield (Client._watch_stream).
_END = object()

_DEFAULT_CHANNEL_OPTIONS = (
    # The client retries UNAVAILABLE itself; let the channel reconnect quickly
    # instead of sitting out gRPC's default 1 s..120 s reconnect backoff.
    # (Not grpc.min_reconnect_backoff_ms: gRPC also uses it as the connect
    # timeout, and 100 ms fails handshakes on a loaded machine.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} \"{path}\": cannot read it: {e.strerror}") from None


def tls_credentials(ca, cert=None, key=None):
    """grpc.ChannelCredentials for a coordinator with TLS (docs/security.md).

    ca: the PEM CA file the coordinator's certificate chains to.
    cert, key: this client's certificate and key (mutual TLS: services,
      agents); leave both out to be identified by a bearer token instead.
    """
    if (cert is None) != (key is None):
        raise ValueError("tls_credentials: cert and key go together: give both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "tls ca"),
        private_key=None if key is None else _read(key, "tls key"),
        certificate_chain=None if cert is None else _read(cert, "tls cert"))


# ------------------------------------------- Client.from_env, operator side


def _operator_credentials(env):
    """Client kwargs of an operator's environment without a worker token:
    {"credentials": mutual TLS} when $RESHARD_TLS_CERT or $RESHARD_TLS_KEY is
    set, {"insecure": True} when $RESHARD_INSECURE is 1/true, else None."""
    cert, key = env.get("RESHARD_TLS_CERT", ""), env.get("RESHARD_TLS_KEY", "")
    if cert or key:
        missing = [n for n in ("RESHARD_TLS_CA", "RESHARD_TLS_CERT", "RESHARD_TLS_KEY")
                   if not env.get(n, "")]
        if missing:
            raise ValueError(f"Client.from_env: {', '.join(missing)} not set (mutual TLS needs "
                             "RESHARD_TLS_CA, RESHARD_TLS_CERT and RESHARD_TLS_KEY)")
        return {"credentials": tls_credentials(env["RESHARD_TLS_CA"], cert, key)}
    if env.get("RESHARD_INSECURE", "").lower() in ("1", "true"):
        return {"insecure": True}
    return None


def is_terminal(operation):
    """True when the Operation is COMMITTED, ABORTED or FAILED."""
    return operation.state in TERMINAL_STATES


def new_idempotency_key():
    """A fresh random idempotency key (32 hex chars)."""
    return uuid.uuid4().hex


class Client:
    """Typed calls for the whole CoordinatorService.

    Args:
      address: "host:port" of a coordinator (any replica).
      timeout: default deadline of one call, seconds, its retries included
        (each attempt gets the time left; None: no deadline).
      max_attempts: attempts per call when the server is UNAVAILABLE (>= 1);
        also the broken streams in a row a watch reopens.
      initial_backoff, max_backoff, backoff_multiplier: retry delays, seconds:
        the wait after failed attempt n is
        min(max_backoff, initial_backoff * backoff_multiplier**(n-1)) times a
        random factor in (0.5, 1] (jitter; reshard._rpc.backoff).
      channel: an existing grpc.Channel to use instead of opening one.
      credentials: grpc.ChannelCredentials (reshard.tls_credentials(...)).
        Required unless `channel` is given or `insecure` is True.
      insecure: plaintext, for a coordinator run with --insecure.
      token: a bearer token, sent as `authorization: Bearer <token>` with
        every call (people and schedulers without a certificate), or the
        job's worker token: a training process's credential for everything
        it does on its own job (get_job, watch_job, get/watch_operation,
        wait, checkpoint, commit_step, dataset_state, mark_prepared,
        report_rank_failure), PermissionDenied for anything else.
        Client.from_env() builds that client from the launcher's environment.
      options: extra gRPC channel options, (key, value) pairs.
      on_retry: optional callable(method, attempt, error, delay_s, idempotency_key)
        called before each retry sleep (for logging and metrics).
    """

    def __init__(self, address, timeout=30.0, max_attempts=_CALL["max_attempts"],
                 initial_backoff=_CALL["initial_backoff_s"], max_backoff=_CALL["max_backoff_s"],
                 backoff_multiplier=_CALL["multiplier"], channel=None, credentials=None,
                 options=(), on_retry=None, insecure=False, token=None):
        if max_attempts < 1:
            raise ValueError(f"max_attempts {max_attempts} must be >= 1")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout {timeout} must be > 0")
        self.address = address
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.backoff_multiplier = backoff_multiplier
        self.on_retry = on_retry
        self._metadata = None if not token else (("authorization", f"Bearer {token}"),)
        if channel is None and credentials is None and not insecure:
            raise ValueError("Client: credentials= (reshard.tls_credentials(ca, ...)) or "
                             "insecure=True (a coordinator run with --insecure) is required")
        if insecure and credentials is not None:
            raise ValueError("Client: insecure=True and credentials= contradict each other")
        self._own_channel = channel is None
        if channel is None:
            opts = list(_DEFAULT_CHANNEL_OPTIONS) + list(options)
            if credentials is None:
                channel = grpc.insecure_channel(address, options=opts)
            else:
                channel = grpc.secure_channel(address, credentials, options=opts)
        self._channel = channel
        self._stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        self._closed = False

    @classmethod
    def from_env(cls, env=None, **kwargs):
        """A training process's Client, from the environment the launcher
        gives each rank (docs/pytorch.md, "Credentials of a training
        process"): the coordinator at $RESHARD_COORDINATOR, the job's worker
        token $RESHARD_WORKER_TOKEN as its only credential, TLS with the CA
        file $RESHARD_TLS_CA (no client certificate), or plaintext when
        $RESHARD_TLS_CA is unset or empty (a coordinator run with --insecure).
        `env`: a mapping to read instead of os.environ; `kwargs` go to
        Client (timeout=, max_attempts=, ...; credentials=, insecure= or
        token= override what the environment says). ValueError names a
        missing variable or an unreadable CA file.

        Without a worker token, an operator's or a scheduler's shell (the
        variables reshardctl reads; the line `deploy/local/cluster.py`
        prints): mutual TLS with $RESHARD_TLS_CA, $RESHARD_TLS_CERT and
        $RESHARD_TLS_KEY, or plaintext with RESHARD_INSECURE=1."""
        env = os.environ if env is None else env
        address = env.get("RESHARD_COORDINATOR", "")
        if not address:
            raise ValueError("Client.from_env: RESHARD_COORDINATOR is not set "
                             "(the coordinator's host:port)")
        if "token" not in kwargs and not env.get("RESHARD_WORKER_TOKEN", ""):
            own = _operator_credentials(env)
            if own is not None:
                if not {"credentials", "insecure", "channel"} & set(kwargs):
                    kwargs.update(own)
                return cls(address, **kwargs)
        if "token" not in kwargs:
            token = env.get("RESHARD_WORKER_TOKEN", "")
            if not token:
                raise ValueError("Client.from_env: RESHARD_WORKER_TOKEN is not set "
                                 "(the job's worker token; an operator gives RESHARD_TLS_CERT "
                                 "and RESHARD_TLS_KEY, or RESHARD_INSECURE=1, instead)")
            kwargs["token"] = token
        if "credentials" not in kwargs and "insecure" not in kwargs and "channel" not in kwargs:
            ca = env.get("RESHARD_TLS_CA", "")
            if ca:
                kwargs["credentials"] = tls_credentials(ca)
            else:
                kwargs["insecure"] = True
        return cls(address, **kwargs)

    # ------------------------------------------------------------ lifecycle

    def close(self):
        """Closes the channel (if the Client opened it). Idempotent."""
        if not self._closed:
            self._closed = True
            if self._own_channel:
                self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -------------------------------------------------------------- plumbing

    def _wait_for_a_slot(self, e, refusals, method, end):
        """Waits before opening again a watch whose stream the coordinator
        refused for its watch limits (RESOURCE_EXHAUSTED: the caller's, its
        tenant's or the replica's slots are taken; `refusals` in a row): the
        same capped, jittered exponential backoff as any retry (_delay),
        reported through on_retry, never past `end` (monotonic; None: no
        end). A refused watch waits for a slot as long as its caller lets it,
        however many refusals that takes, not counted against max_attempts: a
        busy coordinator must never become a training failure."""
        delay = self._delay(min(refusals, 32), _rpc.STREAM_RECONNECT)
        if end is not None:
            delay = min(delay, max(end - time.monotonic(), 0.0))
        if self.on_retry is not None:
            self.on_retry(method, refusals, errors.from_rpc_error(e, method), delay, None)
        time.sleep(delay)

    def _delay(self, attempt, kind=_rpc.CLIENT_CALL):
        """The jittered wait after failed attempt `attempt` of a call of
        `kind` (reshard._rpc.backoff), with this client's delays."""
        return _rpc.backoff(_rpc.policy(
            kind, max_attempts=self.max_attempts, initial_backoff_s=self.initial_backoff,
            max_backoff_s=self.max_backoff, multiplier=self.backoff_multiplier), attempt)

    def _end(self, timeout):
        """The monotonic deadline of a call given `timeout` (None: the
        client's; None there too: no deadline)."""
        budget = self.timeout if timeout is None else timeout
        return None if budget is None else time.monotonic() + budget

    def _call(self, method, request, timeout=None, idempotency_key=None):
        return self._call_until(method, request, self._end(timeout), idempotency_key)

    def _call_until(self, method, request, end, idempotency_key=None):
        """One logical call: attempts while the table retries its code
        (UNAVAILABLE), up to max_attempts, each attempt's deadline the time
        left before `end`; a wait that would reach `end` ends it with
        DeadlineExceeded naming the attempts and the last error."""
        rpc = getattr(self._stub, method)
        attempt = 0
        while True:
            attempt += 1
            left = None if end is None else end - time.monotonic()
            try:
                return rpc(request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e, method)
                if (not _rpc.retryable(_rpc.CLIENT_CALL, e.code().value[0])
                        or attempt >= self.max_attempts):
                    raise err from None
                delay = self._delay(attempt)
                if end is not None and time.monotonic() + delay >= end:
                    raise errors.DeadlineExceeded(
                        f"no answer within the call's timeout after {attempt} attempt"
                        f"{'s' if attempt > 1 else ''}; the last: {err.code.name}: "
                        f"{err.message}", method=method) from None
                if self.on_retry is not None:
                    self.on_retry(method, attempt, err, delay, idempotency_key)
                time.sleep(delay)

    def _call_at_generation(self, method, req, expected_generation, timeout, key):
        """Calls `method` with req.expected_generation = expected_generation
        or, when that is None, the job's generation read just before: the
        caller means the job as it is when the call lands. A checkpoint that
        commits between that read and the call makes the coordinator answer
        Aborted ("is at generation N+1"); then the generation is read again
        and the call repeated (same idempotency key: an Aborted call claimed
        nothing), up to max_attempts, while each Aborted comes with a newer
        generation. A given expected_generation is the caller's own
        precondition: its Aborted is raised at once. The reads and the
        attempts share the call's one deadline (`timeout`)."""
        end = self._end(timeout)
        if expected_generation is not None:
            req.expected_generation = expected_generation
            return self._call_until(method, req, end, key)
        attempt = 0
        while True:
            attempt += 1
            req.expected_generation = self._generation(req.job_id, end)
            try:
                return self._call_until(method, req, end, key)
            except errors.Aborted:
                if (attempt >= self.max_attempts
                        or self._generation(req.job_id, end) == req.expected_generation):
                    raise

    def _generation(self, job_id, end):
        """The job's generation, read through get_job within what is left
        before `end` (monotonic; None: no end)."""
        left = None if end is None else max(end - time.monotonic(), 0.0)
        return self.get_job(job_id, timeout=left).generation

    # ------------------------------------------------------------------ jobs

    def register_job(self, spec, idempotency_key=None, timeout=None, dataset_state=None,
                     with_token=False):
        """Registers a job (JobSpec or dict: name, tenant, ptc, layout) at
        generation 1. Returns the Job, or (Job, worker token) with
        with_token=True: hand the token to the job's workers
        (Worker(worker_token=...) or RESHARD_WORKER_TOKEN). AlreadyExists when
        (tenant, name) is taken by another request; InvalidArgument for a bad
        spec. dataset_state: optional (reshard.data.DatasetState, a
        reshard.v1.DatasetState or its dict; docs/data.md)."""
        key = idempotency_key or new_idempotency_key()
        req = _pb.RegisterJobRequest(spec=as_message(spec, ptc_pb2.JobSpec, "spec"),
                                     idempotency_key=key)
        if dataset_state is not None:
            req.dataset_state.CopyFrom(_dataset_message(dataset_state))
        resp = self._call("RegisterJob", req, timeout, key)
        return (resp.job, resp.worker_token) if with_token else resp.job

    def worker_token(self, job_id, timeout=None):
        """The job's worker token (admin, or a scheduler of its tenant): what
        the job's workers present to their agent. NotFound if unknown."""
        return self._call("GetWorkerToken", _pb.GetWorkerTokenRequest(job_id=job_id),
                          timeout).worker_token

    def get_job(self, job_id, include_ptc=False, timeout=None):
        """The Job (with its PTC when include_ptc). NotFound if unknown."""
        return self._call("GetJob", _pb.GetJobRequest(job_id=job_id, include_ptc=include_ptc),
                          timeout)

    def iter_jobs(self, tenant="", state=None, page_size=100, timeout=None):
        """Yields every Job (optionally of one tenant / JobState), page by page."""
        token = ""
        while True:
            req = _pb.ListJobsRequest(tenant=tenant, page_size=page_size, page_token=token)
            if state is not None:
                req.state = _pb.JobState.Value(state) if isinstance(state, str) else state
            resp = self._call("ListJobs", req, timeout)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def list_jobs(self, tenant="", state=None, page_size=100, timeout=None):
        """Every Job (all pages), as a list."""
        return list(self.iter_jobs(tenant, state, page_size, timeout))

    def delete_job(self, job_id, idempotency_key=None, timeout=None):
        """Deletes a job and its generations. NotFound if unknown."""
        key = idempotency_key or new_idempotency_key()
        self._call("DeleteJob", _pb.DeleteJobRequest(job_id=job_id, idempotency_key=key),
                   timeout, key)

    # ------------------------------------------------------------ operations

    def resize(self, job_id, layout=None, expected_generation=None, idempotency_key=None,
               timeout=None, choose=False, gpus=None, hosts=None, horizon_s=None, devices=None,
               model=None, stop_free=False, at_step_boundary=False, step_boundary_timeout=None,
               deadline_unix_ms=None, abort_past_deadline=False):
        """Starts a resize to `layout` (Layout: config + placement; a Layout
        without config, or a bare Placement, keeps the current config).
        With choose=True and no layout the coordinator picks it: the advisor's
        best candidate for `horizon_s` on `gpus` devices (arguments as
        advise(); `model` a dict of AdviseModel fields). expected_generation
        defaults to the job's current one (read first, and read again if a
        checkpoint commits before the call lands). Returns the new
        Operation (PENDING; its target_layout is the choice); see wait().
        stop_free=True: two-phase (docs/coordinator.md, "Stop-free
        reconfiguration"; reshard.elastic drives it from the training loop).
        at_step_boundary=True (stop-the-world): the operation waits for the
        training loop's checkpoint naming it (Job.step_boundary_operation_id;
        checkpoint(cut_over_operation_id=op.id)) and moves that state; without
        one within step_boundary_timeout seconds (None: the coordinator's
        --step-boundary-timeout-ms) it moves the last committed generation.
        Requested while a checkpoint is in flight, any resize is queued behind
        it (docs/coordinator.md, "Checkpoints and operations").
        deadline_unix_ms (coordinator clock): the operation must end by then;
        the coordinator predicts it first and raises FailedPrecondition,
        naming the prediction and an alternative, when it would not; with
        abort_past_deadline=True it is aborted cleanly if still running at
        the deadline, else it goes on (Operation.eta_unix_ms;
        docs/scheduler.md, "Deadlines")."""
        if choose == (layout is not None):
            raise ValueError("resize: give a layout, or choose=True with gpus")
        key = idempotency_key or new_idempotency_key()
        req = _pb.ResizeRequest(job_id=job_id, idempotency_key=key)
        if choose:
            req.choose.CopyFrom(_advise_request("", gpus, hosts, horizon_s, devices, model or {}))
        else:
            config, placement = _split_layout(layout)
            req.placement.CopyFrom(placement)
            if config is not None:
                req.config.CopyFrom(config)
        req.stop_free = stop_free
        _set_step_boundary(req, at_step_boundary, step_boundary_timeout)
        _set_deadline(req, deadline_unix_ms, abort_past_deadline)
        return self._call_at_generation("Resize", req, expected_generation, timeout, key)

    def checkpoint(self, job_id, dataset_state=None, expected_generation=None,
                   idempotency_key=None, timeout=None, cut_over_operation_id=None):
        """Opens generation current + 1 on the current layout for the job's
        workers to publish at a step boundary (Worker.publish(rank,
        op.to_generation, state)); the Operation commits once every rank is
        sealed, and the previous generation stays current until then.
        dataset_state: the reshard.data.DatasetState after that step (its
        step, cursor and layout fingerprint); the commit then makes it the new
        generation's dataset state in the same transaction (checked like
        commit_step when the checkpoint is created). FailedPrecondition unless
        the job is ACTIVE. cut_over_operation_id: this checkpoint cuts over
        that prepared stop-free operation (needs dataset_state), or is the
        step boundary an at_step_boundary operation waits for; its
        generation becomes the operation's source. Returns the Operation.
        While a stop-free or step-boundary operation is active, a checkpoint
        without cut_over_operation_id is folded into it: the answer is that
        operation with checkpoint_folded set, nothing is created; publish at
        its cut-over (docs/coordinator.md, "Checkpoints and operations")."""
        key = idempotency_key or new_idempotency_key()
        req = _pb.CheckpointRequest(job_id=job_id, idempotency_key=key)
        if dataset_state is not None:
            req.with_step = True
            req.step = dataset_state.step
            req.cursor = dataset_state.cursor
            req.layout_fingerprint = dataset_state.layout_fingerprint
        if cut_over_operation_id:
            req.cut_over_operation_id = cut_over_operation_id
        return self._call_at_generation("Checkpoint", req, expected_generation, timeout, key)

    def mark_prepared(self, operation_id, timeout=None):
        """A stop-free operation's new workers are warm: the old layout may
        cut over at its next step boundary. FailedPrecondition unless the
        operation is stop-free and PLANNED; a repeat is harmless. Returns the
        Operation (prepared_unix_ms, prepare_seconds)."""
        if hasattr(operation_id, "id"):  # an Operation
            operation_id = operation_id.id
        return self._call("MarkPrepared", _pb.MarkPreparedRequest(operation_id=operation_id),
                          timeout)

    def migrate(self, job_id, layout, expected_generation=None, idempotency_key=None,
                timeout=None, stop_free=False, at_step_boundary=False,
                step_boundary_timeout=None, deadline_unix_ms=None, abort_past_deadline=False):
        """Moves the job to another placement (Layout or Placement) with the
        same config and world size (stop_free, at_step_boundary,
        step_boundary_timeout and the deadline as in resize). Returns the new
        Operation."""
        key = idempotency_key or new_idempotency_key()
        _, placement = _split_layout(layout)
        req = _pb.MigrateRequest(job_id=job_id, placement=placement, idempotency_key=key)
        req.stop_free = stop_free
        _set_step_boundary(req, at_step_boundary, step_boundary_timeout)
        _set_deadline(req, deadline_unix_ms, abort_past_deadline)
        return self._call_at_generation("Migrate", req, expected_generation, timeout, key)

    def recover(self, job_id, lost_hosts=(), layout=None, lost_ranks=(),
                expected_generation=None, idempotency_key=None, timeout=None, choose=False,
                gpus=None, hosts=None, horizon_s=None, devices=None, model=None,
                accept_degraded=False, deadline_unix_ms=None, abort_past_deadline=False):
        """Recovers from lost hosts/ranks onto `layout`. Without a layout the
        coordinator chooses (its one survivor policy, docs/coordinator.md):
        the current parallel config with dp shrunk to the surviving device
        slots, ranks on those slots in their old order; FailedPrecondition when
        not even dp 1 fits. With choose=True (and no layout) the advisor picks
        instead, on the surviving hosts (arguments as resize(choose=True)),
        pricing each move as a recovery. FailedPrecondition from the planner
        (via the Operation's error) when some state has no surviving holder.

        A rank that crashed on a live host restarts in place: pass the
        current layout (`get_job(job_id).layout`) with lost_ranks=[rank]; its
        agent still holds its state. A recovery whose layout gives up the
        job's redundancy (its HSDP replicas, or surviving the loss of any one
        host) raises FailedPrecondition naming what is lost and a layout that
        keeps it, if there is one, unless accept_degraded=True (then the
        coordinator's audit trail records it). The deadline as in resize."""
        if choose and layout is not None:
            raise ValueError("recover: give a layout or choose=True, not both")
        key = idempotency_key or new_idempotency_key()
        if isinstance(lost_hosts, str):
            lost_hosts = [lost_hosts]
        req = _pb.RecoverFromFailureRequest(
            job_id=job_id, lost_hosts=list(lost_hosts), lost_ranks=list(lost_ranks),
            idempotency_key=key, accept_degraded=bool(accept_degraded))
        if layout is not None:
            req.target.CopyFrom(as_message(layout, ptc_pb2.Layout, "layout"))
        if choose:
            req.choose.CopyFrom(_advise_request("", gpus, hosts, horizon_s, devices, model or {}))
        _set_deadline(req, deadline_unix_ms, abort_past_deadline)
        return self._call_at_generation("RecoverFromFailure", req, expected_generation,
                                        timeout, key)

    def preview(self, job_id, layout, lost_hosts=(), lost_ranks=(), timeout=None):
        """Plans current generation -> `layout` without running it; returns
        the PreviewPlanResponse: the PlanStats (`stats`) and the cost
        model's CostPrediction (`prediction`: seconds, critical host and
        link, the plan's bound, each host's phases; docs/scheduler.md).
        Planner errors pass through (InvalidArgument, FailedPrecondition)."""
        if isinstance(lost_hosts, str):
            lost_hosts = [lost_hosts]
        req = _pb.PreviewPlanRequest(job_id=job_id,
                                     target=as_message(layout, ptc_pb2.Layout, "layout"),
                                     lost_hosts=list(lost_hosts), lost_ranks=list(lost_ranks))
        return self._call("PreviewPlan", req, timeout)

    def preview_plan(self, job_id, layout, lost_hosts=(), lost_ranks=(), timeout=None):
        """preview(...).stats: the PlanStats only."""
        return self.preview(job_id, layout, lost_hosts, lost_ranks, timeout).stats

    def advise(self, job_id, gpus, hosts=None, horizon_s=None, devices=None, timeout=None,
               **model):
        """Which layouts suit the job on `gpus` devices (docs/advisor.md): the
        AdviseResponse, whose `candidates` are the Pareto set of predicted
        step time and memory per device (fastest first), each with its
        layout and the cost of moving there (cross_host_bytes, busiest_host,
        transfer_seconds); `best` indexes the one completing the most steps
        in `horizon_s` (default 3600) after its move, -1 if none.
        `hosts`: host ids to take the devices from (default: the live hosts,
        the job's first). `devices`: a dict of AdviseDevices fields
        (gpu_type, memory_bytes, intra/inter_host_bytes_per_s, ...).
        `model`: AdviseModel fields (heads, seq_length, global_batch are
        required; layers, hidden, vocab default from the PTC).
        InvalidArgument names a bad field; FailedPrecondition when the hosts
        lack the devices or nothing fits."""
        return self._call("Advise", _advise_request(job_id, gpus, hosts, horizon_s, devices,
                                                    model), timeout)

    def get_operation(self, operation_id, timeout=None):
        """The Operation as it is now. NotFound if unknown."""
        return self._call("GetOperation", _pb.GetOperationRequest(operation_id=operation_id),
                          timeout)

    def cancel_operation(self, operation_id, idempotency_key=None, timeout=None):
        """Cancels a running operation (-> ABORTED "cancelled by client").
        FailedPrecondition when it is already final."""
        key = idempotency_key or new_idempotency_key()
        req = _pb.CancelOperationRequest(operation_id=operation_id, idempotency_key=key)
        return self._call("CancelOperation", req, timeout, key)

    def watch_operation(self, operation_id, callback=None, timeout=None):
        """Follows an operation until it is final.

        Without a callback: returns an iterator of Operation updates, the last
        one final. With a callback: calls callback(operation) for each update
        and returns the final Operation. A broken stream (UNAVAILABLE, or a
        coordinator that ends the stream early) is reopened with backoff
        from the last version seen (no update comes twice);
        `timeout` (seconds, None: no limit) bounds the whole watch and raises
        DeadlineExceeded."""
        if hasattr(operation_id, "id"):  # an Operation
            operation_id = operation_id.id
        updates = self._watch(operation_id, timeout)
        if callback is None:
            return updates
        last = None
        for op in updates:
            callback(op)
            last = op
        return last

    def _watch(self, operation_id, timeout):
        def at_end():
            op = self.get_operation(operation_id)
            return (op if is_terminal(op) else None), None

        return self._watch_stream(
            "WatchOperation", f"operation \"{operation_id}\" not final",
            lambda version, remaining: self._stub.WatchOperation(
                _pb.WatchOperationRequest(operation_id=operation_id, from_version=version),
                timeout=remaining, metadata=self._metadata),
            timeout, 0, final=is_terminal, at_end=at_end)

    def watch_job(self, job_id, timeout=None, from_version=0, follow=False, stop=None):
        """Iterates over the job (a Job message, without its PTC) now and on
        every committed change (each with a larger job.version), until the
        caller stops iterating, `timeout` seconds pass (DeadlineExceeded) or
        the job is deleted (NotFound). How a training loop learns that a
        reconfiguration is pending (job.active_operation_id) without polling
        the scheduler.

        A broken stream (UNAVAILABLE: the replica died or is stopping) is
        reopened with backoff, up to max_attempts times in a row, from the
        last version seen: a change committed meanwhile arrives, and no
        state comes twice. A stream refused for the coordinator's watch
        limits (RESOURCE_EXHAUSTED) is opened again with backoff until a
        slot frees or `timeout` passes, however long that takes.
        `from_version` resumes an earlier watch (the first job is the first
        state newer than it).

        follow: the launcher's mode (`reshard run`), True or a callable
        (error, delay_s) told of each reopening: the watch never gives up
        while the job exists. A stream that breaks (also DEADLINE_EXCEEDED,
        INTERNAL, ABORTED, CANCELLED) or ends (then GetJob: NotFound when the
        job is gone) is reopened with backoff, however many times in a row;
        every job received starts the count again. `stop`: a
        threading.Event that ends the iteration once set (checked before
        each reopening and during its wait)."""
        def at_end():
            if not follow:
                return _END, None
            # The stream ended without an error: a deleted job (NotFound),
            # or a replica that went away cleanly.
            try:
                self.get_job(job_id)
                return None, None
            except errors.ReshardError as e:
                if not self._follows(e.code.value[0]):
                    raise
                return None, e

        return self._watch_stream(
            "WatchJob", f"watch of job \"{job_id}\" ended",
            lambda version, remaining: self._stub.WatchJob(
                _pb.WatchJobRequest(job_id=job_id, from_version=version), timeout=remaining,
                metadata=self._metadata),
            timeout, from_version, at_end=at_end, follow=follow, stop=stop)

    def _watch_stream(self, method, what, open_stream, timeout, version, final=None,
                      at_end=None, follow=False, stop=None):
        """The one watch loop (WatchOperation, WatchJob): yields the messages
        of the stream `open_stream(from_version, remaining_s)` opens, each
        with a larger .version, and reopens it after the last version seen
        when it breaks: UNAVAILABLE up to max_attempts times in a row (with
        `follow`, any code _follows accepts, without limit); a refusal for
        the watch limits until a slot frees (_wait_for_a_slot). `final(m)`:
        the watch ends after m. `at_end()`, when the stream ends without an
        error, returns (last, error): a message to yield last, _END to stop
        with nothing more, or None to reopen (error, if any, goes to a
        callable `follow`). `what` starts the DeadlineExceeded message."""
        end = None if timeout is None else time.monotonic() + timeout
        failures = 0
        refusals, refused = 0, None  # in a row, for the watch limits (_wait_for_a_slot)
        while stop is None or not stop.is_set():
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise errors.DeadlineExceeded(
                    f"{what} after {timeout} s" + (f" (refused: {refused})" if refusals else ""),
                    method=method)
            stream, err = None, None
            try:
                stream = open_stream(version, remaining)
                for message in stream:
                    failures = refusals = 0
                    version = max(version, message.version)
                    yield message
                    if final is not None and final(message):
                        return
                last, err = at_end()
                if last is _END:
                    return
                if last is not None:
                    yield last
                    return
                failures += 1
            except grpc.RpcError as e:
                code = e.code().value[0]
                if code == _rpc.DEADLINE_EXCEEDED and end is not None:
                    raise errors.DeadlineExceeded(f"{what} after {timeout} s",
                                                  method=method) from None
                if _rpc.is_watch_refusal(code):
                    refusals += 1
                    refused = e.details()
                    self._wait_for_a_slot(e, refusals, method, end)
                    continue
                failures += 1
                err = errors.from_rpc_error(e, method)
                if follow:
                    if not self._follows(code):
                        raise err from None
                elif (not _rpc.retryable(_rpc.STREAM_RECONNECT, code)
                        or failures >= self.max_attempts):
                    raise err from None
            finally:
                if stream is not None:
                    stream.cancel()  # the caller stopped early, or the stream is done
            delay = self._delay(min(failures, 32), _rpc.STREAM_RECONNECT)
            if callable(follow):
                follow(err, delay)
            if self.on_retry is not None:
                self.on_retry(method, failures, None, delay, None)
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)

    @staticmethod
    def _follows(code):
        """Whether a follow (watch_job(follow=...)) reopens after `code`."""
        return (code in _FOLLOW_CODES
                or (_rpc.retryable(_rpc.STREAM_RECONNECT, code)
                    and not _rpc.is_watch_refusal(code)))

    def wait(self, operation_id, timeout=None, raise_on_failure=False):
        """Blocks until the operation is final and returns it. With
        raise_on_failure an ABORTED / FAILED end raises OperationFailed.
        DeadlineExceeded after `timeout` seconds (None: no limit)."""
        if hasattr(operation_id, "id"):  # an Operation
            operation_id = operation_id.id
        final = None
        for op in self._watch(operation_id, timeout):
            final = op
        if raise_on_failure and final.state != _pb.OPERATION_STATE_COMMITTED:
            raise errors.OperationFailed(final)
        return final

    # ----------------------------------------------------------------- hosts

    def list_hosts(self, timeout=None):
        """Every registered host (agent) with its state and devices."""
        return list(self._call("ListHosts", _pb.ListHostsRequest(), timeout).hosts)

    def set_policy(self, job_id, policy=None, idempotency_key=None, timeout=None):
        """Sets the job's elastic policy (an ElasticPolicy, or a dict of its
        fields: heal, grow, min_devices, max_devices, spare_hosts, grow_at,
        accept_degraded), or clears it with None. The coordinator's leader
        then heals the job after a host loss and grows it onto free spares
        by itself (docs/scheduler.md, "Elastic policies"); Job.policy_status
        says what it did last or waits for. Returns the Job."""
        key = idempotency_key or new_idempotency_key()
        req = _pb.SetPolicyRequest(job_id=job_id, idempotency_key=key)
        if policy is not None:
            req.policy.CopyFrom(as_message(policy, ptc_pb2.ElasticPolicy, "policy"))
        return self._call("SetPolicy", req, timeout, key)

    def notice_host(self, host_id, leaves_unix_ms, spare_hosts=(), idempotency_key=None,
                    timeout=None):
        """Host `host_id` goes away at `leaves_unix_ms` (coordinator clock; a
        preemption, a spot reclaim, a drain; admin only): the coordinator
        moves every job on it off before then, onto one of `spare_hosts` or
        onto the job's other hosts. Returns the NoticeHostResponse: per job
        the operation started (its target and prediction), or `refused`
        saying why none was and what the job keeps when the host goes
        (docs/scheduler.md, "Host notices"). A retry with the same key gets
        the same operations."""
        if isinstance(spare_hosts, str):
            spare_hosts = [spare_hosts]
        key = idempotency_key or new_idempotency_key()
        req = _pb.NoticeHostRequest(host_id=host_id, leaves_unix_ms=int(leaves_unix_ms),
                                    spare_hosts=list(spare_hosts), idempotency_key=key)
        return self._call("NoticeHost", req, timeout, key)

    def withdraw_notice(self, host_id, timeout=None):
        """Withdraws host `host_id`'s notice (admin only): it may be a spare
        and take new ranks again; moves already started go on."""
        req = _pb.NoticeHostRequest(host_id=host_id, withdraw=True)
        return self._call("NoticeHost", req, timeout)

    # ----------------------------------------------------------------- audit

    def iter_audit(self, tenant="", job_id="", since_unix_ms=0, page_size=100, timeout=None):
        """Yields the audit trail's AuditEntry messages, newest first, page by
        page: every mutating call with its caller, tenant, method, job and
        result code. An admin sees every tenant, a scheduler or viewer its
        own (PermissionDenied naming another)."""
        token = ""
        while True:
            req = _pb.ListAuditRequest(tenant=tenant, job_id=job_id, since_unix_ms=since_unix_ms,
                                       page_size=page_size, page_token=token)
            resp = self._call("ListAudit", req, timeout)
            yield from resp.entries
            token = resp.next_page_token
            if not token:
                return

    def audit(self, tenant="", job_id="", since_unix_ms=0, limit=100, timeout=None):
        """At most `limit` audit entries (newest first), as a list."""
        if limit < 1:
            raise ValueError(f"limit {limit}: must be >= 1")
        out = []
        for entry in self.iter_audit(tenant, job_id, since_unix_ms, min(limit, 1000), timeout):
            out.append(entry)
            if len(out) == limit:
                break
        return out

    # ---- dataset state (docs/data.md) ----

    def commit_step(self, job_id, generation, step=None, cursor=None, layout_fingerprint=None,
                    state=None, timeout=None):
        """Commits a step boundary: `cursor` (samples consumed after `step`)
        with the job's current `generation`. Or pass `state`, a
        reshard.data.DatasetState after the step (its step, cursor and
        layout fingerprint are sent). Returns the committed
        reshard.data.DatasetState. A retried commit of the same step is a
        no-op (so UNAVAILABLE is retried). FailedPrecondition: the generation
        is not current (a reconfiguration committed: reload), another layout
        fingerprint, a cursor that moves backwards or skips samples, a job
        without dataset state; InvalidArgument names a bad field."""
        if state is not None:
            step = state.step if step is None else step
            cursor = state.cursor if cursor is None else cursor
            layout_fingerprint = layout_fingerprint or state.layout_fingerprint
        if step is None or cursor is None or not layout_fingerprint:
            raise ValueError("commit_step needs step, cursor and layout_fingerprint (or state=)")
        req = _pb.CommitStepRequest(job_id=job_id, generation=generation, step=step,
                                    cursor=cursor, layout_fingerprint=layout_fingerprint)
        from reshard.core import data
        return data.DatasetState.from_proto(self._call("CommitStep", req, timeout))

    def report_rank_failure(self, job_id, rank, reason="", timeout=None):
        """Says that `rank` of the job's current generation died (its
        process exited, a collective saw its peer vanish): recorded in the
        audit trail and in the job's failed_ranks, which every watch_job
        stream receives at once, so the scheduler recovers in seconds
        instead of at the host's lease expiry. Allowed to the job's worker
        token and to schedulers of its tenant. Returns the RankFailure
        (rank, reason, generation, reported_unix_ms, reported_by); a
        repeated report of a rank replaces its reason and time (so
        UNAVAILABLE is retried). InvalidArgument names `rank` and its value
        outside 0..world-1."""
        req = _pb.ReportRankFailureRequest(job_id=job_id, rank=rank, reason=reason or "")
        return self._call("ReportRankFailure", req, timeout)

    def dataset_state(self, job_id, timeout=None):
        """The job's committed reshard.data.DatasetState (of its current
        generation), or None when it has none. Build the sampler of a resumed
        or resized job from it."""
        job = self.get_job(job_id, timeout=timeout)
        if not job.HasField("dataset_state"):
            return None
        from reshard.core import data
        return data.DatasetState.from_proto(job.dataset_state)


def _dataset_message(value):
    """A reshard.v1.DatasetState from a reshard.data.DatasetState, the
    message or its dict."""
    if hasattr(value, "to_proto"):
        return value.to_proto()
    return as_message(value, ptc_pb2.DatasetState, "dataset_state")


def _advise_request(job_id, gpus, hosts, horizon_s, devices, model):
    if gpus is None:
        raise ValueError("gpus is required: the devices offered in all")
    if isinstance(hosts, str):
        hosts = [hosts]
    req = _pb.AdviseRequest(job_id=job_id, gpus=gpus, hosts=list(hosts or ()),
                            horizon_s=horizon_s or 0)
    req.model.CopyFrom(as_message(model, ptc_pb2.AdviseModel, "model"))
    req.devices.CopyFrom(as_message(devices or {}, ptc_pb2.AdviseDevices, "devices"))
    return req


def _set_deadline(req, deadline_unix_ms, abort_past):
    """The request's Deadline (docs/scheduler.md, "Deadlines")."""
    if deadline_unix_ms is None:
        if abort_past:
            raise ValueError("abort_past_deadline needs deadline_unix_ms")
        return
    req.deadline.unix_ms = int(deadline_unix_ms)
    req.deadline.abort_past = bool(abort_past)


def _set_step_boundary(req, at_step_boundary, step_boundary_timeout):
    """ResizeRequest/MigrateRequest.at_step_boundary and its timeout (seconds)."""
    if step_boundary_timeout is not None:
        if not at_step_boundary:
            raise ValueError("step_boundary_timeout needs at_step_boundary=True")
        ms = int(round(step_boundary_timeout * 1000))
        if ms <= 0:
            raise ValueError(f"step_boundary_timeout must be positive seconds, got "
                             f"{step_boundary_timeout!r}")
        req.step_boundary_timeout_ms = ms
    req.at_step_boundary = bool(at_step_boundary)


def _split_layout(value):
    """(config or None, placement) from a Layout, a Placement or their dicts."""
    if isinstance(value, ptc_pb2.Placement):
        return None, as_message(value, ptc_pb2.Placement)
    if isinstance(value, dict) and not ({"config", "placement"} & set(value)):
        return None, as_message(value, ptc_pb2.Placement, "placement")
    lay = as_message(value, ptc_pb2.Layout, "layout")
    config = lay.config if lay.HasField("config") else None
    return config, lay.placement
