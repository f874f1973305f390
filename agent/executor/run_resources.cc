#include "agent/executor/run_resources.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace reshard::agent {

StagingPtr StagingPool::Take(int64_t bytes) {
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->capacity >= bytes) {
      StagingPtr s = std::move(free_[i]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return s;
    }
  }
  return std::make_shared<Staging>(std::max(bytes, chunk_bytes_));
}

void StagingPool::Give(StagingPtr s) {
  if (s) free_.push_back(std::move(s));
}

Prefaulter::Prefaulter(std::vector<RankBufferPtr> buffers)
    : thread_([this, buffers = std::move(buffers)] {
        constexpr int64_t kSlice = int64_t{16} << 20;
        for (const RankBufferPtr& b : buffers) {
          for (int64_t at = 0; at < b->size() && !stop_.load(); at += kSlice) {
            (void)PrefaultPages(b->data() + at, std::min(kSlice, b->size() - at));
          }
        }
      }) {}

void Prefaulter::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string DescribeWait(const std::unordered_map<uint64_t, InFlight>& inflight,
                         const std::vector<RemoteStep>& remotes, bool locals_left) {
  const InFlight* first = nullptr;
  uint64_t first_seq = 0;
  for (const auto& [seq, f] : inflight) {
    if (first == nullptr || seq < first_seq) first = &f, first_seq = seq;
  }
  if (first == nullptr) return locals_left ? "local copies" : "";
  const RemoteStep& r = remotes[first->remote];
  return absl::StrCat("step ", r.step->index(), " (", r.is_send ? "send to" : "receive from",
                      " host \"", r.peer, "\")");
}

std::string DescribeSource(const v1::HostTask& task, int rank) {
  return absl::StrCat("sealed source of job \"", task.job_id(), "\" generation ",
                      task.from_generation(), " rank ", rank);
}

absl::StatusOr<std::vector<SourceLease>> LeaseSources(const HostSteps& hs) {
  std::vector<SourceLease> out;
  for (const auto& [rank, buf] : hs.old_bufs) {
    absl::StatusOr<std::unique_ptr<ReadLease>> l = buf->LeaseForReading();
    if (!l.ok()) return l.status();
    out.push_back(SourceLease{rank, *std::move(l)});
  }
  return out;
}

absl::Status CheckLeases(const std::vector<SourceLease>& leases, const v1::HostTask& task) {
  for (const SourceLease& l : leases) {
    if (l.lease->Broken()) {
      return absl::DataLossError(absl::StrCat(
          DescribeSource(task, l.rank),
          ": another process tried to truncate it or open it for writing while the task read it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::agent
