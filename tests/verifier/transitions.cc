#include "tests/verifier/transitions.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/layout.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/jobs.h"

namespace reshard::verifier::testing {
namespace {

using Rng = std::mt19937_64;

int Uniform(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

}  // namespace

std::string Transition::Describe() const {
  return absl::StrCat("ptc { ", ptc.ShortDebugString(), " }\nfrom { ", from.ShortDebugString(),
                      " }\nto { ", to.ShortDebugString(), " }\nlost hosts [",
                      absl::StrJoin(lost.hosts, ", "), "] ranks [", absl::StrJoin(lost.ranks, ", "),
                      "]");
}

namespace {

// `n` as 1..3 positive blocks.
std::vector<int64_t> RandomBlocks(Rng& rng, int64_t n) {
  const int parts = static_cast<int>(std::min<int64_t>(n, Uniform(rng, 1, 3)));
  std::vector<int64_t> cuts;
  for (int64_t i = 1; i < n; ++i) cuts.push_back(i);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(parts - 1);
  cuts.push_back(0);
  cuts.push_back(n);
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> blocks;
  for (size_t i = 1; i < cuts.size(); ++i) blocks.push_back(cuts[i] - cuts[i - 1]);
  return blocks;
}

v1::Ptc RandomPtc(Rng& rng) {
  static constexpr v1::DType kDTypes[] = {
      v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16,     v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT8_E4M3,
      v1::DTYPE_FLOAT64, v1::DTYPE_INT64,       v1::DTYPE_INT32,    v1::DTYPE_INT16,
      v1::DTYPE_INT8,    v1::DTYPE_FLOAT8_E5M2, v1::DTYPE_UINT8,    v1::DTYPE_BOOL};
  v1::Ptc ptc;
  ptc.set_num_layers(Uniform(rng, 1, 6));
  const int tensors = Uniform(rng, 1, 5);
  for (int i = 0; i < tensors; ++i) {
    std::vector<int64_t> shape(Uniform(rng, 1, 3));
    for (auto& d : shape) d = Uniform(rng, 1, 12);
    v1::TensorSpec* t = test_support::AddTensor(&ptc, absl::StrCat("t", i), shape,
                                                kDTypes[Uniform(rng, 0, std::size(kDTypes) - 1)]);
    const int ndim = static_cast<int>(shape.size());
    if (Chance(rng, 0.6)) {
      const int axis = Uniform(rng, 0, ndim - 1);
      test_support::SetTpSplit(
          t, axis, Chance(rng, 0.4) ? RandomBlocks(rng, shape[axis]) : std::vector<int64_t>{});
    }
    switch (Uniform(rng, 0, 3)) {
      case 0:
        test_support::SetPipeline(t, v1::PIPELINE_LAYER, Uniform(rng, 0, ptc.num_layers() - 1));
        break;
      case 1:
        test_support::SetPipeline(t, v1::PIPELINE_FIRST_STAGE);
        break;
      case 2:
        test_support::SetPipeline(t, v1::PIPELINE_LAST_STAGE);
        break;
      default:
        break;  // every stage
    }
    switch (Uniform(rng, 0, 2)) {
      case 1:
        test_support::SetDp(t, v1::DP_SPLIT, Uniform(rng, 0, ndim - 1));
        break;
      case 2:
        test_support::SetDp(t, v1::DP_FLAT);
        break;
      default:
        break;
    }
    // Mostly allowed to be empty so that random layouts stay valid; the
    // rest check that planner and verifier agree on rejecting them.
    t->mutable_partition()->set_allow_empty(Chance(rng, 0.85));
  }
  const int blobs = Uniform(rng, 0, 2);
  for (int i = 0; i < blobs; ++i) {
    test_support::AddBlob(&ptc, absl::StrCat("blob", i), Uniform(rng, 1, 16),
                          Chance(rng, 0.5) ? v1::BLOB_PER_RANK : v1::BLOB_REPLICATED);
  }
  return ptc;
}

void RandomConfig(Rng& rng, int num_layers, v1::ParallelConfig* c) {
  c->set_tp(Uniform(rng, 1, 4));
  c->set_pp(Uniform(rng, 1, std::min(4, num_layers)));
  c->set_dp(Uniform(rng, 1, 4));
  c->set_order(Chance(rng, 0.5) ? v1::RANK_ORDER_TP_DP_PP : v1::RANK_ORDER_TP_PP_DP);
  if (c->pp() > 1 && Chance(rng, 0.4)) {
    std::vector<int> starts;
    for (int l = 1; l < num_layers; ++l) starts.push_back(l);
    std::shuffle(starts.begin(), starts.end(), rng);
    starts.resize(c->pp() - 1);
    starts.push_back(0);
    std::sort(starts.begin(), starts.end());
    for (int s : starts) c->add_stage_starts(s);
  }
}

int World(const v1::Layout& l) { return static_cast<int>(planner::WorldSize(l.config())); }

// Places `world` ranks on hosts <prefix><first>.. with `per_host` devices,
// skipping forbidden hosts and slots; compact form when nothing was skipped
// and the order is kept, else one slot per rank (sometimes shuffled).
void Place(Rng& rng, int world, const std::string& prefix, int first, int per_host,
           const std::set<std::string>& bad_hosts,
           const std::set<std::pair<std::string, int>>& bad_slots, v1::Placement* p) {
  std::vector<std::pair<std::string, int>> slots;
  std::vector<std::string> hosts;
  bool skipped = false;
  for (int h = first; static_cast<int>(slots.size()) < world; ++h) {
    const std::string host = absl::StrCat(prefix, h);
    if (bad_hosts.count(host)) {
      skipped = true;
      continue;
    }
    hosts.push_back(host);
    for (int d = 0; d < per_host; ++d) {
      if (bad_slots.count({host, d})) {
        skipped = true;
      } else {
        slots.emplace_back(host, d);
      }
    }
  }
  slots.resize(world);
  const bool shuffle = Chance(rng, 0.25);
  // The planner wants the compact form to fill its hosts exactly.
  if (!skipped && !shuffle && world % per_host == 0 && Chance(rng, 0.7)) {
    for (const auto& h : hosts) p->add_hosts(h);
    p->set_devices_per_host(per_host);
    return;
  }
  if (shuffle) std::shuffle(slots.begin(), slots.end(), rng);
  for (const auto& [host, device] : slots) {
    v1::DeviceSlot* s = p->add_ranks();
    s->set_host(host);
    s->set_device(device);
  }
}

}  // namespace

Transition RandomTransition(uint64_t seed, double lost_chance, double new_hosts_chance) {
  Rng rng(seed);
  Transition t;
  t.ptc = RandomPtc(rng);
  RandomConfig(rng, t.ptc.num_layers(), t.from.mutable_config());
  RandomConfig(rng, t.ptc.num_layers(), t.to.mutable_config());
  Place(rng, World(t.from), "h", 0, Uniform(rng, 1, 4), {}, {}, t.from.mutable_placement());

  std::set<std::string> old_hosts;
  for (int r = 0; r < World(t.from); ++r) old_hosts.insert(SlotOf(t.from, r).first);
  std::set<std::string> bad_hosts;
  std::set<std::pair<std::string, int>> bad_slots;
  if (Chance(rng, lost_chance)) {
    if (Chance(rng, 0.5)) {
      auto it = old_hosts.begin();
      std::advance(it, Uniform(rng, 0, static_cast<int>(old_hosts.size()) - 1));
      t.lost.hosts.push_back(*it);
      bad_hosts.insert(*it);
    }
    if (t.lost.hosts.empty() || Chance(rng, 0.3)) {
      const int n = Uniform(rng, 1, 2);
      for (int i = 0; i < n; ++i) {
        const int r = Uniform(rng, 0, World(t.from) - 1);
        if (std::count(t.lost.ranks.begin(), t.lost.ranks.end(), r)) continue;
        t.lost.ranks.push_back(r);
        bad_slots.insert(SlotOf(t.from, r));
      }
    }
  }
  if (bad_hosts.empty() && bad_slots.empty() && Chance(rng, 0.08)) {
    t.to = t.from;  // identity
    return t;
  }
  const bool new_hosts = Chance(rng, new_hosts_chance);
  const int first = new_hosts ? 0 : Uniform(rng, 0, static_cast<int>(old_hosts.size()));
  Place(rng, World(t.to), new_hosts ? "n" : "h", first, Uniform(rng, 1, 4), bad_hosts, bad_slots,
        t.to.mutable_placement());
  return t;
}

}  // namespace reshard::verifier::testing
