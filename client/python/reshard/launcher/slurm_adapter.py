"""`reshard slurm`: Slurm's events as reshard operations (docs/slurm.md,
"The adapter"). It runs where the Slurm client commands do (the controller
host), with an admin credential of the coordinator:

    reshard slurm watch  --coordinator C --tls-ca CA (--tls-cert F --tls-key F | --token-file F)
    reshard slurm shrink SLURM_JOB (--nodes N | --release H,...) [same flags]

Which reshard job a Slurm job holds is the Slurm job's Comment,
`reshard:<job id>:<proof>`, which `reshard run --slurm` sets; the proof (an
HMAC of the Slurm job id under the job's worker token, slurm.mark_of) keeps
a user from marking a Slurm job of theirs as another tenant's job. A reshard job's nodes
are those of every RUNNING Slurm job so marked: the batch job it was
submitted as, and any allocation submitted later to grow it (the same
`srun reshard run --slurm ...` on its nodes).

`watch` looks every --interval seconds (Watcher.poll_once):
- **Spares.** The job's policy's `spare_hosts` become its nodes that its
  current layout does not use, in Slurm's order, leaving out nodes that are
  DOWN or whose allocation is being preempted. The policy's heal takes them
  after a node failure, its grow when the job was given more nodes.
- **Preemption.** A marked Slurm job with a PreemptTime is cancelled at its
  EndTime (Slurm pulled EndTime in to the grace time's end). Each of its
  nodes that the reshard job uses gets a host notice that leaves then
  (NoticeHost): the job moves off before Slurm kills it, onto a spare or
  onto its other nodes.
- **A node failure** needs nothing of the adapter: the node's agent dies
  with it, the coordinator's lease finds the host lost and the policy heals
  the job; Slurm (`--no-kill`) takes the node out of the job, which runs on.
- **A job without a policy** is said once; nothing is done for it.

**Shrinking.** An admin's `scontrol update JobId=J NumNodes=N` (or
NodeList=...) of such a job is held by deploy/slurm/job_submit.lua as a
request in the Comment (`reshard:<job> shrink:N`, `keep:LIST`), the job
keeping its nodes. The watcher carries it out (Shrink): the nodes that go
(Slurm's choice for NumNodes: the batch host and the first nodes stay) get
host notices, the job's state moves off them, and only then does the
adapter run `scontrol update JobId=J NodeList=... AdminComment=
reshard-moved-off`, which the hook lets through, and withdraw the notices.
`reshard slurm shrink` does the same at once from the command line.
"""

import argparse
import os
import sys
import time

from reshard.core import errors
from reshard.core import layout as _layout
from reshard.launcher._launch_env import EXIT_OK, EXIT_USAGE, LaunchError
from reshard.launcher import register
from reshard.launcher import slurm as _slurm


CALL_TIMEOUT_S = 10.0  # a coordinator call of the watcher; a late one is tried at the next look

# ------------------------------------------------------- Slurm's state


class SlurmJob:
    """One Slurm job as the adapter reads it."""

    def __init__(self, fields):
        self.id = fields.get("JobId", "")
        self.state = fields.get("JobState", "")
        nodes = fields.get("NodeList", "")
        try:
            self.nodes = _slurm.expand_hostlist(nodes) if nodes and nodes != "(null)" else []
        except ValueError:
            self.nodes = []  # not Slurm's (slurmctld prints valid lists): no nodes to act on
        comment = fields.get("Comment", "")
        # "reshard:<job id>", then an admin's shrink that job_submit.lua
        # turned into a request: " shrink:N" or " keep:NODELIST".
        tagged = comment[len(_slurm.TAG):].split() if comment.startswith(_slurm.TAG) else []
        job, _, self.proof = (tagged[0] if tagged else "").partition(":")
        self.reshard_job = job
        self.request = tagged[1] if len(tagged) > 1 else ""
        self.mark = f"{_slurm.TAG}{tagged[0]}" if tagged else ""  # without the request
        self.batch_host = fields.get("BatchHost", "")
        self.partition = fields.get("Partition", "")
        self.preempt_time = _slurm_time(fields.get("PreemptTime", ""))
        self.end_time = _slurm_time(fields.get("EndTime", ""))

    @property
    def running(self):
        return self.state == "RUNNING"


def _slurm_time(text):
    """Slurm's local "YYYY-MM-DDTHH:MM:SS" -> unix ms; None for None/Unknown."""
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) * 1000)
    except ValueError:
        return None


