"""One gloo process per rank, for tests and benchmarks of PyTorch jobs.

spawn(fn, out_dir, *args, world=N) runs fn(rank, N, *args) in N fresh Python
processes that meet through a file in out_dir (a FileStore rendezvous: no port
to pick and race for) and returns their return values, by rank. A rank may run
under a command prefix (`prefix(rank)`, e.g. `ip netns exec <namespace>` for
an emulated host) and with extra environment (`env(rank)`): the rendezvous
file is all the ranks share, so it works across network namespaces as long as
gloo is told which interface to use (GLOO_SOCKET_IFNAME).

fn must be a module-level function; its module is imported in each rank by
name, or, for a script run as __main__, from its file as "__mp_main__" (as
multiprocessing's spawn does), so `if __name__ == "__main__"` blocks do not
run again. The first rank that fails ends the others; the error names it.
"""

import importlib
import importlib.util
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import uuid


class RankFailed(RuntimeError):
    """A rank exited with a non-zero status (its own traceback is on stderr)."""


def spawn(fn, out_dir, *args, world, prefix=None, env=None, timeout=None):
    """fn(rank, world, *args) in `world` gloo processes; their results by rank.

    prefix(rank) -> argv prefix (default none); env(rank) -> extra environment
    (default none); timeout: seconds for all ranks, or None."""
    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tag = uuid.uuid4().hex
    job = os.path.join(out_dir, f"ranks-{tag}.pkl")
    module = sys.modules[fn.__module__]
    with open(job, "wb") as f:
        # Two pickles: the header (plain values), then the arguments, which
        # may need fn's module to unpickle.
        pickle.dump({"module": fn.__module__, "file": getattr(module, "__file__", None),
                     "fn": fn.__name__, "world": world, "out_dir": out_dir,
                     "store": os.path.join(out_dir, f"rendezvous-{tag}"),
                     "sys_path": list(sys.path)}, f)
        pickle.dump(args, f)
    procs = []
    try:
        for rank in range(world):
            argv = list(prefix(rank) if prefix else []) + [
                sys.executable, os.path.abspath(__file__), job, str(rank)]
            procs.append(subprocess.Popen(argv, env=dict(os.environ, **(env(rank) if env else {})),
                                          stdin=subprocess.DEVNULL))
        _wait_all(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = []
    for rank in range(world):
        with open(_result_path(out_dir, tag, rank), "rb") as f:
            out.append(pickle.load(f))
    return out


def _wait_all(procs, timeout):
    """Waits for every process; on the first non-zero exit, kills the rest
    and raises RankFailed naming that rank."""
    done = queue.Queue()
    for rank, p in enumerate(procs):
        threading.Thread(target=lambda r=rank, p=p: done.put((r, p.wait())), daemon=True).start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in procs:
        try:
            rank, rc = done.get(timeout=None if deadline is None else
                                max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RankFailed(f"{len(procs)} ranks: not all done within {timeout} s") from None
        if rc != 0:
            raise RankFailed(f"rank {rank} of {len(procs)} exited with status {rc}")


def _result_path(out_dir, tag, rank):
    return os.path.join(out_dir, f"result-{tag}.{rank}.pkl")


def _load_module(name, path):
    if name != "__main__":
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module
    spec.loader.exec_module(module)
    return module


def _rank_main(job_path, rank):
    with open(job_path, "rb") as f:
        job = pickle.load(f)
        sys.path[:] = job["sys_path"]
        fn = getattr(_load_module(job["module"], job["file"]), job["fn"])
        args = pickle.load(f)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{job['store']}", rank=rank,
                            world_size=job["world"])
    try:
        result = fn(rank, job["world"], *args)
    finally:
        dist.destroy_process_group()
    tag = os.path.basename(job_path)[len("ranks-"):-len(".pkl")]
    with open(_result_path(job["out_dir"], tag, rank), "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]))
    # The result is written: end without finalizing the interpreter. torch
    # keeps gloo's and the autograd engine's threads past
    # destroy_process_group, and one that needs the GIL while CPython
    # finalizes ends in std::terminate (SIGABRT; seen in CI in
    # examples/torchtitan).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
