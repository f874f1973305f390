#include "services/coordinator/logic/agent_api.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "planner/layout.h"
#include "services/coordinator/logic/cluster_secrets.h"
#include "services/coordinator/logic/cost_estimates.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/task.h"

namespace reshard::coordinator {
namespace {

const HostProgress* FindHost(const std::vector<HostProgress>& rows, const std::string& host_id) {
  for (const HostProgress& row : rows) {
    if (row.host_id == host_id) return &row;
  }
  return nullptr;
}

bool IsHostFinal(v1::HostTaskState state) {
  return state == v1::HOST_TASK_STATE_DONE || state == v1::HOST_TASK_STATE_FAILED;
}

// A DONE host vouches for every shard it wrote: exactly one checksum per
// (item, new rank) the plan writes there, so that the committed generation
// has a checksum for every shard.
absl::Status CheckChecksums(const v1::TransferPlan& plan, const std::string& host_id,
                            const google::protobuf::RepeatedPtrField<v1::ShardChecksum>& sums) {
  const std::set<std::pair<int, int>> expected = ShardsWrittenOnHost(plan, host_id);
  if (absl::Status s = CheckShardChecksums(
          "checksums", sums, expected,
          absl::StrCat(" is not a shard the plan writes on host \"", host_id, "\""));
      !s.ok()) {
    return s;
  }
  std::set<std::pair<int, int>> seen;
  for (const v1::ShardChecksum& c : sums) seen.insert({c.item(), c.rank()});
  for (const auto& [item, rank] : expected) {
    if (seen.count({item, rank}) == 0) {
      const std::string name = item < plan.items_size() ? plan.items(item).name() : "";
      return absl::InvalidArgumentError(
          absl::StrCat("checksums: no checksum for item ", item, " (\"", name, "\") rank ", rank,
                       "; a DONE ", "report carries one for every shard written on host \"",
                       host_id, "\" (", expected.size(), " shards)"));
    }
  }
  return absl::OkStatus();
}

// Whether `held` (what the agent reports) has every rank of `job`'s current
// generation placed on `host_id`, sealed, with the checksums recorded at
// commit (`committed`; none for a generation workers published). Sets *why
// otherwise.
bool HoldsIntact(const v1::Job& job, const std::string& host_id,
                 const std::vector<v1::ShardChecksum>& committed,
                 const std::map<std::pair<int64_t, int>, const v1::HeldRank*>& held,
                 std::string* why) {
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
  for (int rank = 0; rank < static_cast<int>(slots.size()); ++rank) {
    if (slots[rank].host() != host_id) continue;
    auto it = held.find({job.generation(), rank});
    if (it == held.end() || !it->second->sealed()) {
      *why = absl::StrCat("rank ", rank, " of generation ", job.generation(),
                          it == held.end() ? " is not held" : " is not sealed");
      return false;
    }
    for (const v1::ShardChecksum& c : committed) {
      if (c.rank() != rank) continue;
      const v1::HeldRank& h = *it->second;
      if (c.item() >= h.checksums_size() || h.checksums(c.item()) != c.checksum()) {
        *why = absl::StrCat("rank ", rank, " item ", c.item(), ": checksum ",
                            c.item() < h.checksums_size() ? h.checksums(c.item()) : 0, " held, ",
                            c.checksum(), " committed");
        return false;
      }
    }
  }
  return true;
}

}  // namespace

absl::Status CheckShardChecksums(absl::string_view field,
                                 const google::protobuf::RepeatedPtrField<v1::ShardChecksum>& sums,
                                 const std::set<std::pair<int, int>>& expected,
                                 absl::string_view not_expected) {
  std::set<std::pair<int, int>> seen;
  for (int i = 0; i < sums.size(); ++i) {
    const std::pair<int, int> shard{sums[i].item(), sums[i].rank()};
    if (expected.count(shard) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: item ", shard.first,
                                                     " rank ", shard.second, not_expected));
    }
    if (!seen.insert(shard).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: item ", shard.first,
                                                     " rank ", shard.second, " given twice"));
    }
    if (sums[i].bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: bytes is ", sums[i].bytes()));
    }
  }
  return absl::OkStatus();
}

