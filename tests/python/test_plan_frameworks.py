"""The C++ planner's plans of the issue-13 examples (examples/frameworks.py),
executed here: `reshardctl plan --format json` plans each example offline;
this test applies the TransferPlan's copy steps and zero fills to the old
ranks' buffers (reshard.layout.shard of random global values), checks that
every element of every new buffer is written exactly once, and compares each
new buffer byte for byte with reshard.layout.shard of the new layout. No
cluster: the two readings of docs/partitioning.md (C++ planner, Python
reference) against each other on every new kind."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from google.protobuf import json_format

import reshard
from reshard import layout, megatron
from reshard.v1 import plan_pb2, ptc_pb2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples"))
import frameworks  # noqa: E402


def reshardctl():
    build = os.environ.get("RESHARD_BUILD_DIR") or os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(reshard.__file__))))
    return os.path.join(build, "client", "cli", "reshardctl")


def reshardctl_plan(ptc, old, new, *flags):
    """`reshardctl plan` of old -> new with `flags`: its standard output."""
    spec = ptc_pb2.JobSpec(name="x", tenant="t", ptc=ptc, layout=old)
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, msg in (("job.json", spec), ("to.json", new)):
            paths.append(os.path.join(d, name))
            with open(paths[-1], "w") as f:
                json.dump(json_format.MessageToDict(msg), f)
        out = subprocess.run([reshardctl(), "plan", "--spec", paths[0], "--to", paths[1]] +
                             list(flags), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def plan(ptc, old, new):
    return json_format.Parse(reshardctl_plan(ptc, old, new, "--format", "json"),
                             plan_pb2.TransferPlan(), ignore_unknown_fields=True)


def raw(value, element_bytes):
    """A rank's buffer of an item as a flat array of element-sized ints."""
    dt = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[element_bytes]
    if isinstance(value, bytes):
        return np.frombuffer(value, np.uint8).copy()
    return np.ascontiguousarray(value).reshape(-1).view(dt)


def region_index(region, shape):
    """Flat element positions of a strided region, in row-major order of shape."""
    idx = np.full([int(x) for x in shape], region.offset, dtype=np.int64)
    for k, stride in enumerate(region.strides):
        view = [1] * len(shape)
        view[k] = int(shape[k])
        idx = idx + np.arange(int(shape[k]), dtype=np.int64).reshape(view) * stride
    return idx.reshape(-1)


def execute(tp, ptc, old_lay, new_lay, g):
    old = {r: layout.shard(ptc, old_lay, r, g) for r in range(layout.world_size(old_lay))}
    g_new = layout.after_reshard(ptc, new_lay, g)
    want = {r: layout.shard(ptc, new_lay, r, g_new) for r in range(layout.world_size(new_lay))}
    names = [it.name for it in tp.items]
    assert names == [t.name for t in ptc.tensors] + [b.name for b in ptc.blobs]
    ebytes = [it.element_bytes for it in tp.items]
    new, count = {}, {}
    for r, items in want.items():
        for name, value in items.items():
            buf = raw(value, ebytes[names.index(name)])
            new[r, name] = np.full_like(buf, 0xAB if buf.dtype == np.uint8 else 7)
            count[r, name] = np.zeros(buf.size, np.int32)
    for s in tp.steps:
        name = names[s.item]
        src = raw(old[s.src_rank][name], ebytes[s.item])[region_index(s.src, s.shape)]
        for d in s.dsts:
            pos = region_index(d.region, s.shape)
            new[d.rank, name][pos] = src
            count[d.rank, name][pos] += 1
    for z in tp.zero_fills:
        key = (z.rank, names[z.item])
        if key not in new:  # an item of only padding the reference leaves out
            assert z.offset == 0
            continue
        new[key][z.offset:z.offset + z.count] = 0
        count[key][z.offset:z.offset + z.count] += 1
    problems = []
    for (r, name), buf in new.items():
        if not (count[r, name] == 1).all():
            problems.append(f"rank {r} {name}: written {sorted(set(count[r, name].tolist()))} "
                            "times")
        elif buf.tobytes() != raw(want[r][name], ebytes[names.index(name)]).tobytes():
            problems.append(f"rank {r} {name}: bytes differ")
    return problems


@pytest.mark.parametrize("name", sorted(frameworks.EXAMPLES))
def test_planner_plan_reproduces_the_reference(name):
    ptc, old, targets = frameworks.EXAMPLES[name]()
    g = megatron.synthetic_state(ptc, layout.world_size(old), seed=len(name))
    for new in targets:
        tp = plan(ptc, old, new)
        assert tp.stats.bytes_cross_host == tp.stats.lower_bound_cross_host
        assert execute(tp, ptc, old, new, g) == []
        g, old = layout.after_reshard(ptc, new, g), new


def test_committed_json_files_are_generated():
    """examples/framework-jobs/* is what `frameworks.py --write` writes."""
    for rel, text in frameworks.files().items():
        with open(os.path.join(REPO, "examples", rel)) as f:
            assert f.read() == text, f"{rel}: run .venv/bin/python examples/frameworks.py --write"


def test_a_plan_whose_replicas_plan_alone_is_printed_whole():
    """HSDP -> HSDP on 4 hosts x 2, a replica on each pair of hosts on both
    sides: the planner plans one replica and repeats it (docs/partitioning.md,
    "Replicas plan alone"). The summary says so; `--format json` writes out
    every replica's steps, which apply exactly as the reference says."""
    from helpers import hsdp_ptc
    ptc = hsdp_ptc()
    hosts = [f"h{i}" for i in range(4)]
    old = layout.make_layout(2, 1, 4, hosts, 2, dp_shard=2)
    new = layout.make_layout(1, 1, 4, hosts, 2, cp=2, dp_shard=2)
    summary = reshardctl_plan(ptc, old, new)
    tp = plan(ptc, old, new)
    assert not tp.HasField("replicas")
    assert len(tp.steps) == tp.stats.steps
    assert [s.index for s in tp.steps] == list(range(len(tp.steps)))
    each = len(tp.steps) // 2
    rows = [line.split() for line in summary.splitlines()]
    assert ["replicas", "planned", "alone", "2", str(each), "steps", "each"] in rows, summary
    g = megatron.synthetic_state(ptc, layout.world_size(old), seed=5)
    assert execute(tp, ptc, old, new, g) == []
