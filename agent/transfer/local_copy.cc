#include "agent/transfer/local_copy.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/log.h"

namespace reshard::agent {
namespace {

// A copy with dimensions merged where every region is contiguous across them,
// strides and offsets in bytes.
struct Plan {
  std::vector<int64_t> shape;
  std::vector<int64_t> src_strides;               // bytes
  std::vector<std::vector<int64_t>> dst_strides;  // bytes, per destination
  int64_t run_bytes = 0;  // bytes of the innermost contiguous run (>= element)
  int element_bytes = 0;
  bool inner_contiguous = false;  // innermost dim: stride == element for all
  bool nontemporal = false;       // contiguous runs bypass the cache (see CopyRun)
};

// Runs at least this long are worth streaming stores when the copy is large.
constexpr int64_t kNonTemporalMinRun = 1024;

// Copies one contiguous run. With `nontemporal`, the destination is written
// with streaming stores: a large copy then moves each byte twice through
// memory (read source, write destination) instead of three times (the
// destination line is otherwise read for ownership first), and does not
// evict what the cache holds. glibc's memcpy does the same, but only above
// its own threshold (192 MiB here) and never for the short runs of a strided
// copy. The caller issues a store fence before the bytes are handed on.
inline void CopyRun(uint8_t* dst, const uint8_t* src, int64_t n, bool nontemporal) {
#if defined(__SSE2__)
  if (nontemporal && n >= kNonTemporalMinRun) {
    const int64_t head = static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
      // The hardware prefetcher stops at page ends, and runs of a strided
      // copy end every few pages; reading ahead (within the run: what follows
      // it is not read) keeps the loads streaming.
      if (n >= 512 + 64) _mm_prefetch(reinterpret_cast<const char*>(src) + 512, _MM_HINT_NTA);
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
  }
#else
  (void)nontemporal;
#endif
  std::memcpy(dst, src, n);
}

// Makes streaming stores visible before another thread reads the bytes.
inline void StoreFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

Plan MakePlan(const std::vector<int64_t>& shape, const std::vector<int64_t>& src_strides,
              const std::vector<const std::vector<int64_t>*>& dst_strides, int element_bytes) {
  Plan p;
  p.element_bytes = element_bytes;
  p.dst_strides.resize(dst_strides.size());
  // Keep dimensions of size > 1, outermost first.
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    p.shape.push_back(shape[k]);
    p.src_strides.push_back(src_strides[k] * element_bytes);
    for (size_t d = 0; d < dst_strides.size(); ++d) {
      p.dst_strides[d].push_back((*dst_strides[d])[k] * element_bytes);
    }
  }
  // Merge dimension k into k-1 when stride[k-1] == stride[k] * shape[k] everywhere.
  for (size_t k = p.shape.size(); k-- > 1;) {
    auto mergeable = [&](const std::vector<int64_t>& s) { return s[k - 1] == s[k] * p.shape[k]; };
    bool ok = mergeable(p.src_strides);
    for (const auto& s : p.dst_strides) ok = ok && mergeable(s);
    if (!ok) continue;
    p.shape[k - 1] *= p.shape[k];
    p.src_strides[k - 1] = p.src_strides[k];
    p.shape.erase(p.shape.begin() + k);
    p.src_strides.erase(p.src_strides.begin() + k);
    for (auto& s : p.dst_strides) {
      s[k - 1] = s[k];
      s.erase(s.begin() + k);
    }
  }
  p.run_bytes = element_bytes;
  if (!p.shape.empty()) {
    bool inner = p.src_strides.back() == element_bytes;
    for (const auto& s : p.dst_strides) inner = inner && s.back() == element_bytes;
    if (inner) {
      p.inner_contiguous = true;
      p.run_bytes = p.shape.back() * element_bytes;
      p.shape.pop_back();
      p.src_strides.pop_back();
      for (auto& s : p.dst_strides) s.pop_back();
    }
  }
  return p;
}

template <typename T>
void CopyElements(const uint8_t* src, int64_t ss, uint8_t* dst, int64_t ds, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * ss, sizeof(T));
    std::memcpy(dst + i * ds, &v, sizeof(T));
  }
}

// Innermost strided dimension of n elements.
void CopyStridedRow(const uint8_t* src, int64_t ss, uint8_t* dst, int64_t ds, int64_t n, int eb) {
  switch (eb) {
    case 1:
      return CopyElements<uint8_t>(src, ss, dst, ds, n);
    case 2:
      return CopyElements<uint16_t>(src, ss, dst, ds, n);
    case 4:
      return CopyElements<uint32_t>(src, ss, dst, ds, n);
    case 8:
      return CopyElements<uint64_t>(src, ss, dst, ds, n);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, eb);
  }
}

