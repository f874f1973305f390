"""reshard.Worker: the training-worker side of an agent (unix-socket gRPC).

A worker publishes its rank's local tensors into the rank buffer the agent
created (a shared-memory file: the worker maps it and writes in place) and
seals it; after a reshard it loads the rank's buffer of the new generation.
Shard files are the agent's alone (docs/security.md, "Workers"): the worker
maps a file descriptor the agent hands it over `<socket>.fds` for exactly
the buffer its job's token may use, never a path.
Thread contract: one Worker may be used by several threads for different
ranks; publish/load of the same rank must not race.
"""

import mmap
import os
import socket
import struct
import time

import grpc
import numpy as np

from reshard.core import _dtypes, _rank_region, _rpc, errors
from reshard.core._proto import as_message, ptc_pb2
from reshard.core._proto import worker_pb2, worker_pb2_grpc

try:  # optional: expected checksums on seal, verification on load
    import xxhash
except ImportError:  # pragma: no cover - exercised only where xxhash is missing
    xxhash = None


_PUBLISHED_DTYPES = {}  # job id -> {tensor name: (numpy dtype, original dtype)}


def checksum(data):
    """XXH3-64 of a bytes-like, the agent's item checksum (docs/agent.md).
    None when the xxhash module is not installed."""
    if xxhash is None:
        return None
    return xxhash.xxh3_64_intdigest(data)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _is_torch(value):
    return type(value).__module__.startswith("torch")


def _cuda_module():
    from reshard.core import _cuda  # torch and a CUDA device are there: a CUDA tensor is
    return _cuda


def _is_device_source(src):
    return type(src).__name__ == "DeviceSource"


class LoadedShard(dict):
    """What Worker.load returns: {item name: value}, and `regenerated`, the
    frozenset of item names the worker must regenerate (their bytes are
    zeros: no surviving rank held their value after a loss)."""

    regenerated = frozenset()


class Unsealed:
    """A rank buffer written by Worker.publish(..., seal=False), not sealed yet."""

    def __init__(self, worker, rank, generation, names, expected, region=None):
        self.worker, self.rank, self.generation = worker, rank, generation
        self._names, self._expected = names, expected
        self._region = region  # Worker.buffers' mapping: sealed in place

    def seal(self):
        """Seals the buffer (SealShard); returns {item name: checksum}.
        A buffer of Worker.buffers is first made private to this process
        (no writable view of the file left), so the agent seals it in place."""
        w = self.worker
        region = self._region
        if region is not None:
            w._make_private(region, "SealShard")
        try:
            sums = w._call("SealShard", worker_pb2.SealShardRequest(
                job_id=w.job_id, generation=self.generation, rank=self.rank,
                expected_checksums=self._expected)).checksums
        except errors.ReshardError as e:
            if region is not None:
                region.seal_error = e
            raise
        if region is not None:
            region.state = _rank_region.SEALED
        return dict(zip(self._names, sums))


