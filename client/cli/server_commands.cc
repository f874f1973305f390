#include "client/cli/server_commands.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cli/advise_command.h"
#include "client/cli/exit_codes.h"
#include "client/cli/json_file.h"
#include "client/cli/lost_set.h"
#include "client/cli/plan_command.h"
#include "client/cli/progress.h"
#include "client/cli/server_format.h"
#include "client/cpp/coordinator_client.h"
#include "common/rpc/enum_name.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"

namespace reshard::cli {
namespace {

// reshardctl's calls: a person waits, so an unreachable coordinator is
// reported after at most 1.4 s of waits (0.2 + 0.4 + 0.8, jittered down by up
// to half) instead of the client's default.
constexpr rpc::RetryPolicy kCtlRetry{/*max_attempts=*/4, absl::Milliseconds(200), absl::Seconds(2),
                                     /*multiplier=*/2.0, /*jitter=*/0.5};

client::CoordinatorClient::Options ClientOptions(const GlobalOptions& global) {
  client::CoordinatorClient::Options o;
  o.call_timeout = global.timeout;
  o.retry = kCtlRetry;
  o.tls = global.tls;
  o.token = global.token;
  return o;
}

class Runner {
 public:
  Runner(const ServerInvocation& inv, std::ostream& out, std::ostream& err, const CommandEnv& env)
      : inv_(inv),
        out_(out),
        err_(err),
        env_(env),
        client_(inv.global.coordinator, ClientOptions(inv.global)) {}

  int Run() {
    const std::string& c = inv_.command;
    if (c == "jobs list") return JobsList();
    if (c == "jobs show") return JobsShow();
    if (c == "jobs register") return JobsRegister();
    if (c == "jobs delete") return JobsDelete();
    if (c == "jobs worker-token") return JobsWorkerToken();
    if (c == "jobs policy") return JobsPolicy();
    if (c == "resize") return Resize();
    if (c == "migrate") return Migrate();
    if (c == "recover") return Recover();
    if (c == "preview") return Preview();
    if (c == "hosts list") return HostsList();
    if (c == "hosts notice") return HostsNotice();
    if (c == "ops show") return OpsShow();
    if (c == "ops watch") return Watch(inv_.positional[0]);
    if (c == "ops cancel") return OpsCancel();
    if (c == "ops mark-prepared") return OpsMarkPrepared();
    if (c == "auth create") return AuthCreate();
    if (c == "auth revoke") return AuthRevoke();
    if (c == "auth list") return AuthList();
    if (c == "audit") return Audit();
    if (c == "advise") return Advise();
    return LocalError(absl::InvalidArgumentError(absl::StrCat("unknown command \"", c, "\"")),
                      kExitUsage);
  }

 private:
  bool json() const { return inv_.global.output == GlobalOptions::Output::kJson; }
  int64_t Now() const {
    return env_.now_unix_ms ? env_.now_unix_ms() : absl::ToUnixMillis(absl::Now());
  }
  std::string Flag(const std::string& name) const {
    auto it = inv_.flags.find(name);
    return it == inv_.flags.end() ? "" : it->second;
  }
  bool Has(const std::string& name) const { return inv_.flags.contains(name); }

  // An error from the coordinator: its code picks the exit status.
  int Fail(const absl::Status& s) {
    const int code = ExitCodeFor(s);
    PrintError(code == kExitUnavailable
                   ? rpc::WithContext(s, absl::StrCat("coordinator ", inv_.global.coordinator))
                   : s,
               err_);
    return code;
  }
  // An error on this side (files, arguments read from files).
  int LocalError(const absl::Status& s, int code = kExitError) {
    PrintError(s, err_);
    return code;
  }

  // The message as JSON, or `table` as it is.
  int Print(const google::protobuf::Message& message, const std::string& table) {
    if (json()) {
      absl::StatusOr<std::string> text = ToJson(message);
      if (!text.ok()) return LocalError(text.status());
      out_ << *text;
    } else {
      out_ << table;
    }
    out_.flush();
    return kExitOk;
  }

  int JobsList() {
    v1::ListJobsRequest req;
    req.set_tenant(Flag("tenant"));
    if (Has("state")) {
      v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
      if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", Flag("state")), &state)) {
        (void)v1::JobState_Parse(Flag("state"), &state);
      }
      req.set_state(state);
    }
    absl::StatusOr<v1::ListJobsResponse> jobs = client_.ListAllJobs(req);
    if (!jobs.ok()) return Fail(jobs.status());
    return Print(*jobs, FormatJobsTable(*jobs));
  }

