"""The device check of issue 23 (scripts/gpu_check.sh run): on a GPU machine,
with the binaries and libraries scripts/gpu_check.sh pack carried there.

1. The CUDA runtime and NCCL load at run time on a machine with a driver
   (transfer_cuda_libraries_test: the runtime and NCCL found, a device buffer
   copy; transfer_cuda_device_test: the device API's contract on the GPU, CUDA
   IPC into a child process included; transfer_nccl_comm_test: the NCCL
   communicator the agent uses, one rank (64 MiB arrive whole), two with two
   GPUs).
2. tests/python/test_cuda_worker.py: CUDA tensors published through a real
   agent (PostgreSQL + coordinator + agent) and loaded back into CUDA tensors,
   byte for byte.
3. GB/s of Worker.publish and Worker.load(device=) of CUDA tensors against
   torch's own pinned D2H / H2D and D2D copies of the same bytes, measured in
   this run; each reshard transfer checked byte for byte.
3b. The executor's device-local steps (device_bench: one host, 1 -> 2 ranks
   of a device-resident tensor) against one D2D copy (target >= 0.7x).
4. Device-resident state: publish/load via CUDA IPC against torch's D2D, and
   a two-agent reconfiguration on this one GPU, loaded back on both hosts.
Exit status 0 when every check passed (the GB/s targets are reported, not
asserted).
"""

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "deploy", "local"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

NOT_IN_SLICE = (
    "NOT run here: NCCL between two agents needs two GPUs (transfer_nccl_comm_test's two-rank "
    "test skips on one). Two agents on this one machine take the device-ipc route (CUDA IPC "
    "between the agents), which section 4 runs and reports.")


def section(title):
    print(f"\n=== {title} ===", flush=True)


def run_binaries(build):
    ok = True
    for name in ("transfer_cuda_libraries_test", "transfer_cuda_device_test",
                 "transfer_nccl_comm_test"):
        path = os.path.join(build, "tests", name)
        r = subprocess.run([path, "--gtest_brief=0"], capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[") or "Failure" in ln]
        print("\n".join(lines[-12:]))
        print(f"{name}: exit {r.returncode}")
        ok &= r.returncode == 0
    return ok


def run_device_bench(build, mib):
    """The executor's device-local steps against one D2D copy (bench/transfer/device_bench.cc)."""
    r = subprocess.run([os.path.join(build, "tests", "device_bench"), "--device", "cuda",
                        "--mib", str(mib)], capture_output=True, text=True, timeout=180)
    print(r.stdout[-3000:] + "\n".join(r.stderr.splitlines()[-5:]))
    print(f"device_bench: exit {r.returncode}")
    return r.returncode == 0


def run_pytest():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        os.path.join(REPO, "tests", "python", "test_cuda_worker.py")],
                       capture_output=True, text=True, timeout=240)
    print(r.stdout[-4000:] + r.stderr[-2000:])
    return r.returncode == 0


