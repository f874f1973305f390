#include "services/coordinator/logic/advise_api.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "advisor/advisor.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/request_checks.h"

namespace reshard::coordinator {
namespace {

absl::Status NonNegative(absl::string_view field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " ", value, ": must be >= 0 (0: default)"));
}

absl::Status CheckNumbers(const v1::AdviseRequest& r) {
  if (r.gpus() <= 0 || r.gpus() > kMaxAdviseGpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus ", r.gpus(), ": must be in [1, ", kMaxAdviseGpus, "]"));
  }
  if (r.hosts_size() > kMaxAdviseHosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("hosts has ", r.hosts_size(), " entries; the limit is ", kMaxAdviseHosts));
  }
  const v1::AdviseModel& m = r.model();
  const v1::AdviseDevices& d = r.devices();
  const std::pair<absl::string_view, double> fields[] = {
      {"horizon_s", r.horizon_s()},
      {"model.layers", m.layers()},
      {"model.hidden", static_cast<double>(m.hidden())},
      {"model.heads", m.heads()},
      {"model.kv_heads", m.kv_heads()},
      {"model.ffn_hidden", static_cast<double>(m.ffn_hidden())},
      {"model.vocab", static_cast<double>(m.vocab())},
      {"model.seq_length", static_cast<double>(m.seq_length())},
      {"model.global_batch", static_cast<double>(m.global_batch())},
      {"model.max_micro_batch", m.max_micro_batch()},
      {"devices.memory_bytes", d.memory_bytes()},
      {"devices.peak_flops", d.peak_flops()},
      {"devices.hbm_bytes_per_s", d.hbm_bytes_per_s()},
      {"devices.intra_host_bytes_per_s", d.intra_host_bytes_per_s()},
      {"devices.inter_host_bytes_per_s", d.inter_host_bytes_per_s()},
      {"devices.devices_per_host", d.devices_per_host()},
  };
  for (const auto& [field, value] : fields) {
    if (absl::Status s = NonNegative(field, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// [vocab, hidden] of the PTC's word embeddings, named as Megatron and
// Hugging Face name them (client/python/reshard/frameworks/megatron.py); {0, 0} if none.
std::pair<int64_t, int64_t> WordEmbeddingShape(const v1::Ptc& ptc) {
  for (const v1::TensorSpec& t : ptc.tensors()) {
    const absl::string_view name = t.name();
    if (t.shape_size() == 2 && (absl::StrContains(name, "word_embeddings") ||
                                absl::EndsWith(name, "embed_tokens.weight"))) {
      return {t.shape(0), t.shape(1)};
    }
  }
  return {0, 0};
}

absl::StatusOr<advisor::ModelSpec> ModelOf(const v1::AdviseModel& m, const v1::Ptc& ptc) {
  advisor::ModelSpec spec;
  const auto [ptc_vocab, ptc_hidden] = WordEmbeddingShape(ptc);
  spec.layers = m.layers() > 0 ? m.layers() : ptc.num_layers();
  spec.hidden = m.hidden() > 0 ? m.hidden() : ptc_hidden;
  spec.vocab = m.vocab() > 0 ? m.vocab() : ptc_vocab;
  spec.heads = m.heads();
  spec.kv_heads = m.kv_heads();
  spec.ffn_hidden = m.ffn_hidden();
  spec.gated_mlp = m.gated_mlp();
  spec.seq_length = m.seq_length();
  const std::pair<absl::string_view, int64_t> required[] = {
      {"model.hidden", spec.hidden},
      {"model.vocab", spec.vocab},
      {"model.heads", spec.heads},
      {"model.seq_length", spec.seq_length},
      {"model.global_batch", m.global_batch()},
  };
  for (const auto& [field, value] : required) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " 0: required (the job's PTC does not say it)"));
    }
  }
  return spec;
}

}  // namespace

v1::AdviseRequest AdviceRequest(const v1::PolicyAdvice& advice, const std::string& job_id, int gpus,
                                const std::vector<std::string>& hosts) {
  v1::AdviseRequest r;
  r.set_job_id(job_id);
  r.set_gpus(gpus);
  for (const std::string& h : hosts) r.add_hosts(h);
  *r.mutable_model() = advice.model();
  *r.mutable_devices() = advice.devices();
  r.set_horizon_s(advice.horizon_s());
  return r;
}

absl::Status CheckPolicyAdvice(const v1::PolicyAdvice& advice, const v1::Ptc& ptc,
                               absl::string_view field) {
  const v1::AdviseRequest r = AdviceRequest(advice, "", 1, {});
  absl::Status s = CheckNumbers(r);
  if (s.ok()) s = ModelOf(r.model(), ptc).status();
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(field, ".advise.", s.message()));
}

