#include "bench/planner/random_jobs.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/verifier/jobs.h"

namespace reshard::bench {
namespace {

namespace jobs = verifier::testing;
using Rng = std::mt19937_64;

int Uniform(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }
int World(const v1::Layout& l) { return l.config().tp() * l.config().pp() * l.config().dp(); }

v1::Ptc RandomPtc(Rng& rng) {
  static constexpr v1::DType kDTypes[] = {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_INT8,
                                          v1::DTYPE_FLOAT64};
  v1::Ptc ptc;
  ptc.set_num_layers(Uniform(rng, 1, 6));
  const int tensors = Uniform(rng, 1, 5);
  for (int i = 0; i < tensors; ++i) {
    std::vector<int64_t> shape(Uniform(rng, 1, 3));
    for (auto& d : shape) d = Uniform(rng, 1, 12);
    v1::TensorSpec* t =
        jobs::AddTensor(&ptc, absl::StrCat("t", i), shape, kDTypes[Uniform(rng, 0, 3)]);
    const int ndim = static_cast<int>(shape.size());
    if (Chance(rng, 0.6)) jobs::SetTpSplit(t, Uniform(rng, 0, ndim - 1));
    switch (Uniform(rng, 0, 3)) {
      case 0:
        jobs::SetPipeline(t, v1::PIPELINE_LAYER, Uniform(rng, 0, ptc.num_layers() - 1));
        break;
      case 1:
        jobs::SetPipeline(t, v1::PIPELINE_FIRST_STAGE);
        break;
      case 2:
        jobs::SetPipeline(t, v1::PIPELINE_LAST_STAGE);
        break;
      default:
        break;
    }
    switch (Uniform(rng, 0, 2)) {
      case 1:
        jobs::SetDp(t, v1::DP_SPLIT, Uniform(rng, 0, ndim - 1));
        break;
      case 2:
        jobs::SetDp(t, v1::DP_FLAT);
        break;
      default:
        break;
    }
    t->mutable_partition()->set_allow_empty(true);
  }
  if (Chance(rng, 0.5)) {
    jobs::AddBlob(&ptc, "blob", Uniform(rng, 1, 16),
                  Chance(rng, 0.5) ? v1::BLOB_PER_RANK : v1::BLOB_REPLICATED);
  }
  return ptc;
}

void RandomConfig(Rng& rng, int num_layers, v1::ParallelConfig* c) {
  c->set_tp(Uniform(rng, 1, 4));
  c->set_pp(Uniform(rng, 1, std::min(4, num_layers)));
  c->set_dp(Uniform(rng, 1, 4));
  c->set_order(Chance(rng, 0.5) ? v1::RANK_ORDER_TP_DP_PP : v1::RANK_ORDER_TP_PP_DP);
}

// `world` ranks on hosts <prefix><first>.. with `per_host` devices, skipping
// the forbidden hosts and slots; one slot per rank.
void Place(int world, const std::string& prefix, int first, int per_host,
           const std::set<std::string>& bad_hosts,
           const std::set<std::pair<std::string, int>>& bad_slots, v1::Placement* p) {
  for (int h = first; p->ranks_size() < world; ++h) {
    const std::string host = absl::StrCat(prefix, h);
    if (bad_hosts.count(host)) continue;
    for (int d = 0; d < per_host && p->ranks_size() < world; ++d) {
      if (bad_slots.count({host, d})) continue;
      v1::DeviceSlot* s = p->add_ranks();
      s->set_host(host);
      s->set_device(d);
    }
  }
}

}  // namespace

Transition RandomTransition(uint64_t seed, double lost_chance, double new_hosts_chance) {
  Rng rng(seed);
  Transition t;
  t.ptc = RandomPtc(rng);
  RandomConfig(rng, t.ptc.num_layers(), t.from.mutable_config());
  RandomConfig(rng, t.ptc.num_layers(), t.to.mutable_config());
  Place(World(t.from), "h", 0, Uniform(rng, 1, 4), {}, {}, t.from.mutable_placement());
  std::set<std::string> old_hosts;
  for (int r = 0; r < World(t.from); ++r) old_hosts.insert(jobs::SlotOf(t.from, r).first);
  std::set<std::string> bad_hosts;
  std::set<std::pair<std::string, int>> bad_slots;
  if (Chance(rng, lost_chance)) {
    if (Chance(rng, 0.5)) {
      auto it = old_hosts.begin();
      std::advance(it, Uniform(rng, 0, static_cast<int>(old_hosts.size()) - 1));
      t.lost.hosts.push_back(*it);
      bad_hosts.insert(*it);
    } else {
      const int r = Uniform(rng, 0, World(t.from) - 1);
      t.lost.ranks.push_back(r);
      bad_slots.insert(jobs::SlotOf(t.from, r));
    }
  }
  const bool new_hosts = Chance(rng, new_hosts_chance);
  const int first = new_hosts ? 0 : Uniform(rng, 0, static_cast<int>(old_hosts.size()));
  Place(World(t.to), new_hosts ? "n" : "h", first, Uniform(rng, 1, 4), bad_hosts, bad_slots,
        t.to.mutable_placement());
  return t;
}

std::vector<Transition> PropertyPopulation(int per_mix) {
  struct Mix {
    uint64_t base;
    double lost, new_hosts;
  };
  static constexpr Mix kMixes[] = {{1000, 0.0, 0.15}, {100000, 1.0, 0.3}, {200000, 0.2, 1.0}};
  std::vector<Transition> out;
  for (const Mix& m : kMixes) {
    for (int i = 0; i < per_mix; ++i)
      out.push_back(RandomTransition(m.base + i, m.lost, m.new_hosts));
  }
  return out;
}

}  // namespace reshard::bench
