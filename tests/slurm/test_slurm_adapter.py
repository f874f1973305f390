"""The adapter's rules (reshard.launcher.slurm_adapter) on given Slurm
state: reading `scontrol -o show job|node` lines, a job's spares, the
nodes a shrink releases, and one look of the watcher against a given
coordinator (the end-to-end runs are test_slurm_training.py)."""

import re

import pytest

from reshard import layout
from reshard.core import errors
from reshard.core._proto import coordinator_pb2, ptc_pb2
from reshard.launcher import slurm as lslurm
from reshard.launcher import slurm_adapter as a
from reshard.launcher._launch_env import LaunchError

# In slurmctld's order: its own fields first, the user's Comment near the end.
JOB_LINE = ("JobId=7 JobName=job.sh UserId=root(0) GroupId=root(0) Priority=1 "
            "JobState=RUNNING Reason=None Dependency=(null) "
            "PreemptEligibleTime=2026-11-30T10:37:26 PreemptTime=None "
            "EndTime=Unknown Partition=main NodeList=host-[0-2] BatchHost=host-0 "
            "NumNodes=3 Command=/w/job.sh WorkDir=/w Comment=reshard:abc123:0f0f "
            "StdErr=/w/out StdOut=/w/out Power=")


def test_a_job_line_reads_field_by_field():
    j = a.SlurmJob(lslurm.parse_job(JOB_LINE))
    assert (j.id, j.state, j.nodes, j.reshard_job, j.proof, j.request, j.mark, j.batch_host) == (
        "7", "RUNNING", ["host-0", "host-1", "host-2"], "abc123", "0f0f", "",
        "reshard:abc123:0f0f", "host-0")
    assert j.running and j.preempt_time is None and j.end_time is None
    # A comment with spaces is read whole; an untagged one names no job.
    other = a.SlurmJob(lslurm.parse_job(JOB_LINE.replace("Comment=reshard:abc123:0f0f",
                                                         "Comment=my big run")))
    assert lslurm.parse_job(JOB_LINE.replace("Comment=reshard:abc123:0f0f",
                                             "Comment=my big run"))["Comment"] == "my big run"
    assert other.reshard_job == ""
    # A Comment cannot stand for the job's own fields (slurmctld prints them first).
    forged = lslurm.parse_job(JOB_LINE.replace(
        "Comment=reshard:abc123:0f0f", "Comment=reshard:x NodeList=x[ PreemptTime=2026-01-01T00:00:00"))
    assert (forged["NodeList"], forged["PreemptTime"]) == ("host-[0-2]", "None")
    assert forged["Comment"] == "reshard:x NodeList=x[ PreemptTime=2026-01-01T00:00:00"
    preempted = a.SlurmJob(lslurm.parse_job(JOB_LINE.replace(
        "PreemptTime=None", "PreemptTime=2026-11-30T10:37:30").replace(
            "EndTime=Unknown", "EndTime=2026-11-30T10:38:00")))
    assert preempted.end_time - preempted.preempt_time == 30_000


def test_node_lines_read_their_address_and_state():
    text = ("NodeName=host-0 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.0.10 "
            "NodeHostName=host-0 State=ALLOCATED Reason=None\n"
            "NodeName=host-1 NodeAddr=10.1.0.11 State=DOWN* Reason=Not responding "
            "[slurm@2026-11-30T10:00:00]\n")
    nodes = lslurm.parse_nodes(text)
    assert {n: f["NodeAddr"] for n, f in nodes.items()} == {"host-0": "10.1.0.10",
                                                            "host-1": "10.1.0.11"}
    assert nodes["host-1"]["State"] == "DOWN*"


TOKEN = "wt-r1"  # the reshard job's worker token: the key of its marks


def _job(id_, nodes, state="RUNNING", preempted=False, batch=None, mark=None):
    j = a.SlurmJob({"JobId": id_, "JobState": state, "NodeList": nodes,
                    "Comment": mark or lslurm.mark_of("r1", TOKEN, id_),
                    "BatchHost": batch or nodes.split(",")[0]})
    if preempted:
        j.preempt_time, j.end_time = 1_000, 31_000
    return j


