// The entries of a list (the holders of one region) grouped by host, so that
// the planner finds a needing host's local holders, and the first holder of
// every holding host, without scanning the whole list once per needing host.
// Reused across lists: indexing costs the list's length, not the number of
// hosts. Pure; not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::planner {

class HostRuns {
 public:
  explicit HostRuns(int num_hosts) : of_host_(num_hosts) {}

  /// Indexes entries 0 .. n - 1, entry i being on host `host_of(i)`.
  template <typename HostOf>
  void Index(int32_t n, HostOf host_of) {
    ++list_;
    hosts_.clear();
    for (int32_t i = 0; i < n; ++i) {
      Run& r = of_host_[host_of(i)];
      if (r.list != list_) {
        r = Run{list_, 0, 0};
        hosts_.push_back(host_of(i));
      }
      ++r.count;
    }
    int32_t at = 0;
    for (int32_t h : hosts_) {
      of_host_[h].begin = at;
      at += of_host_[h].count;
    }
    entries_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      Run& r = of_host_[host_of(i)];
      entries_[r.begin + r.filled++] = i;
    }
  }

  /// Entries on `host`, ascending; Count(host) of them.
  int32_t Count(int host) const {
    const Run& r = of_host_[host];
    return r.list == list_ ? r.count : 0;
  }
  const int32_t* On(int host) const { return entries_.data() + of_host_[host].begin; }

  /// The hosts holding any entry, in the order of their first entry.
  const std::vector<int32_t>& hosts() const { return hosts_; }

 private:
  struct Run {
    int64_t list = -1;  // the Index() call that last saw the host
    int32_t begin = 0;
    int32_t count = 0;
    int32_t filled = 0;
  };
  std::vector<Run> of_host_;
  std::vector<int32_t> hosts_;
  std::vector<int32_t> entries_;  // entry indices grouped by host
  int64_t list_ = 0;
};

}  // namespace reshard::planner
