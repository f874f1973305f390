// One assigned operation run on this host (CoordinatorSession::RunOperation,
// coordinator_session.h), as named phases:
//   Fetch     GetTask, retried with backoff while the coordinator is unreachable;
//   Announce  the task's job and generations, and a checkpoint's ranks its
//             workers publish here, for AcceptsPublish;
//   Execute   on a thread of its own: TaskExecutor::Execute, which connects
//             the peers itself (or, for a checkpoint, wait for the workers' publish),
//             while this thread watches: a RUNNING report every kReportPeriodMs,
//             which may answer abort (the task is cancelled);
//   Report    the final PREPARED, DONE or FAILED report, and what it implies
//             here (a prepared operation is held; an abort drops the buffers).
// The executor's own phases (set up, prove, move, verify, seal) are task_run.h's.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/published_task.h"
#include "agent/process/coordinator_session.h"
#include "agent/process/session_rpc.h"
#include "common/log.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"

namespace reshard::agent {
namespace {

using session_rpc::SetDeadline;

constexpr int kReportPeriodMs = 500;
constexpr int kGetTaskDeadlineMs = 30000;
constexpr int kGetTaskAttempts = 10;

}  // namespace

class OperationRun {
 public:
  using Checksums = std::vector<v1::ShardChecksum>;

  OperationRun(CoordinatorSession& session, const std::string& operation_id,
               CoordinatorSession::RunningOp* op)
      : s_(session), id_(operation_id), host_(session.options_.host_id), op_(op) {}

  void Run() {
    if (!Fetch()) return;
    Announce();
    StartMetrics();
    ExecuteWatched();
    if (abort_ || s_.stopping_.load()) {
      // The executor dropped the new buffers; the coordinator knows already,
      // or learns it from the lease.
      FinishMetrics(TaskResult::kAborted);
      op_->finished.store(true);
      return;
    }
    Report();
  }

 private:
  // ---- Fetch
  bool Fetch() {
    absl::Status st;
    absl::BitGen rng;
    // While the coordinator does not answer (its store is away: UNAVAILABLE)
    // the task is asked for again for as long as that lasts, as the
    // coordinator's lease rule waits for this host; only other retryable
    // failures (shedding load) count against kGetTaskAttempts. The
    // operation's release (op_->cancel) or the session's stop ends it.
    for (int attempts = 0, failures = 0;;) {
      v1::GetTaskRequest req;
      req.set_host_id(host_);
      req.set_operation_id(id_);
      grpc::ClientContext ctx;
      SetDeadline(&ctx, kGetTaskDeadlineMs);
      const auto sent = std::chrono::steady_clock::now();
      st = rpc::FromGrpc(s_.stub_->GetTask(&ctx, req, &task_));
      s_.NoteReach(st, sent);
      if (st.ok() || !rpc::IsRetryable(rpc::CallKind::kAgentCall, st.code()) ||
          op_->cancel.load()) {
        break;
      }
      if (!rpc::IsSilence(st.code()) && ++attempts >= kGetTaskAttempts) break;
      const absl::Duration wait =
          rpc::Backoff(rpc::DefaultPolicy(rpc::CallKind::kAgentCall), ++failures, rng);
      if (!s_.Sleep(static_cast<int>(absl::ToInt64Milliseconds(wait)))) break;
    }
    if (st.ok()) return true;
    RESHARD_LOG(WARNING) << "operation " << id_ << ": GetTask: " << st;
    op_->finished.store(true);
    s_.cv_.notify_all();  // a publish waiting for this task (AwaitPublishAccepted) stops waiting
    return false;
  }

  // ---- Announce
  // A checkpoint's ranks here are known before the task reports anything, so
  // that the workers' publish is accepted as soon as the operation shows
  // TRANSFERRING.
  void Announce() {
    std::set<int> published;
    if (task_.publish_by_workers()) {
      publish_steps_ = PrepareHostSteps(s_.store_, host_, task_);
      if (publish_steps_.ok()) {
        published.insert(publish_steps_->new_ranks.begin(), publish_steps_->new_ranks.end());
      }
    }
    {
      std::lock_guard<std::mutex> l(s_.mu_);
      op_->job_id = task_.job_id();
      op_->to_generation = task_.to_generation();
      op_->published_ranks = std::move(published);
      op_->from_generation = task_.from_generation();
      op_->task_fetched = true;
    }
    s_.cv_.notify_all();  // publishes waiting in AwaitPublishAccepted
    RESHARD_LOG(INFO) << "operation " << id_ << " job " << task_.job_id() << ": generation "
                      << task_.from_generation() << " -> " << task_.to_generation() << ", "
                      << task_.plan().steps_size() << " steps here";
  }

