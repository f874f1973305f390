"""The staged <build>/python is the package: up to date with client/python,
and a complete project that builds a self-contained wheel (built offline with
the system's setuptools; nothing is installed)."""

import filecmp
import os
import shutil
import subprocess
import sys
import zipfile

import reshard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = os.path.join(REPO, "client", "python")
STAGED = os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__)))


def test_staged_sources_match_the_tree():
    names = sorted(n for n in os.listdir(os.path.join(SOURCES, "reshard")) if n.endswith(".py"))
    assert "__init__.py" in names and "client.py" in names
    for n in names:
        assert filecmp.cmp(os.path.join(SOURCES, "reshard", n),
                           os.path.join(STAGED, "reshard", n), shallow=False), n
    assert filecmp.cmp(os.path.join(SOURCES, "pyproject.toml"),
                       os.path.join(STAGED, "pyproject.toml"), shallow=False)
    for stub in ("ptc_pb2.py", "coordinator_pb2_grpc.py", "worker_pb2_grpc.py"):
        assert os.path.exists(os.path.join(STAGED, "reshard", "v1", stub))


def test_wheel_is_self_contained(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(STAGED, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                "*.egg-info"))
    out = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "--no-cache-dir", "-w", str(out), str(src)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    wheels = list(out.glob("reshard-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "unpacked")
    for f in ("reshard/__init__.py", "reshard/client.py", "reshard/worker.py",
              "reshard/layout.py", "reshard/megatron.py", "reshard/v1/coordinator_pb2.py",
              "reshard/v1/worker_pb2_grpc.py"):
        assert f in names, f
    meta = next(n for n in names if n.endswith("METADATA"))
    with zipfile.ZipFile(wheels[0]) as z:
        text = z.read(meta).decode()
    assert "Name: reshard" in text and "Requires-Dist: grpcio" in text
    # importable from the wheel alone
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "unpacked"))
    r = subprocess.run([sys.executable, "-c", "import reshard, reshard.v1.coordinator_pb2; "
                        "print(reshard.__file__)"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout
    assert r.stdout.strip().startswith(str(tmp_path / "unpacked"))