// Copies dims [dim, rank) of `p`, the outermost of them limited to [begin, end).
void Run(const Plan& p, size_t dim, int64_t begin, int64_t end, const uint8_t* src,
         const std::vector<uint8_t*>& dsts) {
  const size_t rank = p.shape.size();
  if (rank == 0) {
    for (uint8_t* d : dsts) CopyRun(d, src, p.run_bytes, p.nontemporal);
    return;
  }
  // The last remaining dimension with strided elements: a tight loop.
  if (dim + 1 == rank && !p.inner_contiguous) {
    for (size_t d = 0; d < dsts.size(); ++d) {
      CopyStridedRow(src + begin * p.src_strides[dim], p.src_strides[dim],
                     dsts[d] + begin * p.dst_strides[d][dim], p.dst_strides[d][dim], end - begin,
                     p.element_bytes);
    }
    return;
  }
  std::vector<uint8_t*> next(dsts.size());
  for (int64_t i = begin; i < end; ++i) {
    const uint8_t* s = src + i * p.src_strides[dim];
    for (size_t d = 0; d < dsts.size(); ++d) next[d] = dsts[d] + i * p.dst_strides[d][dim];
    if (dim + 1 == rank) {
      for (uint8_t* d : next) CopyRun(d, s, p.run_bytes, p.nontemporal);
    } else {
      Run(p, dim + 1, 0, p.shape[dim + 1], s, next);
    }
  }
}

}  // namespace

class LocalCopier::Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  // Runs fn(0..n-1), the caller taking part; returns when all are done.
  void ParallelFor(int n, const std::function<void(int)>& fn) {
    struct Batch {
      std::mutex mu;
      std::condition_variable cv;
      int left;
    };
    auto batch = std::make_shared<Batch>();
    batch->left = n - 1;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int i = 1; i < n; ++i) {
        queue_.push_back([batch, &fn, i] {
          fn(i);
          std::lock_guard<std::mutex> bl(batch->mu);
          if (--batch->left == 0) batch->cv.notify_all();
        });
      }
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> bl(batch->mu);
    batch->cv.wait(bl, [&] { return batch->left == 0; });
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    s[k] = acc;
    acc *= shape[k];
  }
  return s;
}

bool IsContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] == 1) continue;
    if (strides[k] != expect) return false;
    expect *= shape[k];
  }
  return true;
}

LocalCopier::LocalCopier(int threads) : threads_(std::max(1, threads)) {
  if (threads_ > 1) pool_ = std::make_unique<Pool>(threads_ - 1);
}

LocalCopier::~LocalCopier() = default;

void LocalCopier::Copy(const StridedView& src, const std::vector<MutableStridedView>& dsts,
                       const std::vector<int64_t>& shape, int element_bytes) {
  RESHARD_CHECK(element_bytes > 0);
  RESHARD_CHECK(src.strides.size() == shape.size());
  int64_t elements = 1;
  for (int64_t n : shape) elements *= n;
  if (elements == 0 || dsts.empty()) return;
  std::vector<const std::vector<int64_t>*> dst_strides;
  std::vector<uint8_t*> dst_bases;
  for (const auto& d : dsts) {
    RESHARD_CHECK(d.strides.size() == shape.size());
    dst_strides.push_back(&d.strides);
    dst_bases.push_back(d.base + d.offset * element_bytes);
  }
  Plan p = MakePlan(shape, src.strides, dst_strides, element_bytes);
  const uint8_t* s = src.base + src.offset * element_bytes;
  const int64_t bytes = elements * element_bytes;
  p.nontemporal = bytes >= kNonTemporalThresholdBytes && p.run_bytes >= kNonTemporalMinRun;
  if (!pool_ || bytes < kParallelThresholdBytes) {
    Run(p, 0, 0, p.shape.empty() ? 1 : p.shape[0], s, dst_bases);
    if (p.nontemporal) StoreFence();
    return;
  }
  if (p.shape.empty()) {  // one contiguous run: split it
    const int parts = threads_;
    pool_->ParallelFor(parts, [&](int part) {
      // Cut at 64-byte multiples so that every part streams whole lines.
      const int64_t begin = p.run_bytes * part / parts / 64 * 64;
      const int64_t end =
          part + 1 == parts ? p.run_bytes : p.run_bytes * (part + 1) / parts / 64 * 64;
      for (uint8_t* d : dst_bases) CopyRun(d + begin, s + begin, end - begin, p.nontemporal);
      if (p.nontemporal) StoreFence();
    });
    return;
  }
  const int64_t outer = p.shape[0];
  const int parts = static_cast<int>(std::min<int64_t>(threads_, outer));
  pool_->ParallelFor(parts, [&](int part) {
    const int64_t begin = outer * part / parts;
    const int64_t end = outer * (part + 1) / parts;
    Run(p, 0, begin, end, s, dst_bases);
    if (p.nontemporal) StoreFence();  // before the pool reports this part done
  });
}

void LocalCopier::Pack(const StridedView& src, const std::vector<int64_t>& shape, int element_bytes,
                       uint8_t* out) {
  Copy(src, {MutableStridedView{out, 0, ContiguousStrides(shape)}}, shape, element_bytes);
}

void LocalCopier::Unpack(const uint8_t* in, const std::vector<MutableStridedView>& dsts,
                         const std::vector<int64_t>& shape, int element_bytes) {
  Copy(StridedView{in, 0, ContiguousStrides(shape)}, dsts, shape, element_bytes);
}

}  // namespace reshard::agent