namespace {

// Hosts of `layout` in placement order, and the most ranks on one of them.
std::pair<std::vector<std::string>, int> CurrentHosts(const v1::Layout& layout) {
  std::vector<std::string> order;
  std::map<std::string, int> ranks;
  for (const v1::DeviceSlot& slot : planner::ExpandPlacement(layout.placement())) {
    if (ranks[slot.host()]++ == 0) order.push_back(slot.host());
  }
  int most = 1;
  for (const auto& [host, n] : ranks) most = std::max(most, n);
  return {order, most};
}

int CudaDevices(const v1::Host& host) {
  int n = 0;
  for (const v1::Device& d : host.devices()) n += d.kind() == "cuda" ? 1 : 0;
  return n;
}

// The devices' type: one of the advisor's table, or described in full.
absl::StatusOr<advisor::GpuType> GpuOf(const v1::AdviseDevices& d) {
  advisor::GpuType gpu;
  gpu.name = d.gpu_type().empty() ? kDefaultGpuType : d.gpu_type();
  if (advisor::KnownGpu(gpu.name).memory_bytes == 0 &&
      (d.memory_bytes() == 0 || d.peak_flops() == 0 || d.hbm_bytes_per_s() == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices.gpu_type \"", TruncateError(gpu.name, 64),
        "\" is not in the advisor's table (A100, A100-40GB, H100): give devices.memory_bytes, "
        "devices.peak_flops and devices.hbm_bytes_per_s"));
  }
  gpu.memory_bytes = d.memory_bytes();
  gpu.peak_flops = d.peak_flops();
  gpu.hbm_bytes_per_s = d.hbm_bytes_per_s();
  return gpu;
}

// The hosts offered to the advisor: the request's, in its order (each
// registered, alive and named once), else the live ones, the job's first.
template <typename IsLost>
absl::StatusOr<std::vector<const v1::Host*>> OfferedHosts(
    const v1::AdviseRequest& request, const std::vector<v1::Host>& registered,
    const std::vector<std::string>& current_hosts, const IsLost& is_lost) {
  std::map<std::string, const v1::Host*> by_id;
  for (const v1::Host& h : registered) by_id[h.host_id()] = &h;
  std::vector<const v1::Host*> offered;
  if (request.hosts_size() > 0) {
    std::set<std::string> seen;
    for (int i = 0; i < request.hosts_size(); ++i) {
      const std::string& id = request.hosts(i);
      const std::string field = absl::StrCat("hosts[", i, "] \"", TruncateError(id, 256), "\"");
      if (!seen.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": named twice"));
      }
      auto it = by_id.find(id);
      if (it == by_id.end()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": not a registered host"));
      }
      if (it->second->state() != v1::HOST_STATE_ALIVE || is_lost(id)) {
        return absl::FailedPreconditionError(absl::StrCat(field, ": host is lost"));
      }
      offered.push_back(it->second);
    }
  } else {
    // The live hosts, but those with a notice (they are going).
    for (const std::string& id : current_hosts) {
      auto it = by_id.find(id);
      if (it != by_id.end() && it->second->state() == v1::HOST_STATE_ALIVE && !is_lost(id) &&
          it->second->leaves_unix_ms() == 0) {
        offered.push_back(it->second);
      }
    }
    for (const v1::Host& h : registered) {
      if (h.state() == v1::HOST_STATE_ALIVE && !is_lost(h.host_id()) && h.leaves_unix_ms() == 0 &&
          std::find(current_hosts.begin(), current_hosts.end(), h.host_id()) ==
              current_hosts.end()) {
        offered.push_back(&h);
      }
    }
  }
  return offered;
}

// One candidate of the advice as the API returns it.
v1::AdviseCandidate CandidateOf(advisor::Candidate c, double horizon) {
  v1::AdviseCandidate out;
  out.set_tp(c.choice.tp);
  out.set_pp(c.choice.pp);
  out.set_dp(c.choice.dp);
  out.set_micro_batch(c.choice.micro_batch);
  out.set_recompute(advisor::RecomputeName(c.choice.recompute));
  out.set_step_seconds(c.time.total);
  out.set_memory_bytes(c.memory.total);
  out.set_state_bytes(c.memory.state);
  out.set_activation_bytes(c.memory.activations);
  out.set_tflops_per_gpu(c.tflops_per_gpu);
  *out.mutable_layout() = std::move(c.layout);
  out.set_reconfig_priced(c.reconfig.computed);
  out.set_reconfig_error(TruncateError(c.reconfig.error, 1024));
  out.set_cross_host_bytes(c.reconfig.cross_host_bytes);
  out.set_busiest_host(c.reconfig.busiest_host);
  out.set_busiest_host_bytes(c.reconfig.busiest_host_bytes);
  out.set_transfer_seconds(c.reconfig.transfer_seconds);
  if (c.reconfig.computed && c.time.total > 0) {
    out.set_steps_in_horizon(std::max(0.0, (horizon - c.reconfig.transfer_seconds) / c.time.total));
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::AdviseResponse> AdviseApi::Advise(const v1::AdviseRequest& request) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckNumbers(request); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = store_->GetJob(request.job_id(), /*include_ptc=*/true);
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(request.job_id()));
  return AdviseJob(request, *job);
}

