"""`reshard run`: the per-host launcher of a reshard job's training ranks
(docs/pytorch.md, "The launcher").

One launcher runs on every host (or as a Kubernetes pod's entrypoint):

    reshard run --coordinator HOST:PORT --job JOB --host HOST_ID \\
        --worker-socket PATH [--token-file F] (--tls-ca F | --insecure) \\
        -- python train.py args...

It follows the job with WatchJob (the job's worker token is enough) and
starts, on its host, one process per rank of the job's current layout with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) plus reshard's (RESHARD_*; rank_env() reads it):

- a stop-free operation, once PLANNED: this host's ranks of its target
  layout start in warm-up (RESHARD_OPERATION_ID set) while the old ranks
  train on; after the cut-over the old ranks' loop ends and they exit by
  themselves; once the operation commits the launcher waits for them
  (--retire-timeout) and then terminates them, saying so;
- a stop-the-world operation or a recovery that commits: the ranks still
  running are stopped and the new layout's ranks on this host start
  (RESHARD_GENERATION = the committed generation); none when the host is
  not in the new layout (the launcher then waits for a layout that uses it);
- warm rank processes (--spares N): a `python script.py` or `python -m
  module` command runs in rank hosts (reshard.launcher._rank_host: torch
  imported ahead of need, the script run with runpy); a rank that ends with
  0 or EXIT_PEER_LOST hands its process back to the host's pool, where the
  next layout's rank finds it; N idle ones are kept (reshard._launch_ranks);
- a rank that exits non-zero or by a signal: this host's other ranks of
  that world are terminated (their collectives would hang or fail with
  gloo's "Connection closed by peer"; after --grace when it exited
  EXIT_PEER_LOST, since they lost the same peer and end by themselves) and
  the rank is reported (ReportRankFailure): at once when a signal killed
  it, never when it exits EXIT_PEER_LOST (a peer died), after --settle
  seconds for another status unless another rank of its world was reported
  or its host lost first (a casualty); the launcher exits 1 unless the job gets a recovery within
  --recovery-timeout (it then follows it);
- the job deleted: the ranks are stopped and the launcher exits 0; the job
  FAILED (state lost): exit 3; SIGTERM / SIGINT: forwarded to every rank,
  exit 128 + the signal; a coordinator it cannot reach at start (a closed
  port, TLS against a plaintext endpoint or the reverse), bad arguments or
  a refused credential: one line on stderr, exit 2.

Each rank leads a process group of its own: what a rank starts is
signalled with it and killed when it ends, and a guard process kills the
groups when the launcher dies, even by SIGKILL (reshard._launch_ranks).

Rendezvous (no launcher talks to another): MASTER_ADDR is the address of the
host of the world's rank 0 (--rdzv-host / --rdzv-host-pattern, else the
agent address the coordinator lists for it, else 127.0.0.1 when the whole
world is on this host); MASTER_PORT = lo + E mod (hi - lo + 1) over
--rdzv-port-range lo-hi, where E is the world's layout epoch: the job's
Job.layout_epoch (how many reconfigurations it has committed) for the world
that trains its current layout, that + 1 for the world a stop-free operation
warms up meanwhile (rendezvous_port). Only worlds of consecutive epochs are
ever alive at once, so they never share a port however long either lives.

This module is the command line; it re-exports the launcher's API from the
four modules that hold it: reshard._launch_env (a rank's environment and the
exit statuses: all a rank needs), _launch_rdzv (MASTER_ADDR and MASTER_PORT),
_launch_ranks (this host's rank processes), _launch_follow (the Launcher,
which follows the job).
"""

import argparse
import os
import shutil
import sys

from reshard.launcher._launch_env import (  # noqa: F401
    EXIT_JOB_FAILED, EXIT_OK, EXIT_PEER_LOST, EXIT_RANK_FAILED, EXIT_USAGE, LaunchError, RankEnv,
    rank_env)
from reshard.launcher._launch_follow import Launcher  # noqa: F401
from reshard.launcher import register as _register
from reshard.launcher import slurm as _slurm
from reshard.launcher._launch_ranks import World  # noqa: F401
from reshard.launcher._launch_rdzv import (  # noqa: F401
    DEFAULT_PORT_RANGE, Addresses, parse_port_range, rendezvous_port)


# ------------------------------------------------------------------- CLI


