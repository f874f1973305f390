#include "planner/planner.h"

#include <algorithm>
#include <array>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "planner/balance.h"
#include "planner/bucket.h"
#include "planner/host_runs.h"
#include "planner/layout.h"
#include "planner/overlap.h"
#include "planner/replicas.h"
#include "planner/shard.h"
#include "planner/validate.h"

namespace reshard::planner {
namespace {

std::string BoxString(const Box& b) {
  std::string s = "[";
  for (int d = 0; d < b.ndim; ++d) {
    absl::StrAppend(&s, d ? ", " : "", b.offset[d], ":", b.offset[d] + b.size[d]);
  }
  return s + "]";
}

// One rank that needs (or holds) a region, with where it keeps it: at
// `offset`, with strides Plan::strides[strides]. Small, so that the many
// endpoints of a plan cost little to gather and sort.
struct Endpoint {
  int rank;
  int host;
  int device;
  int32_t strides;
  int64_t offset;
};

// The endpoint of `rank` whose region `sub` lies in the box `box` that member
// `m` keeps.
Endpoint EndpointOf(const ResolvedLayout& layout, int rank, const Box& box, const Member& m,
                    const Box& sub) {
  return Endpoint{rank, layout.host(rank), layout.device(rank), m.strides,
                  SubView(box, m.view, sub).offset};
}

// A region of an item being placed: its shape, the plan's index of that
// shape, and the bytes of one copy of it.
struct Region {
  int item;
  int ndim;
  const int64_t* shape;
  int32_t shape_index;
  int64_t bytes;
};

class PlanBuilder {
 public:
  PlanBuilder(int num_hosts, Plan* plan) : plan_(plan), holders_by_host_(num_hosts) {
    out_.assign(num_hosts, 0);
    in_.assign(num_hosts, 0);
    local_.assign(num_hosts, 0);
    plan_->remote_sends.num_hosts = num_hosts;
    Plan::Strides flat;
    flat.v[0] = 1;
    contiguous_ = InternStrides(flat.v);
  }

  // The plan's index of `strides` (kMaxDims of them), added when new.
  int32_t InternStrides(const int64_t* strides) {
    std::array<int64_t, kMaxDims> key;
    std::copy(strides, strides + kMaxDims, key.begin());
    auto [it, inserted] =
        strides_index_.try_emplace(key, static_cast<int32_t>(plan_->strides.size()));
    if (inserted) {
      Plan::Strides& st = plan_->strides.emplace_back();
      std::copy(strides, strides + kMaxDims, st.v);
    }
    return it->second;
  }

  // Strides {1, 0, ...}: a whole blob, or merged steps.
  int32_t contiguous() const { return contiguous_; }

  // The plan's index of the shape `shape[0, ndim)`, added when new.
  int32_t InternShape(int ndim, const int64_t* shape) {
    std::array<int64_t, kMaxDims> key{};
    std::copy(shape, shape + ndim, key.begin());
    auto [it, inserted] =
        shapes_index_.try_emplace(key, static_cast<int32_t>(plan_->shapes.size()));
    if (inserted) {
      Plan::Shape& sh = plan_->shapes.emplace_back();
      std::copy(key.begin(), key.end(), sh.v);
    }
    return it->second;
  }

  // Plans one region of item `item` (its shape interned as `shape_index`):
  // `needers` (new ranks) need it and `holders` (surviving old ranks) hold
  // it. Returns false when no holder.
  bool PlaceRegion(int item, int ndim, const int64_t* shape, int32_t shape_index, int64_t bytes,
                   std::vector<Endpoint>& needers, const std::vector<Endpoint>& holders) {
    if (needers.empty()) return true;
    if (holders.empty()) return false;
    std::sort(needers.begin(), needers.end(),
              [](const Endpoint& a, const Endpoint& b) { return a.host < b.host; });
    holders_by_host_.Index(static_cast<int32_t>(holders.size()),
                           [&](int32_t i) { return holders[i].host; });
    region_candidates_ = -1;
    const Region region{item, ndim, shape, shape_index, bytes};
    for (size_t begin = 0; begin < needers.size();) {
      size_t end = begin;
      const int host = needers[begin].host;
      while (end < needers.size() && needers[end].host == host) ++end;
      PlaceOnHost(region, &needers[begin], &needers[end], holders);
      begin = end;
    }
    return true;
  }

  void AddFill(int item, int rank, int64_t offset, int64_t count, int element_bytes) {
    plan_->fills.push_back(Plan::Fill{item, rank, offset, count});
    plan_->bytes_zero_filled += count * element_bytes;
  }

