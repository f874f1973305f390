"""reshard.v1.DType <-> numpy / torch element types.

numpy has no bfloat16 or float8: those items are handled as raw unsigned
integers of the same width (bfloat16 -> uint16, float8 -> uint8), and a
numpy uint16 array is read as bfloat16 (no DType is uint16). torch gets
torch.bfloat16; float8 stays uint8 (torch 1.13 has no float8).
"""

import numpy as np

from reshard.core._proto import ptc_pb2

_D = ptc_pb2

# DType -> (numpy dtype of the raw buffer, element bytes, torch dtype name)
_TABLE = {
    _D.DTYPE_FLOAT32: (np.dtype(np.float32), 4, "float32"),
    _D.DTYPE_FLOAT16: (np.dtype(np.float16), 2, "float16"),
    _D.DTYPE_BFLOAT16: (np.dtype(np.uint16), 2, "bfloat16"),
    _D.DTYPE_FLOAT8_E4M3: (np.dtype(np.uint8), 1, "uint8"),
    _D.DTYPE_FLOAT8_E5M2: (np.dtype(np.uint8), 1, "uint8"),
    _D.DTYPE_FLOAT64: (np.dtype(np.float64), 8, "float64"),
    _D.DTYPE_INT64: (np.dtype(np.int64), 8, "int64"),
    _D.DTYPE_INT32: (np.dtype(np.int32), 4, "int32"),
    _D.DTYPE_INT16: (np.dtype(np.int16), 2, "int16"),
    _D.DTYPE_INT8: (np.dtype(np.int8), 1, "int8"),
    _D.DTYPE_UINT8: (np.dtype(np.uint8), 1, "uint8"),
    _D.DTYPE_BOOL: (np.dtype(np.bool_), 1, "bool"),
}

# Names users may write for a dtype (numpy names, torch names, short forms).
_ALIASES = {
    "float32": _D.DTYPE_FLOAT32, "fp32": _D.DTYPE_FLOAT32, "float": _D.DTYPE_FLOAT32,
    "float16": _D.DTYPE_FLOAT16, "fp16": _D.DTYPE_FLOAT16, "half": _D.DTYPE_FLOAT16,
    "bfloat16": _D.DTYPE_BFLOAT16, "bf16": _D.DTYPE_BFLOAT16,
    "float8_e4m3": _D.DTYPE_FLOAT8_E4M3, "float8_e4m3fn": _D.DTYPE_FLOAT8_E4M3,
    "float8_e5m2": _D.DTYPE_FLOAT8_E5M2,
    "float64": _D.DTYPE_FLOAT64, "fp64": _D.DTYPE_FLOAT64, "double": _D.DTYPE_FLOAT64,
    "int64": _D.DTYPE_INT64, "long": _D.DTYPE_INT64,
    "int32": _D.DTYPE_INT32, "int": _D.DTYPE_INT32,
    "int16": _D.DTYPE_INT16, "short": _D.DTYPE_INT16,
    "int8": _D.DTYPE_INT8, "uint8": _D.DTYPE_UINT8, "bool": _D.DTYPE_BOOL,
}


def _check(dtype):
    if dtype not in _TABLE:
        raise ValueError(f"dtype {dtype} is not a known reshard.v1.DType")
    return _TABLE[dtype]


def element_bytes(dtype):
    """Bytes per element of a DType (enum value)."""
    return _check(dtype)[1]


def numpy_dtype(dtype):
    """The numpy dtype that holds a DType's raw elements."""
    return _check(dtype)[0]


def torch_dtype(dtype):
    """The torch dtype for a DType (torch must be importable)."""
    import torch
    return getattr(torch, _check(dtype)[2])


def dtype_enum(value):
    """A DType enum value from an enum value, a DType name ("DTYPE_BFLOAT16"),
    a short name ("bf16", "float32"), a numpy dtype or a torch dtype."""
    if isinstance(value, int) and not isinstance(value, bool) and value in _TABLE:
        return value
    if isinstance(value, str):
        if value.startswith("torch."):
            value = value[len("torch."):]
        if value in ptc_pb2.DType.keys():
            return ptc_pb2.DType.Value(value)
        if value.lower() in _ALIASES:
            return _ALIASES[value.lower()]
        raise ValueError(f"unknown dtype name {value!r}")
    text = str(value)
    if text.startswith("torch."):
        return dtype_enum(text[len("torch."):])
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        raise ValueError(f"cannot map {value!r} to a reshard.v1.DType") from None
    if np_dtype == np.uint16:  # the package's numpy form of bfloat16 (no DType is uint16)
        return _D.DTYPE_BFLOAT16
    if np_dtype.name in _ALIASES:
        return _ALIASES[np_dtype.name]
    raise ValueError(f"numpy dtype {np_dtype} has no reshard.v1.DType")
