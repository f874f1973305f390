#include "agent/executor/precopy_check.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/executor/step_chunks.h"
#include "agent/transfer/local_copy.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

// Runs fn(i) for every i < n on up to `threads` threads (this one included);
// stops handing out indexes once fn returns false.
void ForEach(size_t n, int threads, const std::function<bool(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  auto run = [&] {
    for (size_t i; !stop.load() && (i = next.fetch_add(1)) < n;) {
      if (!fn(i)) stop = true;
    }
  };
  const size_t helpers = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads))) - (n > 0);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < helpers; ++t) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
}

}  // namespace

int64_t PrecopyRegion::bytes() const {
  int64_t n = element_bytes;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<PrecopyRegion> PrecopyRegions(const v1::TransferPlan& plan, const HostSteps& hs) {
  std::vector<PrecopyRegion> out;
  auto add_step = [&](const v1::CopyStep& step, const std::string& how) {
    for (const auto& d : step.dsts()) {
      PrecopyRegion r;
      r.step = step.index();
      r.rank = d.rank();
      r.item = step.item();
      r.offset = d.region().offset();
      r.strides = ToVector(d.region().strides());
      r.shape = ToVector(step.shape());
      r.element_bytes = static_cast<int>(plan.items(step.item()).element_bytes());
      r.what = absl::StrCat("step ", step.index(), " (", how, ")");
      out.push_back(std::move(r));
    }
  };
  for (const v1::CopyStep* step : hs.locals) {
    add_step(*step, absl::StrCat("a local copy from old rank ", step->src_rank()));
  }
  for (const RemoteStep& r : hs.remotes) {
    if (!r.is_send) add_step(*r.step, absl::StrCat("received from host \"", r.peer, "\""));
  }
  for (const v1::ZeroFill* f : hs.fills) {
    PrecopyRegion r;
    r.rank = f->rank();
    r.item = f->item();
    r.offset = f->offset();
    r.strides = {1};
    r.shape = {f->count()};
    r.element_bytes = static_cast<int>(plan.items(f->item()).element_bytes());
    r.what = absl::StrCat("a zero fill of ", f->count(), " elements at ", f->offset());
    out.push_back(std::move(r));
  }
  return out;
}

uint64_t RegionChecksum(const uint8_t* item_base, const PrecopyRegion& region) {
  const std::vector<int64_t>& shape = region.shape;
  const std::vector<int64_t>& strides = region.strides;
  RESHARD_CHECK(shape.size() == strides.size());
  const int64_t eb = region.element_bytes;
  if (region.bytes() == 0) return XXH3_64bits(nullptr, 0);
  if (IsContiguous(shape, strides)) {
    return XXH3_64bits(item_base + region.offset * eb, static_cast<size_t>(region.bytes()));
  }
  // Contiguous runs along the innermost dimension when its stride is 1.
  const size_t n = shape.size();
  const bool inner_run = strides[n - 1] == 1;
  const int64_t run_elements = inner_run ? shape[n - 1] : 1;
  const size_t outer = inner_run ? n - 1 : n;  // dimensions iterated one by one
  XXH3_state_t* state = XXH3_createState();
  RESHARD_CHECK(state != nullptr && XXH3_64bits_reset(state) == XXH_OK);
  std::vector<int64_t> index(outer, 0);
  for (;;) {
    int64_t at = region.offset;
    for (size_t k = 0; k < outer; ++k) at += index[k] * strides[k];
    RESHARD_CHECK(XXH3_64bits_update(state, item_base + at * eb,
                                     static_cast<size_t>(run_elements * eb)) == XXH_OK);
    size_t k = outer;
    while (k > 0 && ++index[k - 1] == shape[k - 1]) index[--k] = 0;
    if (k == 0) break;
  }
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

void ChecksumRegions(const BufferOfRank& buffer, int threads, std::vector<PrecopyRegion>* regions) {
  ForEach(regions->size(), threads, [&](size_t i) {
    PrecopyRegion& r = (*regions)[i];
    r.checksum = RegionChecksum(buffer(r.rank)->item_data(r.item), r);
    return true;
  });
}

absl::Status VerifyPrecopy(const std::vector<PrecopyRegion>& regions,
                           const std::set<int64_t>& rewritten, const BufferOfRank& buffer,
                           const v1::TransferPlan& plan, const std::string& job,
                           int64_t generation, int threads) {
  std::vector<const PrecopyRegion*> check;
  for (const PrecopyRegion& r : regions) {
    if (r.step < 0 || rewritten.count(r.step) == 0) check.push_back(&r);
  }
  std::mutex mu;
  const PrecopyRegion* bad = nullptr;
  uint64_t now_sum = 0;
  ForEach(check.size(), threads, [&](size_t i) {
    const PrecopyRegion& r = *check[i];
    const uint64_t now = RegionChecksum(buffer(r.rank)->item_data(r.item), r);
    if (now == r.checksum) return true;
    std::lock_guard<std::mutex> l(mu);
    if (bad == nullptr || r.step < bad->step) bad = &r, now_sum = now;
    return false;
  });
  if (bad == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "job \"", job, "\" generation ", generation, " rank ", bad->rank, " item ", bad->item,
      " (\"", plan.items(bad->item).name(), "\"): the ", bad->bytes(), " bytes of ", bad->what,
      " that the prepare wrote and the cut-over skipped (unchanged source) read back as ",
      absl::Hex(now_sum, absl::kZeroPad16), ", not the ",
      absl::Hex(bad->checksum, absl::kZeroPad16),
      " written: the pre-copy changed after the prepare; nothing of it is committed"));
}

void PrecopyRecords::Put(const std::string& host, const std::string& operation, Record record) {
  auto p = std::make_shared<const Record>(std::move(record));
  std::lock_guard<std::mutex> l(mu_);
  records_[{host, operation}] = std::move(p);
}

PrecopyRecords::RecordPtr PrecopyRecords::Find(const std::string& host,
                                               const std::string& operation) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = records_.find({host, operation});
  return it == records_.end() ? nullptr : it->second;
}

void PrecopyRecords::Erase(const std::string& host, const std::string& operation) {
  std::lock_guard<std::mutex> l(mu_);
  records_.erase({host, operation});
}

void PrecopyRecords::Prune(ShardStore& store) {
  std::vector<std::pair<std::pair<std::string, std::string>, RecordPtr>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.assign(records_.begin(), records_.end());
  }
  for (const auto& [key, record] : all) {
    bool gone = false;
    for (int rank : record->ranks) {
      absl::StatusOr<RankBufferPtr> b = store.Get({record->job, record->generation, rank});
      gone = gone || !b.ok() || (*b)->sealed();
    }
    if (!gone) continue;
    std::lock_guard<std::mutex> l(mu_);
    auto it = records_.find(key);
    if (it != records_.end() && it->second == record) records_.erase(it);
  }
}

size_t PrecopyRecords::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return records_.size();
}

}  // namespace reshard::agent