  // ---- Execute, watched
  void ExecuteWatched() {
    std::thread worker([this] {
      result_ = Execute();
      exec_finished_.store(true);
      s_.cv_.notify_all();
    });
    Watch();
    worker.join();
  }

  absl::StatusOr<Checksums> Execute() {
    auto progress = [this](int64_t d, int64_t t) { Progress(d, t); };
    auto cancelled = [this] { return op_->cancel.load() || s_.stopping_.load(); };
    auto waiting = [this](const std::string& what) {
      std::lock_guard<std::mutex> l(waiting_mu_);
      waiting_on_ = what;
    };
    if (task_.publish_by_workers()) {
      if (!publish_steps_.ok()) return publish_steps_.status();
      return AwaitPublished(s_.store_, task_, *publish_steps_, progress, cancelled, waiting,
                            s_.options_.devices);
    }
    auto routed = [this](const TaskExecutor::ExecuteInfo& info) {
      if (metrics() != nullptr) metrics()->TaskRouted(info.route);
      std::lock_guard<std::mutex> l(waiting_mu_);
      route_ = info;
    };
    // The whole task's wall and CPU seconds besides its phases' (the cost
    // model's TaskTimings).
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    absl::StatusOr<Checksums> result =
        s_.executor_->Execute(host_, task_, progress, cancelled, waiting, routed, &timings_);
    timings_.set_total_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    timings_.set_cpu_seconds(std::max(0.0, ProcessCpuSeconds() - cpu_start));
    return result;
  }

  static double ProcessCpuSeconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }

  // RUNNING reports until Execute ends; an abort answer cancels the task.
  void Watch() {
    while (!exec_finished_.load()) {
      {
        std::unique_lock<std::mutex> l(s_.mu_);
        s_.cv_.wait_for(l, std::chrono::milliseconds(kReportPeriodMs),
                        [&] { return exec_finished_.load() || s_.stopping_.load(); });
      }
      if (exec_finished_.load() || s_.stopping_.load()) break;
      if (abort_) continue;
      v1::ReportProgressRequest req = ReportOf(v1::HOST_TASK_STATE_RUNNING);
      {
        std::lock_guard<std::mutex> l(waiting_mu_);
        req.set_waiting_on(waiting_on_);
      }
      absl::Status rs = s_.Report(req, /*retry=*/false, &abort_);
      if (!rs.ok()) RESHARD_LOG(WARNING) << "operation " << id_ << ": ReportProgress: " << rs;
      if (abort_) {
        RESHARD_LOG(INFO) << "operation " << id_ << ": aborted by the coordinator";
        op_->cancel.store(true);
      }
    }
  }

