"""The training-like job of the main job (see main_job.py).

TrainingJob owns the global tensors of a small GPT-style model with fp32 Adam
state, registers the job with the coordinator, publishes each rank's shards
through its host's agent, and then runs the reconfiguration sequence,
verifying every rank's new shards byte for byte after each step.
"""

import sys
import time

import numpy as np

try:  # the workers' framework: torch from Debian where installed, numpy otherwise
    import torch
except ImportError:
    torch = None

import reshard
from reshard import layout as rlayout
from reshard import megatron


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


def config_text(lay):
    c = lay.config
    hosts = ",".join(h.replace("host-", "") for h in lay.placement.hosts)
    return f"tp{c.tp} pp{c.pp} dp{c.dp} on hosts {hosts}"


class VerificationError(RuntimeError):
    pass


class TrainingJob:
    def __init__(self, cluster, layers=8, hidden=256, log=print):
        self.cluster = cluster
        self.log = log
        self.client = cluster.client(timeout=60.0)  # mutual TLS as admin:local
        self.layers = layers
        self.hidden = hidden
        self.rows = []  # summary table
        self.tty = sys.stdout.isatty()

    # ------------------------------------------------------------ the model
    def build_state(self):
        self.log(f"\n== model: GPT-style, {self.layers} layers, hidden {self.hidden}, fp16 weights, "
                 "fp32 master weights and Adam moments")
        state = megatron.synthetic_gpt(layers=self.layers, hidden=self.hidden, heads=8, vocab=4096,
                                       seq=256, with_optimizer=True, seed=1234)
        # "Train" a few steps so the state is not what a generator would give:
        # Adam updates of the fp32 master weights from pseudo-gradients.
        rng = np.random.default_rng(7)
        names = [n for n in state if n.startswith("optimizer.master.")]
        for n in names:  # random bytes are not a valid second moment
            v = state["optimizer.exp_avg_sq." + n[len("optimizer.master."):]]
            np.abs(v, out=v)
            np.nan_to_num(v, copy=False, nan=0.0, posinf=1.0)
        for step in range(1, 4):
            for n in names:
                param = n[len("optimizer.master."):]
                w = state[n]
                g = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(1e-2)
                m = state["optimizer.exp_avg." + param]
                v = state["optimizer.exp_avg_sq." + param]
                m *= np.float32(0.9)
                m += np.float32(0.1) * g
                v *= np.float32(0.999)
                v += np.float32(0.001) * g * g
                w -= np.float32(1e-3) * m / (np.sqrt(v) + np.float32(1e-8))
                if param in state:
                    state[param][...] = w.astype(state[param].dtype)
        total = sum(np.asarray(a).nbytes for a in state.values())
        self.log(f"   {len(state)} tensors, {human_bytes(total)} of state, 3 training steps done; "
                 f"workers use {'torch ' + torch.__version__ if torch is not None else 'numpy'}")
        return state

    # ------------------------------------------------------------- helpers
    def layout(self, tp, pp, dp, hosts):
        return rlayout.make_layout(tp=tp, pp=pp, dp=dp, hosts=hosts,
                                   devices_per_host=self.cluster.devices_per_host)

    def worker(self, host):
        return reshard.Worker(self.cluster.agents[host].worker_socket, self.job_id, ptc=self.ptc,
                              worker_token=self.worker_token)

    def host_of(self, lay, rank):
        return lay.placement.hosts[rank // lay.placement.devices_per_host]

    def world(self, lay):
        return lay.config.tp * lay.config.pp * lay.config.dp

    def publish(self, lay):
        for rank in range(self.world(lay)):
            shards = rlayout.shard(self.ptc, lay, rank, self.state)
            if torch is not None:  # as a torch training process holds them
                shards = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                          for k, v in shards.items()}
            self.worker(self.host_of(lay, rank)).publish(rank, 1, shards)

    def load(self, lay, rank, generation):
        got = self.worker(self.host_of(lay, rank)).load(rank, generation, as_torch=torch is not None)
        return {k: v.numpy() if torch is not None and isinstance(v, torch.Tensor) else v
                for k, v in got.items()}

    def verify(self, lay, generation):
        """Loads every rank's shards of `generation` through its host's agent
        and compares them byte for byte with the shards cut from the global
        tensors. Returns the number of bytes compared."""
        compared = 0
        for rank in range(self.world(lay)):
            expected = rlayout.shard(self.ptc, lay, rank, self.state)
            got = self.load(lay, rank, generation)
            if set(got) != set(expected):
                raise VerificationError(f"rank {rank}: items {sorted(set(got) ^ set(expected))} differ")
            for name, want in expected.items():
                have = got[name]
                a = (np.frombuffer(want, np.uint8) if isinstance(want, (bytes, bytearray))
                     else np.ascontiguousarray(want).view(np.uint8).reshape(-1))
                b = (np.frombuffer(have, np.uint8) if isinstance(have, (bytes, bytearray))
                     else np.ascontiguousarray(have).view(np.uint8).reshape(-1))
                if a.shape != b.shape or not np.array_equal(a, b):
                    bad = "sizes differ" if a.shape != b.shape else f"first bad byte {int(np.argmax(a != b))}"
                    raise VerificationError(f"generation {generation} rank {rank} {name}: {bad}")
                compared += a.size
        return compared

    def watch(self, op):
        start = time.monotonic()
        last = [0.0]

        def show(o):
            now = time.monotonic()
            if not self.tty and now - last[0] < 1.0:
                return
            last[0] = now
            total = max(o.bytes_total, 1)
            rate = o.bytes_done / max(now - start, 1e-3)
            line = (f"   {reshard.OperationState.Name(o.state):<28} {human_bytes(o.bytes_done):>10} / "
                    f"{human_bytes(o.bytes_total):<10} {100.0 * o.bytes_done / total:5.1f}%  "
                    f"{human_bytes(rate)}/s")
            print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", flush=True)

        final = self.client.watch_operation(op.id, callback=show)
        if self.tty:
            print()
        return final, time.monotonic() - start

    def step(self, title, start_op, lay, before=None):
        self.log(f"\n== {title}: {config_text(self.current)} -> {config_text(lay)}")
        t0 = time.monotonic()
        if before:
            before()
        op = start_op()
        self.log(f"   operation {op.id} ({reshard.OperationKind.Name(op.kind)})")
        final, secs = self.watch(op)
        if final.state != reshard.OperationState.Value("OPERATION_STATE_COMMITTED"):
            raise VerificationError(f"{title}: operation {op.id} ended "
                                    f"{reshard.OperationState.Name(final.state)}: {final.error}")
        job = self.client.get_job(self.job_id)
        compared = self.verify(lay, job.generation)
        self.log(f"   committed generation {job.generation} in {secs:.2f} s; "
                 f"verified {human_bytes(compared)} on {self.world(lay)} ranks byte for byte")
        s = final.stats
        self.rows.append((title, config_text(lay), s.bytes_local, s.bytes_cross_host,
                          s.lower_bound_cross_host, time.monotonic() - t0, "ok"))
        self.current = lay
        self.generation = job.generation

    # ------------------------------------------------------------ the run
    def run(self):
        try:
            self._run()
            ok = True
        except (VerificationError, reshard.ReshardError) as e:
            self.log(f"\nmain job: FAILED: {e}")
            ok = False
        self.print_summary()
        return ok

    def _run(self):
        h = self.cluster.host_ids  # host-0 .. host-4
        self.state = self.build_state()
        self.current = self.layout(2, 2, 1, h[0:2])
        spec = megatron.build_spec(self.state, name="gpt-local", layout=self.current)
        self.ptc = spec.ptc
        # The worker token goes to the job's workers (self.worker).
        job, self.worker_token = self.client.register_job(spec, with_token=True)
        self.job_id = job.id
        self.log(f"\n== registered job {job.id}: {len(self.ptc.tensors)} tensors and "
                 f"{len(self.ptc.blobs)} blobs, {config_text(self.current)}")
        t0 = time.monotonic()
        self.publish(self.current)
        compared = self.verify(self.current, 1)
        self.log(f"   {self.world(self.current)} ranks published their shards through the agents' "
                 f"worker sockets; read back {human_bytes(compared)} byte for byte")
        self.rows.append(("register + publish", config_text(self.current), 0, 0, 0,
                          time.monotonic() - t0, "ok"))

        grow = self.layout(2, 2, 2, h[0:4])
        self.step("grow data parallelism", lambda: self.client.resize(self.job_id, grow), grow)

        tp_pp = self.layout(4, 1, 2, h[0:4])
        self.step("change tensor and pipeline parallelism",
                  lambda: self.client.resize(self.job_id, tp_pp), tp_pp)

        moved = self.layout(4, 1, 2, [h[0], h[1], h[2], h[4]])
        self.step("migrate off host-3 onto host-4", lambda: self.client.migrate(self.job_id, moved),
                  moved)

        # host-1 holds half of data-parallel replica 0; replica 1 lives on
        # host-2 and host-4. Recover onto the spare host-3.
        recovered = self.layout(4, 1, 2, [h[0], h[3], h[2], h[4]])

        def lose():
            self.cluster.lose_host(h[1])
            self.log(f"   {h[1]} lost (agent SIGKILLed, its shared memory removed)")
            self.wait_lost(h[1])

        self.step("lose host-1, recover onto host-3",
                  lambda: self.client.recover(self.job_id, lost_hosts=[h[1]], layout=recovered),
                  recovered, before=lose)

    def wait_lost(self, host, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for hst in self.client.list_hosts():
                if hst.host_id == host and reshard.HostState.Name(hst.state).endswith("LOST"):
                    self.log(f"   coordinator marked {host} LOST (lease expired)")
                    return
            time.sleep(0.2)
        raise VerificationError(f"{host} was not marked LOST within {timeout} s")

    def print_summary(self):
        if not self.rows:
            return
        head = ("step", "config", "local", "cross-host", "lower bound", "time", "verified")
        table = [head] + [(r[0], r[1], human_bytes(r[2]), human_bytes(r[3]), human_bytes(r[4]),
                           f"{r[5]:.2f} s", r[6]) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        print("\n== summary")
        for k, row in enumerate(table):
            print("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(row, widths))))
            if k == 0:
                print("  " + "  ".join("-" * w for w in widths))
