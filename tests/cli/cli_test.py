#!/usr/bin/env python3
"""End-to-end tests of the reshardctl binary (registered with CTest, label "cli").

  cli_test.py plan  --reshardctl BIN --examples DIR --job J --target T [--lost L]
      plans one example target as JSON and checks the plan's figures.
  cli_test.py error --reshardctl BIN --examples DIR CASE
      runs one failing invocation and checks the exit status and stderr.
  cli_test.py help  --reshardctl BIN
  cli_test.py index --examples DIR
      checks that index.json lists every target file under DIR.

Only the exit status, stdout's plan and the error message a user sees are
checked, never log lines.
"""

import argparse
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

TIMEOUT_S = 300


class Failure(Exception):
    pass


def run(binary, *args):
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout, proc.stderr


def check(cond, message):
    if not cond:
        raise Failure(message)


def stat(stats, name):
    """int64 fields are JSON strings and are omitted when zero."""
    return int(stats.get(name, 0))


# ---------------------------------------------------------------------- plan


def check_plan(plan):
    stats = plan.get("stats", {})
    steps = plan.get("steps", [])
    local, cross = stat(stats, "bytes_local"), stat(stats, "bytes_cross_host")
    lower = stat(stats, "lower_bound_cross_host")
    check(cross == lower, f"bytes_cross_host {cross} != lower_bound_cross_host {lower}")
    if local + cross > 0:
        check(stat(stats, "steps") > 0, f"{local + cross} bytes move but stats.steps is 0")
    check(stat(stats, "steps") == len(steps),
          f"stats.steps {stat(stats, 'steps')} != {len(steps)} steps listed")
    cross_steps = [s for s in steps if s.get("cross_host")]
    check(stat(stats, "cross_host_steps") == len(cross_steps),
          f"stats.cross_host_steps {stat(stats, 'cross_host_steps')} != {len(cross_steps)}")
    summed = sum(int(s.get("bytes", 0)) for s in cross_steps)
    check(summed == cross, f"cross-host steps carry {summed} bytes, stats say {cross}")
    summed_local = sum(int(s.get("bytes", 0)) * len(s.get("dsts", []))
                       for s in steps if not s.get("cross_host"))
    check(summed_local == local, f"local steps write {summed_local} bytes, stats say {local}")
    hosts_in = sum(stat(h, "bytes_in") for h in stats.get("hosts", []))
    check(hosts_in == cross, f"hosts' bytes_in sum to {hosts_in}, cross-host bytes are {cross}")
    return f"{len(steps)} steps, {local} B local, {cross} B cross-host (lower bound {lower})"


def cmd_plan(args):
    job = os.path.join(args.examples, args.job)
    target = os.path.join(args.examples, args.target)
    lost = ["--lost", args.lost] if args.lost else []
    rc, out, err = run(args.reshardctl, "plan", "--spec", job, "--to", target, *lost,
                       "--format", "json")
    check(rc == 0, f"exit status {rc}, stderr:\n{err}")
    try:
        plan = json.loads(out)
    except json.JSONDecodeError as e:
        raise Failure(f"stdout is not JSON: {e}")
    if args.lost:
        check(plan.get("lost_ranks"), f"--lost {args.lost} but the plan lists no lost_ranks")
    print(f"{args.target}: {check_plan(plan)}")
    rc, out, err = run(args.reshardctl, "plan", "--spec", job, "--to", target, *lost)
    check(rc == 0, f"summary format: exit status {rc}, stderr:\n{err}")
    check(re.search(r"cross / lower bound +(1\.000|n/a)$", out, re.MULTILINE),
          f"summary does not show a cross / lower bound ratio of 1.000:\n{out}")


# --------------------------------------------------------------------- error