  void Finish(const HostTable& hosts) {
    FlushMerged();
    ChooseRemoteSources();
    plan_->hosts.resize(hosts.size());
    for (int h = 0; h < hosts.size(); ++h) {
      plan_->hosts[h].host = hosts.Name(h);
      plan_->hosts[h].bytes_in = in_[h];
      plan_->hosts[h].bytes_out = out_[h];
      plan_->hosts[h].bytes_local = local_[h];
    }
  }

 private:
  void PlaceOnHost(const Region& region, Endpoint* first, Endpoint* last,
                   const std::vector<Endpoint>& holders) {
    const int host = first->host;
    const int local_holders = holders_by_host_.Count(host);
    if (local_holders > 0) {
      // Rule 2: same device, else same host (spread over the local holders,
      // in the order of `holders`).
      const int32_t* local = holders_by_host_.On(host);
      int next = 0;
      for (Endpoint* n = first; n != last; ++n) {
        const Endpoint* src = nullptr;
        for (int k = 0; k < local_holders; ++k) {
          if (holders[local[k]].device == n->device) {
            src = &holders[local[k]];
            break;
          }
        }
        if (src == nullptr) src = &holders[local[next++ % local_holders]];
        EmitStep(region, *src, n, n + 1, /*cross=*/false);
      }
      return;
    }
    // Rules 3-4: the region crosses to this host once. Rule 5 (which host
    // sends it) is decided in Finish, once every remote send is known.
    plan_->lower_bound_cross_host += region.bytes;
    AddRemoteSend(region, holders, first, last);
  }

  // The first holder on each holding host (in the order of `holders`) are
  // the candidates; the step is emitted now from the first, and its source
  // set by ChooseRemoteSources. Every send of a region has the same
  // candidates: they are kept once.
  void AddRemoteSend(const Region& region, const std::vector<Endpoint>& holders,
                     const Endpoint* first, const Endpoint* last) {
    const std::vector<int32_t>& hosts = holders_by_host_.hosts();
    RemoteSends& sends = plan_->remote_sends;
    sends.Add(region.bytes, hosts.data(), hosts.data() + hosts.size());
    const bool choice = hosts.size() > 1;  // else only one host can send it
    EmitStep(region, holders[0], first, last, /*cross=*/true, /*may_merge=*/!choice);
    if (!choice) return;
    if (region_candidates_ < 0) {
      region_candidates_ = static_cast<int64_t>(candidates_.size());
      for (int32_t h : hosts) {
        const Endpoint& e = holders[*holders_by_host_.On(h)];
        candidates_.push_back(Candidate{e.rank, e.strides, e.offset});
      }
    }
    pending_.push_back(PendingSend{sends.size() - 1, plan_->steps.size() - 1,
                                   static_cast<size_t>(region_candidates_)});
  }

  void ChooseRemoteSources() {
    RemoteSends& sends = plan_->remote_sends;
    BalanceSenders(&sends);
    for (const PendingSend& p : pending_) {
      const int chosen = sends.chosen[p.send];
      const int32_t* c = sends.CandidatesBegin(p.send);
      const int k = static_cast<int>(std::find(c, c + sends.Candidates(p.send), chosen) - c);
      const Candidate& src = candidates_[p.candidates + k];
      Plan::Step& step = plan_->steps[p.step];
      out_[c[0]] -= step.bytes;  // the step was emitted from the first candidate
      out_[chosen] += step.bytes;
      step.src_rank = src.rank;
      step.src_strides = src.strides;
      step.src_offset = src.offset;
    }
  }

  // True when the region covers one contiguous run of its buffer.
  bool Contiguous(int ndim, const int64_t* shape, int32_t strides_index) const {
    const int64_t* strides = plan_->StridesOf(strides_index);
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] == 1) continue;
      if (strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }

  // Extends the previous step when this one continues it in both buffers (a
  // flat shard's range cut into boxes): one 1-d step instead of several. The
  // merged step's length is interned once its run ends (FlushMerged).
  bool MergeWithPrevious(const Region& r, const Endpoint& src, const Endpoint& dst, bool cross) {
    if (plan_->steps.empty()) return false;
    // A step whose source is still to be chosen takes nothing else in.
    if (!pending_.empty() && pending_.back().step + 1 == plan_->steps.size()) return false;
    Plan::Step& p = plan_->steps.back();
    if (p.item != r.item || p.src_rank != src.rank || p.cross_host != cross ||
        p.dst_end - p.dst_begin != 1 || plan_->dsts[p.dst_begin].rank != dst.rank) {
      return false;
    }
    Plan::Dst& pd = plan_->dsts[p.dst_begin];
    // A merged step is 1-d and contiguous in both buffers.
    if (merged_elements_ < 0 &&
        (!Contiguous(p.ndim, plan_->ShapeOf(p), p.src_strides) ||
         !Contiguous(p.ndim, plan_->ShapeOf(p), pd.strides))) {
      return false;
    }
    if (!Contiguous(r.ndim, r.shape, src.strides) || !Contiguous(r.ndim, r.shape, dst.strides)) {
      return false;
    }
    int64_t n = merged_elements_;
    if (n < 0) {
      n = 1;
      for (int d = 0; d < p.ndim; ++d) n *= plan_->ShapeOf(p)[d];
    }
    if (p.src_offset + n != src.offset || pd.offset + n != dst.offset) return false;
    int64_t m = 1;
    for (int d = 0; d < r.ndim; ++d) m *= r.shape[d];
    p.ndim = 1;
    merged_elements_ = n + m;
    p.src_strides = pd.strides = contiguous_;
    p.bytes += r.bytes;
    return true;
  }

  // Gives the last step, when merged, its 1-d shape.
  void FlushMerged() {
    if (merged_elements_ < 0) return;
    plan_->steps.back().shape = InternShape(1, &merged_elements_);
    merged_elements_ = -1;
  }

  void EmitStep(const Region& r, const Endpoint& src, const Endpoint* first, const Endpoint* last,
                bool cross, bool may_merge = true) {
    const int64_t ndst = last - first;
    if (may_merge && ndst == 1 && MergeWithPrevious(r, src, *first, cross)) {
      Account(src, *first, r.bytes, ndst, cross, /*new_step=*/false);
      return;
    }
    FlushMerged();
    // Written in place: the plan's arrays are the bulk of its memory traffic.
    Plan::Step& s = plan_->steps.emplace_back();
    s.item = r.item;
    s.src_rank = src.rank;
    s.ndim = static_cast<int8_t>(r.ndim);
    s.cross_host = cross;
    s.bytes = r.bytes;
    s.shape = r.shape_index;
    s.src_strides = src.strides;
    s.src_offset = src.offset;
    s.dst_begin = static_cast<int32_t>(plan_->dsts.size());
    for (const Endpoint* d = first; d != last; ++d) {
      plan_->dsts.push_back(Plan::Dst{d->rank, d->strides, d->offset});
    }
    s.dst_end = static_cast<int32_t>(plan_->dsts.size());
    Account(src, *first, r.bytes, ndst, cross, /*new_step=*/true);
  }

  void Account(const Endpoint& src, const Endpoint& dst, int64_t bytes, int64_t ndst, bool cross,
               bool new_step) {
    if (cross) {
      out_[src.host] += bytes;
      in_[dst.host] += bytes;
      plan_->bytes_cross_host += bytes;
      plan_->cross_host_steps += new_step;
    } else {
      local_[dst.host] += bytes * ndst;
      plan_->bytes_local += bytes * ndst;
    }
  }

  // A remote send with a choice of host: its index in plan_->remote_sends,
  // its step, and where its candidates (one holder per host, in the order of
  // its candidate hosts) begin in candidates_.
  struct PendingSend {
    int64_t send;
    size_t step;
    size_t candidates;
  };

  // A candidate source of a pending send: its rank and region.
  struct Candidate {
    int32_t rank;
    int32_t strides;
    int64_t offset;
  };