  // ---- Report
  void Report() {
    const bool prepare = task_.prepare();
    v1::ReportProgressRequest req = ReportOf(v1::HOST_TASK_STATE_FAILED);
    if (result_.ok()) {
      req.set_bytes_done(std::max(done_.load(), total_.load()));
      if (prepare) {
        // The buffers stay; the coordinator learns what the pre-copy read.
        req.set_state(v1::HOST_TASK_STATE_PREPARED);
        for (const v1::ShardChecksum& c : *result_) *req.add_source_checksums() = c;
        RESHARD_LOG(INFO) << "operation " << id_ << ": prepared, " << result_->size()
                          << " source shards read here";
      } else {
        req.set_state(v1::HOST_TASK_STATE_DONE);
        for (const v1::ShardChecksum& c : *result_) *req.add_checksums() = c;
        *req.mutable_timings() = timings_;
        RESHARD_LOG(INFO) << "operation " << id_ << ": done, " << result_->size()
                          << " shards written here";
      }
    } else {
      req.set_error(result_.status().ToString());
      RESHARD_LOG(WARNING) << "operation " << id_ << ": failed: " << result_.status();
    }
    if (req.state() == v1::HOST_TASK_STATE_PREPARED) {
      // The poll in flight names this operation known, so its transfer phase
      // would not wake it: a fresh one without it replaces it.
      std::lock_guard<std::mutex> l(s_.mu_);
      op_->reporting_prepared.store(true);
      if (s_.poll_ctx_ != nullptr) {
        s_.repoll_ = true;
        s_.poll_ctx_->TryCancel();
      }
    }
    absl::Status rs = s_.Report(req, /*retry=*/true, &abort_);
    if (!rs.ok()) RESHARD_LOG(WARNING) << "operation " << id_ << ": final ReportProgress: " << rs;
    if (abort_ && result_.ok()) {
      // Committed nowhere: the coordinator discards the generation too.
      s_.DropGeneration(task_.job_id(), task_.to_generation());
    }
    if (result_.ok() && prepare && !abort_) {
      // Held until the transfer phase is assigned (StartAssigned). Also when
      // the report was lost: a coordinator that still lists the prepare then
      // gets it run again.
      std::lock_guard<std::mutex> l(s_.mu_);
      s_.prepared_[id_] = CoordinatorSession::PreparedOp{task_.job_id(), task_.to_generation(),
                                                         ++s_.list_clock_};
      op_->prepared.store(true);
      s_.cv_.notify_all();
    }
    FinishMetrics(!result_.ok() ? TaskResult::kFailed
                  : abort_      ? TaskResult::kAborted
                                : TaskResult::kDone);
    op_->finished.store(true);
  }

  v1::ReportProgressRequest ReportOf(v1::HostTaskState state) {
    v1::ReportProgressRequest req;
    req.set_host_id(host_);
    req.set_operation_id(id_);
    req.set_state(state);
    req.set_bytes_done(done_.load());
    req.set_bytes_total(total_.load());
    std::lock_guard<std::mutex> l(waiting_mu_);
    req.set_route(route_.route);  // empty until the executor chose it
    req.set_route_reason(route_.route_reason);
    return req;
  }

  // ---- Progress and metrics
  void Progress(int64_t d, int64_t t) {
    const int64_t prev_done = done_.exchange(d);
    const int64_t prev_total = total_.exchange(t);
    if (metrics() != nullptr) metrics()->TaskProgress(d - prev_done, t - prev_total);
  }

  AgentMetrics* metrics() const { return s_.options_.metrics; }

  void StartMetrics() {
    started_ = std::chrono::steady_clock::now();
    if (metrics() != nullptr) token_ = metrics()->TaskStarted();
  }

  // Ends the task in the metrics: takes its bytes out of the progress gauges
  // (counting the rest as written when it succeeded) and records the result.
  void FinishMetrics(TaskResult r) {
    if (metrics() == nullptr) return;
    const int64_t d = done_.load(), t = total_.load();
    if (r == TaskResult::kDone && t > d) metrics()->TaskProgress(t - d, 0);
    const int64_t shown = r == TaskResult::kDone ? std::max(d, t) : d;
    metrics()->TaskProgress(-shown, -t);
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - started_;
    metrics()->TaskFinished(token_, r, seconds.count());
  }

  CoordinatorSession& s_;
  const std::string id_;
  const std::string host_;
  CoordinatorSession::RunningOp* const op_;
  v1::HostTask task_;
  absl::StatusOr<HostSteps> publish_steps_ = absl::UnknownError("not a checkpoint");
  absl::StatusOr<Checksums> result_ = absl::UnknownError("operation did not run");
  std::atomic<bool> exec_finished_{false};
  bool abort_ = false;
  std::atomic<int64_t> done_{0}, total_{0};
  std::mutex waiting_mu_;
  std::string waiting_on_;  // what the task waits on, for the coordinator's stall message
  TaskExecutor::ExecuteInfo route_;  // the executor's route, sent with every report
  v1::TaskTimings timings_;          // sent with DONE
  std::chrono::steady_clock::time_point started_;
  int64_t token_ = 0;
};

void CoordinatorSession::RunOperation(const std::string& operation_id, RunningOp* op) {
  OperationRun(*this, operation_id, op).Run();
}

}  // namespace reshard::agent
