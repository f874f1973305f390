"""Dataset state of an elastic job: sample order, per-rank shares, a sampler.

Everything here is a pure function of the committed dataset state, written
from docs/data.md (the exact definitions and worked examples live there):

- order: the sample id at each position of the global, ordered sample stream
  (epoch e = stream index // num_samples; shuffle "none", "full" or "block",
  keyed by seed and epoch, O(1) per index, no permutation is materialised);
- share(cursor, global_batch, dp, rank, micro_batch_size): the stream range a
  data-parallel rank reads for the next step, cut at epoch boundaries and into
  micro-batches; no divisibility requirements (sizes differ by at most one);
- DatasetState: descriptor, order, global batch, cursor and layout fingerprint,
  to/from dict and the reshard.v1.DatasetState message; resume() checks a
  committed state against the run's configuration;
- ElasticSampler / ElasticBatchSampler: iterables of sample ids for one rank,
  usable without torch; TorchElasticSampler / TorchElasticBatchSampler are the
  torch.utils.data subclasses (torch is imported only when they are used).

The C++ side computes the same functions (common/data/data_share.h);
tests/data/share_vectors.json proves both agree bit for bit.
"""

import dataclasses
import hashlib

MASK64 = (1 << 64) - 1
GOLDEN64 = 0x9E3779B97F4A7C15
FEISTEL_ROUNDS = 6
SHUFFLES = ("none", "full", "block")
_MAX_INT63 = (1 << 63) - 1


# ------------------------------------------------------------ permutation


def splitmix64(x):
    """SplitMix64's output function of state x + golden (all mod 2**64)."""
    z = (x + GOLDEN64) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Permutation:
    """A keyed bijection of [0, n): a 6-round Feistel network over the
    smallest even bit width 2h with 4**h >= n, with cycle walking.

    Round key r is splitmix64(key + r * golden); the round function is
    splitmix64(round_key ^ right) & (2**h - 1). forward(i) and inverse(j) cost
    O(1) expected (fewer than 4 walks on average).
    """

    __slots__ = ("n", "half", "mask", "keys")

    def __init__(self, n, key):
        if n < 1:
            raise ValueError(f"permutation of {n} elements: n must be >= 1")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        self.keys = [splitmix64((key + r * GOLDEN64) & MASK64) for r in range(FEISTEL_ROUNDS)]

    def _encrypt(self, x):
        h, m = self.half, self.mask
        left, right = x >> h, x & m
        for k in self.keys:
            left, right = right, left ^ (splitmix64(k ^ right) & m)
        return (left << h) | right

    def _decrypt(self, y):
        h, m = self.half, self.mask
        left, right = y >> h, y & m
        for k in reversed(self.keys):
            left, right = right ^ (splitmix64(k ^ left) & m), left
        return (left << h) | right

    def forward(self, i):
        if not 0 <= i < self.n:
            raise ValueError(f"index {i} out of range [0, {self.n})")
        if self.n == 1:
            return 0
        y = self._encrypt(i)
        while y >= self.n:
            y = self._encrypt(y)
        return y

    def inverse(self, j):
        if not 0 <= j < self.n:
            raise ValueError(f"index {j} out of range [0, {self.n})")
        if self.n == 1:
            return 0
        x = self._decrypt(j)
        while x >= self.n:
            x = self._decrypt(x)
        return x


def epoch_key(seed, epoch):
    """The key of one epoch's order: splitmix64(splitmix64(seed) ^ epoch)."""
    return splitmix64(splitmix64(seed & MASK64) ^ (epoch & MASK64))


# ------------------------------------------------------------------ order


