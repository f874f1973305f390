// Random jobs that use HSDP (ParallelConfig.dp_shard) and dp-only splits
// (DataParallel.over = DP_OVER_DP) on top of the kinds of issue 13
// (random_jobs.h), for property tests of the planner checked by the
// verifier: docs/partitioning.md, "Data-parallel groups".
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/jobs.h"
#include "tests/verifier/random_jobs.h"

namespace reshard::verifier::testing {

namespace internal {

// A layout with dp from {1, 2, 3, 4, 6} so that HSDP has replicas of more
// than one rank, and a random dp_shard: 0 (no HSDP) or a divisor of dp.
inline v1::Layout RandomHsdpLayout(Rng& rng, int num_layers, const std::string& prefix,
                                   const std::string& avoid) {
  static constexpr int kDp[] = {1, 2, 3, 4, 6};
  const int tp = 1 << Pick(rng, 0, 1), cp = Pick(rng, 1, 2), dp = kDp[Pick(rng, 0, 4)];
  const int pp = Pick(rng, 1, std::min(2, num_layers));
  const int world = tp * cp * dp * pp;
  const int per_host = 1 << Pick(rng, 0, 2);
  std::vector<std::string> hosts;
  for (int h = 0; static_cast<int>(hosts.size()) * per_host < world; ++h) {
    if (absl::StrCat(prefix, h) != avoid) hosts.push_back(absl::StrCat(prefix, h));
  }
  v1::Layout l =
      test_support::MakeLayout(tp, pp, dp, hosts, per_host, {},
                               Coin(rng, 0.5) ? v1::RANK_ORDER_TP_DP_PP : v1::RANK_ORDER_TP_PP_DP);
  l = test_support::With(l, test_support::Extra{.cp = cp});
  std::vector<int> divisors{0};
  for (int d = 1; d <= dp; ++d) {
    if (dp % d == 0) divisors.push_back(d);
  }
  l.mutable_config()->set_dp_shard(divisors[Pick(rng, 0, static_cast<int>(divisors.size()) - 1)]);
  if (world % per_host != 0) PlaceOneSlotPerRank(world, per_host, hosts, &l);
  return l;
}

}  // namespace internal

/// A random PTC of random_jobs.h whose dense, non-bucket tensors split over
/// dp only with probability one half (some with a twin over the other group),
/// between two random HSDP layouts (same or new hosts), sometimes with a lost
/// old host the target does not use.
inline RandomJob RandomHsdpJob(uint64_t seed) {
  internal::Rng rng(seed);
  RandomJob job;
  job.ptc = internal::RandomPtc(rng);
  for (v1::TensorSpec& t : *job.ptc.mutable_tensors()) {
    // Expert tensors and bucket members keep DP_OVER_DP_CP (validation
    // refuses DP_OVER_DP there); expert tensors ignore dp_shard.
    if (t.partition().has_expert() || t.partition().dp().mode() == v1::DP_BUCKET) continue;
    if (internal::Coin(rng, 0.5)) t.mutable_partition()->mutable_dp()->set_over(v1::DP_OVER_DP);
  }
  // Twins: the same shape and rules over the other group (a planner that
  // shares work between equal tensors must tell them apart).
  const int n = job.ptc.tensors_size();
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& t = job.ptc.tensors(i);
    if (t.partition().has_expert() || t.partition().dp().mode() == v1::DP_BUCKET ||
        !internal::Coin(rng, 0.3)) {
      continue;
    }
    v1::TensorSpec twin = t;
    twin.set_name(absl::StrCat(t.name(), ".twin"));
    twin.mutable_partition()->mutable_dp()->set_over(
        t.partition().dp().over() == v1::DP_OVER_DP ? v1::DP_OVER_DP_CP : v1::DP_OVER_DP);
    *job.ptc.add_tensors() = std::move(twin);
  }
  job.from = internal::RandomHsdpLayout(rng, job.ptc.num_layers(), "h", "");
  const bool new_hosts = internal::Coin(rng, 0.2);
  std::string lost;
  if (!new_hosts && internal::Coin(rng, 0.4)) {
    const int old_world = static_cast<int>(job.from.placement().ranks_size() > 0
                                               ? job.from.placement().ranks_size()
                                               : job.from.placement().hosts_size() *
                                                     job.from.placement().devices_per_host());
    lost = SlotOf(job.from, internal::Pick(rng, 0, old_world - 1)).first;
    job.lost_hosts.push_back(lost);
  }
  job.to = internal::RandomHsdpLayout(rng, job.ptc.num_layers(), new_hosts ? "n" : "h", lost);
  return job;
}

}  // namespace reshard::verifier::testing
