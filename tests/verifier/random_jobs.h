// Random jobs that use the kinds of issue 13 (cp, vpp, ep, expert_tp, axis
// padding, unit granularity with replication, expert slabs, DP_CHUNK,
// DP_BUCKET groups, first-and-last and layer-set pipelines, regenerable
// blobs), for property tests of the verifier and, through it, of a planner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/jobs.h"

namespace reshard::verifier::testing {

struct RandomJob {
  v1::Ptc ptc;
  v1::Layout from, to;
  std::vector<std::string> lost_hosts;
  std::vector<int> lost_ranks;  // only when the target is on new hosts
};

namespace internal {

using Rng = std::mt19937_64;
inline int Pick(Rng& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
inline bool Coin(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Unit counts and tp sizes are powers of two, so a block with fewer units
// than tp ranks always divides them.
inline void RandomTensorParallel(Rng& rng, v1::TensorSpec* t, int axis) {
  const int64_t unit = Pick(rng, 1, 2);
  std::vector<int64_t> blocks;
  int64_t sum = 0;
  for (int b = Pick(rng, 1, 3); b > 0; --b) {
    blocks.push_back(unit * (int64_t{1} << Pick(rng, 0, 3)));
    sum += blocks.back();
  }
  t->set_shape(axis, sum);
  test_support::SetTpSplit(t, axis,
                           blocks.size() > 1 || Coin(rng, 0.5) ? blocks : std::vector<int64_t>{});
  test_support::SetGranularity(t, Coin(rng, 0.8) ? unit : 0);
  if (t->partition().tp().granularity() == 0) t->mutable_partition()->set_allow_empty(true);
}

inline void RandomPipeline(Rng& rng, int num_layers, v1::TensorSpec* t) {
  switch (Pick(rng, 0, 5)) {
    case 0:
      test_support::SetPipeline(t, v1::PIPELINE_LAYER, Pick(rng, 0, num_layers - 1));
      break;
    case 1:
      test_support::SetPipeline(t, v1::PIPELINE_FIRST_STAGE);
      break;
    case 2:
      test_support::SetPipeline(t, v1::PIPELINE_LAST_STAGE);
      break;
    case 3:
      test_support::SetPipeline(t, v1::PIPELINE_FIRST_AND_LAST_STAGE);
      break;
    case 4:
      test_support::SetLayers(t, {Pick(rng, 0, num_layers - 1), Pick(rng, 0, num_layers - 1)});
      break;
    default:
      break;  // every stage
  }
}

inline void RandomDataParallel(Rng& rng, v1::TensorSpec* t, bool expert) {
  const int ndim = t->shape_size();
  switch (Pick(rng, 0, 4)) {
    case 1:
      test_support::SetDp(t, v1::DP_SPLIT, Pick(rng, 0, ndim - 1));
      break;
    case 2:
      test_support::SetDp(t, v1::DP_CHUNK, Pick(rng, 0, ndim - 1));
      break;
    case 3:
      test_support::SetDp(t, v1::DP_FLAT);
      break;
    case 4:
      test_support::SetBucket(t, expert ? "experts" : (Coin(rng, 0.5) ? "params" : "grads"));
      break;
    default:
      break;
  }
}

inline v1::Ptc RandomPtc(Rng& rng) {
  v1::Ptc ptc;
  ptc.set_num_layers(Pick(rng, 1, 6));
  test_support::AddGroup(&ptc, "params", Pick(rng, 0, 4), Pick(rng, 0, 1) * Pick(rng, 1, 12),
                         Pick(rng, 0, 4), Coin(rng, 0.5));
  test_support::AddGroup(&ptc, "grads", 1, 0, 1);
  test_support::AddGroup(&ptc, "experts", Pick(rng, 0, 3), Pick(rng, 0, 8), Pick(rng, 0, 3),
                         Coin(rng, 0.5));
  for (int i = Pick(rng, 1, 6); i > 0; --i) {
    std::vector<int64_t> shape(Pick(rng, 1, 3));
    for (auto& d : shape) d = Pick(rng, 1, 7);
    v1::TensorSpec* t =
        test_support::AddTensor(&ptc, absl::StrCat("t", ptc.tensors_size()), shape,
                                Coin(rng, 0.5) ? v1::DTYPE_FLOAT32 : v1::DTYPE_BFLOAT16);
    t->mutable_partition()->set_allow_empty(Coin(rng, 0.8));
    const int ndim = static_cast<int>(shape.size());
    bool expert = false;
    switch (Pick(rng, 0, 3)) {
      case 0:  // vocabulary padding, maybe tp-split on the padded axis
        test_support::SetPadding(t, 0, Pick(rng, 1, 3), Coin(rng, 0.7));
        if (Coin(rng, 0.6)) test_support::SetTpSplit(t, 0);
        break;
      case 1:  // experts on axis 0
        if (ndim < 2) break;
        expert = true;
        test_support::SetExpert(t, 0);
        t->mutable_partition()->set_allow_empty(Coin(rng, 0.7));  // few experts: empty slabs
        if (Coin(rng, 0.6)) RandomTensorParallel(rng, t, Pick(rng, 1, ndim - 1));
        break;
      case 2:
        RandomTensorParallel(rng, t, Pick(rng, 0, ndim - 1));
        break;
      default:
        break;  // tp-replicated
    }
    RandomPipeline(rng, ptc.num_layers(), t);
    RandomDataParallel(rng, t, expert);
  }
  for (int i = Pick(rng, 0, 2); i > 0; --i) {
    test_support::AddBlob(&ptc, absl::StrCat("blob", ptc.blobs_size()), Pick(rng, 1, 6),
                          Coin(rng, 0.6) ? v1::BLOB_PER_RANK : v1::BLOB_REPLICATED);
    ptc.mutable_blobs(ptc.blobs_size() - 1)->set_regenerable(Coin(rng, 0.6));
  }
  return ptc;
}

/// A partly used last host: the placement lists one slot per rank instead of
/// hosts x devices_per_host.
inline void PlaceOneSlotPerRank(int world, int per_host, const std::vector<std::string>& hosts,
                                v1::Layout* l) {
  l->mutable_placement()->clear_hosts();
  l->mutable_placement()->clear_devices_per_host();
  for (int r = 0; r < world; ++r) {
    v1::DeviceSlot* s = l->mutable_placement()->add_ranks();
    s->set_host(hosts[r / per_host]);
    s->set_device(r % per_host);
  }
}

inline v1::Layout RandomLayout(Rng& rng, int num_layers, const std::string& prefix,
                               const std::string& avoid) {
  const int tp = 1 << Pick(rng, 0, 2), cp = Pick(rng, 1, 2), dp = Pick(rng, 1, 3);
  const int vpp = Pick(rng, 1, 2);  // chunks may own no layer, stages always own one
  const int pp = Pick(rng, 1, std::min(3, num_layers));
  const int etp = 1 << Pick(rng, 0, tp == 1 ? 0 : (tp == 2 ? 1 : 2));
  std::vector<int> eps;
  for (int e = 1; e <= tp * cp * dp / etp; ++e) {
    if ((tp * cp * dp / etp) % e == 0) eps.push_back(e);
  }
  const int world = tp * cp * dp * pp;
  const int per_host = 1 << Pick(rng, 0, 2);
  std::vector<std::string> hosts;
  for (int h = 0; static_cast<int>(hosts.size()) * per_host < world; ++h) {
    if (absl::StrCat(prefix, h) != avoid) hosts.push_back(absl::StrCat(prefix, h));
  }
  std::vector<int> starts;  // pp * vpp chunk starts, or none (an even split)
  if (pp * vpp > 1 && pp * vpp <= num_layers && Coin(rng, 0.4)) {
    std::vector<int> cuts;
    for (int layer = 1; layer < num_layers; ++layer) cuts.push_back(layer);
    std::shuffle(cuts.begin(), cuts.end(), rng);
    cuts.resize(pp * vpp - 1);
    cuts.push_back(0);
    std::sort(cuts.begin(), cuts.end());
    starts = cuts;
  }
  v1::Layout l =
      test_support::MakeLayout(tp, pp, dp, hosts, per_host, starts,
                               Coin(rng, 0.5) ? v1::RANK_ORDER_TP_DP_PP : v1::RANK_ORDER_TP_PP_DP);
  l = test_support::With(
      l, test_support::Extra{
             .cp = cp, .vpp = vpp, .ep = eps[Pick(rng, 0, eps.size() - 1)], .expert_tp = etp});
  if (world % per_host != 0) PlaceOneSlotPerRank(world, per_host, hosts, &l);
  return l;
}

}  // namespace internal

/// A random job of small shapes, a random target layout on the same or new
/// hosts, and sometimes a lost old host (never used by the target).
inline RandomJob RandomRealJob(uint64_t seed) {
  internal::Rng rng(seed);
  RandomJob job;
  job.ptc = internal::RandomPtc(rng);
  job.from = internal::RandomLayout(rng, job.ptc.num_layers(), "h", "");
  const int old_world = static_cast<int>(job.from.placement().ranks_size() > 0
                                             ? job.from.placement().ranks_size()
                                             : job.from.placement().hosts_size() *
                                                   job.from.placement().devices_per_host());
  if (internal::Coin(rng, 0.3)) {  // one of the hosts the old layout uses
    job.lost_hosts.push_back(SlotOf(job.from, internal::Pick(rng, 0, old_world - 1)).first);
  }
  const bool new_hosts = internal::Coin(rng, 0.2);
  if (new_hosts && internal::Coin(rng, 0.5)) {
    job.lost_ranks.push_back(internal::Pick(rng, 0, old_world - 1));
  }
  job.to = internal::RandomLayout(rng, job.ptc.num_layers(), new_hosts ? "n" : "h",
                                  job.lost_hosts.empty() ? "" : job.lost_hosts[0]);
  return job;
}

}  // namespace reshard::verifier::testing