  int JobsShow() {
    absl::StatusOr<v1::Job> job = client_.GetJob(inv_.positional[0], Has("ptc"));
    if (!job.ok()) return Fail(job.status());
    return Print(*job, FormatJob(*job, Now()));
  }

  int JobsRegister() {
    v1::RegisterJobRequest req;
    if (absl::Status s = ReadJsonMessage(Flag("spec"), "--spec", req.mutable_spec()); !s.ok()) {
      return LocalError(s);
    }
    req.set_idempotency_key(Flag("idempotency-key"));
    absl::StatusOr<v1::Job> job = client_.RegisterJob(std::move(req));
    if (!job.ok()) return Fail(job.status());
    return Print(*job, FormatJob(*job, Now()));
  }

  int JobsDelete() {
    v1::DeleteJobRequest req;
    req.set_job_id(inv_.positional[0]);
    req.set_idempotency_key(Flag("idempotency-key"));
    if (absl::Status s = client_.DeleteJob(std::move(req)); !s.ok()) return Fail(s);
    return Print(v1::DeleteJobResponse(), absl::StrCat("deleted job ", inv_.positional[0], "\n"));
  }

  int JobsPolicy() {
    if (Has("policy") == Has("clear")) {
      return LocalError(absl::InvalidArgumentError("jobs policy: give --policy FILE or --clear"),
                        kExitUsage);
    }
    v1::SetPolicyRequest req;
    req.set_job_id(inv_.positional[0]);
    if (Has("policy")) {
      if (absl::Status s = ReadJsonMessage(Flag("policy"), "--policy", req.mutable_policy());
          !s.ok()) {
        return LocalError(s);
      }
    }
    absl::StatusOr<v1::Job> job = client_.SetPolicy(std::move(req));
    if (!job.ok()) return Fail(job.status());
    return Print(*job, FormatJob(*job, Now()));
  }

  int JobsWorkerToken() {
    absl::StatusOr<std::string> token = client_.GetWorkerToken(inv_.positional[0]);
    if (!token.ok()) return Fail(token.status());
    v1::GetWorkerTokenResponse reply;
    reply.set_job_id(inv_.positional[0]);
    reply.set_worker_token(*token);
    return Print(reply, *token + "\n");
  }

  absl::Status ReadLayout(v1::Layout* layout) {
    return ReadJsonMessage(Flag("to"), "--to", layout);
  }

  // --expected-generation, else the job's current generation.
  absl::StatusOr<int64_t> ExpectedGeneration(const std::string& job_id, v1::Job* job_out) {
    absl::StatusOr<v1::Job> job = client_.GetJob(job_id);
    if (!job.ok()) return job.status();
    if (job_out != nullptr) *job_out = *job;
    int64_t g = job->generation();
    if (Has("expected-generation")) (void)absl::SimpleAtoi(Flag("expected-generation"), &g);
    return g;
  }

  // --deadline and --abort-past-deadline (checked when parsed).
  v1::Deadline DeadlineFlags() const {
    v1::Deadline d;
    if (Has("deadline")) {
      d.set_unix_ms(ParseWhen("deadline", Flag("deadline"), Now()).value_or(0));
      d.set_abort_past(Has("abort-past-deadline"));
    }
    return d;
  }

  int Resize() {
    if (Has("choose")) return ResizeChosen();
    v1::Layout target;
    if (absl::Status s = ReadLayout(&target); !s.ok()) return LocalError(s);
    v1::ResizeRequest req;
    req.set_job_id(inv_.positional[0]);
    absl::StatusOr<int64_t> gen = ExpectedGeneration(req.job_id(), nullptr);
    if (!gen.ok()) return Fail(gen.status());
    req.set_expected_generation(*gen);
    *req.mutable_placement() = target.placement();
    if (target.has_config()) *req.mutable_config() = target.config();
    req.set_idempotency_key(Flag("idempotency-key"));
    req.set_stop_free(Has("stop-free"));
    *req.mutable_deadline() = DeadlineFlags();
    return Started(client_.Resize(std::move(req)));
  }