  Plan* plan_;
  std::vector<int64_t> out_, in_, local_;
  // Millions in a large plan: a deque grows without copying them.
  std::deque<PendingSend> pending_;
  std::vector<Candidate> candidates_;
  absl::flat_hash_map<std::array<int64_t, kMaxDims>, int32_t> strides_index_;
  absl::flat_hash_map<std::array<int64_t, kMaxDims>, int32_t> shapes_index_;
  // The length of the last step while merged steps extend it, else -1.
  int64_t merged_elements_ = -1;
  int32_t contiguous_ = 0;
  // The holders of the region being placed, by host, and where its
  // candidates begin in candidates_ (-1 until a send needs them).
  HostRuns holders_by_host_;
  int64_t region_candidates_ = -1;
};

absl::Status ResolveLost(const LostSet& lost, const HostTable& hosts, const ResolvedLayout& from,
                         const std::vector<v1::DeviceSlot>& old_slots, std::vector<char>* alive,
                         std::vector<int>* lost_ranks) {
  alive->assign(from.world(), 1);
  for (const std::string& h : lost.hosts) {
    const int index = hosts.Find(h);
    bool found = false;
    for (int r = 0; r < from.world(); ++r) {
      if (from.host(r) == index) {
        (*alive)[r] = 0;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("lost host \"", h, "\" holds no rank of the current layout"));
    }
  }
  for (int r : lost.ranks) {
    if (r < 0 || r >= from.world()) {
      return absl::InvalidArgumentError(absl::StrCat("lost rank ", r, " is out of range: the ",
                                                     "current layout has ranks 0..",
                                                     from.world() - 1));
    }
    (*alive)[r] = 0;
  }
  for (int r = 0; r < from.world(); ++r) {
    if (!(*alive)[r]) lost_ranks->push_back(r);
  }
  (void)old_slots;
  return absl::OkStatus();
}

// A regenerable blob value without a surviving holder: zeros for every new
// rank that needs it, and the worker regenerates it.
void Regenerate(int item, int64_t bytes, const std::vector<Endpoint>& needers, PlanBuilder* builder,
                Plan* plan) {
  for (const Endpoint& n : needers) {
    builder->AddFill(item, n.rank, 0, bytes, 1);
    plan->regenerate.emplace_back(n.rank, item);
  }
}

absl::Status CheckTargetAvoidsLost(const LostSet& lost, const std::vector<int>& lost_ranks,
                                   const std::vector<v1::DeviceSlot>& old_slots,
                                   const std::vector<v1::DeviceSlot>& new_slots) {
  for (size_t r = 0; r < new_slots.size(); ++r) {
    for (const std::string& h : lost.hosts) {
      if (new_slots[r].host() == h) {
        return absl::InvalidArgumentError(
            absl::StrCat("target.placement: rank ", r, " is on lost host \"", h, "\""));
      }
    }
    for (int lr : lost_ranks) {
      if (new_slots[r].host() == old_slots[lr].host() &&
          new_slots[r].device() == old_slots[lr].device()) {
        return absl::InvalidArgumentError(
            absl::StrCat("target.placement: rank ", r, " is on host \"", new_slots[r].host(),
                         "\" device ", new_slots[r].device(), ", the device of lost rank ", lr));
      }
    }
  }
  return absl::OkStatus();
}


// Templates with the destinations of their overlaps: `every_stage` per
// stage holding the tensor, plus `one_stage`. Stable addresses.
struct CachedTemplate {
  Template tpl;
  size_t every_stage = 0, one_stage = 0;
};
using TemplateCache = std::unordered_map<std::string, CachedTemplate>;

// MakePlan's first pass: each tensor's template (shared by tensors cut
// alike), and the exact number of destinations (one per needer of every
// overlap), reserved so that the plan's arrays never reallocate.
std::vector<const Template*> BuildTemplates(const v1::Ptc& ptc, const ResolvedLayout& old_layout,
                                            const Buckets& old_buckets,
                                            const ResolvedLayout& new_layout,
                                            const Buckets& new_buckets, TemplateCache* templates,
                                            PlanBuilder* builder, Plan* plan) {
  std::vector<const Template*> tensor_templates(ptc.tensors_size());
  std::vector<int> new_stages;
  size_t total_dsts = 0;
  for (int item = 0; item < ptc.tensors_size(); ++item) {
    const v1::TensorSpec& t = ptc.tensors(item);
    auto [it, inserted] = templates->try_emplace(TemplateKey(t, item));
    CachedTemplate& cached = it->second;
    if (inserted) {
      cached.tpl = BuildTemplate(ptc, item, old_layout, old_buckets, new_layout, new_buckets);
      for (std::vector<Group>* side : {&cached.tpl.old_groups, &cached.tpl.new_groups}) {
        for (Group& g : *side) {
          for (Member& m : g.members) m.strides = builder->InternStrides(m.view.strides);
        }
      }
      for (Overlap& ov : cached.tpl.overlaps) {
        ov.shape = builder->InternShape(ov.region.ndim, ov.region.size);
        for (const Member& m : cached.tpl.new_groups[ov.new_group].members) {
          ++(m.stage < 0 ? cached.every_stage : cached.one_stage);
        }
      }
    }
    tensor_templates[item] = &cached.tpl;
    new_layout.StagesHolding(t.partition().pipeline(), &new_stages);
    total_dsts += cached.every_stage * new_stages.size() + cached.one_stage;
  }
  // Blobs: at most one destination per new rank each.
  total_dsts += static_cast<size_t>(ptc.blobs_size()) * new_layout.world();
  plan->dsts.reserve(total_dsts);
  plan->steps.reserve(total_dsts);  // untouched capacity costs no memory
  return tensor_templates;
}

// MakePlan's second pass, item by item: who needs each region and who
// still holds it, handed to the builder; what no survivor holds is named
// in `missing`. The scratch vectors are reused across items.
struct PlanPass {
  const v1::Ptc& ptc;
  const ResolvedLayout& old_layout;
  const ResolvedLayout& new_layout;
  const std::vector<char>& alive;
  PlanBuilder& builder;
  Plan& plan;
  std::vector<std::string> missing;  // one line per item with lost regions
  std::vector<int> old_stages, new_stages;
  std::vector<Endpoint> needers, holders;