def _parser():
    p = argparse.ArgumentParser(
        prog="reshard run",
        description="Start this host's ranks of a reshard job and follow its reconfigurations "
                    "(docs/pytorch.md, \"The launcher\").")
    p.add_argument("--coordinator", required=True, help="HOST:PORT of a reshard-coordinator")
    p.add_argument("--job", default="", help="the job id (or --job-name, below)")
    p.add_argument("--host", default="", help="this host's id (its agent's --host-id); "
                   "required unless --slurm")
    p.add_argument("--slurm", action="store_true",
                   help="as a Slurm job step (srun --ntasks-per-node=1): --host is this node "
                        "($SLURMD_NODENAME) and the first layout's --hosts the step's nodes "
                        "($SLURM_STEP_NODELIST), where not given (docs/slurm.md)")
    p.add_argument("--worker-socket", required=True, help="this host agent's --worker-socket "
                   "({host} is replaced by this host's id)")
    p.add_argument("--token-file", help="the credential for the coordinator, normally the job's "
                   "worker token (default $RESHARD_WORKER_TOKEN)")
    p.add_argument("--tls-ca", help="PEM CA of the coordinator's certificate (TLS)")
    p.add_argument("--insecure", action="store_true", help="plaintext (a coordinator run with "
                   "--insecure)")
    p.add_argument("--rdzv-host", action="append", default=[], metavar="HOST=ADDR",
                   help="the address of a host's ranks for MASTER_ADDR (repeatable)")
    p.add_argument("--rdzv-host-pattern", default="", metavar="PATTERN",
                   help="MASTER_ADDR of a host from its id, e.g. '{host}.trainers.ns.svc'")
    p.add_argument("--rdzv-port-range", default=f"{DEFAULT_PORT_RANGE[0]}-{DEFAULT_PORT_RANGE[1]}",
                   metavar="LO-HI", help="MASTER_PORTs of the job's worlds (default %(default)s)")
    p.add_argument("--retire-timeout", type=float, default=120.0, metavar="S",
                   help="after a stop-free cut-over commits, how long the old ranks may take to "
                        "end before they are terminated (default %(default)s)")
    p.add_argument("--recovery-timeout", type=float, default=60.0, metavar="S",
                   help="after a rank failed, how long to wait for the job's recovery before "
                        "exiting 1 (default %(default)s)")
    p.add_argument("--grace", type=float, default=10.0, metavar="S",
                   help="SIGTERM -> SIGKILL of a rank being stopped (default %(default)s)")
    p.add_argument("--settle", type=float, default=1.0, metavar="S",
                   help="a rank that exits with a non-zero status is reported unless another "
                        "rank of its world is reported dead within S seconds (it is then a "
                        "casualty); one killed by a signal is reported at once (default "
                        "%(default)s)")
    p.add_argument("--spares", type=_spares, default=None, metavar="N",
                   help="warm rank processes: run the ranks of a `python script.py` or `python "
                        "-m module` command in interpreters that imported torch ahead of need, "
                        "reused by the next layout's ranks, and keep N idle ones ready (default: "
                        "as many as this host's ranks in a layout; 0: every rank a fresh "
                        "process)")
    p.add_argument("--log-dir", help="each rank's output to DIR/<world>-rank<R>.log instead of "
                   "the launcher's")
    p.add_argument("--events", help="append what the launcher does as JSON lines to this file "
                   "({host} is replaced by this host's id)")
    _register.add_run_flags(p)  # --job-name, --tenant, --register-token-file, first layout
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the rank's command line")
    return p


