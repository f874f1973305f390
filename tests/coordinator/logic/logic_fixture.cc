#include "tests/coordinator/logic/logic_fixture.h"

#include <chrono>
#include <utility>

#include "prometheus/registry.h"
#include "services/coordinator/logic/task.h"
#include "services/coordinator/store/migrator.h"
#include "tests/coordinator/harness/test_postgres.h"
#include "tests/support/job_builders.h"

namespace reshard::coordinator::testing {

void LogicTest::SetUp() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  memory_store_ = info->value_param() != nullptr && GetParam() == "Memory";
  if (!memory_store_) {
    // One server per test process, one fresh database per test.
    absl::StatusOr<std::string> dsn = CreateFreshDatabase("logic");
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    dsn_ = *dsn;
    const absl::Status migrated = Migrate(dsn_);
    ASSERT_TRUE(migrated.ok()) << migrated;
  }
  // The store stamps rows with its own clock (the database's, or the
  // system's in memory); start the fake one at the real time so that ages
  // computed from both agree.
  clock_.Set(std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count());
  if (memory_store_) memory_database_ = std::make_shared<MemoryStore>();
  store_ = ConnectStore();
  ASSERT_NE(store_, nullptr);
  metrics_ = std::make_unique<CoordinatorMetrics>(std::make_shared<prometheus::Registry>());
  SchedulerApi::Options api_options;
  api_ = std::make_unique<SchedulerApi>(store_, &clock_, metrics_.get(), api_options);
  AgentApi::Options agent_options;
  agent_options.lease_ms = kLeaseMs;
  agents_ = std::make_unique<AgentApi>(store_, &clock_, metrics_.get(), agent_options);
  driver_ = MakeDriver(store_);
}

void LogicTest::TearDown() {
  driver_.reset();
  agents_.reset();
  api_.reset();
  store_.reset();
}

StorePtr LogicTest::ConnectStore() {
  if (memory_store_) return memory_database_;
  PgStoreOptions options;
  options.dsn = dsn_;
  options.pool_size = 4;
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *store : nullptr;
}

std::unique_ptr<OperationDriver> LogicTest::MakeDriver(StorePtr store,
                                                       OperationDriver::Options options) {
  options.lease_grace_ms = kLeaseMs;
  return std::make_unique<OperationDriver>(std::move(store), &clock_, metrics_.get(), options);
}

v1::Job LogicTest::Register(const v1::JobSpec& spec, const std::string& key) {
  v1::RegisterJobRequest request;
  *request.mutable_spec() = spec;
  request.set_idempotency_key(key);
  absl::StatusOr<v1::RegisterJobResponse> response = api_->RegisterJob(request);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? response->job() : v1::Job();
}

void LogicTest::RegisterAgents(const std::vector<std::string>& hosts) {
  for (const std::string& host : hosts) {
    v1::RegisterAgentRequest request;
    *request.mutable_host() = test_support::MakeHost(host, {.address = host + ":7171",
                                                            .devices = 0,
                                                            .transports = {"ucx", "nccl"},
                                                            .ucx_address = "ucx-" + host,
                                                            .memory_limit_bytes = 0});
    absl::StatusOr<v1::RegisterAgentResponse> response = agents_->RegisterAgent(request);
    ASSERT_TRUE(response.ok()) << response.status();
    epochs_[host] = response->epoch();
  }
}

absl::StatusOr<v1::HeartbeatResponse> LogicTest::Heartbeat(const std::string& host) {
  v1::HeartbeatRequest request;
  request.set_host_id(host);
  request.set_epoch(epochs_[host]);
  return agents_->Heartbeat(request);
}

absl::StatusOr<v1::Operation> LogicTest::ResizeTo(const v1::Job& job, const v1::Layout& target,
                                                  const std::string& key) {
  v1::ResizeRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(job.generation());
  *request.mutable_placement() = target.placement();
  *request.mutable_config() = target.config();
  request.set_idempotency_key(key);
  return api_->Resize(request);
}

void LogicTest::Tick() {
  const absl::Status s = driver_->Tick();
  EXPECT_TRUE(s.ok()) << s;
}

