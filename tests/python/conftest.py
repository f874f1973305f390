"""Fixtures of the Python SDK suites: a real local cluster (PostgreSQL,
reshard-coordinator, reshard-agents) from deploy/local/cluster.py, one per
test module, and a Client on it.

The build directory is $RESHARD_BUILD_DIR, else the one whose python/ holds
the imported reshard package (PYTHONPATH=<build>/python).
"""

import itertools
import os
import sys

import pytest

import reshard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "deploy", "local"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build_dir():
    explicit = os.environ.get("RESHARD_BUILD_DIR")
    if explicit:
        return explicit
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(reshard.__file__))))


@pytest.fixture(scope="module")
def cluster():
    from cluster import LocalCluster
    with LocalCluster(build_dir=build_dir(), hosts=4, devices_per_host=2) as c:  # mutual TLS
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with cluster.client(timeout=30.0) as c:
        yield c


_names = itertools.count()


@pytest.fixture
def job_name(request):
    """A job name unique within the cluster."""
    return f"{request.node.name[:40]}-{os.getpid()}-{next(_names)}"