def test_spares_are_the_allocations_unused_live_unpreempted_nodes_in_order():
    jobs = [_job("1", "h0,h1,h2"), _job("2", "h5,h4"), _job("3", "h6", preempted=True),
            _job("4", "h7", state="PENDING")]
    assert a.spares_of(jobs, {"h0", "h1"}, down=set()) == ["h2", "h5", "h4"]
    assert a.spares_of(jobs, {"h0", "h1"}, down={"h5"}) == ["h2", "h4"]
    assert a.spares_of(jobs, {"h0", "h1", "h2", "h4", "h5"}, down=set()) == []


def test_a_shrink_releases_what_slurm_would_and_refuses_the_rest():
    j = _job("9", "h0,h1,h2,h3", batch="h2")
    assert a.released_by(j, nodes=2) == ["h1", "h3"]  # the batch host and the first stay
    assert a.released_by(j, nodes=3) == ["h3"]
    assert a.released_by(j, release=["h0", "h3"]) == ["h0", "h3"]
    for kw, said in ((dict(nodes=4), "--nodes 4: Slurm job 9 has 4 nodes; a shrink keeps 1 to 3"),
                     (dict(nodes=0), "--nodes 0"),
                     (dict(release=["h9"]), "h9 not in Slurm job 9's nodes h0,h1,h2,h3"),
                     (dict(release=["h2"]), "h2 is Slurm job 9's batch host"),
                     (dict(), "give --nodes N or --release"),
                     (dict(nodes=2, release=["h3"]), "give --nodes N or --release")):
        with pytest.raises(ValueError, match=re.escape(said)):
            a.released_by(j, **kw)


