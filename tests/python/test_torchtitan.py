"""torchtitan (0.3.0, from the package index) trained with reshard holding its
state and its data loader position (issue 20, item 7): examples/torchtitan.

The example's whole run, for real: a local cluster (PostgreSQL, coordinator,
2 agents), torchtitan's llama3 debugmodel (2 layers, float64) built and
parallelized by torchtitan's own code (ParallelDims, Module.parallelize for
TP, apply_fsdp_to_decoder for FSDP2, spmd_types backend) on a gloo CPU mesh,
one process per rank: tp 2 x dp 1 on host-0 trains 6 steps and publishes its
state after step 3 (pytorch.describe / publish); the job is resized to dp 2 x
tp 1 on host-1; 2 new ranks, built with other weights, load it into their
DTensors (pytorch.load) and train steps 4..6 from the data position they
loaded.

Asserted: each resumed step's loss is bitwise the uninterrupted run's
(torchtitan's CrossEntropyLoss takes float32 of the float64 logits; measured
equal, so asserted equal); the 84 model and AdamW tensors the new layout
loaded are bitwise the published ones (SHA-256 of each full tensor); every
step reads the same global batch at dp 1 and dp 2 and the first epoch reads
each sample exactly once; the final model and optimizer state of both runs
agree to 1e-6 of each tensor's largest magnitude (measured 4.3e-8, 21 of the
84 tensors bitwise: the state is float64, but torchtitan's loss rounds the
logits to float32, so a logit that tp 2 and dp 2 compute a few float64 ulps
apart can round to neighbouring float32 values and its gradient differs by
a float32 ulp). And torchtitan's own data loader refuses the same dp change.
"""

import importlib.util
import os

import pytest

from conftest import build_dir

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

HERE = os.path.dirname(os.path.abspath(__file__))
# The example's driver, under a name no other suite's train.py takes.
_spec = importlib.util.spec_from_file_location(
    "torchtitan_example_train", os.path.join(HERE, "..", "..", "examples", "torchtitan", "train.py"))
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train.drive(build_dir(), str(tmp_path_factory.mktemp("torchtitan")), timeout=300.0)


def test_resumed_losses_equal_the_uninterrupted_run(run):
    a, b = run["uninterrupted"]["losses"], run["resumed"]["losses"]
    assert sorted(a, key=int) == [str(s) for s in range(1, train.STEPS + 1)]
    assert sorted(b, key=int) == [str(s) for s in range(train.CUT + 1, train.STEPS + 1)]
    for step in b:
        assert b[step] == a[step], f"step {step}"
    # Training moved the loss (the equality is not of constants).
    assert len({a[s] for s in a}) == train.STEPS


def test_loaded_state_is_bitwise_the_published_state(run):
    published = run["uninterrupted"]["published_digests"]
    loaded = run["resumed"]["loaded_digests"]
    assert len(published) == 84  # 21 model tensors, 3 AdamW states each
    assert loaded == published


def test_data_position_survives_the_dp_change(run):
    a, b = run["uninterrupted"]["samples"], run["resumed"]["samples"]
    for step in b:
        assert b[step] == a[step], f"step {step}"
        assert len(b[step]) == train.GLOBAL_BATCH
    epoch_steps = train.NUM_SAMPLES // train.GLOBAL_BATCH
    resumed = [i for s in range(1, epoch_steps + 1)
               for i in (a if s <= train.CUT else b)[str(s)]]
    assert sorted(resumed) == list(range(train.NUM_SAMPLES))


def test_final_state_matches_the_uninterrupted_run(run):
    a = torch.load(run["final_state"]["uninterrupted"])
    b = torch.load(run["final_state"]["resumed"])
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        scale = max(a[name].abs().max().item(), 1e-300)
        assert (a[name] - b[name]).abs().max().item() <= 1e-6 * scale, name


def test_torchtitans_data_loader_refuses_a_dp_change():
    """What the example replaces: torchtitan's ParallelAwareDataloader
    checkpointed at dp 1 does not load at dp 2."""
    from torchtitan.components.dataloader import ParallelAwareDataloader

    class Samples(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    before = ParallelAwareDataloader(Samples(), dp_rank=0, dp_world_size=1, batch_size=2)
    it = iter(before)
    next(it)
    saved = before.state_dict()
    after = ParallelAwareDataloader(Samples(), dp_rank=0, dp_world_size=2, batch_size=2)
    with pytest.raises(AssertionError, match="dataloader resharding is not supported"):
        after.load_state_dict(saved)