  // resize --choose: the coordinator resizes to its advisor's best layout.
  int ResizeChosen() {
    v1::ResizeRequest req;
    req.set_job_id(inv_.positional[0]);
    absl::StatusOr<v1::AdviseRequest> advise = AdviseRequestFromFlags(inv_.flags, "");
    if (!advise.ok()) return LocalError(advise.status(), kExitUsage);
    *req.mutable_choose() = *std::move(advise);
    absl::StatusOr<int64_t> gen = ExpectedGeneration(req.job_id(), nullptr);
    if (!gen.ok()) return Fail(gen.status());
    req.set_expected_generation(*gen);
    req.set_idempotency_key(Flag("idempotency-key"));
    req.set_stop_free(Has("stop-free"));
    *req.mutable_deadline() = DeadlineFlags();
    return Started(client_.Resize(std::move(req)));
  }

  int Advise() {
    absl::StatusOr<v1::AdviseRequest> req = AdviseRequestFromFlags(inv_.flags, inv_.positional[0]);
    if (!req.ok()) return LocalError(req.status(), kExitUsage);
    absl::StatusOr<v1::AdviseResponse> advice = client_.Advise(*req);
    if (!advice.ok()) return Fail(advice.status());
    return Print(*advice, FormatAdviceTable(*advice));
  }

  int Migrate() {
    v1::Layout target;
    if (absl::Status s = ReadLayout(&target); !s.ok()) return LocalError(s);
    v1::MigrateRequest req;
    req.set_job_id(inv_.positional[0]);
    absl::StatusOr<int64_t> gen = ExpectedGeneration(req.job_id(), nullptr);
    if (!gen.ok()) return Fail(gen.status());
    req.set_expected_generation(*gen);
    *req.mutable_placement() = target.placement();
    req.set_idempotency_key(Flag("idempotency-key"));
    req.set_stop_free(Has("stop-free"));
    *req.mutable_deadline() = DeadlineFlags();
    return Started(client_.Migrate(std::move(req)));
  }

  int Recover() {
    v1::RecoverFromFailureRequest req;
    req.set_job_id(inv_.positional[0]);
    v1::Job job;
    absl::StatusOr<int64_t> gen = ExpectedGeneration(req.job_id(), &job);
    if (!gen.ok()) return Fail(gen.status());
    req.set_expected_generation(*gen);
    absl::StatusOr<planner::LostSet> lost = ParseLostSet(Flag("lost"), job.layout());
    if (!lost.ok()) return LocalError(lost.status());
    for (const std::string& h : lost->hosts) req.add_lost_hosts(h);
    for (int r : lost->ranks) req.add_lost_ranks(r);
    if (Has("to")) {
      if (absl::Status s = ReadJsonMessage(Flag("to"), "--to", req.mutable_target()); !s.ok()) {
        return LocalError(s);
      }
      if (!req.target().has_config())
        *req.mutable_target()->mutable_config() = job.layout().config();
    } else if (Has("choose")) {  // the coordinator's advisor, on the survivors
      absl::StatusOr<v1::AdviseRequest> advise = AdviseRequestFromFlags(inv_.flags, "");
      if (!advise.ok()) return LocalError(advise.status(), kExitUsage);
      *req.mutable_choose() = *std::move(advise);
    }  // else the coordinator picks the survivors (planner/survivor.h)
    req.set_accept_degraded(Has("accept-degraded"));
    req.set_idempotency_key(Flag("idempotency-key"));
    *req.mutable_deadline() = DeadlineFlags();
    return Started(client_.RecoverFromFailure(std::move(req)));
  }

  int Preview() {
    v1::PreviewPlanRequest req;
    req.set_job_id(inv_.positional[0]);
    if (absl::Status s = ReadLayout(req.mutable_target()); !s.ok()) return LocalError(s);
    if (!req.target().has_config() || Has("lost")) {
      absl::StatusOr<v1::Job> job = client_.GetJob(req.job_id());
      if (!job.ok()) return Fail(job.status());
      if (!req.target().has_config())
        *req.mutable_target()->mutable_config() = job->layout().config();
      absl::StatusOr<planner::LostSet> lost = ParseLostSet(Flag("lost"), job->layout());
      if (!lost.ok()) return LocalError(lost.status());
      for (const std::string& h : lost->hosts) req.add_lost_hosts(h);
      for (int r : lost->ranks) req.add_lost_ranks(r);
    }
    absl::StatusOr<v1::PreviewPlanResponse> preview = client_.PreviewPlan(req);
    if (!preview.ok()) return Fail(preview.status());
    return Print(*preview,
                 absl::StrCat("preview of job ", req.job_id(), " -> ", FormatLayout(req.target()),
                              "\n\n", FormatPlanStats(preview->stats()),
                              preview->has_prediction()
                                  ? absl::StrCat("\n", FormatCostPrediction(preview->prediction()))
                                  : ""));
  }