def write_json(directory, name, obj):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return path


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def error_cases(examples, tmp):
    """name -> (argv after the binary, expected exit status, [regexes stderr must match])."""
    gpt_job = os.path.join(examples, "gpt3-xl/job.json")
    gpt_to = os.path.join(examples, "gpt3-xl/to-tp4.json")
    gpt_lost_to = os.path.join(examples, "gpt3-xl/after-lost-node-3.json")
    llama_job = os.path.join(examples, "llama3-8b/job.json")
    llama_new = os.path.join(examples, "llama3-8b/to-new-hosts.json")
    missing = os.path.join(tmp, "no-such-job.json")

    malformed = os.path.join(tmp, "malformed.json")
    with open(malformed, "w", encoding="utf-8") as f:
        f.write('{"name": "gpt3-xl", "ptc": {"numLayers": 24,')

    spec = load(gpt_job)
    unknown_field = copy.deepcopy(spec)
    unknown_field["ptc"]["tensorz"] = []
    duplicate = copy.deepcopy(spec)
    dup_name = duplicate["ptc"]["tensors"][4]["name"]
    duplicate["ptc"]["tensors"].append(copy.deepcopy(duplicate["ptc"]["tensors"][4]))
    job_world = copy.deepcopy(spec)
    job_world["layout"]["config"]["dp"] = 3  # 2 * 2 * 3 = 12 ranks on 16 slots

    target_world = load(gpt_to)
    target_world["placement"]["hosts"] = target_world["placement"]["hosts"][:3]  # 12 slots, 16 ranks

    plan = ["plan", "--spec"]
    return {
        "missing_spec_file": (plan + [missing, "--to", gpt_to], 1,
                              [r"^NOT_FOUND: ", re.escape(missing)]),
        "missing_target_file": (plan + [gpt_job, "--to", missing], 1,
                                [r"^NOT_FOUND: ", re.escape(missing)]),
        "malformed_json": (plan + [malformed, "--to", gpt_to], 1,
                           [r"^INVALID_ARGUMENT: ", re.escape(malformed), r"JobSpec"]),
        "unknown_json_field": (plan + [write_json(tmp, "unknown.json", unknown_field), "--to",
                                       gpt_to], 1, [r"^INVALID_ARGUMENT: ", r"tensorz"]),
        "duplicate_tensor": (plan + [write_json(tmp, "dup.json", duplicate), "--to", gpt_to], 1,
                             [r"^INVALID_ARGUMENT: ", re.escape(dup_name)]),
        "job_world_mismatch": (plan + [write_json(tmp, "world.json", job_world), "--to", gpt_to],
                               1, [r"^INVALID_ARGUMENT: ", r"\b12\b", r"\b16\b"]),
        "target_world_mismatch": (plan + [gpt_job, "--to",
                                          write_json(tmp, "target.json", target_world)], 1,
                                  [r"^INVALID_ARGUMENT: ", r"\b12\b", r"\b16\b"]),
        "unknown_lost_token": (plan + [gpt_job, "--to", gpt_lost_to, "--lost", "node-3,node-99"],
                               1, [r"^INVALID_ARGUMENT: ", r"--lost", r'"node-99"']),
        "lost_rank_out_of_range": (plan + [gpt_job, "--to", gpt_lost_to, "--lost", "rank:16"], 1,
                                   [r"^INVALID_ARGUMENT: ", r"--lost", r"\b16\b"]),
        "lost_without_replica": (plan + [llama_job, "--to", llama_new, "--lost", "dgx-1"], 1,
                                 [r"^FAILED_PRECONDITION: ", r"optimizer\.exp_avg\."]),
        "missing_flag": (plan + [gpt_job], 2, [r"^INVALID_ARGUMENT: ", r"--to"]),
        "unknown_flag": (plan + [gpt_job, "--to", gpt_to, "--frobnicate"], 2,
                         [r"^INVALID_ARGUMENT: ", r"--frobnicate"]),
        "bad_format": (plan + [gpt_job, "--to", gpt_to, "--format", "yaml"], 2,
                       [r"^INVALID_ARGUMENT: ", r"yaml"]),
        "unknown_command": (["replan"], 2, [r"^INVALID_ARGUMENT: ", r"replan"]),
    }


def cmd_error(args):
    with tempfile.TemporaryDirectory(prefix="reshard-cli-test-") as tmp:
        cases = error_cases(args.examples, tmp)
        if args.case not in cases:
            raise Failure(f"unknown case {args.case!r}; cases: {', '.join(sorted(cases))}")
        argv, want_rc, patterns = cases[args.case]
        rc, out, err = run(args.reshardctl, *argv)
        check(rc == want_rc, f"exit status {rc}, want {want_rc}; stderr:\n{err}")
        check(out == "", f"stdout should be empty on error, got:\n{out[:2000]}")
        for pattern in patterns:
            check(re.search(pattern, err, re.MULTILINE),
                  f"stderr does not match /{pattern}/:\n{err[:4000]}")
        print(f"{args.case}: exit {rc}: {err.splitlines()[0][:300]}")


# ---------------------------------------------------------------- help, index


def cmd_help(args):
    for argv in (["--help"], ["plan", "--help"]):
        rc, out, err = run(args.reshardctl, *argv)
        check(rc == 0, f"reshardctl {' '.join(argv)}: exit status {rc}, stderr:\n{err}")
        check(out.startswith("usage: reshardctl"), f"reshardctl {' '.join(argv)}: {out!r}")
    rc, out, _ = run(args.reshardctl, "plan", "--help")
    for flag in ("--spec", "--to", "--lost", "--format"):
        check(flag in out, f"plan --help does not mention {flag}")
    rc, _, err = run(args.reshardctl)
    check(rc == 2 and "usage: reshardctl" in err, f"no arguments: exit {rc}, stderr {err!r}")


def cmd_index(args):
    index = load(os.path.join(args.examples, "index.json"))["examples"]
    listed = {e["target"] for e in index}
    on_disk = set()
    for path in glob.glob(os.path.join(args.examples, "*", "*.json")):
        rel = os.path.relpath(path, args.examples)
        if os.path.basename(rel) != "job.json":
            on_disk.add(rel)
    check(listed == on_disk, f"index.json lists {sorted(listed - on_disk)} that do not exist "
          f"and misses {sorted(on_disk - listed)}")
    for e in index:
        check(os.path.exists(os.path.join(args.examples, e["job"])), f"missing {e['job']}")
    print(f"{len(index)} targets indexed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--reshardctl", required=True)
    p.add_argument("--examples", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--lost", default="")
    e = sub.add_parser("error")
    e.add_argument("--reshardctl", required=True)
    e.add_argument("--examples", required=True)
    e.add_argument("case")
    h = sub.add_parser("help")
    h.add_argument("--reshardctl", required=True)
    i = sub.add_parser("index")
    i.add_argument("--examples", required=True)
    args = parser.parse_args()
    try:
        {"plan": cmd_plan, "error": cmd_error, "help": cmd_help, "index": cmd_index}[
            args.command](args)
    except Failure as f:
        print(f"FAIL: {f}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as t:
        print(f"FAIL: timed out: {t}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
