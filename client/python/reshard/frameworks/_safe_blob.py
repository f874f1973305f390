"""Blobs read back without running code (docs/pytorch.md, "DCP checkpoints").

A blob is what a rank published (reshard.pytorch's length-prefixed pickle:
the optimizer's param groups, a Stateful's state dict, the RNG state). Any
process holding the job's worker token can publish one, so a tool that reads
blobs with a privilege of its own (`reshard dcp export`) must not let a pickle
call what it names: pickle's REDUCE calls whatever global the stream names,
`os.system` as readily as `collections.OrderedDict`.

load_blob() unpickles with an allowlist of what the state of a PyTorch job
legitimately holds, and nothing else:
- Python's containers and scalars (dict, list, tuple, set, str, bytes, int,
  float, complex, bool, None), collections.OrderedDict / defaultdict /
  Counter / deque, range, slice;
- torch tensors and Parameters (their storage read by torch.load with
  weights_only=True, not by the pickled torch.load(weights_only=False) call),
  torch dtypes, torch.Size, torch.device;
- numpy arrays, dtypes and scalars (numpy's RNG state).
Any other global (a class of the user's, a function) is refused with
reshard.errors.UnsafeBlob naming the blob and the global, before it is
called; so is a pickle that is not well formed.
"""

import importlib
import io
import pickle

from reshard.core.errors import UnsafeBlob
from reshard.frameworks.pytorch import _BLOB_HEADER

_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray",
                       "int", "float", "complex", "bool", "range", "slice"})
_COLLECTIONS = frozenset({"OrderedDict", "defaultdict", "Counter", "deque"})
_TORCH = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
          ("torch", "Size"), ("torch", "device")}
# numpy 2 pickles as numpy._core, numpy 1 as numpy.core.
_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype"),
          ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar")}
_WHAT = ("containers, numbers, strings, torch tensors, dtypes and devices, numpy arrays "
         "and scalars")


def _storage_from_bytes(data):
    """What torch.storage._load_from_bytes returns (a pickled tensor's
    storage), loaded with weights_only=True: a storage and nothing else."""
    import torch
    if not isinstance(data, (bytes, bytearray)):
        raise pickle.UnpicklingError(f"a tensor storage from {type(data).__name__}, not bytes")
    value = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(value, (torch.TypedStorage, torch.UntypedStorage)):
        raise pickle.UnpicklingError(f"a tensor storage that loads as {type(value).__name__}")
    return value


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, blob):
        super().__init__(file)
        self.blob = blob

    def find_class(self, module, name):
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module == "collections" and name in _COLLECTIONS:
            return super().find_class(module, name)
        if (module, name) in _TORCH or (module, name) in _NUMPY:
            return getattr(importlib.import_module(module), name)
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_from_bytes
        if module == "torch":
            import torch
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise UnsafeBlob(self.blob, f"it names {module}.{name}, which reshard does not call "
                                    f"(it loads only {_WHAT})", global_name=f"{module}.{name}")

    def persistent_load(self, pid):
        raise UnsafeBlob(self.blob, f"it holds a persistent id {pid!r} (a blob is a plain "
                                    f"pickle)")


def load_blob(name, raw):
    """The object blob `name`'s bytes hold (reshard.pytorch.decode_blob's
    result), unpickled without calling anything outside the allowlist above.
    UnsafeBlob (an InvalidArgument) names the blob and the global it refused,
    or says why the bytes are not a pickle it can load."""
    raw = bytes(raw)
    if len(raw) < _BLOB_HEADER.size:
        raise UnsafeBlob(name, f"{len(raw)} bytes, shorter than its {_BLOB_HEADER.size}-byte "
                               f"header")
    (n,) = _BLOB_HEADER.unpack_from(raw)
    if _BLOB_HEADER.size + n > len(raw):
        raise UnsafeBlob(name, f"its header says {n} bytes, the blob holds "
                               f"{len(raw) - _BLOB_HEADER.size}")
    try:
        return _Unpickler(io.BytesIO(raw[_BLOB_HEADER.size:_BLOB_HEADER.size + n]), name).load()
    except UnsafeBlob:
        raise
    except Exception as e:  # noqa: BLE001: whatever a malformed pickle raises
        raise UnsafeBlob(name, f"not a pickle of {_WHAT}: {type(e).__name__}: "
                               f"{' '.join(str(e).split())}") from None