@dataclasses.dataclass(frozen=True)
class Order:
    """How the sample stream is ordered. shuffle: "none" (sample i at
    position i of every epoch), "full" (one keyed permutation of the dataset
    per epoch) or "block" (blocks of block_size consecutive samples are
    permuted, then the samples inside each block; the last block may be
    shorter). seed: 0 .. 2**64 - 1."""

    seed: int = 0
    shuffle: str = "none"
    block_size: int = 0

    def validate(self):
        if self.shuffle not in SHUFFLES:
            raise ValueError(f"order.shuffle: {self.shuffle!r} is not one of {', '.join(SHUFFLES)}")
        if not 0 <= self.seed <= MASK64:
            raise ValueError(f"order.seed: {self.seed} out of range [0, 2**64)")
        if self.shuffle == "block" and not 1 <= self.block_size <= _MAX_INT63:
            raise ValueError(f"order.block_size: {self.block_size} must be >= 1 for shuffle "
                             f"\"block\"")
        if self.shuffle != "block" and self.block_size != 0:
            raise ValueError(f"order.block_size: {self.block_size} is only meaningful for shuffle "
                             f"\"block\" (shuffle is {self.shuffle!r}); leave it 0")


class EpochOrder:
    """The order of one epoch: position -> sample id, O(1) per call. Not
    thread-safe: it keeps the permutation of the last block it used."""

    def __init__(self, num_samples, order, epoch):
        _check_num_samples(num_samples)
        order.validate()
        self.num_samples = num_samples
        self.order = order
        self.epoch = epoch
        key = epoch_key(order.seed, epoch)
        if order.shuffle == "full":
            self._perm = Permutation(num_samples, key)
        elif order.shuffle == "block":
            s = order.block_size
            self._blocks = -(-num_samples // s)
            self._tail = num_samples - (self._blocks - 1) * s
            self._key = key
            self._block_perm = Permutation(self._blocks, splitmix64(key))
            # Position (in block order) of the last source block, the only one
            # that may be shorter than block_size.
            self._tail_pos = self._block_perm.inverse(self._blocks - 1)
            self._inner = None  # (block, its Permutation) of the last sample() call

    def sample(self, position):
        n = self.num_samples
        if not 0 <= position < n:
            raise ValueError(f"position {position} out of range [0, {n})")
        shuffle = self.order.shuffle
        if shuffle == "none":
            return position
        if shuffle == "full":
            return self._perm.forward(position)
        s, q, tail = self.order.block_size, self._tail_pos, self._tail
        if position < q * s:
            p, o = divmod(position, s)
        elif position < q * s + tail:
            p, o = q, position - q * s
        else:
            p, o = divmod(position - q * s - tail, s)
            p += q + 1
        block = self._block_perm.forward(p)
        if self._inner is None or self._inner[0] != block:
            # Consecutive positions mostly share a block: keep its permutation.
            size = tail if block == self._blocks - 1 else s
            self._inner = (block, Permutation(
                size, splitmix64((self._key + (block + 1) * GOLDEN64) & MASK64)))
        return block * s + self._inner[1].forward(o)


def sample_at(num_samples, order, stream_index):
    """The sample id at global stream index `stream_index` (epoch
    stream_index // num_samples, position stream_index % num_samples)."""
    epoch, position = divmod(stream_index, num_samples)
    return EpochOrder(num_samples, order, epoch).sample(position)


# ------------------------------------------------------------------ shares


@dataclasses.dataclass(frozen=True)
class Segment:
    """Positions [begin, end) of epoch `epoch`: stream indices
    epoch * num_samples + [begin, end)."""

    epoch: int
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class RankShare:
    """What data-parallel rank `rank` of `dp` reads in one step.

    begin/end: its range [begin, end) of the global sample stream; count =
    end - begin (differs by at most one between ranks); segments: the range cut
    at epoch boundaries; micro_batches: the range cut into micro-batches of at
    most micro_batch_size samples whose sizes differ by at most one. weight =
    count / global_batch: scale this rank's per-sample-mean loss by
    weight * dp before an all-reduce mean (or its loss sum by 1 / global_batch
    before an all-reduce sum) so the step's gradient is the mean over the
    global batch whatever the split."""

    rank: int
    dp: int
    global_batch: int
    begin: int
    end: int
    segments: tuple
    micro_batches: tuple

    @property
    def count(self):
        return self.end - self.begin

    @property
    def weight(self):
        return self.count / self.global_batch


def share_counts(global_batch, dp):
    """Samples of each data-parallel rank for one step: the first
    global_batch % dp ranks get one more."""
    _check_share_args(0, global_batch, dp, 0)
    q, r = divmod(global_batch, dp)
    return [q + (1 if i < r else 0) for i in range(dp)]


def split_epochs(begin, end, num_samples):
    """Stream range [begin, end) cut where an epoch ends."""
    _check_num_samples(num_samples)
    out = []
    while begin < end:
        epoch, position = divmod(begin, num_samples)
        stop = min(end, (epoch + 1) * num_samples)
        out.append(Segment(epoch, position, position + (stop - begin)))
        begin = stop
    return tuple(out)


def micro_batches(begin, end, micro_batch_size):
    """[begin, end) cut into ceil(count / micro_batch_size) consecutive ranges
    whose sizes differ by at most one (the first ones larger); 0: one range."""
    if micro_batch_size < 0:
        raise ValueError(f"micro_batch_size: {micro_batch_size} must be >= 0")
    count = end - begin
    if count == 0:
        return ()
    k = 1 if micro_batch_size == 0 else -(-count // micro_batch_size)
    q, r = divmod(count, k)
    out, at = [], begin
    for j in range(k):
        size = q + (1 if j < r else 0)
        out.append((at, at + size))
        at += size
    return tuple(out)


def share(cursor, global_batch, dp, rank, micro_batch_size=0, num_samples=None):
    """The RankShare of `rank` for the step that starts at `cursor` (samples
    consumed so far). Ranks take consecutive stream ranges in rank order.
    Segments are computed when num_samples is given."""
    _check_share_args(cursor, global_batch, dp, rank)
    q, r = divmod(global_batch, dp)
    begin = cursor + rank * q + min(rank, r)
    end = begin + q + (1 if rank < r else 0)
    segments = split_epochs(begin, end, num_samples) if num_samples is not None else ()
    return RankShare(rank, dp, global_batch, begin, end, segments,
                     micro_batches(begin, end, micro_batch_size))


def _check_num_samples(num_samples):
    if not isinstance(num_samples, int) or not 1 <= num_samples <= _MAX_INT63:
        raise ValueError(f"num_samples: {num_samples} must be an integer in [1, 2**63)")


def _check_share_args(cursor, global_batch, dp, rank):
    if not 0 <= cursor <= _MAX_INT63:
        raise ValueError(f"cursor: {cursor} must be in [0, 2**63)")
    if not 1 <= global_batch <= _MAX_INT63 - cursor:
        raise ValueError(f"global_batch: {global_batch} must be >= 1 (and cursor + global_batch "
                         f"< 2**63)")
    if not 1 <= dp:
        raise ValueError(f"dp: {dp} must be >= 1")
    if not 0 <= rank < dp:
        raise ValueError(f"rank: {rank} out of range [0, {dp})")


# ------------------------------------------------------------- the state


@dataclasses.dataclass(frozen=True)
class DatasetDescriptor:
    """Which dataset: an id, its number of samples and a content fingerprint
    (any string the user chooses, e.g. a hash of the file list)."""

    id: str
    num_samples: int
    fingerprint: str = ""


def layout_fingerprint(descriptor, order, global_batch):
    """"sha256:<hex>" of what fixes the sample stream and the step size:
    dataset id, num_samples, fingerprint, seed, shuffle, block size and
    global batch (not dp: dp may change freely). See docs/data.md."""
    text = (f"reshard-data-v1\nid={descriptor.id}\nnum_samples={descriptor.num_samples}\n"
            f"fingerprint={descriptor.fingerprint}\nseed={order.seed}\nshuffle={order.shuffle}\n"
            f"block_size={order.block_size}\nglobal_batch={global_batch}\n")
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class DatasetState:
    """The dataset part of a job's state: committed with the model generation
    at a step boundary (Client.commit_step), restored after a resize.

    cursor: samples of the global stream consumed by committed steps; step:
    the last committed step (0: none). layout_fingerprint defaults to
    layout_fingerprint(descriptor, order, global_batch)."""

    descriptor: DatasetDescriptor
    order: Order = Order()
    global_batch: int = 1
    cursor: int = 0
    step: int = 0
    layout_fingerprint: str = ""
    # Output only (Job.dataset_state): the generation of the last commit, and when.
    committed_generation: int = dataclasses.field(default=0, compare=False)
    committed_unix_ms: int = dataclasses.field(default=0, compare=False)

    def __post_init__(self):
        if not self.layout_fingerprint:
            object.__setattr__(self, "layout_fingerprint",
                               layout_fingerprint(self.descriptor, self.order, self.global_batch))
        self.validate()

    def validate(self):
        _check_num_samples(self.descriptor.num_samples)
        if not self.descriptor.id:
            raise ValueError("descriptor.id: must not be empty")
        self.order.validate()
        _check_share_args(self.cursor, self.global_batch, 1, 0)
        if self.step < 0:
            raise ValueError(f"step: {self.step} must be >= 0")

    @property
    def epoch(self):
        """The epoch the next sample belongs to."""
        return self.cursor // self.descriptor.num_samples

    def share(self, dp, rank, micro_batch_size=0):
        """This state's next step for one rank (with epoch segments)."""
        return share(self.cursor, self.global_batch, dp, rank, micro_batch_size,
                     self.descriptor.num_samples)

    def samples(self, begin, end):
        """Sample ids of stream indices [begin, end)."""
        out = []
        for seg in split_epochs(begin, end, self.descriptor.num_samples):
            order = EpochOrder(self.descriptor.num_samples, self.order, seg.epoch)
            out.extend(order.sample(p) for p in range(seg.begin, seg.end))
        return out

    def advanced(self, steps=1):
        """The state after `steps` more committed steps."""
        return dataclasses.replace(self, cursor=self.cursor + steps * self.global_batch,
                                   step=self.step + steps)

    def to_dict(self):
        """The proto JSON mapping of reshard.v1.DatasetState (64-bit numbers
        as strings, as protobuf writes them)."""
        d = {
            "dataset": {"id": self.descriptor.id,
                           "numSamples": str(self.descriptor.num_samples),
                           "fingerprint": self.descriptor.fingerprint},
            "order": {"seed": str(self.order.seed), "shuffle": _SHUFFLE_ENUM[self.order.shuffle],
                      "blockSize": str(self.order.block_size)},
            "globalBatch": str(self.global_batch),
            "cursor": str(self.cursor),
            "step": str(self.step),
            "layoutFingerprint": self.layout_fingerprint,
        }
        if self.committed_generation:
            d["committedGeneration"] = str(self.committed_generation)
        if self.committed_unix_ms:
            d["committedUnixMs"] = str(self.committed_unix_ms)
        return d

    @classmethod
    def from_dict(cls, d):
        """From to_dict()'s form (camelCase or snake_case keys)."""
        def get(m, camel, snake, default=None):
            return m.get(camel, m.get(snake, default))
        desc, order = d.get("dataset", d.get("descriptor", {})), d.get("order", {})
        shuffle = order.get("shuffle", "none")
        shuffle = _SHUFFLE_NAME.get(shuffle, shuffle)
        return cls(
            descriptor=DatasetDescriptor(desc.get("id", ""),
                                         int(get(desc, "numSamples", "num_samples", 0)),
                                         desc.get("fingerprint", "")),
            order=Order(int(order.get("seed", 0)), shuffle,
                        int(get(order, "blockSize", "block_size", 0))),
            global_batch=int(get(d, "globalBatch", "global_batch", 0)),
            cursor=int(d.get("cursor", 0)), step=int(d.get("step", 0)),
            layout_fingerprint=get(d, "layoutFingerprint", "layout_fingerprint", ""),
            committed_generation=int(get(d, "committedGeneration", "committed_generation", 0)),
            committed_unix_ms=int(get(d, "committedUnixMs", "committed_unix_ms", 0)))

    def to_proto(self):
        """A reshard.v1.DatasetState message."""
        from reshard.core._proto import as_message, ptc_pb2
        return as_message(self.to_dict(), ptc_pb2.DatasetState, "dataset state")

    @classmethod
    def from_proto(cls, message):
        from reshard.core._proto import to_dict
        return cls.from_dict(to_dict(message))


def resume(committed, configured):
    """The state a (re)started or resized training run continues from: the
    job's `committed` state (Client.dataset_state(job_id)), after checking it
    against the run's `configured` one (its cursor and step are ignored).
    committed None (nothing committed yet): `configured`. Raises
    reshard.FailedPrecondition when the layout fingerprints differ: another
    dataset, order or global batch would silently skip or repeat samples."""
    if committed is None:
        return configured
    if committed.layout_fingerprint != configured.layout_fingerprint:
        from reshard.core.errors import FailedPrecondition
        raise FailedPrecondition(
            f"layout_fingerprint {configured.layout_fingerprint!r} of this run does not match the "
            f"committed {committed.layout_fingerprint!r} (dataset {committed.descriptor.id!r}, "
            f"global_batch {committed.global_batch}): refusing to resume", method="resume")
    return committed


_SHUFFLE_ENUM = {"none": "SHUFFLE_NONE", "full": "SHUFFLE_FULL", "block": "SHUFFLE_BLOCK"}
_SHUFFLE_NAME = {v: k for k, v in _SHUFFLE_ENUM.items()}


# ---------------------------------------------------------------- samplers


class ElasticSampler:
    """Sample ids of one data-parallel rank, step after step, starting at
    state.cursor and assuming every step commits (cursor += global_batch).

    After a resize or a failure, build a new sampler from the committed state
    (Client.get_job(...).dataset_state) with the new dp and rank: shares are a
    function of the global cursor only, so no sample is skipped or repeated
    within an epoch, and a step that did not commit is replayed.
    steps: how many steps to yield (None: forever)."""

    def __init__(self, state, dp, rank, micro_batch_size=0, steps=None):
        share(state.cursor, state.global_batch, dp, rank, micro_batch_size)  # validates
        self.state, self.dp, self.rank = state, dp, rank
        self.micro_batch_size, self.steps = micro_batch_size, steps

    def step_shares(self):
        """(state before the step, RankShare) for each step."""
        state, done = self.state, 0
        while self.steps is None or done < self.steps:
            yield state, state.share(self.dp, self.rank, self.micro_batch_size)
            state, done = state.advanced(), done + 1

    def micro_batch_ids(self):
        """Lists of sample ids, one per micro-batch of each step."""
        for state, sh in self.step_shares():
            for b, e in sh.micro_batches:
                yield state.samples(b, e)

    def __iter__(self):
        for state, sh in self.step_shares():
            yield from state.samples(sh.begin, sh.end)

    def __len__(self):
        if self.steps is None:
            raise TypeError("an ElasticSampler without steps= is endless")
        return sum(sh.count for _, sh in self.step_shares())


class ElasticBatchSampler(ElasticSampler):
    """Like ElasticSampler, but yields one list of sample ids per
    micro-batch (a DataLoader batch_sampler)."""

    def __iter__(self):
        return self.micro_batch_ids()

    def __len__(self):
        if self.steps is None:
            raise TypeError("an ElasticBatchSampler without steps= is endless")
        return sum(len(sh.micro_batches) for _, sh in self.step_shares())


_TORCH_CLASSES = {}


def __getattr__(name):
    # TorchElasticSampler / TorchElasticBatchSampler: torch is imported here,
    # on first use, never by `import reshard`.
    if name not in ("TorchElasticSampler", "TorchElasticBatchSampler"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _TORCH_CLASSES:
        import torch.utils.data
        base = ElasticSampler if name == "TorchElasticSampler" else ElasticBatchSampler

        def init(self, state, dp, rank, micro_batch_size=0, steps=None):
            base.__init__(self, state, dp, rank, micro_batch_size, steps)

        _TORCH_CLASSES[name] = type(name, (base, torch.utils.data.Sampler), {
            "__init__": init, "__doc__": f"{base.__name__} as a torch.utils.data.Sampler.",
            "__module__": __name__})
    return _TORCH_CLASSES[name]
