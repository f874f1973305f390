#include "bench/planner/plan_fingerprint.h"

#include <string>

namespace reshard::bench {
namespace {

class Fnv {
 public:
  void Add(int64_t v) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
  }
  void Add(const std::string& s) {
    Add(static_cast<int64_t>(s.size()));
    for (char c : s) Byte(static_cast<uint8_t>(c));
  }
  // A region: its offset, then its first `ndim` strides.
  void Add(int64_t offset, const int64_t* strides, int ndim) {
    Add(offset);
    for (int d = 0; d < ndim; ++d) Add(strides[d]);
  }
  uint64_t value() const { return h_; }

 private:
  void Byte(uint8_t b) {
    h_ ^= b;
    h_ *= 1099511628211ull;
  }
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace

uint64_t PlanFingerprint(const planner::Plan& plan) {
  Fnv f;
  f.Add(static_cast<int64_t>(plan.items.size()));
  for (const planner::Plan::Item& it : plan.items) {
    f.Add(it.name);
    f.Add(it.is_blob);
    f.Add(it.element_bytes);
    f.Add(it.ndim);
  }
  if (plan.replicas.count > 1) {  // left out otherwise: the older fingerprints stand
    f.Add(plan.replicas.count);
    f.Add(plan.replicas.src_stride);
    f.Add(plan.replicas.dst_stride);
  }
  f.Add(static_cast<int64_t>(plan.steps.size()));
  for (const planner::Plan::Step& s : plan.steps) {
    f.Add(s.item);
    f.Add(s.src_rank);
    f.Add(s.cross_host);
    f.Add(s.ndim);
    f.Add(s.bytes);
    for (int d = 0; d < s.ndim; ++d) f.Add(plan.ShapeOf(s)[d]);
    f.Add(s.src_offset, plan.StridesOf(s.src_strides), s.ndim);
    f.Add(s.dst_end - s.dst_begin);
    for (int32_t i = s.dst_begin; i < s.dst_end; ++i) {
      f.Add(plan.dsts[i].rank);
      f.Add(plan.dsts[i].offset, plan.StridesOf(plan.dsts[i].strides), s.ndim);
    }
  }
  f.Add(static_cast<int64_t>(plan.fills.size()));
  for (const planner::Plan::Fill& z : plan.fills) {
    f.Add(z.item);
    f.Add(z.rank);
    f.Add(z.offset);
    f.Add(z.count);
  }
  f.Add(static_cast<int64_t>(plan.lost_ranks.size()));
  for (int r : plan.lost_ranks) f.Add(r);
  f.Add(static_cast<int64_t>(plan.regenerate.size()));
  for (const auto& [rank, item] : plan.regenerate) {
    f.Add(rank);
    f.Add(item);
  }
  f.Add(plan.bytes_local);
  f.Add(plan.bytes_cross_host);
  f.Add(plan.lower_bound_cross_host);
  f.Add(plan.bytes_zero_filled);
  f.Add(plan.cross_host_steps);
  f.Add(static_cast<int64_t>(plan.hosts.size()));
  for (const planner::Plan::HostStats& h : plan.hosts) {
    f.Add(h.host);
    f.Add(h.bytes_in);
    f.Add(h.bytes_out);
    f.Add(h.bytes_local);
  }
  const planner::RemoteSends& rs = plan.remote_sends;
  f.Add(rs.num_hosts);
  f.Add(rs.size());
  for (int64_t i = 0; i < rs.size(); ++i) {
    f.Add(rs.bytes[i]);
    f.Add(rs.Candidates(i));
    for (int k = 0; k < rs.Candidates(i); ++k) f.Add(rs.CandidatesBegin(i)[k]);
    f.Add(i < static_cast<int64_t>(rs.chosen.size()) ? rs.chosen[i] : -2);
  }
  return f.value();
}

}  // namespace reshard::bench
