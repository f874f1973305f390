#include "services/coordinator/logic/cost_estimates.h"

#include <map>
#include <string>

#include "common/log.h"
#include "cost/predict.h"

namespace reshard::coordinator {
namespace {

// The operations whose hosts run the plan they were predicted for.
bool MovesItsPlan(const v1::Operation& op) {
  return op.kind() != v1::OPERATION_KIND_CHECKPOINT && !op.stop_free() && op.has_prediction();
}

}  // namespace

v1::CostPrediction PredictPlan(cost::CostModel& model, Store& store, const planner::Plan& plan,
                               const v1::Layout& from, const v1::Layout& to) {
  std::map<std::string, v1::HostProbe> probes;
  absl::StatusOr<std::vector<v1::Host>> hosts = store.ListHosts();
  if (hosts.ok()) {
    for (const v1::Host& h : *hosts) {
      if (!h.has_probe()) continue;
      probes[h.host_id()] = h.probe();
      model.NoteProbe(h.host_id(), h.probe());
    }
  }
  return cost::Predict(cost::TrafficOf(plan, from, to), model, probes);
}

void LearnFromDone(cost::CostModel& model, CoordinatorMetrics* metrics, const v1::Operation& op,
                   const v1::ReportProgressRequest& done) {
  if (!MovesItsPlan(op) || !done.has_timings()) return;
  for (const v1::HostCost& h : op.prediction().hosts()) {
    if (h.host() != done.host_id()) continue;
    cost::TaskObservation o;
    o.host = h.host();
    o.bytes_in = h.bytes_in();
    o.bytes_out = h.bytes_out();
    o.bytes_local = h.bytes_local();
    o.bytes_new = h.bytes_new();
    o.route = done.route();
    o.timings = done.timings();
    model.ObserveTask(op.id(), o);
    const v1::TaskTimings& t = o.timings;
    RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id() << " host=" << o.host
                      << " task took " << t.total_seconds() << " s (set up " << t.setup_seconds()
                      << ", prove " << t.prove_seconds() << ", move " << t.move_seconds()
                      << ", verify " << t.verify_seconds() << ", seal " << t.seal_seconds()
                      << "; " << t.cpu_seconds() << " CPU-s), predicted " << h.total_seconds()
                      << " s (set up " << h.setup_seconds() << ", move " << h.move_seconds()
                      << ", verify " << h.verify_seconds() << ", seal " << h.seal_seconds()
                      << "); bytes in " << o.bytes_in << ", out " << o.bytes_out << ", local "
                      << o.bytes_local << ", new " << o.bytes_new;
    const double cpu = model.RatesOf(o.host, nullptr).cpu_seconds_per_byte;
    if (metrics != nullptr && cpu > 0) metrics->HostCpuPerByte(o.host, cpu);
    return;
  }
}

void LearnFromEnd(cost::CostModel& model, CoordinatorMetrics* metrics, const v1::Operation& ended) {
  if (ended.state() != v1::OPERATION_STATE_COMMITTED || !MovesItsPlan(ended) ||
      !(ended.actual_seconds() > 0)) {
    model.Forget(ended.id());
    return;
  }
  model.ObserveCommit(ended.id(), ended.actual_seconds());
  if (metrics != nullptr) {
    metrics->PredictionChecked(ended.kind(), ended.actual_seconds(), ended.prediction().seconds());
  }
}

}  // namespace reshard::coordinator