def _spares(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count >= 0")
    return n


def _read_token(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise LaunchError(f"--token-file \"{path}\": cannot read it: {e.strerror}") from None


def _with_host(path, flag, host):
    """`path` with {host} replaced by this host's id (a shared file system's
    per-host paths); LaunchError naming the flag for another {...}."""
    try:
        return path.format(host=host)
    except (KeyError, IndexError, ValueError) as e:
        raise LaunchError(f"{flag} {path!r}: only {{host}} may be replaced ({e!r})") from None


def run(argv):
    """`reshard run ARGS -- COMMAND...`; returns the exit status."""
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if not command:
            raise LaunchError("no command: reshard run [options] -- python train.py ...")
        if shutil.which(command[0]) is None:
            raise LaunchError(f"command {command[0]!r}: not found or not executable")
        allocation = None
        if args.slurm:
            allocation = _slurm.apply(args)
        elif not args.host:
            raise LaunchError("--host: this host's id is required (or --slurm inside a Slurm "
                              "job step)")
        args.worker_socket = _with_host(args.worker_socket, "--worker-socket", args.host)
        if args.events:
            args.events = _with_host(args.events, "--events", args.host)
        if bool(args.tls_ca) == bool(args.insecure):
            raise LaunchError("give --tls-ca FILE (TLS) or --insecure (plaintext), one of them")
        token = _read_token(args.token_file) if args.token_file else os.environ.get(
            "RESHARD_WORKER_TOKEN", "")
        # The ranks present the worker token to their agent; it is the
        # launcher's own credential unless $RESHARD_WORKER_TOKEN says another.
        worker_token = os.environ.get("RESHARD_WORKER_TOKEN") or token
        explicit = {}
        for item in args.rdzv_host:
            host, sep, addr = item.partition("=")
            if not sep or not host or not addr:
                raise LaunchError(f"--rdzv-host {item!r}: expected HOST=ADDR")
            explicit[host] = addr
        port_range = parse_port_range(args.rdzv_port_range)
        # Under Slurm a world meets at its rank 0's node's NodeAddr.
        use_slurm = bool(allocation and not args.rdzv_host_pattern)

        def listing(list_hosts):
            """How the launcher lists the hosts' addresses: the agents' the
            coordinator lists (`list_hosts`), or under Slurm its NodeAddr
            (the agents' while slurmctld does not answer)."""
            if not use_slurm:
                return list_hosts

            def list_nodes():
                try:
                    return _slurm.node_addresses()
                except LaunchError:
                    return list_hosts()
            return list_nodes
        from reshard.core.client import Client, tls_credentials
        kwargs = {"insecure": True} if args.insecure else {
            "credentials": tls_credentials(os.path.abspath(args.tls_ca))}
        # Registration (reshard.launcher.register): the job by (--tenant,
        # --job-name), registered from its ranks' describe() when absent.
        registration = None
        if args.job_name:
            registration = _register.prepare_run(
                args, command, kwargs,
                lambda list_hosts: Addresses(explicit, args.rdzv_host_pattern,
                                             listing(list_hosts)),
                port_range)
            args.job = registration.job_id
            token = worker_token = registration.worker_token
        elif not args.job:
            raise LaunchError("give --job ID, or --job-name NAME --tenant T (registered "
                              "when it does not exist)")
        client = Client(args.coordinator, token=token or None, **kwargs)
    except (LaunchError, ValueError) as e:
        print(f"reshard run: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        launcher = Launcher(
            client, args.job, args.host, os.path.abspath(args.worker_socket), command,
            args.coordinator, worker_token=worker_token,
            tls_ca=os.path.abspath(args.tls_ca) if args.tls_ca else "",
            addresses=Addresses(explicit, args.rdzv_host_pattern, listing(client.list_hosts)),
            port_range=port_range, retire_timeout=args.retire_timeout,
            recovery_timeout=args.recovery_timeout, grace=args.grace, settle=args.settle,
            events_path=args.events,
            log_dir=args.log_dir, spares=args.spares)
    except OSError as e:
        client.close()
        print(f"reshard run: --events \"{args.events}\": cannot open it: {e.strerror}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if registration is not None:
            registration.hand_over(launcher)
        if allocation is not None and allocation.job_id:
            _slurm.tag_job(allocation.job_id, args.job, worker_token, lambda msg: print(
                f"reshard run [{args.host}]: {msg}", file=sys.stderr, flush=True))
        return launcher.run()
    finally:
        client.close()
        if registration is not None:
            registration.close()


def main(argv=None):
    """The `reshard` console script: `reshard run ...`, `reshard dcp
    import|export ...` (reshard.dcp)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: reshard run [options] -- COMMAND ...   (reshard run --help)\n"
              "       reshard register [options] (--ptc F | -- COMMAND ...)  (reshard register "
              "--help)\n"
              "       reshard dcp import|export DIR ...     (reshard dcp import --help)\n"
              "       reshard slurm watch|shrink ...        (reshard slurm --help)")
        return 0 if argv else EXIT_USAGE
    if argv[0] == "register":
        return _register.main(argv[1:])
    if argv[0] == "slurm":
        from reshard.launcher import slurm_adapter
        return slurm_adapter.main(argv[1:])
    if argv[0] == "dcp":
        from reshard.frameworks import dcp  # torch.distributed.checkpoint: only when asked for
        return dcp.main(argv[1:])
    if argv[0] != "run":
        print(f"reshard: unknown command {argv[0]!r} (known: run, register, dcp, slurm)",
              file=sys.stderr)
        return EXIT_USAGE
    return run(argv[1:])
