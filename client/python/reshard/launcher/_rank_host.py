"""A warm rank process of `reshard run` (docs/pytorch.md, "The launcher"):
the launcher starts it ahead of need as a spare. It imports torch,
torch.distributed and reshard once, runs a one-rank FSDP2 + tensor-parallel
step on its own (torch's lazy initialisation), imports what the rank's
script imports at its top level ($RESHARD_RANK_HOST_SCRIPT: the user's own
modules), says "ready MODULES", then serves ranks one after
another: for each assignment (one JSON line on its assignment pipe: the
rank's environment, command line, working directory and log file) it sets
os.environ, sys.argv and sys.path as `python script.py args` would and runs
the user's script (or `-m module`) with runpy in this interpreter. So a rank
it runs starts without an interpreter start or `import torch`, and a rank
that ends at a reconfiguration hands its process, with every module it
imported, to the next layout's rank on this host.

When the script ends with status 0 or reshard.launch.EXIT_PEER_LOST (75, a
peer died), the process SIGKILLs what the rank left in its process group,
tears the torch.distributed state down (every process group destroyed,
DeviceMesh's registry emptied), collects the rank's garbage so that the
groups' connections and stores close (a peer blocked on one of them fails
at once, as it would if the process had ended; if anything still holds one,
the process ends instead), reports
"done STATUS" on its status pipe and waits for the next assignment. Any
other end (an uncaught exception: status 1; sys.exit(N); a signal;
os._exit) ends the process with that status, exactly as a cold rank would,
and a teardown that does not finish within a few seconds ends it with the
script's status. The launcher reads the status pipe: "ready", "done STATUS";
its end means the process ended (then its exit status is the rank's).

Run as: python -c <bootstrap> STATUS_FD ASSIGN_FD (reshard._launch_ranks).
"""

import ast
import gc
import importlib.util
import json
import os
import runpy
import signal
import sys
import threading
import traceback
import warnings
import weakref

# Importing this module (the bootstrap's `import reshard.launcher._rank_host`)
# imported the reshard package already: the launcher's constant is free.
from reshard.launcher._launch_env import EXIT_PEER_LOST

TEARDOWN_S = 5.0   # a teardown that takes longer ends the process (same status)


def _warm():
    """Imports what every PyTorch rank imports (minutes of CPU across a
    host's ranks when they all start at once); none of it is required."""
    for name in ("torch", "torch.distributed", "torch.distributed.device_mesh",
                 "torch.distributed.tensor", "torch.distributed.tensor.parallel",
                 "torch.distributed.fsdp", "torch.nn", "torch.optim", "numpy",
                 "reshard", "reshard.frameworks.pytorch", "reshard.frameworks.pytorch_loop",
                 "reshard.core.elastic", "reshard.core.data"):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001: a module this rank cannot import stays cold
            pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's, about this toy model: not the user's
            _exercise()
    except Exception:  # noqa: BLE001: another torch, no gloo: the ranks initialise it
        pass
    try:
        _teardown()
    except Exception:  # noqa: BLE001
        pass


def _top_level_imports(source):
    """The modules a script's source imports at its top level (`import a.b`,
    `from a.b import c`, also inside a top-level try), in order; relative and
    __future__ imports left out."""
    names = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return names
    body = []
    for node in tree.body:
        body += node.body if isinstance(node, ast.Try) else [node]
    for node in body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n for n in dict.fromkeys(names) if n != "__future__"]


def _preimport(script):
    """Imports the modules the rank's script (the launcher's {"mode":
    "path"|"module", "target", "cwd"}) imports at its top level, with
    sys.path[0] as running it will set it: the user's own modules (a
    model library, transformers, torchtitan) are then imported once per
    process, before any rank needs them. A module that cannot be imported
    yet (it reads the rank's environment, say) is left to the rank. Returns
    the names of those imported now."""
    cwd = script.get("cwd") or os.getcwd()
    target = script["target"]
    saved = list(sys.path)
    try:
        if script["mode"] == "module":
            sys.path[0] = cwd
            spec = importlib.util.find_spec(target)
            path = spec.origin if spec is not None else None
        else:
            path = os.path.join(cwd, target)
            sys.path[0] = os.path.dirname(os.path.abspath(path))
        if not path or not os.path.isfile(path):
            return []
        with open(path, encoding="utf-8") as f:
            names = _top_level_imports(f.read())
        done = []
        for name in names:
            if name in sys.modules:
                continue
            try:
                __import__(name)
                done.append(name)
            except (Exception, SystemExit):  # noqa: BLE001: the rank imports it itself
                pass
        return done
    except (Exception, SystemExit):  # noqa: BLE001: nothing pre-imported
        return []
    finally:
        sys.path[:] = saved