  static std::string TokenLine(const v1::Token& t) {
    return absl::StrCat(
        t.id(), "  ", t.name(), "  ", t.role(), "  tenants=", absl::StrJoin(t.tenants(), ","),
        "  expires ",
        absl::FormatTime(absl::FromUnixMillis(t.expires_unix_ms()), absl::UTCTimeZone()),
        t.revoked_unix_ms() != 0 ? "  REVOKED" : "", "\n");
  }

  int AuthCreate() {
    v1::CreateTokenRequest req;
    req.set_name(Flag("name"));
    req.set_role(Flag("role"));
    for (absl::string_view t : absl::StrSplit(Flag("tenants"), ',', absl::SkipEmpty())) {
      req.add_tenants(std::string(t));
    }
    if (Has("ttl")) {
      absl::StatusOr<absl::Duration> ttl = ParseTimeout(Flag("ttl"));
      if (!ttl.ok()) {
        return LocalError(
            absl::InvalidArgumentError(absl::StrCat("--ttl ", ttl.status().message())), kExitUsage);
      }
      req.set_ttl_seconds(absl::ToInt64Seconds(*ttl));
    }
    absl::StatusOr<v1::CreateTokenResponse> created = client_.CreateToken(req);
    if (!created.ok()) return Fail(created.status());
    return Print(*created, absl::StrCat(TokenLine(created->token()),
                                        "token (shown once): ", created->bearer_token(), "\n"));
  }

  int AuthRevoke() {
    absl::StatusOr<v1::Token> token = client_.RevokeToken(inv_.positional[0]);
    if (!token.ok()) return Fail(token.status());
    return Print(*token, TokenLine(*token));
  }

  int AuthList() {
    absl::StatusOr<v1::ListTokensResponse> tokens = client_.ListTokens();
    if (!tokens.ok()) return Fail(tokens.status());
    std::string table;
    for (const v1::Token& t : tokens->tokens()) table += TokenLine(t);
    return Print(*tokens, table);
  }

  int Audit() {
    v1::ListAuditRequest req;
    req.set_job_id(Flag("job"));
    req.set_tenant(Flag("tenant"));
    if (Has("since")) {
      absl::StatusOr<int64_t> since = ParseSince(Flag("since"), Now());
      if (!since.ok()) return LocalError(since.status(), kExitUsage);
      req.set_since_unix_ms(*since);
    }
    int64_t limit = 100;
    if (Has("limit") && (!absl::SimpleAtoi(Flag("limit"), &limit) || limit < 1)) {
      return LocalError(absl::InvalidArgumentError(absl::StrCat("--limit \"", Flag("limit"),
                                                                "\": expected a positive integer")),
                        kExitUsage);
    }
    v1::ListAuditResponse all;
    while (all.entries_size() < limit) {
      req.set_page_size(static_cast<int32_t>(std::min<int64_t>(limit - all.entries_size(), 1000)));
      absl::StatusOr<v1::ListAuditResponse> page = client_.ListAudit(req);
      if (!page.ok()) return Fail(page.status());
      for (v1::AuditEntry& e : *page->mutable_entries()) *all.add_entries() = std::move(e);
      if (page->next_page_token().empty()) break;
      req.set_page_token(page->next_page_token());
    }
    return Print(all, FormatAuditTable(all));
  }

  int HostsList() {
    absl::StatusOr<v1::ListHostsResponse> hosts = client_.ListHosts();
    if (!hosts.ok()) return Fail(hosts.status());
    return Print(*hosts, FormatHostsTable(*hosts, Now()));
  }

  int HostsNotice() {
    v1::NoticeHostRequest req;
    req.set_host_id(inv_.positional[0]);
    if (Has("withdraw")) {  // alone: checked with the arguments
      req.set_withdraw(true);
      absl::StatusOr<v1::NoticeHostResponse> reply = client_.NoticeHost(req);
      if (!reply.ok()) return Fail(reply.status());
      return Print(*reply, absl::StrCat("host ", req.host_id(), ": notice withdrawn\n"));
    }
    req.set_leaves_unix_ms(ParseWhen("leaves", Flag("leaves"), Now()).value_or(0));
    if (Has("spare")) {
      for (absl::string_view h : absl::StrSplit(Flag("spare"), ',', absl::SkipEmpty())) {
        req.add_spare_hosts(std::string(h));
      }
    }
    req.set_idempotency_key(Flag("idempotency-key"));
    absl::StatusOr<v1::NoticeHostResponse> reply = client_.NoticeHost(req);
    if (!reply.ok()) return Fail(reply.status());
    return Print(*reply, FormatHostNotice(*reply));
  }

