// LocalCopier against a naive element loop on random shapes and strides.
#include "agent/transfer/local_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

namespace reshard::agent {
namespace {

// A random region of `shape` inside a buffer: dimensions permuted and padded so
// strides are neither contiguous nor in order. Returns the buffer elements needed.
int64_t RandomStrides(std::mt19937_64& rng, const std::vector<int64_t>& shape,
                      std::vector<int64_t>* strides, int64_t* offset) {
  const size_t n = shape.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (rng() % 3 == 0) std::shuffle(order.begin(), order.end(), rng);
  strides->assign(n, 0);
  int64_t acc = 1;
  for (size_t j = n; j-- > 0;) {  // order[n-1] innermost
    const size_t k = order[j];
    (*strides)[k] = acc;
    acc *= shape[k] + static_cast<int64_t>(rng() % 2 == 0 ? 0 : rng() % 3);
  }
  *offset = static_cast<int64_t>(rng() % 5);
  return *offset + acc;
}

void NaiveCopy(const uint8_t* src, int64_t so, const std::vector<int64_t>& ss, uint8_t* dst,
               int64_t d_off, const std::vector<int64_t>& ds, const std::vector<int64_t>& shape,
               int eb) {
  const size_t n = shape.size();
  std::vector<int64_t> i(n, 0);
  for (int64_t x : shape) {
    if (x == 0) return;
  }
  for (;;) {
    int64_t s = so, d = d_off;
    for (size_t k = 0; k < n; ++k) {
      s += i[k] * ss[k];
      d += i[k] * ds[k];
    }
    std::memcpy(dst + d * eb, src + s * eb, eb);
    size_t k = n;
    while (k > 0) {
      --k;
      if (++i[k] < shape[k]) break;
      i[k] = 0;
      if (k == 0) return;
    }
    if (n == 0) return;
  }
}

void RandomCase(std::mt19937_64& rng, LocalCopier* copier, int max_elements) {
  const int ndim = static_cast<int>(rng() % 5);
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (int k = 0; k < ndim; ++k) {
    int64_t x = 1 + static_cast<int64_t>(rng() % 9);
    if (elements * x > max_elements) x = 1;
    shape.push_back(x);
    elements *= x;
  }
  const int ebs[] = {1, 2, 4, 8, 3, 6};
  const int eb = ebs[rng() % 6];
  StridedView src;
  std::vector<int64_t> sstr;
  int64_t soff;
  const int64_t src_n = RandomStrides(rng, shape, &sstr, &soff);
  std::vector<uint8_t> src_buf(src_n * eb);
  for (auto& b : src_buf) b = static_cast<uint8_t>(rng());
  src = StridedView{src_buf.data(), soff, sstr};

  const int ndst = 1 + static_cast<int>(rng() % 3);
  std::vector<std::vector<uint8_t>> got(ndst), want(ndst);
  std::vector<MutableStridedView> dsts;
  for (int d = 0; d < ndst; ++d) {
    std::vector<int64_t> dstr;
    int64_t doff;
    const int64_t n = RandomStrides(rng, shape, &dstr, &doff);
    got[d].assign(n * eb, 0xee);
    want[d] = got[d];
    NaiveCopy(src_buf.data(), soff, sstr, want[d].data(), doff, dstr, shape, eb);
    dsts.push_back(MutableStridedView{got[d].data(), doff, dstr});
  }
  copier->Copy(src, dsts, shape, eb);
  for (int d = 0; d < ndst; ++d) ASSERT_EQ(got[d], want[d]) << "dst " << d;

  // Pack then Unpack reproduces the same destinations.
  std::vector<uint8_t> packed(elements * eb);
  std::vector<uint8_t> want_packed(elements * eb);
  NaiveCopy(src_buf.data(), soff, sstr, want_packed.data(), 0, ContiguousStrides(shape), shape, eb);
  copier->Pack(src, shape, eb, packed.data());
  ASSERT_EQ(packed, want_packed);
  for (int d = 0; d < ndst; ++d) std::fill(got[d].begin(), got[d].end(), 0xee);
  copier->Unpack(packed.data(), dsts, shape, eb);
  for (int d = 0; d < ndst; ++d) ASSERT_EQ(got[d], want[d]) << "unpack dst " << d;
}

TEST(LocalCopyTest, RandomShapesAndStridesMatchNaiveLoop) {
  std::mt19937_64 rng(42);
  LocalCopier copier(1);
  for (int i = 0; i < 2000; ++i) RandomCase(rng, &copier, 4096);
}

TEST(LocalCopyTest, ThreadedLargeCopiesMatchNaiveLoop) {
  std::mt19937_64 rng(7);
  LocalCopier copier(4);
  // Big enough to cross kParallelThresholdBytes.
  for (int i = 0; i < 4; ++i) {
    std::vector<int64_t> shape = {64, 3, 1024 * (1 + i)};
    std::vector<int64_t> sstr, dstr;
    int64_t soff, doff;
    const int64_t sn = RandomStrides(rng, shape, &sstr, &soff);
    const int64_t dn = RandomStrides(rng, shape, &dstr, &doff);
    const int eb = 8;
    std::vector<uint8_t> src(sn * eb), got(dn * eb, 0), want(dn * eb, 0);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    NaiveCopy(src.data(), soff, sstr, want.data(), doff, dstr, shape, eb);
    copier.Copy(StridedView{src.data(), soff, sstr}, {MutableStridedView{got.data(), doff, dstr}},
                shape, eb);
    ASSERT_EQ(got, want) << "case " << i;
  }
}

// Copies above kNonTemporalThresholdBytes stream their runs past the cache:
// unaligned starts, runs that are not a multiple of 64 bytes, two
// destinations, one thread or several; and one long contiguous run split
// over threads.
TEST(LocalCopyTest, LargeCopiesWithStreamingStoresMatchNaiveLoop) {
  std::mt19937_64 rng(11);
  const std::vector<int64_t> shape = {2100, 1027};  // 4108-byte runs, 8.6 MB
  const int eb = 4;
  ASSERT_GE(shape[0] * shape[1] * eb, LocalCopier::kNonTemporalThresholdBytes);
  const std::vector<int64_t> sstr = {1100, 1}, d0str = {1030, 1}, d1str = {1027, 1};
  const int64_t soff = 3, d0off = 5, d1off = 1;
  std::vector<uint8_t> src((soff + shape[0] * sstr[0]) * eb);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int threads : {1, 3}) {
    LocalCopier copier(threads);
    std::vector<uint8_t> got0((d0off + shape[0] * d0str[0]) * eb, 0), want0 = got0;
    std::vector<uint8_t> got1((d1off + shape[0] * d1str[0]) * eb, 0), want1 = got1;
    NaiveCopy(src.data(), soff, sstr, want0.data(), d0off, d0str, shape, eb);
    NaiveCopy(src.data(), soff, sstr, want1.data(), d1off, d1str, shape, eb);
    copier.Copy(StridedView{src.data(), soff, sstr},
                {MutableStridedView{got0.data(), d0off, d0str},
                 MutableStridedView{got1.data(), d1off, d1str}},
                shape, eb);
    ASSERT_EQ(got0, want0) << threads << " threads";
    ASSERT_EQ(got1, want1) << threads << " threads";

    const int64_t n = (int64_t{9} << 20) + 13;  // one run
    std::vector<uint8_t> run(n + 7), flat(n + 16, 0);
    for (auto& b : run) b = static_cast<uint8_t>(rng());
    copier.Copy(StridedView{run.data(), 7, {1}}, {MutableStridedView{flat.data(), 3, {1}}}, {n}, 1);
    ASSERT_EQ(0, std::memcmp(flat.data() + 3, run.data() + 7, n)) << threads << " threads";
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, n + 3, n + 15}) {
      ASSERT_EQ(flat[i], 0) << "byte " << i << " outside the destination written";
    }
  }
}

TEST(LocalCopyTest, ContiguityHelpers) {
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_TRUE(IsContiguous({2, 3, 4}, {12, 4, 1}));
  EXPECT_TRUE(IsContiguous({1, 3, 4}, {99, 4, 1}));
  EXPECT_FALSE(IsContiguous({2, 3, 4}, {24, 4, 1}));
  EXPECT_TRUE(IsContiguous({}, {}));
}

TEST(LocalCopyTest, EmptyShapeCopiesNothing) {
  LocalCopier copier(2);
  uint8_t src[4] = {1, 2, 3, 4}, dst[4] = {};
  copier.Copy(StridedView{src, 0, {1, 1}}, {MutableStridedView{dst, 0, {1, 1}}}, {0, 4}, 1);
  EXPECT_EQ(dst[0], 0);
}

}  // namespace
}  // namespace reshard::agent
