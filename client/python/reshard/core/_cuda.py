"""CUDA tensors in and out of a rank buffer (reshard.Worker): the agent's
shared-memory mapping is registered as pinned memory (cudaHostRegister) for
the duration of one publish or load, so each CUDA tensor moves with ONE
device-to-host copy straight into the agent's buffer, or ONE host-to-device
copy straight out of it: no pageable intermediate, no full-tensor staging.
Only imported when a CUDA tensor or device is involved (torch is there then).

Where registration is refused (e.g. a read-only mapping on a device without
cudaDevAttrHostRegisterReadOnlySupported), the copies still go straight
between the mapping and the device, as pageable copies the driver stages in
chunks; `Pinned.path` says which it was ("pinned" or "pageable: <why>").
"""

import bisect
import concurrent.futures
import ctypes
import time
import warnings

import numpy as np

_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context
_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: a sealed buffer's read-only mapping


def _torch():
    import torch
    return torch


def is_cuda_tensor(value):
    return type(value).__module__.startswith("torch") and value.device.type == "cuda"


def numpy_dtype(torch_dtype):
    """The numpy dtype Worker.load gives items of `torch_dtype`: bfloat16 as
    uint16, float8 kinds as uint8."""
    torch = _torch()
    if torch_dtype == torch.bfloat16:
        return np.dtype(np.uint16)
    try:
        return torch.empty(0, dtype=torch_dtype).numpy().dtype
    except TypeError:  # float8 and other kinds numpy lacks
        return np.dtype(f"u{torch_dtype.itemsize}")


def torch_dtype(np_dtype, bfloat16):
    """The torch dtype of an item Worker.load reads as `np_dtype` (uint16 is
    bfloat16 when the PTC says so, else int16 bits)."""
    torch = _torch()
    if np_dtype == np.uint16:
        return torch.bfloat16 if bfloat16 else torch.int16
    return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype


class DeviceSource:
    """A CUDA tensor given to Worker.publish, with the array attributes the
    worker checks (shape, dtype, size, ndim) and no host copy of it."""

    def __init__(self, tensor):
        self.tensor = tensor.detach()
        self.shape = tuple(self.tensor.shape)
        self.dtype = numpy_dtype(self.tensor.dtype)
        self.size = self.tensor.numel()
        self.ndim = self.tensor.dim()
        self.nbytes = self.size * self.tensor.element_size()


# Registration pins every page of the mapping, which costs more than the copy
# itself (the driver walks the pages). It may be done in page-aligned chunks by
# REGISTER_THREADS threads at once, each copy then split at chunk bounds so that
# no copy spans two registrations; on an H100 VM (bench/gpu_check) 4 to 16
# threads were slower than one (14-15 GB/s against 18 GB/s), hence 1.
REGISTER_THREADS = 1
_MIN_CHUNK = 64 << 20
_ALIGN = 2 << 20


