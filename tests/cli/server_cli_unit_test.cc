// Unit tests of reshardctl's server commands' pure parts: argument parsing,
// global flags, exit codes, the default recovery target and the formatting
// of tables, JSON and progress. No network, no files.
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cli/args.h"
#include "client/cli/exit_codes.h"
#include "client/cli/plan_command.h"
#include "client/cli/server_commands.h"
#include "client/cli/server_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseArgsBoolFlagsTest, BoolFlagsTakeNoValue) {
  auto parsed = ParseArgs({"--no-wait", "job", "--to", "t.json"}, {"to"}, {"no-wait"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->values.at("no-wait"), "true");
  EXPECT_THAT(parsed->positional, ElementsAre("job"));
  EXPECT_THAT(ParseArgs({"--no-wait=1"}, {}, {"no-wait"}).status().message(),
              HasSubstr("takes no value"));
  EXPECT_THAT(ParseArgs({"--no-wait", "--no-wait"}, {}, {"no-wait"}).status().message(),
              HasSubstr("given twice"));
}

TEST(ParseServerArgsTest, ResizeWithGlobalFlags) {
  auto inv = ParseServerArgs("resize",
                             {"job-1", "--to", "t.json", "--no-wait", "--output", "json",
                              "--coordinator", "db:7070", "--timeout", "5s"},
                             "env:1");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->command, "resize");
  EXPECT_THAT(inv->positional, ElementsAre("job-1"));
  EXPECT_EQ(inv->flags.at("to"), "t.json");
  EXPECT_TRUE(inv->flags.contains("no-wait"));
  EXPECT_EQ(inv->global.output, GlobalOptions::Output::kJson);
  EXPECT_EQ(inv->global.coordinator, "db:7070");
  EXPECT_EQ(inv->global.timeout, absl::Seconds(5));
}

TEST(ParseServerArgsTest, CoordinatorFromEnvironmentThenDefault) {
  auto from_env = ParseServerArgs("hosts", {"list"}, "env:1");
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->command, "hosts list");
  EXPECT_EQ(from_env->global.coordinator, "env:1");
  EXPECT_EQ(from_env->global.output, GlobalOptions::Output::kTable);
  auto by_default = ParseServerArgs("hosts", {"list"}, "");
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(by_default->global.coordinator, kDefaultCoordinator);
}

TEST(ParseServerArgsTest, GroupsNeedAKnownSubcommand) {
  auto show = ParseServerArgs("jobs", {"--output=json", "show", "abc"}, "");
  ASSERT_TRUE(show.ok()) << show.status();
  EXPECT_EQ(show->command, "jobs show");
  EXPECT_THAT(show->positional, ElementsAre("abc"));
  EXPECT_THAT(ParseServerArgs("jobs", {}, "").status().message(), HasSubstr("list"));
  EXPECT_THAT(ParseServerArgs("ops", {"frob", "x"}, "").status().message(), HasSubstr("frob"));
  auto help = ParseServerArgs("ops", {"--help"}, "");
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(help->help);
}

TEST(ParseServerArgsTest, UsageErrorsNameTheProblem) {
  EXPECT_THAT(ParseServerArgs("resize", {"job"}, "").status().message(), HasSubstr("--to"));
  EXPECT_THAT(ParseServerArgs("resize", {"--to", "t"}, "").status().message(), HasSubstr("JOB"));
  EXPECT_THAT(ParseServerArgs("resize", {"a", "b", "--to", "t"}, "").status().message(),
              HasSubstr("\"b\""));
  EXPECT_THAT(ParseServerArgs("recover", {"job"}, "").status().message(), HasSubstr("--lost"));
  EXPECT_THAT(ParseServerArgs("hosts", {"list", "--output", "yaml"}, "").status().message(),
              HasSubstr("yaml"));
  EXPECT_THAT(ParseServerArgs("hosts", {"list", "--timeout", "soon"}, "").status().message(),
              HasSubstr("soon"));
  EXPECT_THAT(ParseServerArgs("jobs", {"list", "--state", "HAPPY"}, "").status().message(),
              HasSubstr("HAPPY"));
  EXPECT_THAT(ParseServerArgs("resize", {"j", "--to", "t", "--expected-generation", "0"}, "")
                  .status()
                  .message(),
              HasSubstr("positive"));
  EXPECT_THAT(ParseServerArgs("hosts", {"list", "--no-wait"}, "").status().message(),
              HasSubstr("--no-wait"));
  EXPECT_TRUE(ParseServerArgs("jobs", {"list", "--state", "DEGRADED"}, "").ok());
}

