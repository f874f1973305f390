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


SUBPACKAGES = ("core", "frameworks", "launcher")


def _sources():
    """Every .py of the package, relative to its root: the top level and the
    subpackages by audience."""
    out = []
    for sub in ("",) + SUBPACKAGES:
        folder = os.path.join(SOURCES, "reshard", sub)
        out += [os.path.join(sub, n) for n in sorted(os.listdir(folder)) if n.endswith(".py")]
    return out


def test_staged_sources_match_the_tree():
    names = _sources()
    for must in ("__init__.py", "client.py", "core/__init__.py", "core/client.py",
                 "frameworks/pytorch.py", "launcher/launch.py"):
        assert must in names, must
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
    for f in ["reshard/" + n for n in _sources()] + ["reshard/v1/coordinator_pb2.py",
                                                      "reshard/v1/worker_pb2_grpc.py"]:
        assert f in names, f
    meta = next(n for n in names if n.endswith("METADATA"))
    with zipfile.ZipFile(wheels[0]) as z:
        text = z.read(meta).decode()
    assert "Name: reshard" in text and "Requires-Dist: grpcio" in text
    # importable from the wheel alone
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "unpacked"))
    r = subprocess.run([sys.executable, "-c", "import reshard, reshard.v1.coordinator_pb2; "
                        "import reshard.client, reshard.core.client; "
                        "assert reshard.client is reshard.core.client; "
                        "print(reshard.__file__)"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout
    assert r.stdout.strip().startswith(str(tmp_path / "unpacked"))


# Modules written after the grouping: they never had a top-level path, so
# they have no alias there.
ADDED_AFTER_THE_GROUPING = {"launcher": {"_rank_host", "register", "slurm", "slurm_adapter"}}


def test_old_module_paths_are_the_moved_modules():
    """Each module moved into core/, frameworks/ or launcher/ still imports
    under its old path as the very same module object (patches and
    isinstance checks see one module), and every top-level module other
    than the package's own is such an alias; a module added since lives
    in its subpackage only."""
    import importlib
    moved = {}
    for sub in SUBPACKAGES:
        for n in os.listdir(os.path.join(SOURCES, "reshard", sub)):
            name = n[:-3]
            if (n.endswith(".py") and n != "__init__.py"
                    and name not in ADDED_AFTER_THE_GROUPING.get(sub, ())):
                moved[name] = f"reshard.{sub}.{name}"
    top = {n[:-3] for n in os.listdir(os.path.join(SOURCES, "reshard"))
           if n.endswith(".py") and n not in ("__init__.py", "__main__.py")}
    assert top == set(moved), sorted(top ^ set(moved))
    for old, new in sorted(moved.items()):
        assert importlib.import_module(f"reshard.{old}") is importlib.import_module(new), old


def test_import_reshard_gives_the_same_attributes_as_before_the_grouping():
    """`import reshard` alone makes these modules attributes of the package
    (callers write reshard.client.X or reshard._dtypes.Y without importing
    them), as it did when every module sat at the top level."""
    before = ["_dtypes", "_proto", "_rank_region", "_rpc", "buckets", "client", "data", "errors",
              "fsdp", "layout", "megatron", "megatron_core", "worker"]
    r = subprocess.run([sys.executable, "-c",
                        "import types, reshard; print(' '.join(sorted(k for k, v in "
                        "vars(reshard).items() if isinstance(v, types.ModuleType) and "
                        "k not in ('os', 'v1', 'core', 'frameworks', 'launcher') and "
                        "not k.endswith('_pb2'))))"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    assert r.stdout.split() == before