class Pinned:
    """The mapping `mm` (an mmap of `size` bytes) registered as pinned memory
    while in use; every copy queued through it is finished by close().
    `writable`: False for the read-only mapping of a sealed buffer.
    `timings`: seconds spent registering, waiting for the copies and
    unregistering (a benchmark's breakdown)."""

    def __init__(self, mm, size, writable, device=None):
        torch = _torch()
        self._torch = torch
        self._device = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device())
        if self._device.index is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.init()
        self._registered = []
        self.path = "pinned"
        self.timings = {}
        with warnings.catch_warnings():  # a sealed buffer's mapping is read-only
            warnings.simplefilter("ignore", UserWarning)
            self._host = torch.frombuffer(mm, dtype=torch.uint8, count=size)
        base = self._host.data_ptr()
        threads = max(1, REGISTER_THREADS)
        chunk = max(_MIN_CHUNK, -(-size // threads))
        chunk = -(-chunk // _ALIGN) * _ALIGN
        self._bounds = list(range(0, size, chunk)) + [size]
        flags = _REGISTER_PORTABLE | (0 if writable else _REGISTER_READ_ONLY)
        runtime = _runtime()
        t0 = time.perf_counter()

        def register(i):
            a, b = self._bounds[i], self._bounds[i + 1]
            return i, runtime.cudaHostRegister(ctypes.c_void_p(base + a), ctypes.c_size_t(b - a),
                                               ctypes.c_uint(flags))

        pieces = range(len(self._bounds) - 1)
        if len(pieces) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(threads, len(pieces))) as pool:
                results = list(pool.map(register, pieces))
        else:
            results = [register(i) for i in pieces]
        failed = [(i, err) for i, err in results if err != 0]
        self._registered = [i for i, err in results if err == 0]
        self.timings["register"] = time.perf_counter() - t0
        if failed:
            self._unregister()
            runtime.cudaGetLastError()  # else torch's next kernel-launch check reports it
            self.path = (f"pageable: cudaHostRegister of {size} bytes failed "
                         f"(cudaError {failed[0][1]})")
        # The copies are queued on the current stream of the tensor's device:
        # after the kernels that made a published tensor, before those that
        # use a loaded one.
        self._streams = set()

    def _pieces(self, offset, nbytes):
        """(host start, piece start, piece end) of [offset, offset + nbytes)
        split at registration bounds."""
        i = bisect.bisect_right(self._bounds, offset) - 1
        at = 0
        while at < nbytes:
            end = min(nbytes, self._bounds[i + 1] - offset)
            yield offset + at, at, end
            at = end
            i += 1

    def to_host(self, offset, src):
        """Queues the copy of the CUDA tensor `src` into the mapping at `offset`."""
        flat = src.contiguous().view(-1).view(self._torch.uint8)  # strided: made dense on device
        stream = self._torch.cuda.current_stream(src.device)
        self._streams.add(stream)
        with self._torch.cuda.stream(stream):
            for host_at, a, b in self._pieces(offset, flat.numel()):
                self._host[host_at:host_at + b - a].copy_(flat[a:b],
                                                          non_blocking=bool(self._registered))

    def to_device(self, offset, shape, dtype):
        """Queues the copy of the mapping's bytes at `offset` into a new CUDA
        tensor of `shape` and torch `dtype` (returned; complete once close()
        returned)."""
        torch = self._torch
        stream = torch.cuda.current_stream(self._device)
        self._streams.add(stream)
        with torch.cuda.stream(stream):
            out = torch.empty(tuple(shape), dtype=dtype, device=self._device)
            flat = out.view(-1).view(torch.uint8)
            for host_at, a, b in self._pieces(offset, flat.numel()):
                flat[a:b].copy_(self._host[host_at:host_at + b - a],
                                non_blocking=bool(self._registered))
        return out

    def _unregister(self):
        runtime = _runtime()
        base = self._host.data_ptr()
        done, self._registered = self._registered, []
        if not done:
            return

        def unregister(i):
            runtime.cudaHostUnregister(ctypes.c_void_p(base + self._bounds[i]))

        with concurrent.futures.ThreadPoolExecutor(min(max(1, REGISTER_THREADS), len(done))) as pool:
            list(pool.map(unregister, done))

    def close(self):
        """Waits for the queued copies, unregisters, drops the view of the
        mapping. Idempotent."""
        if self._host is None:
            return
        try:
            t0 = time.perf_counter()
            for stream in self._streams:
                stream.synchronize()  # the mapping is unmapped after
            t1 = time.perf_counter()
            self._unregister()
            self.timings["copy wait"] = t1 - t0
            self.timings["unregister"] = time.perf_counter() - t1
        finally:
            self._host = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_RUNTIME = None


def _runtime():
    """The CUDA runtime torch loaded (found by its soname: ctypes calls
    release the GIL, so registrations run in parallel)."""
    global _RUNTIME
    if _RUNTIME is None:
        _torch().cuda.init()
        last = None
        for soname in ("libcudart.so.13", "libcudart.so.12"):
            try:
                lib = ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL | _RTLD_NOLOAD)
            except OSError as e:
                last = e
                continue
            lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
            _RUNTIME = lib
            break
        else:
            raise RuntimeError(f"the CUDA runtime torch loaded was not found by soname: {last}")
    return _RUNTIME


_RTLD_NOLOAD = 4  # dlopen's RTLD_NOLOAD on Linux: only a library already loaded