def _exercise():
    """Runs once, on a one-rank world of this process, what a PyTorch 2
    rank's first layout runs: a gloo process group, a DeviceMesh, tensor
    parallel, FSDP2, a step of Adam. torch initialises much of that lazily
    (op registrations, dispatch caches: most of a first parallelize and
    step), which then happens here, before any rank needs it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    for dtype in (torch.float32, torch.float64):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(dtype)
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.Adam(model.parameters())
        model(torch.ones(2, 8, dtype=dtype)).sum().backward()
        opt.step()
        opt.zero_grad()
        model.state_dict()
        opt.state_dict()


def _teardown():
    """Leaves torch.distributed as a fresh interpreter has it. Returns weak
    references to the process groups it destroyed and their stores: once
    nothing else holds them, their connections close (a peer blocked on
    one learns at once that this rank is gone)."""
    refs = []
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        pg_map = getattr(getattr(c10d, "_world", None), "pg_map", None) or {}
        for pg, entry in list(pg_map.items()):
            for obj in (pg, entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None):
                try:
                    refs.append(weakref.ref(obj))
                except TypeError:  # None, or a type without weak references
                    pass
        dist.destroy_process_group()
    mesh = sys.modules.get("torch.distributed.device_mesh")
    env = getattr(mesh, "_mesh_resources", None) if mesh is not None else None
    if env is not None:
        try:
            env.__init__()
        except Exception:  # noqa: BLE001: another torch's registry: left as it is
            pass
    return refs


def _end_group():
    """SIGKILLs what the rank started and left running in this process's
    group (a data-loader worker, a grandchild), as the launcher does when a
    cold rank ends, and reaps this process's children among them."""
    me, killed = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                pgid = int(f.read().rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if pgid == me:
            try:
                os.kill(int(name), signal.SIGKILL)
                killed.append(int(name))
            except OSError:
                pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)  # one of ours: reaped; another's: its parent's
        except ChildProcessError:
            pass
    while True:  # children that ended before, left unreaped by the script
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _status_of(exc):
    """The exit status a cold `python script.py` would have ended with."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    # reshard.pytorch_loop's excepthook prints it (a collective that failed
    # because a peer is gone as PeerLost) and answers EXIT_PEER_LOST in a
    # rank host instead of ending the process.
    got = sys.excepthook(type(exc), exc, exc.__traceback__)
    return EXIT_PEER_LOST if got == EXIT_PEER_LOST else 1


def _run(job):
    """Runs one rank; returns its exit status."""
    os.environ.clear()
    os.environ.update(job["env"])
    os.environ["RESHARD_RANK_HOST"] = "1"
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    if job.get("cwd"):
        os.chdir(job["cwd"])
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    try:
        if job["mode"] == "module":
            sys.argv = [job["target"]] + job["args"]
            sys.path[0] = os.getcwd()
            runpy.run_module(job["target"], run_name="__main__", alter_sys=True)
        else:
            script = job["target"]
            sys.argv = [script] + job["args"]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
        return 0
    except BaseException as e:  # noqa: BLE001: the script's end, whatever it is
        return _status_of(e)
    finally:
        sys.path[:] = saved_path
        sys.argv = saved_argv


def _too_long(code):
    """The teardown's watchdog: says so in the rank's log, then ends the
    process with the rank's status (it is not reusable)."""
    sys.stderr.write(f"reshard: rank host {os.getpid()}: tearing the rank's torch.distributed "
                     f"state down took over {TEARDOWN_S:g} s: ending with status {code}\n")
    sys.stderr.flush()
    os._exit(code)


def _redirect(path, saved):
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    else:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)


def main(status_fd, assign_fd):
    status = os.fdopen(status_fd, "w", buffering=1)
    assign = os.fdopen(assign_fd, "r")
    _warm()
    script = os.environ.pop("RESHARD_RANK_HOST_SCRIPT", "")
    modules = _preimport(json.loads(script)) if script else []
    status.write(f"ready {json.dumps(modules)}\n")
    saved = (os.dup(1), os.dup(2))
    for line in assign:
        job = json.loads(line)
        _redirect(job.get("log"), saved)
        code = _run(job)
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        if code not in (0, EXIT_PEER_LOST):
            os._exit(code)  # a real failure ends the process, as a cold rank's would
        watchdog = threading.Timer(TEARDOWN_S, _too_long, args=(code,))
        watchdog.daemon = True
        watchdog.start()
        try:
            _end_group()
            groups = _teardown()
            gc.collect()  # the rank's cycles (a model's hooks, its loop): its groups with them
        except Exception:  # noqa: BLE001: not reusable: end with the rank's status
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(code)
        held = sum(1 for r in groups if r() is not None)
        if held:
            # Something the rank left (a thread still running, a cache) holds
            # them: their connections stay open and a peer blocked on one
            # would wait for its timeout. Ending the process closes them.
            sys.stderr.write(f"reshard: rank host {os.getpid()}: {held} of the rank's process "
                             f"groups and stores are still referenced after it ended: ending "
                             f"the process (status {code}) so that its peers see them close\n")
            sys.stderr.flush()
            os._exit(code)
        watchdog.cancel()
        _redirect(None, saved)
        try:
            status.write(f"done {code}\n")
        except OSError:
            os._exit(code)
    os._exit(0)  # the launcher closed the pipe: no more ranks


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