  // Rank r of `layout` holding a whole blob.
  Endpoint WholeBlob(const ResolvedLayout& layout, int r) const {
    return Endpoint{r, layout.host(r), layout.device(r), builder.contiguous(), 0};
  }

  void PlaceTensor(int item, const Template& tpl) {
    const v1::TensorSpec& t = ptc.tensors(item);
    const int ebytes = ElementBytes(t.dtype());
    plan.items.push_back(Plan::Item{t.name(), false, ebytes, t.shape_size()});
    old_layout.StagesHolding(t.partition().pipeline(), &old_stages);
    new_layout.StagesHolding(t.partition().pipeline(), &new_stages);
    const std::vector<int> kNoStages;

    // Report each lost old box once, however many new shards need part of it.
    std::vector<int> lost_groups;
    for (const Overlap& ov : tpl.overlaps) {
      const Group& og = tpl.old_groups[ov.old_group];
      const Group& ng = tpl.new_groups[ov.new_group];
      needers.clear();
      holders.clear();
      for (const Member& m : ng.members) {
        const auto need = [&](int p) {
          needers.push_back(
              EndpointOf(new_layout, new_layout.RankAt(m.position, p), ng.box, m, ov.region));
        };
        if (m.stage >= 0) need(m.stage);
        for (int p : m.stage < 0 ? new_stages : kNoStages) need(p);
      }
      for (const Member& m : og.members) {
        const auto hold = [&](int p) {
          const int r = old_layout.RankAt(m.position, p);
          if (alive[r]) holders.push_back(EndpointOf(old_layout, r, og.box, m, ov.region));
        };
        if (m.stage >= 0) hold(m.stage);
        for (int p : m.stage < 0 ? old_stages : kNoStages) hold(p);
      }
      const int64_t bytes = ov.region.Elements() * ebytes;
      if (!builder.PlaceRegion(item, ov.region.ndim, ov.region.size, ov.shape, bytes, needers,
                               holders)) {
        if (std::find(lost_groups.begin(), lost_groups.end(), ov.old_group) == lost_groups.end()) {
          lost_groups.push_back(ov.old_group);
        }
      }
    }
    if (!lost_groups.empty()) {
      std::vector<std::string> lost_regions;
      for (int g : lost_groups) lost_regions.push_back(BoxString(tpl.old_groups[g].box));
      missing.push_back(
          absl::StrCat("tensor \"", t.name(), "\" regions ", absl::StrJoin(lost_regions, " ")));
      return;
    }
    for (const PadRun& run : tpl.new_padding) {
      if (run.stage >= 0) {
        builder.AddFill(item, new_layout.RankAt(run.position, run.stage), run.offset, run.count,
                        ebytes);
        continue;
      }
      for (int p : new_stages) {
        builder.AddFill(item, new_layout.RankAt(run.position, p), run.offset, run.count, ebytes);
      }
    }
  }

  // Places the blob's needers (all of `needers`) or, with no holder left,
  // regenerates it or reports it lost. False when lost.
  bool PlaceWholeBlob(int item, const v1::BlobSpec& blob, int32_t shape_index) {
    const int64_t shape[1] = {blob.size_bytes()};
    if (builder.PlaceRegion(item, 1, shape, shape_index, blob.size_bytes(), needers, holders)) {
      return true;
    }
    if (!blob.regenerable()) return false;
    Regenerate(item, blob.size_bytes(), needers, &builder, &plan);
    return true;
  }

