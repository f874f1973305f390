"""The project's Python environment is the one requirements/python.txt pins.

CI runs every Python test in .venv (scripts/bootstrap.sh); this suite fails if
that environment regresses: torch older than 2, the PyTorch 2 APIs reshard is
built for missing (DTensor, FSDP2's fully_shard, torch.distributed.checkpoint),
a package at another version than the pin, or build/python's stubs generated
for another protobuf/grpcio than the runtime."""

import os
import re
import sys
from importlib import metadata

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = os.path.join(REPO, "requirements", "python.txt")


def pins():
    out = {}
    with open(REQUIREMENTS) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, version = line.split("==")
                out[name] = version
    return out


def test_runs_in_the_project_venv():
    assert sys.prefix != sys.base_prefix, f"{sys.executable} is not a virtual environment"
    assert os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(REPO, ".venv")), \
        sys.prefix


def test_every_pinned_package_has_its_version():
    want = pins()
    assert {"torch", "numpy", "grpcio", "grpcio-tools", "protobuf"} <= set(want)
    wrong = {name: (version, metadata.version(name)) for name, version in want.items()
             if metadata.version(name) != version}
    assert not wrong, f"installed versions differ from requirements/python.txt: {wrong}"


def test_torch_is_2_with_dtensor_fsdp2_and_dcp():
    import torch
    major = int(re.match(r"(\d+)\.", torch.__version__).group(1))
    assert major >= 2, torch.__version__
    assert torch.distributed.is_available()
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: F401
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: F401
    from torch.distributed.checkpoint.stateful import Stateful  # noqa: F401
    assert callable(dcp.save) and callable(dcp.load)


def test_numpy_is_2():
    import numpy
    assert int(numpy.__version__.split(".")[0]) >= 2, numpy.__version__


def test_stubs_match_the_runtime():
    """The generated code checks its protobuf and grpcio at import; its recorded
    versions are the venv's grpcio-tools'."""
    import grpc
    from google.protobuf import __version__ as protobuf_version
    from reshard.v1 import coordinator_pb2, coordinator_pb2_grpc
    with open(coordinator_pb2.__file__) as f:
        gen = re.search(r"^# Protobuf Python Version: (\S+)$", f.read(), re.MULTILINE)
    assert gen and gen.group(1) == protobuf_version, (gen and gen.group(1), protobuf_version)
    assert coordinator_pb2_grpc.GRPC_GENERATED_VERSION == grpc.__version__


def test_dtensor_runs_on_cpu_with_gloo(tmp_path):
    """A one-rank gloo group: DTensor shards and gathers on the CPU."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        full = torch.arange(12, dtype=torch.float64).reshape(3, 4)
        d = distribute_tensor(full, mesh, [Shard(0)])
        assert d.to_local().shape == (3, 4)
        assert torch.equal(d.full_tensor(), full)
    finally:
        dist.destroy_process_group()