class Worker:
    """Publishes and loads one job's rank buffers through the agent of this host.

    Args:
      socket_path: the agent's --worker-socket path.
      job_id: the job.
      ptc: the job's Ptc (message or dict), used for item dtypes on load.
      coordinator: where to fetch the PTC when it is needed and not given:
        a reshard.Client (its credentials are used), or "host:port" of the
        coordinator, dialled with `client_kwargs` (reshard.Client's
        credentials=, token= or insecure=True; one of them is required).
      timeout: deadline of each call, seconds; a publish the agent answers
        UNAVAILABLE (the generation not open here yet) is retried within it,
        each attempt getting the time left.
      worker_token: the job's worker token (Client.register_job(...,
        with_token=True), Client.worker_token(job_id) or `reshardctl jobs
        worker-token JOB`); default $RESHARD_WORKER_TOKEN. The agent serves
        a call only with the token of the job it names: none is
        Unauthenticated, another job's is PermissionDenied. With
        coordinator="host:port" and no other credentials it is also the
        bearer token for the coordinator unless token= is given (role
        `worker`: this job's calls only, docs/security.md "Worker tokens";
        still needs credentials= with the CA, or insecure=True).

    Dtypes on load: from `ptc`, else from the coordinator, else the dtypes
    last published under each name by a Worker of this process for this job;
    otherwise load raises ValueError.
    """

    def __init__(self, socket_path, job_id, ptc=None, coordinator=None, timeout=30.0,
                 worker_token=None, **client_kwargs):
        self.socket_path = socket_path
        self.job_id = job_id
        self.timeout = timeout
        # The job's worker token (RegisterJob, Client.worker_token, `reshardctl
        # jobs worker-token JOB`): the agent serves only the job it is for.
        if worker_token is None:
            worker_token = os.environ.get("RESHARD_WORKER_TOKEN") or None
        self._token = worker_token or ""
        self._metadata = (("authorization", "Bearer " + worker_token),) if worker_token else ()
        target = socket_path if socket_path.startswith("unix:") else (
            "unix:" + os.path.abspath(socket_path))
        # The descriptor socket beside the worker socket (WorkerFdRequest).
        self._fd_socket_path = target[len("unix:"):] + ".fds"
        self._channel = grpc.insecure_channel(target)
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        if isinstance(coordinator, str):
            from reshard.core.client import Client
            if worker_token:
                # The worker token is also a coordinator credential: the
                # `worker` role, scoped to this job (docs/security.md).
                client_kwargs.setdefault("token", worker_token)
            coordinator = Client(coordinator, timeout=timeout, **client_kwargs)
            self._own_client = coordinator
        elif client_kwargs:
            raise ValueError(f"Worker: {', '.join(sorted(client_kwargs))} apply only to a "
                             f"coordinator given as \"host:port\"")
        else:
            self._own_client = None
        self._coordinator = coordinator
        self._ptc = as_message(ptc, ptc_pb2.Ptc, "ptc") if ptc is not None else None
        # Dtypes published through any Worker of this process, per job: a
        # process that publishes and later loads needs no PTC.
        self._seen_dtypes = _PUBLISHED_DTYPES.setdefault(job_id, {})
        # How the last publish/load moved CUDA tensors: "pinned" or why not
        # (reshard._cuda.Pinned.path); None before any did.
        self.last_device_copy = None

    def close(self):
        """Closes the channel (and the coordinator Client it made). Idempotent."""
        self._channel.close()
        if self._own_client is not None:
            self._own_client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, method) from None

    def _shard_fd(self, access, generation, rank, size, method):
        """A descriptor of the rank buffer (job, generation, rank) from the
        agent's descriptor socket: writable for ACCESS_PUBLISH, read-only
        for ACCESS_LOAD, checked to hold `size` bytes. The caller closes it."""
        where = f"job \"{self.job_id}\" generation {generation} rank {rank}"
        body = worker_pb2.WorkerFdRequest(
            worker_token=self._token, job_id=self.job_id, generation=generation, rank=rank,
            access=access).SerializeToString()
        data, fds = b"", []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(self._fd_socket_path)
                s.sendall(struct.pack("<I", len(body)) + body)
                while len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
                    msg, got, _, _ = socket.recv_fds(s, 1 << 16, 1, socket.MSG_CMSG_CLOEXEC)
                    fds += got
                    if not msg:
                        break
                    data += msg
        except OSError as e:
            for fd in fds:
                os.close(fd)
            raise errors.Unavailable(f"{where}: the agent's descriptor socket "
                                     f"{self._fd_socket_path}: {e}", method=method) from None
        if len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
            for fd in fds:
                os.close(fd)
            raise errors.Unavailable(f"{where}: the agent's descriptor socket closed before "
                                     f"answering", method=method)
        resp = worker_pb2.WorkerFdResponse.FromString(data[4:])
        if resp.code != 0 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if resp.code == 0:
                raise errors.Internal(f"{where}: the agent sent {len(fds)} descriptors",
                                      method=method)
            raise errors.from_code(resp.code, resp.message, method=method)
        fd = fds[0]
        have = os.fstat(fd).st_size
        if have != size:
            os.close(fd)
            raise errors.DataLoss(f"{where}: its shard file has {have} bytes, {size} expected "
                                  f"(truncated or replaced)", method=method)
        return fd

    def _call_retrying_unavailable(self, method, request):
        """_call, retried while the agent answers UNAVAILABLE (a checkpoint's
        generation not yet open here) with the backoff of reshard._rpc's
        worker_publish row, within self.timeout for the whole call: each
        attempt's deadline is the time left."""
        end = time.monotonic() + self.timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._call(method, request, timeout=end - time.monotonic())
            except errors.ReshardError as e:
                if not _rpc.retryable(_rpc.WORKER_PUBLISH, e.code.value[0]):
                    raise
                delay = _rpc.backoff(_rpc.WORKER_PUBLISH, attempt)
                if time.monotonic() + delay > end:
                    raise
                time.sleep(delay)

    # ----------------------------------------------------------------- publish

    def publish(self, rank, generation, state_dict, verify=True, seal=True, via="pinned"):
        """Writes `rank`'s local tensors and blobs of `generation` (the job's
        current one) into the agent's rank buffer and seals it.

        state_dict maps every item the rank holds to its local data: tensors as
        numpy arrays or torch tensors of the local shape the agent reports and
        the PTC's element size; blobs as bytes-likes or arrays of exactly the
        blob's size. Items the rank does not hold (other pipeline stages) may
        be left out, or given with zero elements. Everything is checked before
        the first byte is written; then each item is copied once, straight
        from the source (strided arrays included) into the shared-memory file.
        CUDA tensors are copied by ONE device-to-host copy each into the file,
        registered as pinned memory for the call (reshard._cuda), never
        through a host copy of the tensor.

        verify: send XXH3-64 checksums computed here so the agent refuses
        (DataLoss) bytes that differ from what it reads back (needs xxhash).
        Returns {item name: checksum} as the agent recorded them.
        seal=False: only write; returns an object whose seal() seals later
        (from any thread) and returns that dict. The bytes are in the rank
        buffer once publish returns: an asynchronous checkpoint's snapshot
        (reshard.elastic).
        via="ipc": every tensor is a contiguous CUDA tensor (blobs may be
        bytes); the agent (started with --device) copies them device to
        device through CUDA IPC into a device buffer of its own and seals it
        (publish_device; docs/python.md "CUDA IPC"). verify and seal do not
        apply: the agent's checksums are returned.
        """
        if via == "ipc":
            return self._publish_ipc(rank, generation, state_dict)
        if via != "pinned":
            raise ValueError(f"via \"{via}\": expected \"pinned\" or \"ipc\"")
        region = self._region_for(rank, generation, state_dict)
        resp = self._call_retrying_unavailable("PublishShard", worker_pb2.PublishShardRequest(
            job_id=self.job_id, generation=generation, rank=rank))
        names = [it.name for it in resp.items]
        unknown = sorted(set(state_dict) - set(names))
        if unknown:
            raise ValueError(f"rank {rank}: {', '.join(repr(n) for n in unknown)} "
                             f"not in the job's PTC")
        plan = []  # (item, checked source array: local shape, or flat uint8 for blobs)
        for it in resp.items:
            plan.append((it, self._source(rank, it, state_dict.get(it.name))))
        if region is not None:
            return self._publish_in_region(region, resp, plan, names, seal)
        expected = []
        hashing = verify and xxhash is not None
        fd = self._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_PUBLISH, generation, rank,
                            resp.size, "PublishShard")
        device_items = [i for i, (_, src) in enumerate(plan) if _is_device_source(src)]
        # Registration faults the pages in itself: no MAP_POPULATE then.
        with _Mapping(fd, resp.size, writable=True, populate=not device_items) as mm:
            pinned = _cuda_module().Pinned(mm, resp.size, writable=True) if device_items else None
            try:
                for i in device_items:  # queued first: the DMA runs while the host copies
                    pinned.to_host(plan[i][0].offset, plan[i][1].tensor)
            except BaseException:
                pinned.close()
                raise
            if pinned is not None:
                self.last_device_copy = pinned.path
            try:
                for i, (it, src) in enumerate(plan):
                    h = xxhash.xxh3_64() if hashing else None
                    if pinned is not None and i == device_items[0]:
                        pinned.close()  # the device bytes are in the file from here
                    if _is_device_source(src):
                        if hashing:
                            h.update(memoryview(mm)[it.offset:it.offset + it.bytes])
                    elif it.bytes:
                        # One pass from the (possibly strided) source into the file,
                        # each block hashed while it is still in cache.
                        dst = np.ndarray(src.shape, dtype=src.dtype, buffer=mm, offset=it.offset)
                        _copy_blocks(dst, src, mm, it.offset, h, hash_first=False)
                        del dst
                    if hashing:
                        expected.append(h.intdigest())
            finally:
                if pinned is not None:
                    pinned.close()
        unsealed = Unsealed(self, rank, generation, names, expected)
        return unsealed.seal() if seal else unsealed

    # ------------------------------------------------------------- CUDA IPC

    def publish_device(self, rank, generation, items, device=0, expected=None):
        """Publishes `rank`'s buffer of `generation` from device memory
        (PublishDeviceShard): the agent opens each item's IPC handle, copies
        its bytes device to device into a device buffer of its own and seals
        it, so the generation stays as published whatever the caller does
        with its memory afterwards.

        items: one per item of the rank buffer (the PTC's tensors in order,
        then its blobs): (ipc_handle: bytes, offset: int, nbytes: int) with
        `offset` the item's first byte from the allocation's base, or None
        for an item the rank does not hold. device: the device of the
        handles. expected: optional XXH3-64 per item (DataLoss on a
        mismatch). Returns the agent's checksums, one per item.
        """
        req = worker_pb2.PublishDeviceShardRequest(
            job_id=self.job_id, generation=generation, rank=rank, device=device,
            expected_checksums=list(expected or []))
        for item in items:
            if item is None:
                req.items.add()
            else:
                handle, offset, nbytes = item
                req.items.add(ipc_handle=handle, offset=offset, bytes=nbytes)
        return list(self._call_retrying_unavailable("PublishDeviceShard", req).checksums)

    def open_device(self, rank, generation):
        """`rank`'s sealed buffer of `generation` in the agent's device memory
        (OpenDeviceGeneration; a host-resident one is staged to a device
        first): the reply's device, ipc_handle (read it, never write), size,
        items (offset, bytes, name, local_shape) and checksums. The handle
        is valid while the agent holds the generation."""
        return self._call("OpenDeviceGeneration", worker_pb2.OpenDeviceGenerationRequest(
            job_id=self.job_id, generation=generation, rank=rank))

    def _publish_ipc(self, rank, generation, state_dict):
        torch = _torch()
        from reshard.core import _device_ipc
        ptc = self._ptc if self._ptc is not None else (
            self._fetch_ptc() if self._coordinator else None)
        if ptc is None:
            raise ValueError("publish via=\"ipc\" needs the job's PTC: pass ptc= or "
                             "coordinator= to Worker")
        names = [t.name for t in ptc.tensors] + [b.name for b in ptc.blobs]
        unknown = sorted(set(state_dict) - set(names))
        if unknown:
            raise ValueError(f"rank {rank}: {', '.join(repr(n) for n in unknown)} "
                             f"not in the job's PTC")
        keep, items, device = [], [], None  # keep: blob copies alive until the agent copied
        releases = []  # torch's IPC references, given back once the agent copied
        for i, name in enumerate(names):
            value = state_dict.get(name)
            if value is None or (_is_torch(value) and value.numel() == 0):
                items.append(None)  # not held by this rank
                continue
            if i >= len(ptc.tensors) and not _is_torch(value):  # a blob: bytes to the device
                value = torch.frombuffer(bytearray(bytes(value)), dtype=torch.uint8).to(
                    device if device is not None else "cuda")
                keep.append(value)
            if not (_is_torch(value) and value.device.type == "cuda"):
                raise ValueError(f"rank {rank} item \"{name}\": publish via=\"ipc\" needs a "
                                 f"CUDA tensor, got {type(value).__name__}")
            if device is not None and value.device != device:
                raise ValueError(f"rank {rank} item \"{name}\" is on {value.device}, the "
                                 f"others on {device}: publish via=\"ipc\" takes one device")
            device = value.device
            handle, offset, release = _device_ipc.CudaBackend.handle_of(value.detach())
            releases.append(release)
            items.append((handle, offset, value.numel() * value.element_size()))
        if device is None:  # the rank holds nothing: the current device names the call
            device = torch.device("cuda", torch.cuda.current_device())
        try:
            torch.cuda.current_stream(device).synchronize()  # the agent copies on its own stream
            # The agent's device ordinal: the worker's when both see the same
            # devices (docs/python.md, "CUDA IPC").
            index = device.index if device.index is not None else torch.cuda.current_device()
            sums = self.publish_device(rank, generation, items, device=index)
        finally:
            for release in releases:
                release()
        self.last_device_copy = "ipc"
        return dict(zip(names, sums))

    def _load_ipc(self, rank, generation, device, ptc):
        torch = _torch()
        device = torch.device(device)
        if device.index is None:  # "cuda": the current device, as torch means it
            device = torch.device("cuda", torch.cuda.current_device())
        resp = self.open_device(rank, generation)
        kinds = self._item_kinds(resp.items, ptc)
        out = LoadedShard()
        out.regenerated = frozenset()
        # Opening a handle makes its device current: the caller's comes back after.
        with torch.cuda.device(device):
            return self._copy_ipc_items(resp, kinds, ptc, device, out)

    def _copy_ipc_items(self, resp, kinds, ptc, device, out):
        torch = _torch()
        from reshard.core import _cuda, _device_ipc
        opened = _device_ipc.backend_for(resp.ipc_handle).open(resp.ipc_handle, device.index)
        try:
            for i, it in enumerate(resp.items):
                kind = kinds[i]
                if kind[0] == "blob":
                    raw = torch.empty(it.bytes, dtype=torch.uint8, device=device)
                    if it.bytes:
                        opened.copy_to(raw, it.offset, it.bytes)
                    out[kind[-1]] = raw.cpu().numpy().tobytes()
                    continue
                if it.bytes == 0:
                    continue
                np_dtype, enum = kind[1], kind[2]
                shape = list(it.local_shape) or [it.bytes // np_dtype.itemsize]
                t = torch.empty(shape, dtype=_cuda.torch_dtype(
                    np_dtype, enum == ptc_pb2.DTYPE_BFLOAT16), device=device)
                opened.copy_to(t, it.offset, it.bytes)
                out[kind[-1]] = t
        finally:
            opened.close()
        self.last_device_copy = "ipc"
        return out

    # ------------------------------------------------ zero-copy publish

    def buffers(self, rank, generation, as_torch=False, ptc=None):
        """The agent's rank buffer of `rank` in `generation` (the job's
        current one), for the worker to keep its state in from the start:
        {item name: writable array} for every tensor the rank holds (local
        shape, the PTC's dtype; bfloat16 as uint16 in numpy, torch.bfloat16
        with as_torch) and {blob name: writable flat uint8 array} for every
        blob. Items the rank does not hold are left out. The arrays are
        zeros at first and are views of ONE shared writable mapping of the
        agent's file (PublishShard, then the descriptor of ACCESS_PUBLISH):
        what the worker writes there is in the agent's buffer, no copy.

        Publishing is then sealing, not copying: publish(rank, generation,
        d) given these arrays (recognised by address, whatever dict holds
        them; an item given as other memory is copied into the buffer
        first) maps the same file privately over the same addresses from a
        read-only descriptor, closes every writable one and seals in place:
        no copy and no worker-side hashing pass (the agent checksums the
        file under its read lease). The arrays keep their values and stay
        writable; later writes (training on) go to private copy-on-write
        pages and never reach the sealed buffer. The mapping goes when the
        last array (or tensor) of it goes. Called again while arrays of
        an earlier call live, it returns new views of the same mapping.

        ptc: the job's PTC for the dtypes (as for load); default the
        Worker's, else the coordinator's, else dtypes this process published.
        """
        torch = _torch() if as_torch else None
        if as_torch and torch is None:
            raise ImportError("as_torch=True needs torch")
        resp = self._call_retrying_unavailable("PublishShard", worker_pb2.PublishShardRequest(
            job_id=self.job_id, generation=generation, rank=rank))
        kinds = self._item_kinds(resp.items, ptc)
        # Asked again while arrays of the first call live: views of the same
        # mapping (a second writable mapping would deny the seal its lease).
        region = next((r for r in _rank_region.live()
                       if (r.job_id, r.rank, r.generation) == (self.job_id, rank, generation)
                       and r.state == _rank_region.WRITABLE and r.size == resp.size), None)
        if region is None:
            fd = self._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_PUBLISH, generation, rank,
                                resp.size, "PublishShard")
            try:
                region = _rank_region.RankRegion(self.job_id, rank, generation, fd, resp.size)
            except OSError as e:
                raise errors.Internal(str(e), method="buffers") from None
        whole = np.asarray(region)  # its base is the region: unmapped with the last view
        out = {}
        for it, kind in zip(resp.items, kinds):
            if it.bytes == 0:
                continue
            name = kind[-1]
            if kind[0] == "blob":
                out[name] = whole[it.offset:it.offset + it.bytes]
                continue
            np_dtype, enum = kind[1], kind[2]
            shape = list(it.local_shape) or [it.bytes // np_dtype.itemsize]
            arr = np.ndarray(shape, dtype=np_dtype, buffer=whole, offset=it.offset)
            self._seen_dtypes.setdefault(name, (np_dtype, None))
            out[name] = _to_torch(torch, arr, enum) if torch is not None else arr
        return out

    def _region_for(self, rank, generation, state_dict):
        """The RankRegion of (rank, generation) that publish must seal in
        place, or None (the copy path). Refuses, before anything is written,
        values that view the buffers of another rank or generation (still
        unsealed) and a region that is already sealed or being sealed."""
        regions = _rank_region.live()
        if not regions:
            return None  # no Worker.buffers alive in this process: the copy path
        own = None
        for name, value in state_dict.items():
            addr = _data_address(value)
            region = _rank_region.find(addr, regions) if addr is not None else None
            if region is None:
                continue
            mine = (region.job_id, region.rank, region.generation) == (
                self.job_id, rank, generation)
            if not mine:
                if region.state == _rank_region.WRITABLE:
                    raise ValueError(
                        f"rank {rank} generation {generation} item \"{name}\": its value views "
                        f"the buffers of {region.describe()} (Worker.buffers), not of this rank "
                        f"and generation")
                continue  # sealed elsewhere: private memory now, copied like any other
            if region.state == _rank_region.SEALED:
                raise errors.FailedPrecondition(
                    f"{region.describe()} item \"{name}\": these buffers are sealed already "
                    f"(publish seals a rank's buffers once)", method="publish")
            if region.state == _rank_region.PRIVATE:
                why = (f" (that SealShard failed: {region.seal_error})"
                       if region.seal_error is not None else "")
                raise errors.FailedPrecondition(
                    f"{region.describe()} item \"{name}\": these buffers were handed to "
                    f"SealShard already{why}; sealing twice is refused", method="publish")
            own = region
        if own is None:
            for region in regions:
                if ((region.job_id, region.rank, region.generation) ==
                        (self.job_id, rank, generation) and region.state == _rank_region.WRITABLE):
                    own = region  # buffers handed out, the state given as other memory
                    break
        return own

    def _publish_in_region(self, region, resp, plan, names, seal):
        """publish's zero-copy path: items not already in place are copied
        into the region; then seal in place, with no expected checksums
        (the worker holds no other copy of the bytes to hash)."""
        if resp.size != region.size:
            raise errors.DataLoss(f"{region.describe()}: the buffer has {resp.size} bytes, "
                                  f"{region.size} were mapped", method="publish")
        whole = np.asarray(region)
        for it, src in plan:
            if src is None or not it.bytes:
                continue
            if _is_device_source(src):
                src = self._as_array(src.tensor.cpu())
            elif _data_address(src) == region.addr + it.offset and src.flags.c_contiguous:
                continue  # the handed-out array: already in the buffer
            dst = np.ndarray(src.shape, dtype=src.dtype, buffer=whole, offset=it.offset)
            np.copyto(dst, src, casting="no")  # overlapping views are copied as if via a temp
            del dst
        del whole
        unsealed = Unsealed(self, region.rank, region.generation, names, [], region=region)
        return unsealed.seal() if seal else unsealed

    def _make_private(self, region, method):
        if region.state != _rank_region.WRITABLE:
            raise errors.FailedPrecondition(f"{region.describe()}: these buffers were handed to "
                                            f"SealShard already; sealing twice is refused",
                                            method=method)
        fd = self._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_PUBLISHED_READ, region.generation,
                            region.rank, region.size, method)
        try:
            region.make_private(fd)
        except OSError as e:
            raise errors.Internal(str(e), method=method) from None

    def _source(self, rank, item, value):
        """`value` checked against the item: an array of the local shape
        (any strides), a flat uint8 array for blobs, None for nothing."""
        where = f"rank {rank} item \"{item.name}\""
        if value is None:
            if item.bytes:
                raise ValueError(f"{where}: missing from the state dict ({item.bytes} bytes "
                                 f"held by this rank)")
            return None
        if isinstance(value, (bytes, bytearray, memoryview)):
            raw = np.frombuffer(value, dtype=np.uint8)
            if raw.size != item.bytes:
                raise ValueError(f"{where}: {raw.size} bytes given, the rank buffer holds "
                                 f"{item.bytes}")
            return raw
        arr = self._as_array(value)
        shape = list(item.local_shape)
        is_tensor_item = bool(shape) or (item.bytes == 0)
        if item.bytes == 0:
            if arr.size:
                raise ValueError(f"{where}: rank {rank} does not hold this item (0 bytes in "
                                 f"its buffer) but {arr.size} elements were given")
            return None
        if not is_tensor_item:  # blob given as an array: raw bytes
            if _is_device_source(arr):
                arr = self._as_array(arr.tensor.cpu())
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if raw.size != item.bytes:
                raise ValueError(f"{where}: {raw.size} bytes given, the blob holds {item.bytes}")
            return raw
        if list(arr.shape) != shape:
            raise ValueError(f"{where}: local shape {list(arr.shape)} given, the layout gives "
                             f"rank {rank} {shape}")
        elements = int(np.prod(shape, dtype=np.int64))
        if arr.dtype.itemsize * elements != item.bytes:
            raise ValueError(f"{where}: dtype {arr.dtype} has {arr.dtype.itemsize}-byte "
                             f"elements, the PTC's dtype has {item.bytes // max(elements, 1)}")
        self._seen_dtypes[item.name] = (arr.dtype, getattr(value, "dtype", None))
        return arr

    @staticmethod
    def _as_array(value):
        if _is_torch(value):
            torch = _torch()
            t = value.detach()
            if t.device.type == "cuda":  # copied once, into the file (publish)
                return _cuda_module().DeviceSource(t)
            if t.device.type != "cpu":
                t = t.cpu()
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(np.uint16)
            return t.numpy()
        return np.asarray(value)

    # -------------------------------------------------------------------- load

    def load(self, rank, generation, as_torch=False, copy=True, verify=True, ptc=None,
             device=None, via="pinned"):
        """`rank`'s sealed buffer of `generation`: {name: array} for every
        tensor the rank holds (local shape, the PTC's dtype; bfloat16 as
        uint16 and float8 as uint8 in numpy, torch.bfloat16 in torch) and
        {name: bytes} for every blob. Tensors with no bytes in the rank's
        buffer (other pipeline stages, or an empty share) are left out.

        The result is a dict (LoadedShard) whose `regenerated` attribute is
        the frozenset of item names whose bytes are zeros, not the job's
        state: no surviving rank held their value after a loss (a
        regenerable blob such as an RNG state, TransferPlan.regenerate), so
        the worker must regenerate them (re-seed its RNG) before use. Empty
        unless a recovery made this generation without them.

        copy=True: the arrays own their memory (one copy out of shared memory).
        copy=False: zero-copy, copy-on-write views of a private mapping of the
        file: writable, and writes never reach the agent's buffer; the mapping
        lives as long as any array of it.
        verify: recompute each item's XXH3-64 and raise DataLoss on a mismatch
        with the agent's recorded checksum (needs xxhash).
        ptc: the job's PTC (ptc_pb2.Ptc) to take the dtypes from for this
        load instead of the Worker's own (reshard.pytorch.load passes its
        Spec's).
        device: a CUDA device (torch.device, "cuda" or "cuda:N"): tensors come
        back as torch tensors on it, each made by ONE host-to-device copy
        straight from the agent's buffer, registered as pinned memory for the
        call (reshard._cuda; Worker.last_device_copy says "pinned" or why
        not); as_torch and copy do not apply to them. Blobs stay bytes.
        via="ipc" (with a CUDA device): the agent's device buffer of the rank
        (open_device) is copied device to device through CUDA IPC into fresh
        tensors on `device` (the agent's seal covers the bytes: verify does
        not apply); docs/python.md "CUDA IPC".
        """
        if via == "ipc":
            if device is None:
                raise ValueError("load via=\"ipc\" needs device= (a CUDA device)")
            return self._load_ipc(rank, generation, device, ptc)
        if via != "pinned":
            raise ValueError(f"via \"{via}\": expected \"pinned\" or \"ipc\"")
        resp = self._call("OpenGeneration", worker_pb2.OpenGenerationRequest(
            job_id=self.job_id, generation=generation, rank=rank))
        kinds = self._item_kinds(resp.items, ptc)
        torch = _torch() if as_torch else None
        if as_torch and torch is None:
            raise ImportError("as_torch=True needs torch")
        out = LoadedShard()
        out.regenerated = frozenset(kinds[i][-1] for i, it in enumerate(resp.items)
                                    if it.regenerated)
        fd = self._shard_fd(worker_pb2.WorkerFdRequest.ACCESS_LOAD, generation, rank,
                            resp.size, "OpenGeneration")
        pinned = None
        if device is not None:
            copy = True  # device tensors own their memory; the mapping is shared, read-only
        mm = _open_map(fd, resp.size, private=not copy, populate=device is None)
        try:
            if device is not None and mm is not None:
                pinned = _cuda_module().Pinned(mm, resp.size, writable=False, device=device)
                self.last_device_copy = pinned.path
            for i, it in enumerate(resp.items):
                kind = kinds[i]
                np_dtype = kind[1] if kind[0] != "blob" else None
                hashing = verify and xxhash is not None and i < len(resp.checksums)
                copied = None
                if hashing and copy and np_dtype is not None and it.bytes and pinned is None:
                    # Hash each block and copy it out while it is in cache.
                    shape = list(it.local_shape) or [it.bytes // np_dtype.itemsize]
                    copied = np.empty(shape, dtype=np_dtype)
                    h = xxhash.xxh3_64()
                    view = np.ndarray(shape, dtype=np_dtype, buffer=mm, offset=it.offset)
                    _copy_blocks(copied, view, mm, it.offset, h, hash_first=True)
                    del view
                    got = h.intdigest()
                elif hashing:
                    got = checksum(memoryview(mm)[it.offset:it.offset + it.bytes]
                                   if it.bytes else b"")
                if hashing:
                    if got != resp.checksums[i]:
                        raise errors.DataLoss(
                            f"job \"{self.job_id}\" generation {generation} rank {rank} item "
                            f"\"{kind[-1]}\": checksum {got:016x}, agent recorded "
                            f"{resp.checksums[i]:016x}", method="load")
                name = kind[-1]
                if kind[0] == "blob":
                    out[name] = bytes(memoryview(mm)[it.offset:it.offset + it.bytes])
                    continue
                if it.bytes == 0:
                    continue  # no element of it in this rank's buffer
                np_dtype, enum = kind[1], kind[2]
                # An old generation this agent never served may come without
                # local shapes: such a tensor is returned flat.
                shape = list(it.local_shape) or [it.bytes // np_dtype.itemsize]
                if pinned is not None:
                    out[name] = pinned.to_device(it.offset, shape, _cuda_module().torch_dtype(
                        np_dtype, enum == ptc_pb2.DTYPE_BFLOAT16))
                    continue
                if copied is not None:
                    arr = copied
                else:
                    arr = np.ndarray(shape, dtype=np_dtype, buffer=mm, offset=it.offset)
                    if copy:
                        arr = arr.copy()
                out[name] = _to_torch(torch, arr, enum) if torch is not None else arr
        finally:
            if pinned is not None:
                pinned.close()  # every device tensor is complete from here
            if copy and mm is not None:
                _close(mm)
        return out

    def _item_kinds(self, items, ptc=None):
        """Per item: ("blob", name) or ("tensor", numpy dtype, DType or None, name)."""
        ptc = self._ptc if ptc is None else as_message(ptc, ptc_pb2.Ptc, "ptc")
        if ptc is None and self._coordinator and any(
                it.name not in self._seen_dtypes for it in items):
            ptc = self._fetch_ptc()
        if ptc is not None:
            # Items are the PTC's tensors in order, then its blobs.
            specs = [("tensor", t) for t in ptc.tensors] + [("blob", b) for b in ptc.blobs]
            if len(specs) != len(items):
                raise errors.ReshardError(
                    f"the rank buffer has {len(items)} items, the job's PTC "
                    f"{len(specs)}", method="load")
            out = []
            for it, (kind, spec) in zip(items, specs):
                if it.name and it.name != spec.name:
                    raise errors.ReshardError(f"item \"{it.name}\" where the PTC has "
                                              f"\"{spec.name}\"", method="load")
                if kind == "blob":
                    out.append(("blob", spec.name))
                else:
                    out.append(("tensor", _dtypes.numpy_dtype(spec.dtype), spec.dtype, spec.name))
            return out
        out = []
        for it in items:
            if it.name in self._seen_dtypes:
                np_dtype, _ = self._seen_dtypes[it.name]
                enum = ptc_pb2.DTYPE_BFLOAT16 if np_dtype == np.uint16 else -1
                out.append(("tensor", np_dtype, enum, it.name))
            elif it.bytes and not len(it.local_shape):
                out.append(("blob", it.name))  # blobs carry no local shape
            elif it.bytes == 0:
                out.append(("tensor", np.dtype(np.uint8), None, it.name))  # skipped by load
            else:
                raise ValueError(f"dtype of tensor \"{it.name}\" unknown: pass ptc= or "
                                 f"coordinator= to Worker")
        return out

    def _fetch_ptc(self):
        self._ptc = self._coordinator.get_job(self.job_id, include_ptc=True).ptc
        return self._ptc


def _to_torch(torch, arr, enum):
    """A torch tensor sharing `arr`'s memory: uint16 bits as torch.bfloat16
    when the PTC's dtype `enum` is bfloat16 (torch has no uint16)."""
    if arr.dtype == np.uint16:
        t = torch.from_numpy(arr.view(np.int16))
        return t.view(torch.bfloat16) if enum == ptc_pb2.DTYPE_BFLOAT16 else t
    return torch.from_numpy(arr)


def _data_address(value):
    """The address of the first byte of an array's or tensor's data; None
    for other values (bytes, None)."""
    if _is_torch(value):
        try:  # a tensor without storage of its own (a DTensor, meta) has none
            return value.data_ptr() if value.device.type == "cpu" else None
        except (RuntimeError, AttributeError):
            return None
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0]
    return None


# Blocks of the copy-and-hash loops: small enough to be hashed from cache
# right after they were copied, large enough that the loop costs nothing.
_BLOCK_BYTES = 1 << 20
# Shared mappings have their page tables filled in one call instead of a
# fault per page (the agent made the pages already). Not for private
# mappings: populating a writable private mapping would copy every page.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _copy_blocks(dst, src, mm, offset, h, hash_first):
    """np.copyto(dst, src) a block at a time; with `h` (an xxh3_64 hasher),
    each block of the file bytes (the mapping `mm` from `offset`, which is
    `dst` when hash_first is False and `src` when True) is hashed right after
    (or before) it is copied. Blocks follow the file's byte order: whole
    runs of the first axis; arrays of rank 0 go in one block."""
    file_side = src if hash_first else dst
    if file_side.ndim == 0 or file_side.size == 0:
        np.copyto(dst, src, casting="no")
        if h is not None:
            h.update(memoryview(mm)[offset:offset + file_side.nbytes])
        return
    row = file_side.nbytes // file_side.shape[0]
    step = max(1, _BLOCK_BYTES // max(row, 1))
    view = memoryview(mm)
    try:
        for first in range(0, file_side.shape[0], step):
            last = min(first + step, file_side.shape[0])
            block = view[offset + first * row:offset + last * row]
            if h is not None and hash_first:
                h.update(block)
            np.copyto(dst[first:last], src[first:last], casting="no")
            if h is not None and not hash_first:
                h.update(block)
            block.release()
    finally:
        view.release()


def _open_map(fd, size, private=False, writable=False, populate=True):
    """Maps `size` bytes of the descriptor `fd` (closing it: the mapping
    holds its own reference to the file). populate=False: no MAP_POPULATE
    (the caller registers the mapping as pinned memory, which faults it in)."""
    if size == 0:
        os.close(fd)
        return None
    flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
    try:
        if writable:
            return mmap.mmap(fd, size, flags=flags,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if private:
            return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


class _Mapping:
    """A shared writable mapping of a rank buffer, closed on exit."""

    def __init__(self, fd, size, writable, populate=True):
        self._mm = _open_map(fd, size, writable=writable, populate=populate)

    def __enter__(self):
        return self._mm if self._mm is not None else bytearray()

    def __exit__(self, *exc):
        if self._mm is not None:
            _close(self._mm)


def _close(mm):
    """Unmaps now, or (while an array still views it, e.g. after an error
    mid-copy) leaves the unmapping to the garbage collector."""
    try:
        mm.close()
    except BufferError:
        pass
