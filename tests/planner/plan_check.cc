#include "tests/planner/plan_check.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "verifier/verifier.h"

namespace reshard::planner::testing {
namespace {

using Buffers = std::vector<std::vector<std::vector<int64_t>>>;  // [item][rank][pos]

// What each rank's buffer of each item holds: the global flat index of a
// tensor element, value * size + byte for a blob, -1 for padding.
Buffers Contents(const v1::Ptc& ptc, const v1::Layout& layout, int world, int old_world) {
  Buffers out(ptc.tensors_size() + ptc.blobs_size(), std::vector<std::vector<int64_t>>(world));
  std::map<std::string, int> index;
  for (int i = 0; i < ptc.tensors_size(); ++i) index[ptc.tensors(i).name()] = i;
  for (const v1::Shard& s : DeriveShards(ptc, layout)) {
    const int item = index.at(s.tensor());
    const v1::TensorSpec& t = ptc.tensors(item);
    std::vector<int64_t>& buf = out[item][s.rank()];
    buf.assign(s.local_elements(), -1);
    std::vector<int64_t> gstrides(t.shape_size());
    RowMajorStrides(t.shape_size(), t.shape().data(), gstrides.data());
    for (const v1::ShardPiece& p : s.pieces()) {
      const int nd = p.global().offset_size();
      std::vector<int64_t> idx(nd, 0);
      int64_t n = 1;
      for (int d = 0; d < nd; ++d) n *= p.global().size(d);
      for (int64_t k = 0; k < n; ++k) {
        int64_t g = 0, l = p.local_offset();
        for (int d = 0; d < nd; ++d) {
          g += (p.global().offset(d) + idx[d]) * gstrides[d];
          l += idx[d] * p.local_strides(d);
        }
        buf.at(l) = g;
        for (int d = nd - 1; d >= 0; --d) {
          if (++idx[d] < p.global().size(d)) break;
          idx[d] = 0;
        }
      }
    }
  }
  for (int b = 0; b < ptc.blobs_size(); ++b) {
    const v1::BlobSpec& blob = ptc.blobs(b);
    for (int r = 0; r < world; ++r) {
      const int64_t value = blob.scope() == v1::BLOB_PER_RANK ? r % old_world : 0;
      std::vector<int64_t>& buf = out[ptc.tensors_size() + b][r];
      for (int64_t k = 0; k < blob.size_bytes(); ++k) buf.push_back(value * blob.size_bytes() + k);
    }
  }
  return out;
}

int64_t Key(int item, int64_t g) { return (int64_t{item} << 40) | g; }

}  // namespace

Plan WrittenOut(const Plan& plan) {
  Plan out = plan;
  out.replicas = Plan::Replicas{};
  out.steps.clear();
  out.dsts.clear();
  out.fills.clear();
  out.regenerate.clear();
  ForEachStep(plan, [&](const Plan::Step& s, const ReplicaShift& at) {
    Plan::Step step = s;
    step.src_rank += at.src;
    step.dst_begin = static_cast<int32_t>(out.dsts.size());
    for (int32_t d = s.dst_begin; d < s.dst_end; ++d) {
      Plan::Dst dst = plan.dsts[d];
      dst.rank += at.dst;
      out.dsts.push_back(dst);
    }
    step.dst_end = static_cast<int32_t>(out.dsts.size());
    out.steps.push_back(step);
  });
  ForEachFill(plan, [&](const Plan::Fill& f, const ReplicaShift& at) {
    Plan::Fill fill = f;
    fill.rank += at.dst;
    out.fills.push_back(fill);
  });
  for (int k = 0; k < plan.replicas.count; ++k) {
    for (const auto& [rank, item] : plan.regenerate) {
      out.regenerate.emplace_back(rank + k * plan.replicas.dst_stride, item);
    }
  }
  std::sort(out.regenerate.begin(), out.regenerate.end());
  return out;
}

::testing::AssertionResult CheckPlan(const v1::Ptc& ptc, const v1::Layout& from,
                                     const v1::Layout& to, const LostSet& lost,
                                     const Plan& compact) {
  // A plan whose replicas repeat is replayed written out.
  const Plan whole = compact.replicas.count > 1 ? WrittenOut(compact) : Plan{};
  const Plan& plan = compact.replicas.count > 1 ? whole : compact;
  if (!std::is_sorted(compact.regenerate.begin(), compact.regenerate.end())) {
    return ::testing::AssertionFailure() << "regenerate is not sorted";
  }
  HostTable hosts;
  const ResolvedLayout ol = ResolvedLayout::Resolve(from, ptc.num_layers(), &hosts);
  const ResolvedLayout nl = ResolvedLayout::Resolve(to, ptc.num_layers(), &hosts);
  const Buffers old_buf = Contents(ptc, from, ol.world(), ol.world());
  const Buffers new_buf = Contents(ptc, to, nl.world(), ol.world());
  std::vector<char> alive(ol.world(), 1);
  for (int r : lost.ranks) alive[r] = 0;
  for (const std::string& h : lost.hosts) {
    for (int r = 0; r < ol.world(); ++r) alive[r] &= ol.host(r) != hosts.Find(h);
  }
  // Elements held by the surviving ranks of each (host, device) and host.
  std::map<std::pair<int, int>, std::unordered_set<int64_t>> on_device;
  std::map<int, std::unordered_set<int64_t>> on_host;
  for (size_t item = 0; item < old_buf.size(); ++item) {
    for (int r = 0; r < ol.world(); ++r) {
      if (!alive[r]) continue;
      for (int64_t g : old_buf[item][r]) {
        if (g < 0) continue;
        on_device[{ol.host(r), ol.device(r)}].insert(Key(item, g));
        on_host[ol.host(r)].insert(Key(item, g));
      }
    }
  }
  std::set<std::pair<int, int>> regenerated(plan.regenerate.begin(), plan.regenerate.end());
  if (!std::is_sorted(plan.regenerate.begin(), plan.regenerate.end())) {
    return ::testing::AssertionFailure() << "regenerate is not sorted";
  }
  Buffers written = new_buf;
  for (auto& item : written) {
    for (auto& rank : item) std::fill(rank.begin(), rank.end(), 0);
  }
  int64_t cross = 0;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const Plan::Step& s = plan.steps[si];
    if (!alive[s.src_rank])
      return ::testing::AssertionFailure() << "step " << si << " reads a lost rank";
    const int eb = plan.items[s.item].element_bytes;
    int64_t n = 1;
    const int64_t* shape = plan.ShapeOf(s);
    for (int d = 0; d < s.ndim; ++d) n *= shape[d];
    if (s.bytes != n * eb) return ::testing::AssertionFailure() << "step " << si << " bytes";
    if (s.cross_host) cross += s.bytes;
    for (int di = s.dst_begin; di < s.dst_end; ++di) {
      const Plan::Dst& dst = plan.dsts[di];
      const bool same_host = nl.host(dst.rank) == ol.host(s.src_rank);
      if (s.cross_host == same_host) {
        return ::testing::AssertionFailure() << "step " << si << " cross_host is wrong";
      }
      if (nl.host(dst.rank) != nl.host(plan.dsts[s.dst_begin].rank)) {
        return ::testing::AssertionFailure() << "step " << si << " spans hosts";
      }
      const bool same_device = same_host && nl.device(dst.rank) == ol.device(s.src_rank);
      std::vector<int64_t> idx(s.ndim, 0);
      for (int64_t k = 0; k < n; ++k) {
        int64_t sp = s.src_offset, dp = dst.offset;
        for (int d = 0; d < s.ndim; ++d) {
          sp += idx[d] * plan.StridesOf(s.src_strides)[d];
          dp += idx[d] * plan.StridesOf(dst.strides)[d];
        }
        const std::vector<int64_t>& nb = new_buf[s.item][dst.rank];
        const std::vector<int64_t>& ob = old_buf[s.item][s.src_rank];
        if (dp < 0 || dp >= static_cast<int64_t>(nb.size()) || sp < 0 ||
            sp >= static_cast<int64_t>(ob.size())) {
          return ::testing::AssertionFailure() << "step " << si << " leaves a buffer";
        }
        const int64_t want = nb[dp];
        const int64_t got = ob[sp];
        if (want < 0 || got != want) {
          return ::testing::AssertionFailure()
                 << "step " << si << " item " << plan.items[s.item].name << " writes " << got
                 << " to rank " << dst.rank << " position " << dp << " which needs " << want;
        }
        ++written[s.item][dst.rank][dp];
        const int64_t key = Key(s.item, want);
        if (!same_device && on_device[{nl.host(dst.rank), nl.device(dst.rank)}].count(key)) {
          return ::testing::AssertionFailure() << "step " << si << " ignores a same-device source";
        }
        if (!same_host && on_host[nl.host(dst.rank)].count(key)) {
          return ::testing::AssertionFailure() << "step " << si << " ignores a same-host source";
        }
        for (int d = s.ndim - 1; d >= 0; --d) {
          if (++idx[d] < shape[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
  for (const Plan::Fill& f : plan.fills) {
    const bool regen = regenerated.count({f.rank, f.item}) > 0;
    if (f.offset < 0 || f.offset + f.count > static_cast<int64_t>(new_buf[f.item][f.rank].size())) {
      return ::testing::AssertionFailure() << "a fill leaves the buffer of rank " << f.rank;
    }
    for (int64_t p = f.offset; p < f.offset + f.count; ++p) {
      if (!regen && new_buf[f.item][f.rank].at(p) >= 0) {
        return ::testing::AssertionFailure()
               << "fill of a non-padding position: item " << plan.items[f.item].name << " rank "
               << f.rank << " position " << p;
      }
      ++written[f.item][f.rank][p];
    }
  }
  for (size_t item = 0; item < written.size(); ++item) {
    for (int r = 0; r < nl.world(); ++r) {
      for (size_t p = 0; p < written[item][r].size(); ++p) {
        if (written[item][r][p] != 1) {
          return ::testing::AssertionFailure()
                 << "item " << plan.items[item].name << " rank " << r << " position " << p
                 << " written " << written[item][r][p] << " times";
        }
      }
    }
  }
  // The lower bound: per host, distinct needed elements no survivor there holds.
  int64_t lower = 0;
  std::map<int, std::unordered_set<int64_t>> needed;
  for (size_t item = 0; item < new_buf.size(); ++item) {
    for (int r = 0; r < nl.world(); ++r) {
      if (regenerated.count({r, static_cast<int>(item)})) continue;
      for (int64_t g : new_buf[item][r]) {
        if (g < 0 || on_host[nl.host(r)].count(Key(item, g))) continue;
        if (needed[nl.host(r)].insert(Key(item, g)).second) lower += plan.items[item].element_bytes;
      }
    }
  }
  if (cross != plan.bytes_cross_host || plan.bytes_cross_host != lower ||
      plan.lower_bound_cross_host != lower) {
    return ::testing::AssertionFailure()
           << "cross-host bytes " << plan.bytes_cross_host << " (steps " << cross
           << "), planner's bound " << plan.lower_bound_cross_host << ", lower bound " << lower;
  }
  return ::testing::AssertionSuccess();
}

Plan PlanAndCheck(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                  const LostSet& lost) {
  absl::StatusOr<Plan> plan = MakePlan(ptc, from, to, lost);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return Plan{};
  EXPECT_TRUE(CheckPlan(ptc, from, to, lost, *plan));
  const absl::Status verified =
      verifier::VerifyPlan(ptc, from, to, lost.hosts, lost.ranks, ToProto(*plan, from, to));
  EXPECT_TRUE(verified.ok()) << verified;
  return *std::move(plan);
}

PlanOutcome AgreeOnRefusal(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                           const std::vector<std::string>& lost_hosts,
                           absl::StatusOr<Plan>* plan) {
  *plan = MakePlan(ptc, from, to, LostSet{lost_hosts, {}});
  const absl::StatusOr<std::vector<std::string>> missing =
      verifier::UnrecoverableItems(ptc, from, to, lost_hosts, std::vector<int>{});
  if (plan->ok()) {
    if (!missing.ok()) {
      ADD_FAILURE() << "planned, but the verifier refuses: " << missing.status();
    } else {
      EXPECT_TRUE(missing->empty()) << "the verifier finds " << missing->front() << " lost";
    }
    return PlanOutcome::kPlanned;
  }
  const absl::Status& refused = plan->status();
  if (absl::IsInvalidArgument(refused)) {
    EXPECT_TRUE(absl::IsInvalidArgument(missing.status()))
        << "planner: " << refused << "\nverifier: " << missing.status();
    return PlanOutcome::kInvalid;
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  if (!missing.ok()) {
    ADD_FAILURE() << "planner: " << refused << "\nverifier: " << missing.status();
    return PlanOutcome::kUnrecoverable;
  }
  EXPECT_FALSE(missing->empty()) << refused;
  for (const std::string& name : *missing) {
    EXPECT_NE(refused.message().find(absl::StrCat("\"", name, "\"")), std::string::npos)
        << name << " not named in: " << refused;
  }
  return PlanOutcome::kUnrecoverable;
}

}  // namespace reshard::planner::testing