TEST(ParseServerArgsTest, StopFreeResizeMigrateAndMarkPrepared) {
  auto resize = ParseServerArgs("resize", {"j", "--to", "t.json", "--stop-free"}, "");
  ASSERT_TRUE(resize.ok()) << resize.status();
  EXPECT_TRUE(resize->flags.contains("stop-free"));
  auto migrate = ParseServerArgs("migrate", {"j", "--stop-free", "--to", "t.json"}, "");
  ASSERT_TRUE(migrate.ok()) << migrate.status();
  EXPECT_TRUE(migrate->flags.contains("stop-free"));
  auto mark = ParseServerArgs("ops", {"mark-prepared", "op-1"}, "");
  ASSERT_TRUE(mark.ok()) << mark.status();
  EXPECT_EQ(mark->command, "ops mark-prepared");
  EXPECT_THAT(mark->positional, ElementsAre("op-1"));
  EXPECT_THAT(ParseServerArgs("ops", {"mark-prepared"}, "").status().message(), HasSubstr("OP"));
  EXPECT_THAT(
      ParseServerArgs("resize", {"j", "--to", "t", "--stop-free=yes"}, "").status().message(),
      HasSubstr("takes no value"));
  EXPECT_THAT(
      ParseServerArgs("recover", {"j", "--lost", "h", "--stop-free"}, "").status().message(),
      HasSubstr("--stop-free"));
  EXPECT_THAT(ServerUsage("resize"), HasSubstr("--stop-free"));
  EXPECT_THAT(ServerUsage("ops"), HasSubstr("mark-prepared OP"));
}

TEST(ParsePlanArgsOutputTest, OutputIsAnAliasOfFormat) {
  auto json = ParsePlanArgs({"--spec", "j", "--to", "t", "--output", "json"});
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->format, PlanOptions::Format::kJson);
  auto table = ParsePlanArgs({"--spec", "j", "--to", "t", "--output=table"});
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->format, PlanOptions::Format::kSummary);
  EXPECT_FALSE(ParsePlanArgs({"--spec", "j", "--to", "t", "--output", "xml"}).ok());
  EXPECT_FALSE(
      ParsePlanArgs({"--spec", "j", "--to", "t", "--output", "json", "--format", "json"}).ok());
}

TEST(ParseTimeoutTest, DurationsAndSeconds) {
  EXPECT_EQ(*ParseTimeout("2.5"), absl::Milliseconds(2500));
  EXPECT_EQ(*ParseTimeout("1m"), absl::Minutes(1));
  EXPECT_EQ(*ParseTimeout("500ms"), absl::Milliseconds(500));
  EXPECT_FALSE(ParseTimeout("0").ok());
  EXPECT_FALSE(ParseTimeout("-3s").ok());
  EXPECT_FALSE(ParseTimeout("later").ok());
}

