"""What the vector generators of this folder share.

Each generator computes its vectors with a module of the Python SDK loaded
on its own (`load_sdk_module`: the reshard package's __init__ would pull in
grpc and the generated protos) and writes them with `write`: compact JSON and
one trailing newline, into this folder, or into the folder given by --out
(tests/python checks that a fresh run reproduces the checked-in file).
"""

import argparse
import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_sdk_module(relative_path, name):
    """client/python/reshard/<relative_path> as a module called `name`."""
    path = os.path.join(ROOT, "client", "python", "reshard", relative_path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def output_folder(description):
    """The folder to write into: --out, or this folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=HERE, help="folder to write into (default: tests/data)")
    return parser.parse_args().out


def write(folder, file_name, vectors):
    """Writes `vectors` as tests/data's files are written; returns the path."""
    path = os.path.join(folder, file_name)
    with open(path, "w") as f:
        json.dump(vectors, f, separators=(",", ":"))
        f.write("\n")
    return path
