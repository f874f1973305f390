"""Fixtures of the fault suite: a fresh local cluster per test (faults
change it for good), a Client, and a small GPT-style job published on it."""

import itertools
import os

import pytest

import faultlib
import reshard
from cluster import LocalCluster

_names = itertools.count()


@pytest.fixture
def cluster():
    with LocalCluster(build_dir=faultlib.BUILD, hosts=4, devices_per_host=2,
                      work_dir=os.environ.get("RESHARD_FAULT_WORK_DIR")) as c:
        yield c


@pytest.fixture
def client(cluster):
    # Generous retries: the coordinator is restarted under it.
    with cluster.client(timeout=30.0, max_attempts=50, max_backoff=1.0) as c:
        yield c


@pytest.fixture
def job(cluster, client, request):
    """tp 2, pp 2, dp 1 on host-0 and host-1 (generation 1 published and
    verified); hidden 256 so that transfers take long enough to be hit."""
    j = faultlib.Job(cluster, client, f"{request.node.name[:40]}-{os.getpid()}-{next(_names)}",
                     layers=4, hidden=256, vocab=2048, seq=128)
    j.register_and_publish(j.make_layout(2, 2, 1, cluster.host_ids[0:2]))
    return j