  int OpsShow() {
    absl::StatusOr<v1::Operation> op = client_.GetOperation(inv_.positional[0]);
    if (!op.ok()) return Fail(op.status());
    return Print(*op, FormatOperation(*op, Now()));
  }

  int OpsCancel() {
    v1::CancelOperationRequest req;
    req.set_operation_id(inv_.positional[0]);
    req.set_idempotency_key(Flag("idempotency-key"));
    absl::StatusOr<v1::Operation> op = client_.CancelOperation(std::move(req));
    if (!op.ok()) return Fail(op.status());
    return Print(*op, FormatOperation(*op, Now()));
  }

  int OpsMarkPrepared() {
    absl::StatusOr<v1::Operation> op = client_.MarkPrepared(inv_.positional[0]);
    if (!op.ok()) return Fail(op.status());
    return Print(*op, FormatOperation(*op, Now()));
  }

  // An operation was requested: print its id (--no-wait) or wait for it.
  int Started(const absl::StatusOr<v1::Operation>& op) {
    if (!op.ok()) return Fail(op.status());
    if (Has("no-wait")) return Print(*op, absl::StrCat(op->id(), "\n"));
    if (!json() && !env_.stderr_is_tty) {
      err_ << "operation " << op->id() << " started\n";
    }
    if (op->stop_free()) {
      // Otherwise the wait below would look stuck in PLANNED.
      err_ << "operation " << op->id()
           << " is stop-free: it waits in PLANNED until \"reshardctl ops mark-prepared " << op->id()
           << "\" and the job's cut-over checkpoint\n";
    }
    return Watch(op->id());
  }

  int Watch(const std::string& op_id) {
    absl::Duration timeout = absl::InfiniteDuration();
    if (Has("wait-timeout")) {
      absl::StatusOr<absl::Duration> d = ParseTimeout(Flag("wait-timeout"));
      if (d.ok()) timeout = *d;
    }
    ProgressReporter progress(err_, env_.stderr_is_tty);
    absl::StatusOr<v1::Operation> final_op = client_.WatchOperation(
        op_id, [&](const v1::Operation& op) { progress.Update(op); }, timeout);
    progress.Finish();
    if (!final_op.ok())
      return Fail(rpc::WithContext(final_op.status(), "waiting for the operation"));
    const int printed = Print(*final_op, FormatOperation(*final_op, Now()));
    if (printed != kExitOk) return printed;
    if (final_op->state() != v1::OPERATION_STATE_COMMITTED) {
      err_ << "operation " << final_op->id() << " " << rpc::EnumShortName(final_op->state()) << ": "
           << final_op->error() << "\n";
      return kExitOperationFailed;
    }
    return kExitOk;
  }

  const ServerInvocation& inv_;
  std::ostream& out_;
  std::ostream& err_;
  const CommandEnv& env_;
  client::CoordinatorClient client_;
};

}  // namespace

int RunServerCommand(const ServerInvocation& invocation, std::ostream& out, std::ostream& err,
                     const CommandEnv& env) {
  return Runner(invocation, out, err, env).Run();
}

int ServerMain(const std::string& command, const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err, const std::string& coordinator_env, const CommandEnv& env) {
  absl::StatusOr<ServerInvocation> inv =
      ParseServerArgs(command, args, coordinator_env, env.getenv);
  if (inv.ok() && !inv->help) {
    // Checked before any call, so that a missing CA is a usage error.
    if (absl::Status s = ValidateTlsFiles(inv->global.tls, /*need_identity=*/false); !s.ok()) {
      inv = s;
    }
  }
  if (!inv.ok()) {
    PrintError(rpc::WithContext(inv.status(), absl::StrCat("reshardctl ", command)), err);
    err << "run \"reshardctl " << command << " --help\" for usage\n";
    return kExitUsage;
  }
  if (inv->help) {
    out << ServerUsage(inv->command);
    return kExitOk;
  }
  return RunServerCommand(*inv, out, err, env);
}

}  // namespace reshard::cli
