// PlaceLayout and PtcStateBytesPerDevice: the advisor's bridge to the
// planner's view of a job (layouts over hosts, bytes per rank).
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "advisor/advisor.h"
#include "planner/layout.h"
#include "planner/validate.h"

namespace reshard::advisor {

absl::StatusOr<v1::Layout> PlaceLayout(const ParallelChoice& c, const ClusterOffer& cluster,
                                       const v1::Layout* current) {
  // Host order: the current placement's hosts first, so that ranks stay
  // where their bytes are, then the rest of the offer.
  std::vector<int> order;
  std::unordered_set<int> taken;
  if (current != nullptr) {
    for (const v1::DeviceSlot& slot : planner::ExpandPlacement(current->placement())) {
      for (int i = 0; i < static_cast<int>(cluster.hosts.size()); ++i) {
        if (cluster.hosts[i].name == slot.host() && taken.insert(i).second) order.push_back(i);
      }
    }
  }
  for (int i = 0; i < static_cast<int>(cluster.hosts.size()); ++i) {
    if (taken.insert(i).second) order.push_back(i);
  }
  const int world = c.tp * c.pp * c.dp;
  v1::Layout layout;
  v1::ParallelConfig* config = layout.mutable_config();
  config->set_tp(c.tp);
  config->set_pp(c.pp);
  config->set_dp(c.dp);
  config->set_order(v1::RANK_ORDER_TP_DP_PP);
  config->set_dp_shard(KeptDpShard(current, c.dp));
  int placed = 0;
  for (int i : order) {
    const HostOffer& host = cluster.hosts[i];
    const int usable = host.devices / c.tp * c.tp;  // tp groups stay inside a host
    for (int d = 0; d < usable && placed < world; ++d, ++placed) {
      v1::DeviceSlot* slot = layout.mutable_placement()->add_ranks();
      slot->set_host(host.name);
      slot->set_device(d);
    }
    if (placed == world) break;
  }
  if (placed < world) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", c.tp, " x pp ", c.pp, " x dp ", c.dp, " = ", world,
                     " ranks do not fit the offer: ", placed, " devices usable at tp ", c.tp));
  }
  return layout;
}

int KeptDpShard(const v1::Layout* current, int dp) {
  if (current == nullptr) return 0;
  const int ds = current->config().dp_shard();
  return ds > 0 && ds < dp && dp % ds == 0 ? ds : 0;
}

double PtcStateBytesPerDevice(const v1::Ptc& ptc, int tp, int pp, int dp, int dp_shard) {
  v1::ParallelConfig config;
  config.set_tp(tp);
  config.set_pp(pp);
  config.set_dp(dp);
  const int layers = std::max(1, ptc.num_layers());
  const std::vector<int> starts = planner::StageStarts(config, layers);
  auto stage_of = [&](int layer) {
    return static_cast<int>(std::upper_bound(starts.begin(), starts.end(), layer) -
                            starts.begin()) -
           1;
  };
  std::vector<double> stage(pp, 0.0);
  auto add = [&](const v1::Pipeline& p, double bytes) {
    switch (p.mode()) {
      case v1::PIPELINE_LAYER:
        stage[std::clamp(stage_of(p.layer()), 0, pp - 1)] += bytes;
        break;
      case v1::PIPELINE_LAST_STAGE:
        stage[pp - 1] += bytes;
        break;
      case v1::PIPELINE_EVERY_STAGE:
        for (double& s : stage) s += bytes;
        break;
      default:  // first stage (and unspecified, which validation rejects)
        stage[0] += bytes;
    }
  };
  for (const v1::TensorSpec& t : ptc.tensors()) {
    double elements = 1;
    for (int64_t d : t.shape()) elements *= static_cast<double>(d);
    // Uneven splits: the largest piece, rounded up.
    if (t.partition().tp().mode() == v1::TP_SPLIT) {
      const int axis = t.partition().tp().axis();
      const double len = axis < t.shape_size() ? static_cast<double>(t.shape(axis)) : 1;
      if (len > 0) elements = elements / len * std::ceil(len / tp);
    }
    // Expert tensors ignore dp_shard (their edp group); the advisor has no cp.
    const int group = dp_shard > 0 && !t.partition().has_expert() ? dp_shard : dp;
    if (t.partition().dp().mode() != v1::DP_REPLICATED) elements = std::ceil(elements / group);
    add(t.partition().pipeline(), elements * planner::ElementBytes(t.dtype()));
  }
  double blobs = 0;
  for (const v1::BlobSpec& b : ptc.blobs()) blobs += static_cast<double>(b.size_bytes());
  return *std::max_element(stage.begin(), stage.end()) + blobs;
}

}  // namespace reshard::advisor