AgentApi::AgentApi(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics, Options options)
    : store_(std::move(store)), clock_(clock), metrics_(metrics), options_(options) {}

absl::StatusOr<v1::RegisterAgentResponse> AgentApi::RegisterAgent(
    const v1::RegisterAgentRequest& request) {
  if (absl::Status s = RequireNonEmpty("host.host_id", request.host().host_id()); !s.ok()) {
    return s;
  }
  v1::Host host = request.host();
  host.set_state(v1::HOST_STATE_ALIVE);
  const int64_t now = clock_->NowUnixMs();
  host.set_last_heartbeat_unix_ms(now);
  host.set_lease_expires_unix_ms(now + options_.lease_ms);
  absl::StatusOr<int64_t> epoch = store_->RegisterHost(host, now, now + options_.lease_ms);
  if (!epoch.ok()) return epoch.status();
  {
    std::lock_guard<std::mutex> l(known_mu_);
    known_hosts_.insert(host.host_id());  // its polls need not read it
  }
  RESHARD_LOG(INFO) << "host=" << host.host_id() << " registered epoch=" << *epoch
                    << " address=" << host.address() << " devices=" << host.devices_size()
                    << " holding " << request.held_ranks_size() << " rank buffers";
  if (*epoch > 1) {
    if (absl::Status s = FailTasksOfEarlierIncarnation(host.host_id(), *epoch); !s.ok()) return s;
  }
  if (absl::Status s = RestoreReturnedHost(request); !s.ok()) return s;
  v1::RegisterAgentResponse response;
  response.set_lease_ms(options_.lease_ms);
  response.set_epoch(*epoch);
  if (absl::Status s = AddDeletedJobs(request.held_jobs(), response.mutable_deleted_jobs());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AddStaleGenerations(request.held_ranks(), response.mutable_release());
      !s.ok()) {
    return s;
  }
  return response;
}

absl::Status AgentApi::AddDeletedJobs(const google::protobuf::RepeatedPtrField<std::string>& held,
                                      google::protobuf::RepeatedPtrField<std::string>* deleted) {
  absl::StatusOr<std::vector<std::string>> missing =
      store_->DeletedJobs({held.begin(), held.end()});
  if (!missing.ok()) return missing.status();
  for (std::string& id : *missing) deleted->Add(std::move(id));
  return absl::OkStatus();
}

absl::Status AgentApi::AddStaleGenerations(
    const google::protobuf::RepeatedPtrField<v1::HeldRank>& held,
    google::protobuf::RepeatedPtrField<v1::GenerationRef>* release) {
  // Generations released or discarded while the agent was away may be
  // pruned by now (retention), so Heartbeat would never name them.
  std::set<std::pair<std::string, int64_t>> generations;
  for (const v1::HeldRank& h : held) generations.emplace(h.job_id(), h.generation());
  std::vector<v1::GenerationRef> refs;
  for (const auto& [job_id, generation] : generations) {
    v1::GenerationRef ref;
    ref.set_job_id(job_id);
    ref.set_generation(generation);
    refs.push_back(std::move(ref));
  }
  absl::StatusOr<std::vector<v1::GenerationRef>> stale = store_->StaleGenerations(refs);
  if (!stale.ok()) return stale.status();
  for (v1::GenerationRef& ref : *stale) *release->Add() = std::move(ref);
  return absl::OkStatus();
}

