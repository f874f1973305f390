"""One gloo process per rank for the PyTorch 2 tests (test_pytorch_state,
test_dcp): spawn(fn, out_dir, *args, world=N) runs fn(rank, N, *args) in N
processes that meet through a file in out_dir (a FileStore rendezvous: no
port to pick and race for) and returns their results, by rank. The spawner is
deploy/local/gloo_ranks.py, which bench/dcp_race uses too."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                                "local"))

from gloo_ranks import RankFailed, spawn  # noqa: E402,F401