class _Coordinator:
    """The coordinator's answers to the watcher, as given."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.calls = []

    def get_job(self, job_id):
        if job_id not in self.jobs:
            raise errors.NotFound("no such job")
        return self.jobs[job_id]

    def worker_token(self, job_id):
        return TOKEN

    def withdraw_notice(self, host):
        self.calls.append(("Withdraw", host))

    def set_policy(self, job_id, policy):
        self.calls.append(("SetPolicy", job_id, list(policy.spare_hosts), policy.heal))
        stored = coordinator_pb2.Job()
        stored.CopyFrom(self.jobs[job_id])  # a new object, as the coordinator's answers are
        stored.policy.CopyFrom(policy)
        self.jobs[job_id] = stored

    def notice_host(self, host, leaves, spare_hosts=(), timeout=None, idempotency_key=None):
        self.calls.append(("NoticeHost", host, leaves, list(spare_hosts)))
        return coordinator_pb2.NoticeHostResponse(jobs=[coordinator_pb2.HostNoticeJob(
            job_id="r1", operation_id="op-1")])


def _rjob(hosts, policy=None):
    job = coordinator_pb2.Job(id="r1", layout=layout.make_layout(1, 1, 2 * len(hosts), hosts, 2))
    if policy is not None:
        job.policy.CopyFrom(policy)
    return job


def test_the_watcher_sets_spares_once_and_notices_a_preempted_allocation_once():
    coord = _Coordinator({"r1": _rjob(["h0", "h1"], ptc_pb2.ElasticPolicy(heal=True))})
    jobs = {"1": _job("1", "h0,h1,h2")}
    said = []
    w = a.Watcher(coord, said.append, read_jobs=lambda: jobs, read_down=set,
                  read_grace=lambda: {"spot": 45}, now_ms=lambda: 0)
    w.poll_once()
    w.poll_once()
    assert coord.calls == [("SetPolicy", "r1", ["h2"], True)]
    jobs["2"] = _job("2", "h3", preempted=True)
    coord.jobs["r1"].layout.CopyFrom(layout.make_layout(1, 1, 6, ["h0", "h1", "h3"], 2))
    w.poll_once()
    w.poll_once()
    assert coord.calls[1:] == [("NoticeHost", "h3", 31_000, ["h2"])]
    assert "Slurm job 2 preempted: h3 leaves in 31 s; noticing it" in said
    # EndTime not pulled in yet (a job without a time limit shows Unknown at
    # first): PreemptTime + the partition's GraceTime; never in the past.
    jobs["3"] = _job("3", "h4", preempted=True)
    jobs["3"].end_time, jobs["3"].partition = None, "spot"
    coord.jobs["r1"].layout.CopyFrom(layout.make_layout(1, 1, 6, ["h0", "h1", "h4"], 2))
    w.poll_once()
    assert coord.calls[-1] == ("NoticeHost", "h4", 46_000, ["h2"])
    jobs["3"].preempt_time = -60_000
    w._noticed.clear()
    w.poll_once()
    assert coord.calls[-1] == ("NoticeHost", "h4", 1_000, ["h2"])
    # A node Slurm holds DOWN is no spare.
    w2 = a.Watcher(coord, said.append, read_jobs=lambda: {"1": jobs["1"]},
                   read_down=lambda: {"h2"}, read_grace=dict, now_ms=lambda: 0)
    w2.poll_once()
    assert coord.calls[-1] == ("SetPolicy", "r1", [], True)


def test_a_job_without_a_policy_is_said_once_and_left_alone():
    coord = _Coordinator({"r1": _rjob(["h0"])})
    said = []
    w = a.Watcher(coord, said.append, read_jobs=lambda: {"1": _job("1", "h0,h1")},
                  read_down=set)
    w.poll_once()
    w.poll_once()
    assert coord.calls == []
    assert len([s for s in said if "has no elastic policy" in s]) == 1, said


def test_shrink_refuses_a_job_slurm_does_not_run():
    coord = _Coordinator({})
    for jobs, said in (({}, "Slurm job 9: no such job"),
                       ({"9": _job("9", "h0,h1", state="PENDING")}, "is PENDING, not RUNNING")):
        with pytest.raises(LaunchError, match=said):
            a.shrink(coord, "9", 1, None, 10, lambda m: None, read_jobs=lambda: jobs)
    assert coord.calls == []


def test_an_admins_request_releases_what_it_names():
    j = _job("9", "h0,h1,h2,h3", batch="h0")
    for request, gone in (("shrink:2", ["h2", "h3"]), ("keep:h[0-1],h3", ["h2"])):
        j.request = request
        assert a.released_by_request(j) == gone
    for request, said in (("shrink:4", "NumNodes=4: --nodes 4: Slurm job 9 has 4 nodes"),
                          ("shrink:x", "NumNodes=x"),
                          ("keep:h1,h2", "h0 is Slurm job 9's batch host"),
                          ("grow:2", "unknown request 'grow:2'")):
        j.request = request
        with pytest.raises(ValueError, match=re.escape(said)):
            a.released_by_request(j)
    tagged = a.SlurmJob(lslurm.parse_job(JOB_LINE.replace(
        "Comment=reshard:abc123:0f0f", "Comment=reshard:abc123:0f0f shrink:2")))
    assert (tagged.reshard_job, tagged.request, tagged.mark) == (
        "abc123", "shrink:2", "reshard:abc123:0f0f")


def test_a_mark_without_the_jobs_proof_is_ignored():
    """A user's Slurm job marked as another tenant's reshard job (without
    the proof only the job's worker token makes) gives that job nothing."""
    coord = _Coordinator({"r1": _rjob(["h0"], ptc_pb2.ElasticPolicy(heal=True))})
    said = []
    forged = _job("5", "h0,h8", mark="reshard:r1:0000000000000000")
    w = a.Watcher(coord, said.append, read_jobs=lambda: {"5": forged}, read_down=set)
    w.poll_once()
    w.poll_once()
    assert coord.calls == []
    assert said == ["Slurm job 5 is marked as reshard job r1 without the job's proof: ignored"]
    assert lslurm.mark_of("r1", TOKEN, "5") != lslurm.mark_of("r1", TOKEN, "6")
    assert lslurm.mark_of("r1", TOKEN, "5") != lslurm.mark_of("r1", "another token", "5")


def test_a_preempted_allocations_notices_are_withdrawn_when_it_ends():
    coord = _Coordinator({"r1": _rjob(["h0", "h3"], ptc_pb2.ElasticPolicy(heal=True))})
    jobs = {"1": _job("1", "h0"), "2": _job("2", "h3", preempted=True)}
    w = a.Watcher(coord, lambda m: None, read_jobs=lambda: jobs, read_down=set,
                  read_grace=dict, now_ms=lambda: 0)
    w.poll_once()
    assert coord.calls == [("NoticeHost", "h3", 31_000, [])]
    jobs["2"].state = "PREEMPTED"
    w.poll_once()
    w.poll_once()
    assert coord.calls[1:] == [("Withdraw", "h3")]


def test_one_jobs_error_does_not_stop_the_others():
    class Failing(_Coordinator):
        def get_job(self, job_id):
            if job_id == "r0":
                raise errors.Unavailable("the coordinator is busy")
            return super().get_job(job_id)
    coord = Failing({"r1": _rjob(["h0"], ptc_pb2.ElasticPolicy(heal=True))})
    said = []
    jobs = {"0": _job("0", "h5", mark=lslurm.mark_of("r0", TOKEN, "0")), "1": _job("1", "h0,h1")}
    w = a.Watcher(coord, said.append, read_jobs=lambda: jobs, read_down=set)
    w.poll_once()
    assert coord.calls == [("SetPolicy", "r1", ["h1"], True)]
    assert any(m.startswith("job r0: ") and "busy" in m for m in said), said


def test_an_admins_shrink_is_carried_out_step_by_step(monkeypatch):
    """shrink:2 on h0..h2: h2 gets a notice and is no spare meanwhile; the
    Slurm update waits until the job is off h2, then releases it with the
    hook's AdminComment and the plain mark; the notice is withdrawn."""
    slurm_calls = []
    monkeypatch.setattr(lslurm, "scontrol", lambda argv, **kw: slurm_calls.append(argv) or "")
    coord = _Coordinator({"r1": _rjob(["h0", "h1", "h2"], ptc_pb2.ElasticPolicy(
        heal=True, spare_hosts=["h3"]))})
    mark = lslurm.mark_of("r1", TOKEN, "1")
    jobs = {"1": _job("1", "h0,h1,h2,h3", mark=f"{mark} shrink:2")}
    said = []
    w = a.Watcher(coord, said.append, read_jobs=lambda: jobs, read_down=set)
    w.poll_once()
    assert coord.calls == [("NoticeHost", "h2", coord.calls[0][2], []),
                           ("NoticeHost", "h3", coord.calls[1][2], []),
                           ("SetPolicy", "r1", [], True)]  # h3, leaving, is no spare
    assert slurm_calls == []
    w.poll_once()
    assert slurm_calls == [], "the job is still on h2"
    coord.jobs["r1"].layout.CopyFrom(layout.make_layout(1, 1, 4, ["h0", "h1"], 2))
    w.poll_once()
    assert slurm_calls == [["update", "JobId=1", "NodeList=h0,h1",
                            "AdminComment=reshard-moved-off", f"Comment={mark}"]]
    assert coord.calls[3:] == [("Withdraw", "h2"), ("Withdraw", "h3")]
    assert "Slurm job 1 now on h0,h1" in said


def test_a_shrink_request_that_cannot_be_done_is_dropped(monkeypatch):
    slurm_calls = []
    monkeypatch.setattr(lslurm, "scontrol", lambda argv, **kw: slurm_calls.append(argv) or "")
    coord = _Coordinator({"r1": _rjob(["h0", "h1"], ptc_pb2.ElasticPolicy(heal=True))})
    mark = lslurm.mark_of("r1", TOKEN, "1")
    said = []
    w = a.Watcher(coord, said.append, read_jobs=lambda: {
        "1": _job("1", "h0,h1", mark=f"{mark} shrink:5")}, read_down=set)
    w.poll_once()
    assert slurm_calls == [["update", "JobId=1", f"Comment={mark}"]]
    assert [c for c in coord.calls if c[0] == "NoticeHost"] == []
    assert any("Slurm job 1: not shrunk: NumNodes=5" in m for m in said), said
