"""reshard.Worker with CUDA tensors against a real agent (issue 23, item 2):
publish makes one device-to-host copy per tensor into the agent's buffer,
registered as pinned memory; load(device=...) one host-to-device copy per
tensor out of it. Byte for byte, against the CPU path's bytes and checksums.
Needs a CUDA device: skipped without one (scripts/gpu_check.sh runs it on a
GPU machine)."""

import shutil

import numpy as np
import pytest
import xxhash

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (scripts/gpu_check.sh runs this on a GPU)")

from conftest import build_dir  # noqa: E402
from helpers import register, tensor  # noqa: E402
import reshard  # noqa: E402
from reshard import layout  # noqa: E402
from reshard.v1 import ptc_pb2, worker_pb2  # noqa: E402


def _ptc():
    t = [tensor("w.f32", "DTYPE_FLOAT32", [1024, 257]),
         tensor("w.bf16", "DTYPE_BFLOAT16", [333, 64]),
         tensor("w.i64", "DTYPE_INT64", [4097]),
         tensor("w.t", "DTYPE_FLOAT16", [96, 40])]  # published as a transposed (strided) view
    blobs = [{"name": "step", "sizeBytes": 8, "scope": "BLOB_REPLICATED"}]
    return reshard.as_message({"numLayers": 1, "tensors": t, "blobs": blobs}, ptc_pb2.Ptc)


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=1, devices_per_host=1,
                      tls=shutil.which("openssl") is not None) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with cluster.client(timeout=30.0) as c:
        yield c


def _state(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    return {
        "w.f32": torch.randn(1024, 257, device=dev, generator=g),
        "w.bf16": torch.randn(333, 64, device=dev, generator=g).to(torch.bfloat16),
        "w.i64": torch.randint(-2**62, 2**62, (4097,), device=dev, generator=g),
        "w.t": torch.randn(40, 96, device=dev, generator=g).half().t(),
        "step": (7).to_bytes(8, "little"),
    }


def _host_bytes(value):
    if isinstance(value, bytes):
        return value
    t = value.detach().cpu().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_cuda_publish_then_cuda_load_is_byte_exact(cluster, client, job_name):
    ptc = _ptc()
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    job = register(client, cluster, job_name, ptc, lay)
    state = _state(3)
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        sums = w.publish(0, 1, state)
        assert w.last_device_copy == "pinned"
        for name, value in state.items():  # the agent's checksums are of the CPU bytes
            assert sums[name] == xxhash.xxh3_64_intdigest(_host_bytes(value)), name
        got = w.load(0, 1, device="cuda")
        assert w.last_device_copy == "pinned", w.last_device_copy
        assert set(got) == set(state)
        assert got["step"] == state["step"]
        for name in ("w.f32", "w.bf16", "w.i64", "w.t"):
            t = got[name]
            assert t.device.type == "cuda" and t.dtype == state[name].dtype, name
            assert list(t.shape) == list(state[name].shape), name
            assert _host_bytes(t) == _host_bytes(state[name]), name
        # The same bytes through the CPU path: what the agent holds.
        cpu = w.load(0, 1)
        for name in ("w.f32", "w.i64"):
            assert cpu[name].tobytes() == _host_bytes(state[name]), name


def test_mixed_cpu_and_cuda_sources(cluster, client, job_name):
    ptc = _ptc()
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    job = register(client, cluster, job_name, ptc, lay)
    state = _state(4)
    state["w.f32"] = state["w.f32"].cpu()  # one CPU tensor among CUDA ones
    state["w.i64"] = state["w.i64"].cpu().numpy()
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        sums = w.publish(0, 1, state)
        for name, value in state.items():
            raw = value.tobytes() if isinstance(value, np.ndarray) else _host_bytes(value)
            assert sums[name] == xxhash.xxh3_64_intdigest(raw), name
        got = w.load(0, 1, device=torch.device("cuda", 0))
        assert _host_bytes(got["w.f32"]) == _host_bytes(state["w.f32"])
        assert got["w.i64"].cpu().numpy().tobytes() == state["w.i64"].tobytes()


def test_a_corrupted_cuda_load_is_data_loss(cluster, client, job_name):
    """verify=True checks the host bytes before they go to the device."""
    ptc = _ptc()
    lay = layout.make_layout(1, 1, 1, cluster.host_ids[:1], 1)
    job = register(client, cluster, job_name, ptc, lay)
    with cluster.worker("host-0", job.id, ptc=ptc) as w:
        w.publish(0, 1, _state(5))
        resp = w._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
            job_id=job.id, generation=1, rank=0))
        assert resp.size > 0
        with open(resp.path, "r+b") as f:  # the test runs as the agent's user (or root)
            f.seek(resp.items[0].offset)
            b = f.read(1)
            f.seek(resp.items[0].offset)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(reshard.DataLoss, match=f'"{resp.items[0].name}"'):
            w.load(0, 1, device="cuda")