v1::Operation LogicTest::Op(const std::string& operation_id) {
  v1::GetOperationRequest request;
  request.set_operation_id(operation_id);
  absl::StatusOr<v1::Operation> op = api_->GetOperation(request);
  EXPECT_TRUE(op.ok()) << op.status();
  return op.ok() ? *op : v1::Operation();
}

v1::Job LogicTest::Job(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::Job> job = api_->GetJob(request);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : v1::Job();
}

void LogicTest::CompleteTask(const std::string& host, const std::string& operation_id) {
  v1::GetTaskRequest get;
  get.set_host_id(host);
  get.set_operation_id(operation_id);
  absl::StatusOr<v1::HostTask> task = agents_->GetTask(get);
  ASSERT_TRUE(task.ok()) << host << ": " << task.status();
  v1::ReportProgressRequest report;
  report.set_host_id(host);
  report.set_operation_id(operation_id);
  report.set_state(v1::HOST_TASK_STATE_DONE);
  // A prepared stop-free operation's slice leaves out the unchanged steps;
  // the host checksums every shard its prepare wrote (the whole plan's).
  v1::TransferPlan written = task->plan();
  if (task->prepared()) {
    absl::StatusOr<OperationRecord> record = store_->GetOperation(operation_id, true);
    ASSERT_TRUE(record.ok()) << record.status();
    written = *record->plan;
  }
  for (const auto& [item, rank] : ShardsWrittenOnHost(written, host)) {
    v1::ShardChecksum* sum = report.add_checksums();
    sum->set_item(item);
    sum->set_rank(rank);
    sum->set_checksum(ShardChecksumOf(item, rank));
    sum->set_bytes(4);
  }
  absl::StatusOr<v1::ReportProgressResponse> reply = agents_->ReportProgress(report);
  ASSERT_TRUE(reply.ok()) << host << ": " << reply.status();
  EXPECT_FALSE(reply->abort());
}

std::vector<std::string> LogicTest::Participants(const std::string& operation_id) {
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(operation_id);
  EXPECT_TRUE(rows.ok()) << rows.status();
  std::vector<std::string> hosts;
  if (rows.ok()) {
    for (const HostProgress& row : *rows) hosts.push_back(row.host_id);
  }
  return hosts;
}

v1::Operation LogicTest::StartTransfer(const v1::Job& job, const v1::Layout& target) {
  absl::StatusOr<v1::Operation> op = ResizeTo(job, target);
  EXPECT_TRUE(op.ok()) << op.status();
  if (!op.ok()) return v1::Operation();
  Tick();
  const v1::Operation now = Op(op->id());
  EXPECT_EQ(now.state(), v1::OPERATION_STATE_TRANSFERRING) << now.error();
  return now;
}

DatabaseSnapshot LogicTest::Snapshot() {
  DatabaseSnapshot snap;
  ListJobsQuery query;
  query.page_size = 1000;
  absl::StatusOr<JobPage> page = store_->ListJobs(query);
  EXPECT_TRUE(page.ok()) << page.status();
  if (!page.ok()) return snap;
  for (const v1::Job& listed : page->jobs) {
    absl::StatusOr<v1::Job> job = store_->GetJob(listed.id(), /*include_ptc=*/true);
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) snap.jobs.push_back(job->SerializeAsString());
    absl::StatusOr<std::vector<v1::Operation>> ops = store_->ListOperationsForJob(listed.id());
    EXPECT_TRUE(ops.ok()) << ops.status();
    if (!ops.ok()) continue;
    for (const v1::Operation& op : *ops) snap.operations.push_back(op.SerializeAsString());
  }
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->ListHosts();
  EXPECT_TRUE(hosts.ok()) << hosts.status();
  if (hosts.ok()) {
    for (const v1::Host& h : *hosts) snap.hosts.push_back(h.SerializeAsString());
  }
  return snap;
}

double LogicTest::MetricValue(const std::string& name,
                              const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : metrics_->registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const prometheus::ClientMetric::Label& l : metric.label) have[l.name] = l.value;
      bool match = true;
      for (const auto& [k, v] : labels) match = match && have[k] == v;
      if (!match) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return 0;
      }
    }
  }
  return 0;
}

}  // namespace reshard::coordinator::testing