  void PlaceBlob(int b) {
    const v1::BlobSpec& blob = ptc.blobs(b);
    const int item = ptc.tensors_size() + b;
    plan.items.push_back(Plan::Item{blob.name(), true, 1, 1});
    const int64_t size = blob.size_bytes();
    const int32_t shape = builder.InternShape(1, &size);
    if (blob.scope() == v1::BLOB_REPLICATED) {
      needers.clear();
      holders.clear();
      for (int r = 0; r < new_layout.world(); ++r) needers.push_back(WholeBlob(new_layout, r));
      for (int r = 0; r < old_layout.world(); ++r) {
        if (alive[r]) holders.push_back(WholeBlob(old_layout, r));
      }
      if (!PlaceWholeBlob(item, blob, shape)) {
        missing.push_back(absl::StrCat("blob \"", blob.name(), "\" (every holder lost)"));
      }
      return;
    }
    std::vector<int> lost_values;
    for (int k = 0; k < std::min(old_layout.world(), new_layout.world()); ++k) {
      needers.clear();
      holders.clear();
      for (int r = k; r < new_layout.world(); r += old_layout.world()) {
        needers.push_back(WholeBlob(new_layout, r));
      }
      if (alive[k]) holders.push_back(WholeBlob(old_layout, k));
      if (!PlaceWholeBlob(item, blob, shape)) lost_values.push_back(k);
    }
    if (!lost_values.empty()) {
      missing.push_back(absl::StrCat("blob \"", blob.name(), "\" values of old ranks ",
                                     absl::StrJoin(lost_values, ",")));
    }
  }
};

// MakePlan on validated inputs, the job as one.
absl::StatusOr<Plan> PlanWhole(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                               const LostSet& lost) {
  HostTable hosts;
  const ResolvedLayout old_layout = ResolvedLayout::Resolve(from, ptc.num_layers(), &hosts);
  const ResolvedLayout new_layout = ResolvedLayout::Resolve(to, ptc.num_layers(), &hosts);
  const std::vector<v1::DeviceSlot> old_slots = ExpandPlacement(from.placement());
  const std::vector<v1::DeviceSlot> new_slots = ExpandPlacement(to.placement());

  Plan plan;
  std::vector<char> alive;
  if (absl::Status s = ResolveLost(lost, hosts, old_layout, old_slots, &alive, &plan.lost_ranks);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTargetAvoidsLost(lost, plan.lost_ranks, old_slots, new_slots);
      !s.ok()) {
    return s;
  }

  const Buckets old_buckets(ptc, old_layout);
  const Buckets new_buckets(ptc, new_layout);
  PlanBuilder builder(hosts.size(), &plan);
  TemplateCache templates;
  const std::vector<const Template*> tensor_templates = BuildTemplates(
      ptc, old_layout, old_buckets, new_layout, new_buckets, &templates, &builder, &plan);
  PlanPass pass{ptc, old_layout, new_layout, alive, builder, plan, {}, {}, {}, {}, {}};
  for (int item = 0; item < ptc.tensors_size(); ++item) {
    pass.PlaceTensor(item, *tensor_templates[item]);
  }
  for (int b = 0; b < ptc.blobs_size(); ++b) pass.PlaceBlob(b);

  if (!pass.missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        pass.missing.size(), " items have regions that no surviving rank holds (lost ranks ",
        absl::StrJoin(plan.lost_ranks, ","), "): ", absl::StrJoin(pass.missing, "; ")));
  }
  std::sort(plan.regenerate.begin(), plan.regenerate.end());
  builder.Finish(hosts);
  return plan;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                              const LostSet& lost) {
  if (absl::Status s = ValidatePtc(ptc); !s.ok()) return s;
  if (absl::Status s = ValidateLayout(ptc, from, "layout"); !s.ok()) return s;
  if (absl::Status s = ValidateLayout(ptc, to, "target"); !s.ok()) return s;
  if (std::optional<ReplicaSplit> split = SplitReplicas(ptc, from, to, lost)) {
    absl::StatusOr<Plan> one = PlanWhole(ptc, split->from, split->to, {});
    if (!one.ok()) return one.status();
    return RepeatOverReplicas(*std::move(one), *split);
  }
  return PlanWhole(ptc, from, to, lost);
}

absl::StatusOr<v1::TransferPlan> PlanTransfer(const v1::Ptc& ptc, const v1::Layout& from,
                                              const v1::Layout& to, const LostSet& lost) {
  absl::StatusOr<Plan> plan = MakePlan(ptc, from, to, lost);
  if (!plan.ok()) return plan.status();
  return ToProto(*plan, from, to);
}

}  // namespace reshard::planner