absl::Status AgentApi::FailTasksOfEarlierIncarnation(const std::string& host_id, int64_t epoch) {
  absl::StatusOr<std::vector<std::string>> ops = store_->OperationsOnHosts({host_id});
  if (!ops.ok()) return ops.status();
  const int64_t now = clock_->NowUnixMs();
  for (const std::string& op_id : *ops) {
    absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op_id);
    if (absl::IsNotFound(rows.status())) continue;  // deleted since
    if (!rows.ok()) return rows.status();
    const HostProgress* row = FindHost(*rows, host_id);
    if (row == nullptr || IsHostFinal(row->state)) continue;
    HostProgress failed = *row;
    failed.state = v1::HOST_TASK_STATE_FAILED;
    failed.progress_unix_ms = now;
    failed.error = absl::StrCat("the agent restarted (epoch ", epoch - 1, " -> ", epoch,
                                "): the task its earlier incarnation held (",
                                v1::HostTaskState_Name(row->state), ", ", row->bytes_done, " of ",
                                row->bytes_total, " bytes) is lost");
    absl::Status s = store_->RecordHostProgress(op_id, failed, {});
    if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) continue;  // ended since
    if (!s.ok()) return s;
    RESHARD_LOG(WARNING) << "operation=" << op_id << " host=" << host_id << ": " << failed.error;
  }
  return absl::OkStatus();
}

