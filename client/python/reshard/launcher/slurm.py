"""Slurm's allocation as `reshard run`'s placement (`reshard run --slurm`,
docs/slurm.md): inside a Slurm job step, this host is the node the step runs
on (SLURMD_NODENAME) and the first layout's hosts are the step's nodes in
Slurm's order (SLURM_STEP_NODELIST, expanded as `scontrol show hostnames`
expands it), so that the launchers of every node agree without a hand-written
host list. Flags given explicitly win.

Two more things come from Slurm: a world's MASTER_ADDR is its rank 0's
node's NodeAddr (`scontrol show node`, node_addresses()) unless
--rdzv-host/--rdzv-host-pattern say otherwise (the agents' addresses the
coordinator lists while slurmctld does not answer), and the launcher marks
its Slurm job as the reshard job's (the job's Comment
`reshard:<job id>:<proof>`, mark_of() and tag_job()), which is how
`reshard slurm watch` finds a Slurm job's reshard job.
"""

import hashlib
import hmac
import os
import re
import subprocess

from reshard.launcher._launch_env import LaunchError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text):
    """Slurm's hostlist expression -> host names, in order: `host-[0-2,5]`,
    `gpu[01-03],login`, `a[1-2]b[3-4]` (each bracket a cross product, zero
    padding kept from the range's start). ValueError names what is wrong."""
    hosts = []
    for item in _split_top(text):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top(text):
    """Splits at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"hostlist {text!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {text!r}: '[' without ']'")
    items.append(text[start:])
    if any(not item for item in items):
        raise ValueError(f"hostlist {text!r}: an empty name")
    return items


def _expand_one(item):
    open_ = item.find("[")
    if open_ < 0:
        return [item]
    close = item.index("]", open_)
    prefix, ranges, rest = item[:open_], item[open_ + 1:close], item[close + 1:]
    middles = []
    for part in ranges.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"hostlist {item!r}: {part!r} is not a number or a range")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"hostlist {item!r}: range {part!r} runs backwards")
        width = len(lo)
        middles.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    tails = _expand_one(rest) if rest else [""]
    return [prefix + mid + tail for mid in middles for tail in tails]


class Allocation:
    """This step's node and the job's nodes."""

    def __init__(self, host, hosts, job_id, job_name):
        self.host, self.hosts, self.job_id, self.job_name = host, hosts, job_id, job_name

    def __repr__(self):
        return (f"Allocation(host={self.host!r}, hosts={self.hosts!r}, job_id={self.job_id!r}, "
                f"job_name={self.job_name!r})")


def _tasks_per_node(text):
    """Slurm's tasks-per-node list ("1(x2)", "2,1") -> counts, one per node."""
    counts = []
    for item in text.split(","):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", item)
        if not m:
            raise ValueError(f"{item!r} is not COUNT or COUNT(xNODES)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def allocation(env=None):
    """The allocation the environment of a Slurm job step describes: this
    node, and the step's nodes in Slurm's order. LaunchError naming the
    variable when it is not a step (a batch script is not one: its launchers
    start with srun), or when the step runs more than one task on a node
    (one launcher per node starts that node's ranks)."""
    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME", "")
    nodelist = env.get("SLURM_STEP_NODELIST", "")
    for name, value in (("SLURMD_NODENAME", node), ("SLURM_STEP_NODELIST", nodelist)):
        if not value:
            raise LaunchError(f"--slurm: ${name} is not set: run it as a Slurm job step, one "
                              "task per node (srun --ntasks-per-node=1 reshard run --slurm ...)")
    try:
        hosts = expand_hostlist(nodelist)
    except ValueError as e:
        raise LaunchError(f"--slurm: $SLURM_STEP_NODELIST: {e}") from None
    if node not in hosts:
        raise LaunchError(f"--slurm: this node {node!r} ($SLURMD_NODENAME) is not in the step's "
                          f"nodes {nodelist!r} ($SLURM_STEP_NODELIST)")
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE", "")
    if tasks:
        try:
            counts = _tasks_per_node(tasks)
        except ValueError as e:
            raise LaunchError(f"--slurm: $SLURM_STEP_TASKS_PER_NODE {tasks!r}: {e}") from None
        if any(c != 1 for c in counts):
            raise LaunchError(f"--slurm: the step runs {tasks} tasks per node "
                              "($SLURM_STEP_TASKS_PER_NODE); one launcher per node starts its "
                              "ranks: srun --ntasks-per-node=1")
    return Allocation(node, hosts, env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_NAME", ""))


def apply(args, env=None):
    """Fills `reshard run`'s --host and (registering) --hosts from the
    allocation where they were not given; an explicit --host must be this
    node. Returns the Allocation."""
    a = allocation(env)
    if args.host and args.host != a.host:
        raise LaunchError(f"--host {args.host!r} with --slurm: this step runs on {a.host!r} "
                          "($SLURMD_NODENAME); leave --host out")
    args.host = a.host
    if not getattr(args, "hosts", ""):
        args.hosts = ",".join(a.hosts)
    return a


class NodeAddress:
    """A Slurm node as Addresses reads a listed host: host_id, address."""

    def __init__(self, host_id, address):
        self.host_id, self.address = host_id, address


def parse_nodes(text):
    """`scontrol show node -o` -> {NodeName: {field: value}} (one line per
    node; a value never holds a space except Reason=..., the last field)."""
    nodes = {}
    for line in text.splitlines():
        fields = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep and key[:1].isupper():
                fields[key] = value
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields
    return nodes


def scontrol(argv, env=None, timeout=30):
    """`scontrol ARGV` -> stdout; LaunchError with scontrol's words when it fails."""
    try:
        r = subprocess.run(["scontrol"] + list(argv), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"scontrol {' '.join(argv)}: {e}") from None
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        raise LaunchError(f"scontrol {' '.join(argv)}: exit {r.returncode}: "
                          f"{' '.join(out.split())}")
    return out


def node_addresses():
    """[NodeAddress] of every Slurm node: its NodeAddr, where its ranks
    listen (the launcher's MASTER_ADDR under --slurm)."""
    nodes = parse_nodes(scontrol(["-o", "show", "node"]))
    return [NodeAddress(name, f.get("NodeAddr") or name) for name, f in nodes.items()]


TAG = "reshard:"


def mark_of(job_id, worker_token, slurm_job_id):
    """The Comment that marks Slurm job `slurm_job_id` as reshard job
    `job_id`'s: `reshard:<job id>:<proof>`, the proof an HMAC of the Slurm
    job id under the job's worker token. Only the job's launchers (and the
    coordinator's admins) hold that token, so a user cannot mark a Slurm job
    of theirs as another tenant's job and have the adapter move that job
    onto their nodes."""
    proof = hmac.new(worker_token.encode(), f"slurm-job:{slurm_job_id}".encode(),
                     hashlib.sha256).hexdigest()[:16]
    return f"{TAG}{job_id}:{proof}"


def tag_job(slurm_job_id, job_id, worker_token, log):
    """Marks Slurm job `slurm_job_id` as reshard job `job_id`'s (its
    Comment, mark_of()), once: what `reshard slurm watch` reads. A failure
    is said and the launcher goes on (the job trains; the adapter cannot
    follow it)."""
    want = mark_of(job_id, worker_token, slurm_job_id)
    try:
        shown = parse_job(scontrol(["-o", "show", "job", slurm_job_id]))
        if shown.get("Comment", "").split(" ")[0] == want:
            return True  # marked already (perhaps with an admin's request after it)
        scontrol(["update", f"JobId={slurm_job_id}", f"Comment={want}"])
        return True
    except LaunchError as e:
        log(f"could not mark Slurm job {slurm_job_id} as reshard job {job_id} (its Comment), "
            f"so `reshard slurm watch` will not follow it: {e}")
        return False


def parse_job(text):
    """`scontrol show job -o J` -> {field: value}. A field starts at a word
    `Key=` with a CamelCase key; a word without one continues the value
    before it (Comment= and Reason= may hold spaces). The first of a key
    wins: slurmctld prints its own fields before the user's Comment, so a
    Comment holding `NodeList=...` cannot stand for the job's nodes."""
    fields, key = {}, None
    for word in text.split():
        k, sep, v = word.partition("=")
        if sep and re.match(r"^[A-Z][A-Za-z:/]*$", k) and k not in fields:
            key = k
            fields[key] = v
        elif key is not None:
            fields[key] += " " + word
    return fields