TEST(ParseSinceTest, DurationBackFromNowOrRfc3339) {
  EXPECT_EQ(*ParseSince("1h", 10 * 3600 * 1000), 9 * 3600 * 1000);
  EXPECT_EQ(*ParseSince("90", 100'000), 10'000);
  EXPECT_EQ(*ParseSince("1970-01-01T00:00:01Z", 5), 1000);
  EXPECT_EQ(*ParseSince("2h", 1000), 0);  // not before the epoch
  const absl::Status s = ParseSince("yesterday", 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("--since \"yesterday\""), std::string::npos) << s;
}

TEST(ParseWhenTest, DurationFromNowOrRfc3339) {
  EXPECT_EQ(*ParseWhen("deadline", "10m", 1000), 1000 + 600'000);
  EXPECT_EQ(*ParseWhen("leaves", "1970-01-01T00:00:02Z", 5), 2000);
  const absl::Status s = ParseWhen("deadline", "soon", 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(),
            "--deadline \"soon\": expected a duration from now (90s, 10m) or an RFC 3339 time "
            "(2026-01-02T15:04:05Z)");
}

TEST(ParseServerArgsTest, DeadlinesNoticesAndPolicies) {
  absl::StatusOr<ServerInvocation> inv = ParseServerArgs(
      "migrate", {"J", "--to", "l.json", "--deadline", "90s", "--abort-past-deadline"}, "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->flags.at("deadline"), "90s");
  EXPECT_TRUE(inv->flags.contains("abort-past-deadline"));
  absl::Status s =
      ParseServerArgs("resize", {"J", "--to", "l.json", "--abort-past-deadline"}, "").status();
  EXPECT_EQ(s.message(), "--abort-past-deadline needs --deadline");
  s = ParseServerArgs("recover", {"J", "--lost", "h1", "--deadline", "never"}, "").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("--deadline \"never\""));
  inv = ParseServerArgs("hosts", {"notice", "h3", "--leaves", "2m", "--spare", "h7,h8"}, "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->command, "hosts notice");
  EXPECT_EQ(inv->flags.at("spare"), "h7,h8");
  EXPECT_EQ(ParseServerArgs("hosts", {"notice", "h3"}, "").status().message(),
            "hosts notice: give --leaves WHEN, or --withdraw");
  inv = ParseServerArgs("hosts", {"notice", "h3", "--withdraw"}, "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_TRUE(inv->flags.contains("withdraw"));
  EXPECT_EQ(ParseServerArgs("hosts", {"notice", "h3", "--withdraw", "--leaves", "2m"}, "")
                .status()
                .message(),
            "hosts notice: --withdraw takes no --leaves or --spare");
  inv = ParseServerArgs("jobs", {"policy", "J", "--clear"}, "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->command, "jobs policy");
}

TEST(ServerFormatTest, HostNoticeShowsEachJobsMoveOrWhyNot) {
  v1::NoticeHostResponse notice;
  EXPECT_EQ(FormatHostNotice(notice), "(no job has ranks on the host)\n");
  v1::HostNoticeJob* moved = notice.add_jobs();
  moved->set_job_id("j1");
  moved->set_operation_id("op-1");
  moved->mutable_prediction()->set_seconds(2.5);
  moved->mutable_prediction()->set_critical_host("h9");
  *moved->mutable_target() = test_support::MakeLayout(1, 1, 2, {"h0", "h9"}, 1);
  v1::HostNoticeJob* kept = notice.add_jobs();
  kept->set_job_id("j2");
  kept->set_refused("no spare host was offered; when h3 goes, ...");
  const std::string text = FormatHostNotice(notice);
  EXPECT_THAT(text, HasSubstr("j1"));
  EXPECT_THAT(text, HasSubstr("op-1"));
  EXPECT_THAT(text, HasSubstr("2.50s (seeded rates), critical host h9"));
  EXPECT_THAT(text, HasSubstr("not moved (below)"));
  EXPECT_THAT(text, HasSubstr("j2: no spare host was offered; when h3 goes, ...\n"));
}

TEST(ServerFormatTest, JobShowsItsPolicyAndOperationItsDeadline) {
  v1::Job job;
  job.set_id("j1");
  EXPECT_THAT(FormatJob(job, 0), Not(HasSubstr("policy")));
  job.mutable_policy()->set_heal(true);
  job.mutable_policy()->set_grow(true);
  job.mutable_policy()->set_grow_at(v1::ElasticPolicy::GROW_STOP_FREE);
  job.mutable_policy()->set_min_devices(2);
  job.mutable_policy()->add_spare_hosts("h7");
  job.set_policy_status("waiting: h1 lost; ...");
  const std::string text = FormatJob(job, 0);
  EXPECT_THAT(text, HasSubstr("policy:             heal, grow stop-free, min 2, spares h7\n"));
  EXPECT_THAT(text, HasSubstr("policy status:      waiting: h1 lost; ...\n"));

  v1::Operation op;
  op.set_id("op-1");
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  op.mutable_deadline()->set_unix_ms(30'000);
  op.mutable_deadline()->set_abort_past(true);
  op.set_eta_unix_ms(25'000);
  const std::string shown = FormatOperation(op, 20'000);
  EXPECT_THAT(shown, HasSubstr("deadline:           in 10s (aborts past it)\n"));
  EXPECT_THAT(shown, HasSubstr("eta:                in 5.0s\n"));
}

TEST(ParseServerArgsTest, AuditFlagsAndJsonAlias) {
  absl::StatusOr<ServerInvocation> inv = ParseServerArgs(
      "audit", {"--job", "J", "--tenant", "T", "--since", "1h", "--limit", "5", "--json"}, "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->flags.at("job"), "J");
  EXPECT_EQ(inv->flags.at("tenant"), "T");
  EXPECT_EQ(inv->flags.at("limit"), "5");
  EXPECT_EQ(inv->global.output, GlobalOptions::Output::kJson);
  EXPECT_FALSE(ParseServerArgs("audit", {"--jobs", "J"}, "").ok());
}

TEST(ServerFormatTest, AuditTableNamesWhoWhatAndResult) {
  v1::ListAuditResponse audit;
  v1::AuditEntry* e = audit.add_entries();
  e->set_unix_ms(1000);
  e->set_identity("scheduler:s@team-a");
  e->set_role("scheduler");
  e->set_tenant("team-a");
  e->set_method("DeleteJob");
  e->set_job_id("job-1");
  e->set_code("PERMISSION_DENIED");
  e->set_message(std::string(200, 'm'));
  const std::string table = FormatAuditTable(audit);
  EXPECT_NE(table.find("TIME"), std::string::npos) << table;
  EXPECT_NE(table.find("1970-01-01T00:00:01.000Z"), std::string::npos) << table;
  EXPECT_NE(table.find("scheduler:s@team-a"), std::string::npos) << table;
  EXPECT_NE(table.find("PERMISSION_DENIED"), std::string::npos) << table;
  EXPECT_NE(table.find(std::string(77, 'm') + "..."), std::string::npos) << table;
  EXPECT_EQ(table.find(std::string(78, 'm')), std::string::npos) << table;
  EXPECT_NE(FormatAuditTable(v1::ListAuditResponse()).find("(no audit entries)"),
            std::string::npos);
}

TEST(ExitCodeTest, ConflictNotFoundAndUnavailable) {
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), kExitNotFound);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("x")), kExitConflict);
  EXPECT_EQ(ExitCodeFor(absl::AlreadyExistsError("x")), kExitConflict);
  EXPECT_EQ(ExitCodeFor(absl::AbortedError("x")), kExitConflict);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x")), kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), kExitError);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), kExitError);
  EXPECT_NE(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_THAT(std::string(kExitCodesHelp), HasSubstr("6  coordinator unreachable"));
}

v1::Layout TwoHostsOfTwo() { return test_support::MakeLayout(2, 1, 2, {"a", "b"}, 2); }

TEST(ServerFormatTest, JsonUsesOriginalFieldNames) {
  v1::Operation op;
  op.set_id("op-1");
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  op.set_bytes_total(10);
  auto json = ToJson(op);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"bytes_total\": \"10\""));
  EXPECT_THAT(*json, HasSubstr("\"bytes_done\": \"0\""));  // every field printed
  EXPECT_THAT(*json, HasSubstr("\"OPERATION_STATE_TRANSFERRING\""));
  EXPECT_THAT(*json, Not(HasSubstr("bytesTotal")));
}

TEST(ServerFormatTest, TablesShowTheFields) {
  v1::ListJobsResponse jobs;
  v1::Job* j = jobs.add_jobs();
  j->set_id("j1");
  j->set_name("gpt");
  j->set_tenant("t");
  j->set_state(v1::JOB_STATE_DEGRADED);
  j->set_generation(3);
  *j->mutable_layout() = TwoHostsOfTwo();
  j->set_total_bytes(int64_t{3} << 30);
  const std::string table = FormatJobsTable(jobs);
  EXPECT_THAT(table, HasSubstr("ID"));
  EXPECT_THAT(table, HasSubstr("DEGRADED"));
  EXPECT_THAT(table, HasSubstr("3.00 GiB"));
  EXPECT_THAT(FormatJobsTable(v1::ListJobsResponse()), HasSubstr("(no jobs)"));

  j->add_lost_hosts("b");
  const std::string shown = FormatJob(*j, 0);
  EXPECT_THAT(shown, HasSubstr("tp 2, pp 1, dp 2 (4 ranks) on a, b x 2"));
  EXPECT_THAT(shown, HasSubstr("b (LOST)"));
  EXPECT_THAT(shown, HasSubstr("state memory:       host\n"));
  j->set_state_memory(v1::STATE_MEMORY_DEVICE);
  EXPECT_THAT(FormatJob(*j, 0), HasSubstr("state memory:       device\n"));

  v1::ListHostsResponse hosts;
  v1::Host* h = hosts.add_hosts();
  h->set_host_id("h0");
  h->set_state(v1::HOST_STATE_LOST);
  h->set_last_heartbeat_unix_ms(10'000);
  h->set_lease_expires_unix_ms(13'000);
  const std::string host_table = FormatHostsTable(hosts, 20'000);
  EXPECT_THAT(host_table, HasSubstr("LOST"));
  EXPECT_THAT(host_table, HasSubstr("10s ago"));
  EXPECT_THAT(host_table, HasSubstr("expired 7.0s ago"));
}

TEST(ServerFormatTest, OperationShowsEachHostsRoute) {
  v1::Operation op;
  op.set_id("op-1");
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  v1::OperationHost* h0 = op.add_hosts();
  h0->set_host_id("h0");
  h0->set_state(v1::HOST_TASK_STATE_DONE);
  h0->set_bytes_done(int64_t{2} << 20);
  h0->set_bytes_total(int64_t{2} << 20);
  h0->set_route("device-comm nccl");
  v1::OperationHost* h1 = op.add_hosts();
  h1->set_host_id("h1");
  h1->set_state(v1::HOST_TASK_STATE_RUNNING);
  h1->set_bytes_total(int64_t{1} << 20);
  h1->set_route("host-staged");
  h1->set_route_reason("no device communicator");
  h1->set_waiting_on("local copies");
  op.add_hosts()->set_host_id("h2");
  const std::string text = FormatOperation(op, 20'000);
  EXPECT_THAT(text, HasSubstr("host h0:            DONE 2.00 MiB / 2.00 MiB, route device-comm "
                              "nccl\n"));
  EXPECT_THAT(text, HasSubstr("host h1:            RUNNING 0 B / 1.00 MiB, route host-staged (no "
                              "device communicator), waiting on local copies\n"));
  EXPECT_THAT(text, HasSubstr("host h2:            UNSPECIFIED 0 B / 0 B, route -\n"));
}

v1::CostPrediction TwoHostPrediction() {
  v1::CostPrediction p;
  p.set_seconds(4.5);
  p.set_overhead_seconds(0.25);
  p.set_critical_host("h1");
  p.set_critical_link("h0->h1");
  p.set_bound_seconds(3.0);
  p.set_bound_host("h1");
  p.set_load_seconds(0.125);
  v1::HostCost* h = p.add_hosts();
  h->set_host("h1");
  h->set_setup_seconds(0.5);
  h->set_move_seconds(3.0);
  h->set_verify_seconds(0.25);
  h->set_seal_seconds(0.5);
  h->set_total_seconds(4.25);
  h->set_route("host");
  return p;
}

TEST(ServerFormatTest, CostPredictionShowsTheCriticalHostAndEachHostsPhases) {
  v1::CostPrediction p = TwoHostPrediction();
  std::string text = FormatCostPrediction(p);
  EXPECT_THAT(text, HasSubstr("predicted:          4.50s (seeded rates), critical host h1 (link "
                              "h0->h1)\n"));
  EXPECT_THAT(text, HasSubstr("overhead:           0.25s\n"));
  EXPECT_THAT(text, HasSubstr("plan bound:         3.00s on h1\n"));
  EXPECT_THAT(text, HasSubstr("load after:         0.12s\n"));
  EXPECT_THAT(text, HasSubstr("HOST  SETUP  MOVE   VERIFY  SEAL   TOTAL  ROUTE"));
  EXPECT_THAT(text, HasSubstr("h1    0.50s  3.00s  0.25s   0.50s  4.25s  host"));
  p.set_calibrated(true);
  EXPECT_THAT(FormatCostPrediction(p), HasSubstr("predicted:          4.50s, critical host h1"));
}

TEST(ServerFormatTest, OperationShowsItsPredictionAndWhatItTook) {
  v1::Operation op;
  op.set_id("op-1");
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_THAT(FormatOperation(op, 20'000), Not(HasSubstr("predicted")));
  *op.mutable_prediction() = TwoHostPrediction();
  std::string text = FormatOperation(op, 20'000);
  EXPECT_THAT(text, HasSubstr("predicted:          4.50s (seeded rates), critical host h1"));
  EXPECT_THAT(text, HasSubstr("actual:             -\n"));
  op.set_state(v1::OPERATION_STATE_COMMITTED);
  op.set_actual_seconds(5.4);
  text = FormatOperation(op, 20'000);
  EXPECT_THAT(text, HasSubstr("actual:             5.40s (planned -> committed), 1.20x the "
                              "prediction\n"));
}

TEST(ServerFormatTest, StopFreeOperationShowsItsPhases) {
  v1::Operation op;
  op.set_id("op-1");
  op.set_state(v1::OPERATION_STATE_PLANNED);
  const std::string plain = FormatOperation(op, 20'000);
  EXPECT_THAT(plain, Not(HasSubstr("stop-free")));
  EXPECT_THAT(plain, Not(HasSubstr("pause")));

  op.set_stop_free(true);
  std::string waiting = FormatOperation(op, 20'000);
  EXPECT_THAT(waiting, HasSubstr("stop-free:          yes"));
  EXPECT_THAT(waiting,
              HasSubstr("prepared:           - (waiting for mark-prepared and the agents)"));
  EXPECT_THAT(waiting, HasSubstr("workers prepared:   -\n"));
  EXPECT_THAT(waiting, HasSubstr("agents prepared:    -\n"));
  EXPECT_THAT(waiting, Not(HasSubstr("pre-copied")));
  op.set_prepared_from_generation(1);
  op.set_bytes_precopied(int64_t{3} << 20);
  op.set_workers_prepared_unix_ms(14'000);
  waiting = FormatOperation(op, 20'000);
  EXPECT_THAT(waiting, HasSubstr("prepared:           - (waiting for the agents)"));
  EXPECT_THAT(waiting, HasSubstr("workers prepared:   6.0s ago"));
  EXPECT_THAT(waiting, HasSubstr("pre-copied:         3.00 MiB from generation 1"));
  EXPECT_THAT(waiting, HasSubstr("skipped unchanged:  -\n"));
  op.set_agents_prepared_unix_ms(15'000);
  op.set_bytes_skipped_unchanged(int64_t{2} << 20);
  EXPECT_THAT(waiting, HasSubstr("cut over:           - (waiting"));
  EXPECT_THAT(waiting, HasSubstr("pause:              -\n"));

  op.set_prepared_unix_ms(15'000);
  op.set_prepare_seconds(4.25);
  op.set_cutover_unix_ms(18'000);
  op.set_cutover_operation_id("ckpt-9");
  op.set_state(v1::OPERATION_STATE_COMMITTED);
  op.set_pause_seconds(0.07);
  const std::string done = FormatOperation(op, 20'000);
  EXPECT_THAT(done, HasSubstr("prepared:           5.0s ago"));
  EXPECT_THAT(done, HasSubstr("prepare:            4.250s (created -> prepared)"));
  EXPECT_THAT(done, HasSubstr("cut over:           2.0s ago by checkpoint ckpt-9"));
  EXPECT_THAT(done, HasSubstr("pause:              0.070s (cut-over -> commit)"));
  EXPECT_THAT(done, HasSubstr("agents prepared:    5.0s ago"));
  EXPECT_THAT(done, HasSubstr("skipped unchanged:  2.00 MiB (not moved again at the cut-over)"));
  auto json = ToJson(op);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"prepare_seconds\": 4.25"));
  EXPECT_THAT(*json, HasSubstr("\"pause_seconds\": 0.07"));
  EXPECT_THAT(*json, HasSubstr("\"cutover_operation_id\": \"ckpt-9\""));
  EXPECT_THAT(*json, HasSubstr("\"bytes_skipped_unchanged\": \"2097152\""));
  EXPECT_THAT(*json, HasSubstr("\"prepared_from_generation\": \"1\""));
}

TEST(ServerFormatTest, ProgressShowsBytesRateAndTimeLeft) {
  ProgressSample s;
  s.state = v1::OPERATION_STATE_TRANSFERRING;
  s.bytes_done = int64_t{1} << 30;
  s.bytes_total = int64_t{2} << 30;
  s.rate_bytes_per_s = 100.0 * (1 << 20);
  s.elapsed_s = 12;
  const std::string bar = FormatProgressBar(s, 10);
  EXPECT_THAT(bar, HasSubstr("TRANSFERRING [#####-----]"));
  EXPECT_THAT(bar, HasSubstr("50.0%"));
  EXPECT_THAT(bar, HasSubstr("1.00 GiB / 2.00 GiB"));
  EXPECT_THAT(bar, HasSubstr("100 MiB/s"));
  EXPECT_THAT(bar, HasSubstr("10s left"));
  const std::string line = FormatProgressLine("op-9", s);
  EXPECT_THAT(line, HasSubstr("operation op-9: TRANSFERRING"));
  EXPECT_THAT(line, HasSubstr("10s left"));
  ProgressSample pending;
  pending.state = v1::OPERATION_STATE_PENDING;
  EXPECT_THAT(FormatProgressBar(pending, 4), HasSubstr("PENDING [----]"));
  EXPECT_EQ(FormatSeconds(75), "1m15s");
  EXPECT_EQ(FormatSeconds(0.42), "0.4s");
}

}  // namespace
}  // namespace reshard::cli