absl::StatusOr<v1::AdviseResponse> AdviseApi::AdviseJob(const v1::AdviseRequest& request,
                                                        const v1::Job& job,
                                                        const planner::LostSet* lost) {
  auto is_lost = [&](const std::string& host) {
    return lost != nullptr &&
           std::find(lost->hosts.begin(), lost->hosts.end(), host) != lost->hosts.end();
  };
  if (absl::Status s = CheckNumbers(request); !s.ok()) return s;
  const v1::AdviseDevices& d = request.devices();
  advisor::AdviceRequest in;
  absl::StatusOr<advisor::ModelSpec> model = ModelOf(request.model(), job.ptc());
  if (!model.ok()) return model.status();
  in.model = *std::move(model);
  in.training.global_batch = request.model().global_batch();
  in.training.distributed_optimizer = request.model().distributed_optimizer();
  in.max_micro_batch = request.model().max_micro_batch();

  absl::StatusOr<advisor::GpuType> gpu_type = GpuOf(d);
  if (!gpu_type.ok()) return gpu_type.status();
  const advisor::GpuType& gpu = *gpu_type;
  in.cluster.intra_host_bytes_per_s =
      d.intra_host_bytes_per_s() > 0 ? d.intra_host_bytes_per_s() : kDefaultIntraHostBytesPerS;
  in.cluster.inter_host_bytes_per_s =
      d.inter_host_bytes_per_s() > 0 ? d.inter_host_bytes_per_s() : kDefaultInterHostBytesPerS;

  // The hosts: named ones in their order, else the live ones, the job's first.
  absl::StatusOr<std::vector<v1::Host>> registered = store_->ListHosts();
  if (!registered.ok()) return registered.status();
  const auto [current_hosts, ranks_per_host] = CurrentHosts(job.layout());
  absl::StatusOr<std::vector<const v1::Host*>> offered_hosts =
      OfferedHosts(request, *registered, current_hosts, is_lost);
  if (!offered_hosts.ok()) return offered_hosts.status();
  const std::vector<const v1::Host*>& offered = *offered_hosts;
  int remaining = request.gpus();
  std::vector<std::string> have;
  for (const v1::Host* h : offered) {
    if (remaining == 0) break;
    int devices = d.devices_per_host();
    if (devices == 0) devices = CudaDevices(*h);
    if (devices == 0) devices = ranks_per_host;
    const int take = std::min(devices, remaining);
    remaining -= take;
    in.cluster.hosts.push_back({h->host_id(), take, gpu});
    have.push_back(absl::StrCat(h->host_id(), ": ", devices));
  }
  if (remaining > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("gpus ", request.gpus(), ": the ", offered.size(), " live hosts offered have ",
                     request.gpus() - remaining, " devices (",
                     have.empty() ? "none" : absl::StrJoin(have, ", "), ")"));
  }

  in.current = {&job.ptc(), &job.layout(), lost};
  absl::StatusOr<advisor::Advice> advice = advisor::Advise(in);
  if (!advice.ok()) return advice.status();
  const double memory =
      gpu.memory_bytes > 0 ? gpu.memory_bytes : advisor::KnownGpu(gpu.name).memory_bytes;
  if (advice->pareto.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job.id(), "\": no layout of at most ", request.gpus(), " ", gpu.name,
        " devices fits: none of the ", advice->considered,
        " (tp, pp, dp, micro-batch, recompute) tuples considered stays within ",
        in.training.usable_memory_fraction * 100, "% of ", memory / (1 << 30), " GiB per device"));
  }
  const double horizon = request.horizon_s() > 0 ? request.horizon_s() : kDefaultAdviseHorizonS;

  v1::AdviseResponse response;
  response.set_horizon_s(horizon);
  response.set_considered(advice->considered);
  response.set_feasible(advice->feasible);
  response.set_gpu_type(gpu.name);
  for (const advisor::HostOffer& h : in.cluster.hosts) {
    response.add_hosts(h.name);
    response.add_host_devices(h.devices);
  }
  response.set_best(advisor::BestForHorizon(*advice, horizon, /*priced=*/true));
  for (advisor::Candidate& c : advice->pareto) {
    *response.add_candidates() = CandidateOf(std::move(c), horizon);
  }
  return response;
}

absl::StatusOr<v1::Layout> AdviseApi::Choose(const v1::AdviseRequest& request, const v1::Job& job,
                                             const planner::LostSet* lost) {
  absl::StatusOr<v1::AdviseResponse> advice = AdviseJob(request, job, lost);
  if (!advice.ok()) return advice.status();
  if (advice->best() >= 0) return advice->candidates(advice->best()).layout();
  for (const v1::AdviseCandidate& c : advice->candidates()) {
    if (c.reconfig_priced()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job \"", job.id(), "\": no candidate completes a step within horizon_s ",
                       advice->horizon_s(), " after its move"));
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("job \"", job.id(), "\": none of the ", advice->candidates_size(),
                   " candidates can be planned from the current layout; the first: ",
                   advice->candidates(0).reconfig_error()));
}

}  // namespace reshard::coordinator