def read_jobs():
    """{Slurm job id: SlurmJob} of every job slurmctld knows."""
    text = _slurm.scontrol(["-o", "show", "job"])
    if text.strip() == "No jobs in the system":
        return {}
    jobs = [SlurmJob(_slurm.parse_job(line)) for line in text.splitlines() if line.strip()]
    return {j.id: j for j in jobs}


def read_grace_times():
    """{partition: GraceTime in seconds} (a preempted job's time left when
    Slurm has not yet pulled its EndTime in: a job without a time limit
    shows EndTime=Unknown at first)."""
    out = {}
    for line in _slurm.scontrol(["-o", "show", "partition"]).splitlines():
        f = _slurm.parse_job(line)
        if f.get("PartitionName"):
            try:
                out[f["PartitionName"]] = int(f.get("GraceTime", "0"))
            except ValueError:
                out[f["PartitionName"]] = 0
    return out


def read_down_nodes():
    """The nodes Slurm holds DOWN (or not responding, or draining out)."""
    nodes = _slurm.parse_nodes(_slurm.scontrol(["-o", "show", "node"]))
    return {name for name, f in nodes.items()
            if any(s in f.get("State", "") for s in ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN"))}


# ------------------------------------------------------------- the rules


def spares_of(slurm_jobs, layout_hosts, down):
    """A reshard job's spares: the nodes of its RUNNING, unpreempted Slurm
    jobs that its layout does not use and that are not in `down` (Slurm
    holds them DOWN or draining, or a shrink is releasing them), in order
    of the Slurm jobs and their node lists."""
    out = []
    for j in slurm_jobs:
        if not j.running or j.preempt_time is not None:
            continue
        for n in j.nodes:
            if n not in layout_hosts and n not in down and n not in out:
                out.append(n)
    return out


def released_by(job, nodes=None, release=None):
    """The nodes `scontrol update NumNodes=nodes` would release from Slurm
    job `job` (it keeps the batch host, then the first nodes in order), or
    the named `release` checked against the job; ValueError says why not."""
    if (nodes is None) == (release is None):
        raise ValueError("give --nodes N or --release H,..., one of them")
    if release is not None:
        unknown = [n for n in release if n not in job.nodes]
        if unknown:
            raise ValueError(f"--release {','.join(release)}: {','.join(unknown)} not in Slurm "
                             f"job {job.id}'s nodes {','.join(job.nodes)}")
        if job.batch_host in release:
            raise ValueError(f"--release {','.join(release)}: {job.batch_host} is Slurm job "
                             f"{job.id}'s batch host, which Slurm never releases")
        if not release:
            raise ValueError("--release: no node named")
        return list(release)
    if not 1 <= nodes < len(job.nodes):
        raise ValueError(f"--nodes {nodes}: Slurm job {job.id} has {len(job.nodes)} nodes; a "
                         f"shrink keeps 1 to {len(job.nodes) - 1}")
    keep = [job.batch_host] if job.batch_host in job.nodes else []
    keep += [n for n in job.nodes if n not in keep][:nodes - len(keep)]
    return [n for n in job.nodes if n not in keep]


# ----------------------------------------------------------- the watcher


class Watcher:
    """`reshard slurm watch`: poll_once() reads Slurm and the coordinator
    once and acts (the module doc). `read_jobs`, `read_down` and `now_ms`
    are Slurm and the clock (replaced in unit tests). One job's error is
    said and the others are served; it is tried again at the next look."""

    def __init__(self, client, log, read_jobs=read_jobs, read_down=read_down_nodes,
                 read_grace=read_grace_times, now_ms=lambda: int(time.time() * 1000)):
        self.client, self.log = client, log
        self._read_jobs, self._read_down, self._now_ms = read_jobs, read_down, now_ms
        self._read_grace = read_grace
        self._said = set()       # what was said once (no policy, a false mark)
        self._noticed = {}       # (node, Slurm job id) -> its notice, until the job ends
        self._shrinks = {}       # Slurm job id -> (its request, Shrink)
        self._tokens = {}        # reshard job id -> its worker token (the marks' key)
        self.shrink_timeout_s = 300.0

    def _once(self, key, msg):
        if key not in self._said:
            self._said.add(key)
            self.log(msg)

    def _marked(self, j):
        """Whether Slurm job j's mark is the reshard job's own (its proof made
        with the job's worker token, which only the job's launchers hold)."""
        if j.reshard_job not in self._tokens:
            self._tokens[j.reshard_job] = self.client.worker_token(j.reshard_job)
        if _slurm.mark_of(j.reshard_job, self._tokens[j.reshard_job], j.id) == \
                f"{_slurm.TAG}{j.reshard_job}:{j.proof}":
            return True
        self._once(("mark", j.id), f"Slurm job {j.id} is marked as reshard job {j.reshard_job} "
                                   "without the job's proof: ignored")
        return False

    def poll_once(self):
        jobs = self._read_jobs()
        down = self._read_down()
        by_job = {}
        for j in jobs.values():
            if j.reshard_job and j.running:
                by_job.setdefault(j.reshard_job, []).append(j)
        for job_id, slurm_jobs in sorted(by_job.items()):
            try:
                slurm_jobs = [j for j in slurm_jobs if self._marked(j)]
                if not slurm_jobs:
                    continue
                job = self.client.get_job(job_id)
                requested = [j for j in slurm_jobs if j.request]
                for j in requested:
                    self._shrink_begin(j)
                # Nodes a shrink releases are no spares, from its notices
                # until Slurm has them back.
                leaving = {n for _, sh in self._shrinks.values() for n in sh.gone}
                spares = self._sync_spares(job, slurm_jobs, down | leaving)
                self._notice_preempted(job, slurm_jobs, spares)
                for j in requested:
                    self._shrink_step(j)
            except errors.NotFound:
                continue  # deleted, or another coordinator's job
            except (errors.ReshardError, LaunchError, ValueError) as e:
                self.log(f"job {job_id}: {' '.join(str(e).split())} (tried again next look)")
        self._end_what_ended(jobs)

    def _end_what_ended(self, jobs):
        """Withdraws the notices of preempted Slurm jobs that ended (their
        nodes serve others now), and drops shrinks whose request is gone."""
        for key in [k for k in self._noticed if not (
                jobs.get(k[1]) is not None and jobs[k[1]].running)]:
            del self._noticed[key]
            try:
                self.client.withdraw_notice(key[0])
                self.log(f"Slurm job {key[1]} ended: {key[0]}'s notice withdrawn")
            except errors.ReshardError as e:
                self.log(f"withdrawing {key[0]}'s notice: {e}")
        for sid in [sid for sid, (req, _) in self._shrinks.items() if not (
                jobs.get(sid) is not None and jobs[sid].running and jobs[sid].request == req)]:
            _, sh = self._shrinks.pop(sid)
            sh.abandon("the request is gone", reset_comment=False)

    def _shrink_begin(self, j):
        """An admin's shrink (job_submit.lua made it a request): notices."""
        request, s = self._shrinks.get(j.id, (None, None))
        if request == j.request:
            return
        if s is not None:
            del self._shrinks[j.id]
            s.abandon(f"replaced by {j.request}", reset_comment=False)
        try:
            gone = released_by_request(j)
        except ValueError as e:
            Shrink(self.client, j, [], 0, self.log).abandon(str(e))
            return
        s = Shrink(self.client, j, gone, self.shrink_timeout_s, self.log)
        self._shrinks[j.id] = (j.request, s)
        try:
            s.begin()
        except (LaunchError, errors.ReshardError) as e:
            del self._shrinks[j.id]
            s.abandon(str(e))

    def _shrink_step(self, j):
        """Once the job is off the nodes: Slurm releases them."""
        if j.id not in self._shrinks:
            return
        s = self._shrinks[j.id][1]
        if s.moved():
            try:
                s.finish(j, retry_s=0)
            except LaunchError as e:
                if "try again" in str(e):
                    return  # Slurm asked to: the next look does
                del self._shrinks[j.id]
                s.abandon(str(e))
                return
            del self._shrinks[j.id]
        elif s.late():
            del self._shrinks[j.id]
            s.abandon(s.late())

    def _sync_spares(self, job, slurm_jobs, leave_out):
        """Sets the policy's spares; returns them ([] without a policy)."""
        if not job.HasField("policy"):
            self._once(("policy", job.id),
                       f"job {job.id} (Slurm job {','.join(j.id for j in slurm_jobs)}) has no "
                       "elastic policy: a node failure, preemption or grow cannot move it; "
                       "give it one (reshard run --policy, or reshardctl jobs policy)")
            return []
        hosts = set(_layout.hosts_of(job.layout))
        spares = spares_of(slurm_jobs, hosts, leave_out)
        if list(job.policy.spare_hosts) != spares:
            policy = type(job.policy)()
            policy.CopyFrom(job.policy)
            del policy.spare_hosts[:]
            policy.spare_hosts.extend(spares)
            self.client.set_policy(job.id, policy)
            self.log(f"job {job.id}: spares {','.join(spares) or '(none)'} (Slurm's nodes it "
                     "does not use)")
        return spares

    def _notice_preempted(self, job, slurm_jobs, spares):
        hosts = set(_layout.hosts_of(job.layout))
        for j in slurm_jobs:
            if j.preempt_time is None:
                continue
            now = self._now_ms()
            # Slurm pulls EndTime in to the grace time's end; a job without
            # a time limit shows EndTime=Unknown at first.
            if j.end_time and j.end_time > now:
                leaves = j.end_time
            else:
                leaves = j.preempt_time + 1000 * self._read_grace().get(j.partition, 0)
            leaves = max(leaves, now + 1000)  # a notice leaves in the future
            for node in j.nodes:
                if node not in hosts or (node, j.id) in self._noticed:
                    continue
                self.log(f"Slurm job {j.id} preempted: {node} leaves in "
                         f"{(leaves - now) / 1000:.0f} s; noticing it")
                # A call that does not answer in time is tried again at the
                # next look, with the same key: the same operations.
                reply = self.client.notice_host(
                    node, leaves, spare_hosts=spares, timeout=CALL_TIMEOUT_S,
                    idempotency_key=f"slurm-preempt-{j.id}-{node}-{j.preempt_time}")
                self._noticed[(node, j.id)] = leaves
                said = "; ".join(f"{r.job_id}: {r.refused or 'operation ' + r.operation_id}"
                                 for r in reply.jobs)
                self.log(f"{node} noticed: {said}")


# -------------------------------------------------------------- shrink

MOVED = "reshard-moved-off"  # the AdminComment job_submit.lua lets through


class Shrink:
    """One shrink of a Slurm job, in steps: begin() gives the nodes that go
    host notices (the job moves off them), moved() says when the job no
    longer uses them, finish() has Slurm release them; abandon() withdraws
    the notices and drops the request, Slurm untouched."""

    def __init__(self, client, job, gone, timeout_s, log):
        self.client, self.job, self.gone, self.log = client, job, list(gone), log
        self.keep = [n for n in job.nodes if n not in self.gone]
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._noticed = []

    def begin(self):
        leaves = int(time.time() * 1000 + self.timeout_s * 1000)
        self.log(f"Slurm job {self.job.id} (reshard job {self.job.reshard_job}): releasing "
                 f"{','.join(self.gone)}, keeping {','.join(self.keep)}; moving the job off first")
        for node in self.gone:
            reply = self.client.notice_host(node, leaves, timeout=CALL_TIMEOUT_S)
            self._noticed.append(node)
            for r in reply.jobs:
                if r.refused:
                    raise LaunchError(f"{node}: job {r.job_id} cannot move off it: {r.refused}")

    def moved(self):
        rjob = self.client.get_job(self.job.reshard_job)
        self.on = sorted(set(self.gone) & set(_layout.hosts_of(rjob.layout)))
        self.operation = rjob.active_operation_id
        return not self.on and not self.operation

    def late(self):
        if time.monotonic() <= self.deadline:
            return None
        return (f"job {self.job.reshard_job} still on {','.join(self.on) or 'its hosts'} after "
                f"{self.timeout_s:g} s (operation {self.operation or 'none'})")

    def finish(self, now=None, retry_s=60.0):
        """Slurm releases the nodes: those of the job as it is `now` (a kept
        node Slurm took out since, a failed one, stays out)."""
        if now is not None:
            self.keep = [n for n in now.nodes if n not in self.gone]
        argv = ["update", f"JobId={self.job.id}", f"NodeList={','.join(self.keep)}",
                f"AdminComment={MOVED}", f"Comment={self.job.mark}"]
        end = time.monotonic() + retry_s
        while True:
            try:
                _slurm.scontrol(argv)
                break
            except LaunchError as e:
                # Right after a job's resize Slurm answers "Job update not
                # available right now, ... try again in a bit".
                if "try again" not in str(e) or time.monotonic() > end:
                    raise
                time.sleep(0.5)  # Slurm asked to try again: a retry's pace
        self.log(f"Slurm job {self.job.id} now on {','.join(self.keep)}")
        self._withdraw()

    def abandon(self, why, reset_comment=True):
        """Withdraws the notices; drops the request from the Comment."""
        self.log(f"Slurm job {self.job.id}: not shrunk: {why}")
        self._withdraw()
        if self.job.request and reset_comment:
            try:
                _slurm.scontrol(["update", f"JobId={self.job.id}", f"Comment={self.job.mark}"])
            except LaunchError as e:
                self.log(f"Slurm job {self.job.id}: dropping the request: {e}")

    def _withdraw(self):
        for node in self._noticed:
            try:
                self.client.withdraw_notice(node)
            except errors.ReshardError as e:
                self.log(f"withdrawing {node}'s notice: {e}")
        self._noticed = []


def released_by_request(job):
    """The nodes an admin's request (job_submit.lua's `shrink:N` or
    `keep:NODELIST`) releases; ValueError says why not."""
    kind, _, value = job.request.partition(":")
    if kind == "shrink":
        try:
            return released_by(job, nodes=int(value))
        except ValueError as e:
            raise ValueError(f"NumNodes={value}: {e}") from None
    if kind == "keep":
        keep = _slurm.expand_hostlist(value)
        return released_by(job, release=[n for n in job.nodes if n not in keep])
    raise ValueError(f"unknown request {job.request!r} in Slurm job {job.id}'s Comment")


def shrink(client, slurm_job_id, nodes, release, timeout, log, read_jobs=read_jobs):
    """`reshard slurm shrink`: returns the nodes released. LaunchError when
    it cannot; then Slurm was not touched and the notices are withdrawn."""
    jobs = read_jobs()
    job = jobs.get(slurm_job_id)
    if job is None:
        raise LaunchError(f"Slurm job {slurm_job_id}: no such job")
    if not job.running:
        raise LaunchError(f"Slurm job {slurm_job_id} is {job.state}, not RUNNING")
    if not job.reshard_job:
        raise LaunchError(f"Slurm job {slurm_job_id} is no reshard job's (its Comment is not "
                          f"'{_slurm.TAG}<job id>'; `reshard run --slurm` sets it)")
    try:
        gone = released_by(job, nodes, release)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    s = Shrink(client, job, gone, timeout, log)
    try:
        s.begin()
        while not s.moved():
            late = s.late()
            if late:
                raise LaunchError(late)
            time.sleep(0.2)  # polling the job's layout, not a synchronisation
        s.finish()
    except BaseException as e:
        s.abandon(str(e) if isinstance(e, (LaunchError, errors.ReshardError)) else repr(e))
        raise
    return gone


# ----------------------------------------------------------------- CLI


def _parser():
    p = argparse.ArgumentParser(prog="reshard slurm",
                                description="Slurm's events as reshard operations "
                                            "(docs/slurm.md, \"The adapter\").")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("watch", "follow Slurm: spares, preemptions (until SIGTERM)"),
                       ("shrink", "release nodes of a Slurm job once reshard moved off them")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--coordinator", required=True, help="HOST:PORT of a reshard-coordinator")
        s.add_argument("--tls-ca", help="PEM CA of the coordinator's certificate (TLS)")
        s.add_argument("--tls-cert", help="an admin's client certificate")
        s.add_argument("--tls-key", help="its key")
        s.add_argument("--token-file", help="an admin's bearer token (default $RESHARD_TOKEN)")
        s.add_argument("--insecure", action="store_true", help="plaintext")
        if name == "watch":
            s.add_argument("--interval", type=float, default=5.0, metavar="S",
                           help="seconds between looks at Slurm (default %(default)s)")
        else:
            s.add_argument("job", help="the Slurm job id")
            s.add_argument("--nodes", type=int, help="the node count to keep (as scontrol's "
                           "NumNodes: the batch host and the first nodes stay)")
            s.add_argument("--release", help="the nodes to release, comma-separated")
            s.add_argument("--timeout", type=float, default=300.0, metavar="S",
                           help="how long the job may take to move off (default %(default)s)")
    return p


def _client(args):
    register.check_transport(args)
    token = register.token_of(args, "an admin's credential: --tls-cert/--tls-key, --token-file "
                                    "or $RESHARD_TOKEN")
    return register.connect(args, token)


def main(argv):
    args = _parser().parse_args(argv)

    def log(msg):
        print(f"reshard slurm {args.cmd}: {msg}", file=sys.stderr, flush=True)
    try:
        client = _client(args)
    except (LaunchError, OSError) as e:
        print(f"reshard slurm: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.cmd == "shrink":
            release = [n for n in args.release.split(",") if n] if args.release else None
            shrink(client, args.job, args.nodes, release, args.timeout, log)
            return EXIT_OK
        watcher = Watcher(client, log)
        log(f"following Slurm every {args.interval:g} s")
        slurm_down = False
        while True:
            try:
                watcher.poll_once()
                if slurm_down:
                    log("Slurm answers again")
                slurm_down = False
            except LaunchError as e:   # Slurm not answering: said, tried again
                slurm_down = True
                log(f"Slurm: {e}")
            except errors.ReshardError as e:  # the coordinator: said, tried again
                log(f"coordinator: {' '.join(str(e).split())}")
            time.sleep(args.interval)
    except LaunchError as e:
        print(f"reshard slurm {args.cmd}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except errors.ReshardError as e:
        print(f"reshard slurm {args.cmd}: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        client.close()