def timed(fn):
    """(seconds, fn()) with the GPU idle before and after."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, r


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def bench(total_mib, tensors, reps, huge_dir):
    import mmap
    import torch
    import reshard
    from cluster import LocalCluster
    from helpers import register, tensor
    from reshard import _cuda, layout
    from reshard.v1 import ptc_pb2

    n = total_mib * (1 << 20) // (4 * tensors)  # float32 elements per tensor
    nbytes = n * 4 * tensors
    dev = torch.device("cuda", 0)
    src = [torch.randn(n, device=dev) for _ in range(tensors)]
    ptc = reshard.as_message({"numLayers": 1, "tensors": [
        tensor(f"t{i}", "DTYPE_FLOAT32", [n]) for i in range(tensors)]}, ptc_pb2.Ptc)
    torch.cuda.synchronize()

    # torch's own copies of the same bytes (best of reps, after a warm-up).
    pinned = [torch.empty(n, dtype=torch.float32, pin_memory=True) for _ in range(tensors)]
    on_dev = [torch.empty(n, dtype=torch.float32, device=dev) for _ in range(tensors)]

    def d2h():
        for p, s in zip(pinned, src):
            p.copy_(s, non_blocking=True)

    def h2d():
        for d, p in zip(on_dev, pinned):
            d.copy_(p, non_blocking=True)

    def d2d():
        for d, s in zip(on_dev, src):
            d.copy_(s, non_blocking=True)

    def pageable_d2h():
        return [s.cpu() for s in src]

    base = {}
    for name, fn in (("torch pinned D2H", d2h), ("torch pinned H2D", h2d),
                     ("torch D2D", d2d), ("torch pageable D2H (.cpu())", pageable_d2h)):
        fn()
        base[name] = min(timed(fn)[0] for _ in range(reps))
    del pinned

    made = []  # every Pinned the worker made: its registration/copy/unregister timings

    class Recorded(_cuda.Pinned):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    _cuda.Pinned = Recorded
    lay = layout.make_layout(1, 1, 1, ["host-0"], 1)
    want = [s.view(torch.int32) for s in src]
    problems = []

    def measure(label, work_dir):
        results, breakdown = {}, {}
        with LocalCluster(build_dir=os.environ["RESHARD_BUILD_DIR"], hosts=1, devices_per_host=1,
                          tls=False, work_dir=work_dir,
                          memory_limit_bytes=(reps + 4) * nbytes + (1 << 30)) as c, \
                c.client(timeout=120.0) as client:
            for rep in range(reps + 1):  # rep 0 warms up
                job = register(client, c, f"gpu-check-{rep}", ptc, lay)
                state = {f"t{i}": s for i, s in enumerate(src)}
                with c.worker("host-0", job.id, ptc=ptc, timeout=120.0) as w:
                    t_copy, unsealed = timed(
                        lambda: w.publish(0, 1, state, verify=False, seal=False))
                    paths = [w.last_device_copy]
                    pub_times = dict(made[-1].timings)
                    t_seal, _ = timed(unsealed.seal)
                    t_load, got = timed(lambda: w.load(0, 1, device=dev, verify=False))
                    paths.append(w.last_device_copy)
                    load_times = dict(made[-1].timings)
                    t_load_v, got_v = timed(lambda: w.load(0, 1, device=dev, verify=True))
                    for i in range(tensors):
                        for g in (got, got_v):
                            if not torch.equal(g[f"t{i}"].view(torch.int32), want[i]):
                                problems.append(f"{label} rep {rep} tensor t{i}: bytes differ")
                    del got, got_v
                if rep == 0:
                    continue
                if t_copy < results.get("publish (seal=False, verify=False)", 1e9):
                    breakdown["publish"] = pub_times
                if t_load < results.get("load(device=) verify=False", 1e9):
                    breakdown["load"] = load_times
                for k, v in (("publish (seal=False, verify=False)", t_copy),
                             ("publish's seal (the agent hashes)", t_seal),
                             ("load(device=) verify=False", t_load),
                             ("load(device=) verify=True", t_load_v)):
                    results[k] = min(results.get(k, v), v)
            job = register(client, c, "gpu-check-verified", ptc, lay)
            with c.worker("host-0", job.id, ptc=ptc, timeout=120.0) as w:
                t_full, _ = timed(lambda: w.publish(0, 1, {f"t{i}": s for i, s in enumerate(src)}))
            results["publish verify=True + seal (end to end)"] = t_full
        section(f"GB/s, agent buffers on {label}: {tensors} float32 CUDA tensors, "
                f"{nbytes / 1e9:.2f} GB, best of {reps}")
        print(f"device copy paths: publish {paths[0]}, load {paths[1]}")
        for k, v in breakdown.items():
            print(f"  {k} breakdown (best run): " + ", ".join(
                f"{name} {secs * 1e3:.1f} ms" for name, secs in v.items()))
        for name, secs in list(base.items()) + list(results.items()):
            print(f"  {name:45s} {gbps(nbytes, secs):8.2f} GB/s  ({secs * 1e3:8.1f} ms)")
        pub = gbps(nbytes, results["publish (seal=False, verify=False)"])
        load = gbps(nbytes, results["load(device=) verify=False"])
        d2h_bw = gbps(nbytes, base["torch pinned D2H"])
        h2d_bw = gbps(nbytes, base["torch pinned H2D"])
        print(f"publish / torch pinned D2H = {pub / d2h_bw:.2f}x (target >= 0.8x): "
              f"{'MET' if pub >= 0.8 * d2h_bw else 'NOT MET'}")
        print(f"load    / torch pinned H2D = {load / h2d_bw:.2f}x (target >= 0.8x): "
              f"{'MET' if load >= 0.8 * h2d_bw else 'NOT MET'}")
        for k, v in breakdown.items():
            copy = v.get("copy wait", 0.0)
            if copy:
                print(f"  {k}: the copy itself (registered, queued to done) "
                      f"{gbps(nbytes, copy):.2f} GB/s")

    measure("/dev/shm (4 KiB pages)", None)
    if huge_dir:
        measure(f"{huge_dir} (tmpfs huge=always)", os.path.join(huge_dir, "cluster"))

    # What registration alone costs (cudaHostRegister + Unregister of a
    # mapping of the same size, its pages already there): the part of
    # publish/load that torch's pinned copies do not pay, their buffers being
    # pinned once, up front.
    places = [("anonymous shared memory", None)]
    if huge_dir:
        places.append((f"a file on {huge_dir}", os.path.join(huge_dir, "register-probe")))
    for label, path in places:
        if path is None:
            mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS |
                           getattr(mmap, "MAP_POPULATE", 0))
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.posix_fallocate(fd, 0, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            os.close(fd)
        t_reg = min(timed(lambda: _cuda.Pinned(mm, nbytes, writable=True).close())[0]
                    for _ in range(reps))
        print(f"  cudaHostRegister+Unregister of {label}: {gbps(nbytes, t_reg):.2f} GB/s "
              f"({t_reg * 1e3:.1f} ms)")
        mm.close()
        if path is not None:
            os.unlink(path)
    return problems, src, ptc, base


def device_resident(src, ptc, reps, base):
    """Device-resident state (issue 23 item 3): agents with --device=cuda.
    publish(via="ipc") (the agent copies device to device from the worker's
    CUDA IPC handles, then seals: every byte hashed on the host) and
    load(device=, via="ipc") (one D2D copy from the agent's device buffer)
    against torch's D2D; then a two-agent reconfiguration on this one GPU
    (dp 1 -> 2 across host-0 and host-1: two agent processes), loaded back
    on both hosts byte for byte. Prints the route each host's task took, as
    the operation reports it: device-ipc (two agents on one machine),
    device-comm, or host-staged and why."""
    import torch
    from cluster import LocalCluster
    from helpers import register
    from reshard import layout
    from reshard.v1 import coordinator_pb2 as OP
    from reshard.v1 import ptc_pb2
    dev = torch.device("cuda", 0)
    nbytes = sum(s.numel() * s.element_size() for s in src)
    state = {f"t{i}": s for i, s in enumerate(src)}
    want = [s.view(torch.int32) for s in src]
    problems, results = [], {}

    def check(label, got):
        for i in range(len(src)):
            if not torch.equal(got[f"t{i}"].view(torch.int32), want[i]):
                problems.append(f"{label}: tensor t{i} bytes differ")

    one = layout.make_layout(1, 1, 1, ["host-0"], 1)
    two = layout.make_layout(1, 1, 2, ["host-0", "host-1"], 1)
    # The device-to-device routes between agents are opt-in (docs/agent.md):
    # the agents inherit these.
    os.environ["RESHARD_DEVICE_IPC"] = "auto"
    os.environ["RESHARD_DEVICE_COMM"] = "auto"
    with LocalCluster(build_dir=os.environ["RESHARD_BUILD_DIR"], hosts=2, devices_per_host=1,
                      tls=False, agent_device="cuda",
                      memory_limit_bytes=4 * nbytes + (1 << 30)) as c, \
            c.client(timeout=180.0) as client:
        for rep in range(reps + 1):  # rep 0 warms up
            job = register(client, c, f"gpu-ipc-{rep}", ptc, one)
            with c.worker("host-0", job.id, ptc=ptc, timeout=180.0) as w:
                t_pub, _ = timed(lambda: w.publish(0, 1, state, via="ipc"))
                t_load, got = timed(lambda: w.load(0, 1, device=dev, via="ipc", verify=False))
                check(f"ipc rep {rep}", got)
                del got
            if rep == 0:
                continue
            for k, v in (("publish via=ipc (agent D2D + seal)", t_pub),
                         ("load via=ipc (D2D from the agent)", t_load)):
                results[k] = min(results.get(k, v), v)
        # A job of device-resident state: the routes between agents carry
        # only those (JobSpec.state_memory).
        job = register(client, c, "gpu-two-agents", ptc, one,
                       state_memory=ptc_pb2.STATE_MEMORY_DEVICE)
        with c.worker("host-0", job.id, ptc=ptc, timeout=180.0) as w:
            w.publish(0, 1, state, via="ipc")
        t0 = time.perf_counter()
        final = client.wait(client.resize(job.id, two).id, timeout=240)
        t_resize = time.perf_counter() - t0
        ok = final.state == OP.OPERATION_STATE_COMMITTED
        if not ok:
            problems.append(f"two-agent resize: {final.state} {final.error}")
        else:
            for host, rank in (("host-0", 0), ("host-1", 1)):
                with c.worker(host, job.id, ptc=ptc, timeout=180.0) as w:
                    check(f"two-agent resize, {host} rank {rank}",
                          w.load(rank, 2, device=dev, via="ipc", verify=False))
        # Each host's route, as the operation reports it (docs/coordinator.md).
        routes = [f"  {h.host_id}: {h.route or '-'}"
                  + (f" ({h.route_reason})" if h.route_reason else "")
                  for h in client.get_operation(final.id).hosts]
    section(f"4. device-resident state: {len(src)} float32 CUDA tensors, {nbytes / 1e9:.2f} GB, "
            f"best of {reps}")
    d2d = gbps(nbytes, base["torch D2D"])
    for name, secs in results.items():
        print(f"  {name:45s} {gbps(nbytes, secs):8.2f} GB/s  ({secs * 1e3:8.1f} ms)  "
              f"{gbps(nbytes, secs) / d2d:.2f}x torch D2D")
    print(f"  two-agent resize on one GPU (dp 1 -> 2, {nbytes / 1e9:.2f} GB to host-1): "
          f"{t_resize:.2f} s end to end, {'COMMITTED' if ok else 'FAILED'}")
    print("  each host's route (GetOperation):")
    print("\n".join(routes) or "  (none reported)")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=2048, help="bytes moved per transfer, MiB")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--huge-dir", default="",
                    help="also measure with the cluster's work dir (agent buffers) here: a "
                         "tmpfs mounted with huge=always (scripts/gpu_check.sh run mounts one)")
    args = ap.parse_args()
    import torch
    section("environment")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
          f" device {torch.cuda.get_device_name(0)}, NCCL {torch.cuda.nccl.version()}")
    print(f"RESHARD_CUDA_LIBRARY_PATH={os.environ.get('RESHARD_CUDA_LIBRARY_PATH')}")
    print(NOT_IN_SLICE)
    t0 = time.monotonic()
    section("1. CUDA runtime and NCCL loaded at run time (C++)")
    ok_bin = run_binaries(os.environ["RESHARD_BUILD_DIR"])
    section("2. tests/python/test_cuda_worker.py (real PostgreSQL, coordinator, agent)")
    ok_py = run_pytest()
    section("3. bandwidth")
    problems, src, ptc, base = bench(args.mib, args.tensors, args.reps, args.huge_dir)
    section("3b. device-local steps (bench/transfer/device_bench.cc)")
    ok_dev = run_device_bench(os.environ["RESHARD_BUILD_DIR"], args.mib)
    problems += device_resident(src, ptc, args.reps, base)
    for p in problems:
        print("BYTES DIFFER:", p)
    section("summary")
    print(f"C++ CUDA/NCCL tests: {'PASS' if ok_bin else 'FAIL'}; CUDA worker tests: "
          f"{'PASS' if ok_py else 'FAIL'}; device_bench: {'PASS' if ok_dev else 'FAIL'}; "
          f"every run byte-exact: {'PASS' if not problems else 'FAIL'}; "
          f"{time.monotonic() - t0:.0f} s")
    print(NOT_IN_SLICE)
    return 0 if ok_bin and ok_py and ok_dev and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