absl::Status AgentApi::RestoreReturnedHost(const v1::RegisterAgentRequest& request) {
  const std::string& host_id = request.host().host_id();
  absl::StatusOr<std::vector<std::string>> jobs = store_->JobsLostOnHost(host_id);
  if (!jobs.ok()) return jobs.status();
  for (const std::string& job_id : *jobs) {
    absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/false);
    if (absl::IsNotFound(job.status())) continue;
    if (!job.ok()) return job.status();
    absl::StatusOr<std::vector<v1::ShardChecksum>> committed =
        store_->GetGenerationChecksums(job_id, job->generation());
    if (!committed.ok()) return committed.status();
    std::map<std::pair<int64_t, int>, const v1::HeldRank*> held;
    for (const v1::HeldRank& h : request.held_ranks()) {
      if (h.job_id() == job_id) held[{h.generation(), h.rank()}] = &h;
    }
    std::string why;
    if (!HoldsIntact(*job, host_id, *committed, held, &why)) {
      RESHARD_LOG(WARNING) << "job=" << job_id << " host=" << host_id
                           << " registered again but stays lost: " << why;
      continue;
    }
    if (absl::Status s = store_->RestoreLostHost(job_id, host_id); !s.ok()) return s;
    RESHARD_LOG(INFO) << "job=" << job_id << " host=" << host_id
                      << " is back with the shards of generation " << job->generation()
                      << " intact: no longer lost";
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> AgentApi::Heartbeat(const v1::HeartbeatRequest& request) {
  return std::move(HeartbeatMany({&request}).front());
}

void AgentApi::NoteAgentHealth(const v1::HeartbeatRequest& request) {
  const int64_t lag_ms = request.scheduling_lag_ms();
  if (metrics_ != nullptr) metrics_->AgentHeartbeatLag(static_cast<double>(lag_ms) / 1000.0);
  // A third of a lease late is a whole heartbeat period missed: a busy host,
  // kept (docs/coordinator.md, "Busy is not dead"), and worth a line.
  if (lag_ms > options_.lease_ms / 3) {
    RESHARD_LOG(WARNING) << "host=" << request.host_id() << " busy: its heartbeat left " << lag_ms
                         << " ms late (lease " << options_.lease_ms << " ms), "
                         << request.tasks_running() << " tasks running, "
                         << request.bytes_written() << " bytes written so far";
  }
}

std::vector<absl::StatusOr<v1::HeartbeatResponse>> AgentApi::HeartbeatMany(
    const std::vector<const v1::HeartbeatRequest*>& requests) {
  std::vector<absl::StatusOr<v1::HeartbeatResponse>> answers(requests.size());
  std::vector<HostHeartbeat> beats;
  std::vector<size_t> beat_of;  // beats[k] answers requests[beat_of[k]]
  const int64_t now = clock_->NowUnixMs();
  for (size_t i = 0; i < requests.size(); ++i) {
    const v1::HeartbeatRequest& request = *requests[i];
    if (absl::Status s = RequireNonEmpty("host_id", request.host_id()); !s.ok()) {
      answers[i] = s;
      continue;
    }
    if (request.epoch() < 1) {
      answers[i] = absl::InvalidArgumentError(absl::StrCat(
          "epoch is ", request.epoch(), "; use the epoch RegisterAgent returned (>= 1)"));
      continue;
    }
    HostHeartbeat beat;
    beat.host_id = request.host_id();
    beat.epoch = request.epoch();
    beat.now_unix_ms = now;
    beat.lease_expires_unix_ms = now + options_.lease_ms;
    beat.held_jobs.assign(request.held_jobs().begin(), request.held_jobs().end());
    NoteAgentHealth(request);
    beats.push_back(std::move(beat));
    beat_of.push_back(i);
  }
  if (beats.empty()) return answers;
  absl::StatusOr<std::vector<HostHeartbeatResult>> results = store_->HeartbeatHosts(beats);
  for (size_t k = 0; k < beats.size(); ++k) {
    absl::StatusOr<v1::HeartbeatResponse>& answer = answers[beat_of[k]];
    if (!results.ok()) {
      answer = results.status();
      continue;
    }
    HostHeartbeatResult& result = (*results)[k];
    if (!result.status.ok()) {
      answer = NameNotFound(result.status, HostNotFound(beats[k].host_id));
      continue;
    }
    v1::HeartbeatResponse response;
    response.set_lease_ms(options_.lease_ms);
    for (std::string& id : result.assigned_operations) {
      response.add_assigned_operations(std::move(id));
    }
    for (v1::GenerationRef& ref : result.release) *response.add_release() = std::move(ref);
    for (v1::GenerationRef& ref : result.discard) *response.add_discard() = std::move(ref);
    for (std::string& id : result.deleted_jobs) response.add_deleted_jobs(std::move(id));
    answer = std::move(response);
  }
  return answers;
}

absl::StatusOr<v1::HostTask> AgentApi::GetTask(const v1::GetTaskRequest& request) {
  const std::string& host_id = request.host_id();
  const std::string& op_id = request.operation_id();
  if (absl::Status s = RequireNonEmpty("host_id", host_id); !s.ok()) return s;
  if (absl::Status s = RequireNonEmpty("operation_id", op_id); !s.ok()) return s;
  absl::StatusOr<OperationRecord> record = store_->GetOperation(op_id, /*include_plan=*/true);
  if (!record.ok()) return NameNotFound(record.status(), OperationNotFound(op_id));
  const v1::Operation& op = record->op;
  if (!AgentsHaveTasks(op) || !record->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "operation \"", op_id, "\" is ", rpc::EnumShortName(op.state()),
        ", not TRANSFERRING (nor a stop-free operation in PLANNED whose agents prepare)"));
  }
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op_id);
  if (!rows.ok()) return rows.status();
  if (FindHost(*rows, host_id) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("operation \"", op_id, "\" has no task for host \"", host_id, "\""));
  }
  // The job for its PTC and where its state lives (HostTask.device_resident).
  absl::StatusOr<v1::Job> job = store_->GetJob(op.job_id(), /*include_ptc=*/true);
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(op.job_id()));
  // Only the task's peers: reading every host per task would cost O(hosts)
  // rows per agent per operation.
  std::vector<std::string> peer_ids;
  for (const HostProgress& row : *rows) {
    if (row.host_id != host_id) peer_ids.push_back(row.host_id);
  }
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->GetHosts(peer_ids);
  if (!hosts.ok()) return hosts.status();
  std::map<std::string, const v1::Host*> by_id;
  for (const v1::Host& h : *hosts) by_id[h.host_id()] = &h;

  v1::HostTask task;
  task.set_operation_id(op_id);
  task.set_job_id(op.job_id());
  task.set_from_generation(op.from_generation());
  task.set_to_generation(op.to_generation());
  *task.mutable_ptc() = std::move(*job->mutable_ptc());
  *task.mutable_plan() = SliceForHost(*record->plan, host_id);
  task.set_publish_by_workers(op.kind() == v1::OPERATION_KIND_CHECKPOINT);
  // Every kind and phase alike: one fact all hosts of the operation share.
  task.set_device_resident(job->state_memory() == v1::STATE_MEMORY_DEVICE);
  ShapePreparedTask(*record, host_id, &task);
  if (options_.secrets != nullptr) {
    // Only hosts with a task in the operation get here (checked above).
    absl::StatusOr<std::string> secret = options_.secrets->TransferSecret(op_id);
    if (!secret.ok()) return secret.status();
    task.set_transfer_secret(*std::move(secret));
  }
  for (const HostProgress& row : *rows) {
    if (row.host_id == host_id) continue;
    v1::PeerHost* peer = task.add_peers();
    peer->set_host_id(row.host_id);
    auto it = by_id.find(row.host_id);
    if (it == by_id.end()) continue;  // gone since: the driver aborts the operation
    peer->set_address(it->second->address());
    peer->set_ucx_address(it->second->ucx_address());
    for (const std::string& t : it->second->transports()) peer->add_transports(t);
  }
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op_id << " host=" << host_id
                    << " fetched its "
                    << (task.prepare()    ? "prepare "
                        : task.prepared() ? "prepared "
                                          : "")
                    << "task: " << task.plan().steps_size() << " steps, "
                    << task.plan().zero_fills_size() << " zero fills, " << task.peers_size()
                    << " peers";
  return task;
}

