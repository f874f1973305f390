"""Elastic training on a local reshard cluster, as a scheduler drives it:
used by the main job (deploy/local/main_job.py) and the training test
(tests/python/test_training.py).

One process per rank (elastic_rank.py) trains the tiny GPT of tiny_gpt.py.
Each phase ends at a step boundary with a checkpoint that carries the
dataset state of that step (every rank publishes into the new generation;
model and cursor commit together), then the scheduler reconfigures (resize,
or a lost host and a recover with the coordinator's survivor policy) and the
next phase's ranks load their shards and resume the committed cursor.
Reconfiguration stops the world: the pause of each is measured from the last
step on the old layout to the first step on the new one.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tiny_gpt  # noqa: E402

SEED, N, BATCH, STEPS = 11, 21, 7, 3


def dataset_state():
    from reshard import data
    return data.DatasetState(data.DatasetDescriptor("tiny-tokens", N, "gen:1000003"),
                             data.Order(seed=5, shuffle="full"), global_batch=BATCH)


def reference(steps):
    """The uninterrupted run: one process, tp 1, dp 1. (losses, final state)."""
    model = tiny_gpt.Model(tiny_gpt.init_global(SEED), 1, 0, None)
    state, losses = dataset_state(), []
    for _ in range(steps):
        loss, _ = tiny_gpt.train_step(model, state, 1, 0, None, SEED)
        losses.append(loss)
        state = state.advanced()
    return losses, model.shard()


def job_ptc():
    from reshard import megatron
    return megatron.build_ptc(tiny_gpt.init_global(SEED),
                              overrides=tiny_gpt.replicated_overrides(), per_rank_blobs=())


def scenario(hosts):
    """(how, layout) per phase: dp 2 -> 4 -> (host lost) 3, tp 2 -> 1 -> 2."""
    from reshard import layout
    return [("register", layout.make_layout(2, 1, 2, hosts[:2], 2)),
            ("resize", layout.make_layout(1, 1, 4, hosts[:4], 1)),
            ("lose " + hosts[3], None),
            ("resize", layout.make_layout(2, 1, 1, hosts[2:3], 2))]


class Phase:
    """The ranks of one phase, as subprocesses."""

    def __init__(self, cluster, job, ptc, lay, load_generation, state, work_dir, name):
        import reshard
        self.procs = []
        # The ranks import the same reshard package as this process.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join(
                       p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
        for rank in range(lay.config.tp * lay.config.pp * lay.config.dp):
            cfg = {"rank": rank, "layout": reshard.to_dict(lay), "ptc": reshard.to_dict(ptc),
                   "store": os.path.join(work_dir, f"{name}.store"), "job_id": job.id,
                   "seed": SEED, "steps": STEPS, "worker_token": cluster.worker_token(job.id),
                   "sockets": {h: cluster.agents[h].worker_socket for h in cluster.host_ids},
                   "load_generation": load_generation, "dataset_state": state.to_dict()}
            path = os.path.join(work_dir, f"{name}-rank{rank}.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "elastic_rank.py"), path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))

    def train(self, on_first_step):
        """Reads every rank's output up to READY: (losses, sample ids)."""
        losses, ids = [], []
        for p in self.procs:
            for line in p.stdout:
                if line.strip() == "READY":
                    break
                out = json.loads(line)
                if "loss" in out:
                    if not losses:
                        on_first_step()
                    losses.append(out["loss"])
                ids.extend(out.get("ids", []))
            else:
                raise RuntimeError(f"a rank exited before READY (exit status {p.wait()})")
        return losses, ids

    def publish(self, generation):
        for p in self.procs:
            p.stdin.write(f"PUBLISH {generation}\n")
            p.stdin.flush()
        for p in self.procs:
            if p.stdout.readline().strip() != "PUBLISHED" or p.wait(timeout=120) != 0:
                raise RuntimeError("a rank failed to publish")

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run(cluster, client, name, work_dir, hosts=None, log=lambda *a: None):
    """Registers a job and trains it through scenario(hosts) (default: the
    cluster's first four hosts, all alive); returns a dict with
    losses, reference losses and final state, sample ids, the job, its PTC,
    the last layout and generation, and per reconfiguration its pause."""
    import reshard
    from reshard import data, layout
    ptc = job_ptc()
    phases = scenario(hosts or cluster.host_ids)
    job = client.register_job({"name": name, "tenant": "training", "ptc": reshard.to_dict(ptc),
                               "layout": reshard.to_dict(phases[0][1])},
                              dataset_state=dataset_state())
    want_losses, want_final = reference(STEPS * len(phases))
    out = {"job": job, "ptc": ptc, "losses": [], "ids": [], "pauses": [],
           "want_losses": want_losses, "want_final": want_final, "committed": []}
    generation, state, last_step_at = 0, dataset_state(), None
    for i, (how, lay) in enumerate(phases):
        t0 = time.monotonic()
        if how == "resize":
            op = client.wait(client.resize(job.id, lay).id, timeout=120, raise_on_failure=True)
        elif how.startswith("lose "):
            lost = how.split()[1]
            cluster.lose_host(lost)  # agent SIGKILLed, its shared memory gone
            op = client.wait(client.recover(job.id, [lost]).id, timeout=120,
                             raise_on_failure=True)
            lay = op.target_layout  # the coordinator's survivor policy
        reconfigure_s = time.monotonic() - t0
        if i > 0:
            generation = op.to_generation
            state = data.resume(client.dataset_state(job.id), dataset_state())
        log(f"training: phase {i} ({how}): tp {lay.config.tp} dp {lay.config.dp} on "
            f"{', '.join(layout.hosts_of(lay))}, from step {state.step}")
        phase = Phase(cluster, job, ptc, lay, generation, state, work_dir, f"phase{i}")
        try:
            first = {}
            losses, ids = phase.train(lambda: first.setdefault("t", time.monotonic()))
            if last_step_at is not None:
                out["pauses"].append({"how": how, "pause_s": first["t"] - last_step_at,
                                      "checkpoint_s": out["committed"][-1]["checkpoint_s"],
                                      "reconfigure_s": reconfigure_s})
            t1 = time.monotonic()
            op = client.checkpoint(job.id, dataset_state=state.advanced(STEPS))
            phase.publish(op.to_generation)
            committed = client.wait(op.id, timeout=120, raise_on_failure=True)
            last_step_at = t1
        finally:
            phase.kill()
        out["losses"] += losses
        out["ids"] += ids
        out["committed"].append({"generation": committed.to_generation, "layout": lay,
                                 "checkpoint_s": time.monotonic() - t1})
        generation, state = committed.to_generation, state.advanced(STEPS)
    out["layout"], out["generation"] = lay, generation
    return out
