"""CUDA IPC between a worker and its agent (docs/python.md, "CUDA IPC"): the
worker hands the agent IPC handles of its device allocations
(Worker.publish_device, publish(via="ipc")) and opens the handle of the
agent's sealed device buffer to copy device to device into its own tensors
(Worker.open_device, load(device=..., via="ipc")).

Two backends behind one interface (handle_of / open / read / copy_to /
close):
- "cuda": ctypes over the CUDA runtime torch loaded (reshard._cuda._runtime):
  a tensor's handle is its allocation block's cudaIpcMemHandle (torch's
  untyped_storage()._share_cuda_(), whose reference is given back once the
  agent copied) plus the tensor's byte offset in it;
  loads open the agent's handle (cudaIpcOpenMemHandle) and cudaMemcpy device
  to device into fresh tensors. Runs only where CUDA is.
- "fake": the agent's fake device (RESHARD_DEVICE=fake, agent/transfer/
  fake_device.h) on host memory, for CPU tests: an allocation is a memfd
  (FakeAllocation), its handle "fake-ipc <pid> <fd> <device> <bytes>", and
  the agent's handles are opened through /proc/<pid>/fd.
"""

import ctypes
import mmap
import os

_FAKE_TAG = "fake-ipc"


class FakeAllocation:
    """`nbytes` of fake device memory owned by this process: a memfd the
    agent maps when it opens handle() (same user). Write through `view`
    (writable memoryview); close() releases it."""

    def __init__(self, nbytes, device=0):
        self.nbytes = int(nbytes)
        self.device = int(device)
        self.fd = os.memfd_create("reshard-fake-device", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(self.nbytes, 1))
        self._mm = mmap.mmap(self.fd, max(self.nbytes, 1))
        self.view = memoryview(self._mm)[:self.nbytes]

    def handle(self):
        return f"{_FAKE_TAG} {os.getpid()} {self.fd} {self.device} {self.nbytes}".encode()

    def close(self):
        if self._mm is None:
            return
        self.view.release()
        self._mm.close()
        os.close(self.fd)
        self._mm = None


class _FakeOpened:
    """The agent's fake device allocation, mapped read-only here."""

    def __init__(self, handle):
        fields = handle.decode(errors="replace").split(" ")
        if len(fields) != 5 or fields[0] != _FAKE_TAG:
            raise ValueError(f"\"{handle!r}\" is not a fake device IPC handle "
                             f"(\"{_FAKE_TAG} PID FD DEVICE BYTES\")")
        pid, fd, self.device, self.nbytes = (int(f) for f in fields[1:])
        file = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._mm = mmap.mmap(file, self.nbytes, prot=mmap.PROT_READ) if self.nbytes else None
        finally:
            os.close(file)

    def read(self, offset, nbytes):
        """`nbytes` bytes at `offset` of the allocation, copied."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"[{offset}, {offset + nbytes}) is outside the {self.nbytes}-byte "
                             f"allocation")
        return bytes(self._mm[offset:offset + nbytes]) if nbytes else b""

    def close(self):
        if self._mm is not None:
            self._mm.close()
            self._mm = None


class FakeBackend:
    name = "fake"

    @staticmethod
    def open(handle, device):
        del device  # a fake allocation is host memory, readable from any "device"
        return _FakeOpened(handle)


class _CudaOpened:
    """The agent's device allocation opened with cudaIpcOpenMemHandle."""

    def __init__(self, handle, device):
        rt = _cuda_runtime()
        if len(handle) != 64:
            raise ValueError(f"a CUDA IPC handle has 64 bytes, not {len(handle)}")
        self.device = device
        _check(rt.cudaSetDevice(device), "cudaSetDevice", device)
        ptr = ctypes.c_void_p()
        raw = _IpcMemHandle.from_buffer_copy(handle)  # passed by value, as the C API takes it
        _check(rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), raw, 1), "cudaIpcOpenMemHandle", device)
        self.base = ptr.value

    def copy_to(self, tensor, offset, nbytes):
        """Device to device: `nbytes` at `offset` of the allocation into the
        contiguous CUDA `tensor` (same device), synchronously."""
        rt = _cuda_runtime()
        _check(rt.cudaMemcpy(ctypes.c_void_p(tensor.data_ptr()),
                             ctypes.c_void_p(self.base + offset), nbytes, _D2D),
               "cudaMemcpy", self.device)

    def close(self):
        if self.base is not None:
            _check(_cuda_runtime().cudaIpcCloseMemHandle(ctypes.c_void_p(self.base)),
                   "cudaIpcCloseMemHandle", self.device)
            self.base = None


class CudaBackend:
    name = "cuda"

    @staticmethod
    def handle_of(tensor):
        """(64-byte cudaIpcMemHandle of the allocation block holding the
        contiguous CUDA `tensor`, byte offset of its first element there,
        release): call release() once the agent has copied. torch counts the
        share (untyped_storage()._share_cuda_() adds a reference the
        consumer is to give back); without the release the block stays in
        torch's IPC limbo after the tensor is freed, a leak per publish."""
        if not tensor.is_contiguous():
            raise ValueError("publish via=\"ipc\" needs contiguous CUDA tensors")
        import torch
        storage = tensor.untyped_storage()
        shared = storage._share_cuda_()
        # (device, handle, size, offset of the storage in its block,
        #  ref counter handle, ref counter offset, event handle, event sync)
        handle, storage_offset = shared[1], shared[3]
        counter, counter_offset = shared[4], shared[5]

        def release():
            if counter:
                torch.UntypedStorage._release_ipc_counter(counter, counter_offset,
                                                          device=storage.device)

        return (bytes(handle), storage_offset + tensor.storage_offset() * tensor.element_size(),
                release)

    @staticmethod
    def open(handle, device):
        return _CudaOpened(handle, device)


_D2D = 3  # cudaMemcpyDeviceToDevice


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]  # cudaIpcMemHandle_t


def _cuda_runtime():
    from reshard.core import _cuda
    rt = _cuda._runtime()
    if not getattr(rt, "_reshard_ipc_types", False):
        rt.cudaSetDevice.argtypes = [ctypes.c_int]
        rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                            _IpcMemHandle, ctypes.c_uint]
        rt.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        rt._reshard_ipc_types = True
    return rt


def _check(err, call, device):
    if err != 0:
        raise RuntimeError(f"{call} (CUDA device {device}) failed: cudaError {err}")


def backend_for(handle):
    """The backend that opens `handle` (the agent's OpenDeviceGeneration)."""
    return FakeBackend if handle.startswith(_FAKE_TAG.encode()) else CudaBackend