absl::StatusOr<v1::ReportProgressResponse> AgentApi::AnswerAfterTransfer(const v1::Operation& op,
                                                                         const std::string& host_id,
                                                                         v1::HostTaskState state) {
  v1::ReportProgressResponse response;
  // The operation committed only once every host's DONE was recorded, this
  // host's too: a DONE now is a retry whose first attempt the coordinator
  // took while the agent gave up waiting for the answer (PostgreSQL slow or
  // frozen), or one that raced that first attempt. Answering it "abort" would
  // make the agent drop the committed generation's buffers (tests/fault: a
  // resize across a frozen PostgreSQL).
  if (state == v1::HOST_TASK_STATE_DONE && op.state() == v1::OPERATION_STATE_COMMITTED) {
    absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
    if (!rows.ok()) return rows.status();
    const HostProgress* row = FindHost(*rows, host_id);
    if (row != nullptr && row->state == v1::HOST_TASK_STATE_DONE) return response;
  }
  response.set_abort(true);  // cancelled, aborted or committed without it: stop
  return response;
}

absl::StatusOr<v1::ReportProgressResponse> AgentApi::ReportProgress(
    const v1::ReportProgressRequest& request) {
  const std::string& host_id = request.host_id();
  const std::string& op_id = request.operation_id();
  if (absl::Status s = RequireNonEmpty("host_id", host_id); !s.ok()) return s;
  if (absl::Status s = RequireNonEmpty("operation_id", op_id); !s.ok()) return s;
  const v1::HostTaskState state = request.state();
  if (state != v1::HOST_TASK_STATE_RUNNING && state != v1::HOST_TASK_STATE_DONE &&
      state != v1::HOST_TASK_STATE_FAILED && state != v1::HOST_TASK_STATE_PREPARED) {
    return absl::InvalidArgumentError(absl::StrCat("state ", v1::HostTaskState_Name(state), " (",
                                                   static_cast<int>(state),
                                                   ") is not RUNNING, PREPARED, DONE or FAILED"));
  }
  if (request.bytes_done() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_done is ", request.bytes_done(), "; it must be >= 0"));
  }

  v1::ReportProgressResponse response;
  absl::StatusOr<OperationRecord> record =
      store_->GetOperation(op_id, /*include_plan=*/state == v1::HOST_TASK_STATE_DONE ||
                                      state == v1::HOST_TASK_STATE_PREPARED);
  if (!record.ok()) return NameNotFound(record.status(), OperationNotFound(op_id));
  const v1::Operation& op = record->op;
  if (!AgentsHaveTasks(op)) return AnswerAfterTransfer(op, host_id, state);
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op_id);
  if (!rows.ok()) return rows.status();
  const HostProgress* row = FindHost(*rows, host_id);
  if (row == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("operation \"", op_id, "\" has no task for host \"", host_id, "\""));
  }
  // In the prepare phase PREPARED is the host's final report, unless it
  // fails later (it lost the buffers it prepared).
  const bool prepared_then_failed =
      row->state == v1::HOST_TASK_STATE_PREPARED && state == v1::HOST_TASK_STATE_FAILED;
  if ((IsHostFinal(row->state) || row->state == v1::HOST_TASK_STATE_PREPARED) &&
      !prepared_then_failed) {
    // A resent final report (the reply was lost) is fine; a change of mind is not.
    if (row->state == state) return response;
    return absl::FailedPreconditionError(absl::StrCat("host \"", host_id, "\" already reported ",
                                                      v1::HostTaskState_Name(row->state),
                                                      " for operation \"", op_id, "\""));
  }
  if (absl::Status s = CheckReportForPhase(*record, request); !s.ok()) return s;
  if (state == v1::HOST_TASK_STATE_PREPARED) {
    absl::StatusOr<bool> left = RecordPrepared(*record, request);
    if (!left.ok()) return left.status();
    response.set_abort(*left);
    if (!*left) FinalReported();
    return response;
  }
  if (state == v1::HOST_TASK_STATE_DONE) {
    if (!record->plan.has_value()) {
      return absl::InternalError(absl::StrCat("operation \"", op_id, "\" has no stored plan"));
    }
    if (absl::Status s = CheckChecksums(*record->plan, host_id, request.checksums()); !s.ok()) {
      return s;
    }
  }

  HostProgress progress;
  progress.host_id = host_id;
  progress.state = state;
  // The coordinator's count of the host's bytes is the one the operation's
  // total is made of; the agent's own count only bounds what it reports.
  progress.bytes_total = row->bytes_total;
  progress.bytes_done = state == v1::HOST_TASK_STATE_DONE
                            ? row->bytes_total
                            : std::min(request.bytes_done(), row->bytes_total);
  progress.progress_unix_ms = clock_->NowUnixMs();
  progress.waiting_on = request.waiting_on();
  progress.route = request.route();
  progress.route_reason = request.route_reason();
  if (state == v1::HOST_TASK_STATE_FAILED) {
    progress.error =
        TruncateError(request.error().empty() ? "no error text given" : request.error());
  }
  std::vector<v1::ShardChecksum> checksums;
  if (state == v1::HOST_TASK_STATE_DONE) {
    checksums.assign(request.checksums().begin(), request.checksums().end());
  }
  absl::Status recorded = store_->RecordHostProgress(op_id, progress, checksums);
  if (absl::IsFailedPrecondition(recorded)) {
    // It left TRANSFERRING since we looked (a DONE may have raced its own
    // first attempt, which committed the operation meanwhile).
    absl::StatusOr<OperationRecord> now = store_->GetOperation(op_id, /*include_plan=*/false);
    if (!now.ok()) return NameNotFound(now.status(), OperationNotFound(op_id));
    return AnswerAfterTransfer(now->op, host_id, state);
  }
  if (!recorded.ok()) return recorded;
  if (state == v1::HOST_TASK_STATE_DONE && options_.cost != nullptr) {
    LearnFromDone(*options_.cost, metrics_, op, request);
  }
  if (state != v1::HOST_TASK_STATE_RUNNING) {
    RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op_id << " host=" << host_id
                      << " reported " << v1::HostTaskState_Name(state)
                      << (progress.error.empty() ? "" : ": ") << progress.error;
    FinalReported();
  }
  return response;
}

}  // namespace reshard::coordinator
