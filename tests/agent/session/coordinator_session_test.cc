// The agent's CoordinatorSession against a fake coordinator (a real gRPC
// server on port 0 that serves AgentService from a script the test drives),
// with a real shard store and executor on one host (local plans): a stop-free
// operation's prepare ends PREPARED with its source checksums, the prepared
// operation runs again in its transfer phase when it is assigned again, the
// long poll (WaitForTasks) starts operations without a heartbeat, a
// coordinator without WaitForTasks leaves the agent on heartbeats, and a
// discard drops the prepared buffers while the poll stays open. And the
// host the agent registers lists the devices of its device API.
#include "agent/process/coordinator_session.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/device/device_api.h"
#include "agent/executor/executor.h"
#include "agent/shard_store/device_buffer.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent {
namespace {

namespace fs = std::filesystem;
using executor_testing::kJob;
using executor_testing::RenderRank;
using executor_testing::SourceUnchanged;
using executor_testing::TransferPhaseOf;
using test_support::ExecutorPtc;
using test_support::MakeLayoutOnHosts;
using Clock = std::chrono::steady_clock;

constexpr char kHost[] = "h0";

// AgentService as the coordinator would serve it to one host, from what the
// test scripts: the operations assigned, the task of each, discards.
class FakeCoordinator final : public v1::AgentService::Service {
 public:
  grpc::Status RegisterAgent(grpc::ServerContext*, const v1::RegisterAgentRequest* req,
                             v1::RegisterAgentResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    registered_.push_back(req->host());
    cv_.notify_all();
    resp->set_epoch(1);
    resp->set_lease_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++heartbeats_;
    for (const std::string& id : assigned_) resp->add_assigned_operations(id);
    for (const v1::GenerationRef& g : discard_) *resp->add_discard() = g;
    cv_.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status GetTask(grpc::ServerContext*, const v1::GetTaskRequest* req,
                       v1::HostTask* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = tasks_.find(req->operation_id());
    if (it == tasks_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such task");
    fetched_again_.insert(req->operation_id());
    *resp = it->second;
    return grpc::Status::OK;
  }
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* req,
                              v1::ReportProgressResponse*) override {
    std::lock_guard<std::mutex> l(mu_);
    if (req->state() != v1::HOST_TASK_STATE_RUNNING) {
      finals_.push_back(*req);
      fetched_again_.erase(req->operation_id());
      // The row is PREPARED, DONE or FAILED: no longer listed (a stop-free
      // operation waits in PLANNED; the others are over for this test).
      assigned_.erase(req->operation_id());
      cv_.notify_all();
    }
    return grpc::Status::OK;
  }
  grpc::Status WaitForTasks(grpc::ServerContext* ctx, const v1::WaitForTasksRequest* req,
                            v1::WaitForTasksResponse* resp) override {
    std::unique_lock<std::mutex> l(mu_);
    ++polls_;
    if (!wait_for_tasks_) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "WaitForTasks is not implemented");
    }
    ++polls_waiting_;
    cv_.notify_all();
    const std::set<std::string> known(req->known_operations().begin(),
                                      req->known_operations().end());
    const uint64_t wake = wakes_;
    cv_.wait_for(l, std::chrono::milliseconds(req->wait_ms() > 0 ? req->wait_ms() : 10000), [&] {
      if (ctx->IsCancelled() || wakes_ != wake) return true;
      for (const std::string& id : assigned_) {
        if (known.count(id) == 0) return true;
      }
      return false;
    });
    --polls_waiting_;
    // An operation whose last final report is PREPARED and whose transfer
    // phase the agent has not fetched (GetTask) is held by the agent: a poll
    // it did not cancel (the agent replaces the one in flight when it
    // reports PREPARED) naming it known keeps its transfer phase from waking
    // the poll.
    for (const std::string& id : ctx->IsCancelled() ? std::set<std::string>() : known) {
      for (auto r = finals_.rbegin(); r != finals_.rend(); ++r) {
        if (r->operation_id() != id) continue;
        if (r->state() == v1::HOST_TASK_STATE_PREPARED && fetched_again_.count(id) == 0) {
          held_named_known_.push_back(id);
        }
        break;
      }
    }
    for (const std::string& id : assigned_) resp->add_assigned_operations(id);
    return grpc::Status::OK;
  }

  void Assign(const std::string& id, const v1::HostTask& task) {
    std::lock_guard<std::mutex> l(mu_);
    tasks_[id] = task;
    assigned_.insert(id);
    cv_.notify_all();
  }
  void Discard(const std::string& job, int64_t generation) {
    std::lock_guard<std::mutex> l(mu_);
    v1::GenerationRef g;
    g.set_job_id(job);
    g.set_generation(generation);
    discard_.push_back(g);
  }
  void SetWaitForTasks(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    wait_for_tasks_ = on;
  }
  /// Ends the polls in progress (with the list as it is).
  void WakePolls() {
    std::lock_guard<std::mutex> l(mu_);
    ++wakes_;
    cv_.notify_all();
  }

  /// Waits (up to 60 s) until `pred` holds under the lock; whether it did.
  bool WaitUntil(const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_until(l, Clock::now() + std::chrono::seconds(60), pred);
  }
  /// The final report of `id` in `state`, once there (waits up to 60 s).
  std::optional<v1::ReportProgressRequest> Final(const std::string& id, v1::HostTaskState state) {
    std::optional<v1::ReportProgressRequest> out;
    WaitUntil([&] {
      for (const auto& r : finals_) {
        if (r.operation_id() == id && r.state() == state) out = r;
      }
      return out.has_value();
    });
    return out;
  }
  /// Finals of `id` so far.
  std::vector<v1::ReportProgressRequest> Finals(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<v1::ReportProgressRequest> out;
    for (const auto& r : finals_) {
      if (r.operation_id() == id) out.push_back(r);
    }
    return out;
  }
  int heartbeats() {
    std::lock_guard<std::mutex> l(mu_);
    return heartbeats_;
  }
  int polls() {
    std::lock_guard<std::mutex> l(mu_);
    return polls_;
  }
  /// Held (PREPARED) operations a poll named in known_operations.
  std::vector<std::string> held_named_known() {
    std::lock_guard<std::mutex> l(mu_);
    return held_named_known_;
  }
  /// The host of the first registration (waits up to 60 s).
  std::optional<v1::Host> Registered() {
    std::optional<v1::Host> out;
    WaitUntil([&] {
      if (!registered_.empty()) out = registered_.front();
      return out.has_value();
    });
    return out;
  }
  // Fields the predicates of WaitUntil read (under the lock).
  int heartbeats_ = 0, polls_ = 0, polls_waiting_ = 0;
  std::vector<v1::Host> registered_;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> assigned_;
  std::map<std::string, v1::HostTask> tasks_;
  std::vector<v1::GenerationRef> discard_;
  std::vector<v1::ReportProgressRequest> finals_;
  bool wait_for_tasks_ = true;
  uint64_t wakes_ = 0;
  std::vector<std::string> held_named_known_;
  std::set<std::string> fetched_again_;  // GetTask since the last final report
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ptc_ = ExecutorPtc(64);
    from_ = MakeLayoutOnHosts(2, 1, 3, 6);  // h0: ranks 0-5
    to_ = MakeLayoutOnHosts(4, 1, 2, 8);    // h0: ranks 0-7
    dir_ = fs::temp_directory_path() / ("reshard-session-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    ShardStore::Options so;
    so.shm_dir = dir_.string();
    so.host_id = kHost;
    so.memory_limit_bytes = int64_t{1} << 30;
    auto store = ShardStore::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    executor_ = std::make_unique<TaskExecutor>(store_.get(), nullptr, TaskExecutor::Options());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    WriteOld(1, {});
  }
  void TearDown() override {
    if (session_) session_->Stop();
    fake_.WakePolls();  // a poll the stopped session left open ends now
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    session_.reset();
    executor_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // With `device_api` and `devices` (not owned) as the agent passes them.
  void StartSession(int heartbeat_ms, const DeviceApi* device_api = nullptr,
                    DeviceBufferStore* devices = nullptr) {
    CoordinatorSession::Options o;
    o.host_id = kHost;
    o.address = "127.0.0.1:1";
    o.memory_limit_bytes = int64_t{1} << 30;
    o.heartbeat_ms = heartbeat_ms;
    o.device_api = device_api;
    o.devices = devices;
    session_ = std::make_unique<CoordinatorSession>(
        o,
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                            grpc::InsecureChannelCredentials()),
        store_.get(), executor_.get(), nullptr);
    session_->Start();
  }

  // Generation `gen` of the old layout, sealed; the shards in `changed`
  // ((rank, item)) differ from generation 1's.
  void WriteOld(int64_t gen, const std::set<std::pair<int, int>>& changed) {
    for (int r = 0; r < 6; ++r) {
      auto bufs = store_->CreateAll({RankBufferKey{kJob, gen, r}}, {RankItemBytes(ptc_, from_, r)});
      ASSERT_TRUE(bufs.ok()) << bufs.status();
      RankBuffer& b = *(*bufs)[0];
      RenderRank(ptc_, from_, r, 6, &b);
      for (const auto& [rank, item] : changed) {
        if (rank != r) continue;
        for (int64_t i = 0; i < b.items()[item].bytes; ++i) b.item_data(item)[i] ^= 0x5a;
      }
      ASSERT_TRUE(store_->Seal({kJob, gen, r}, {}).ok());
    }
  }

  v1::HostTask Task(const std::string& op, int64_t from, int64_t to) {
    absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(ptc_, from_, to_, {});
    EXPECT_TRUE(plan.ok()) << plan.status();
    v1::HostTask t;
    t.set_operation_id(op);
    t.set_job_id(kJob);
    t.set_from_generation(from);
    t.set_to_generation(to);
    *t.mutable_ptc() = ptc_;
    *t.mutable_plan() = *plan;
    return t;
  }

  // The transfer phase of `prepare` from generation `from`, without the
  // steps whose source shard the prepare reported unchanged since.
  v1::HostTask TransferPhase(const v1::HostTask& prepare, const v1::ReportProgressRequest& report,
                             int64_t from) {
    std::map<std::pair<int, int>, v1::ShardChecksum> reported;
    for (const auto& c : report.source_checksums()) reported[{c.rank(), c.item()}] = c;
    return TransferPhaseOf(prepare, from, [&](const v1::CopyStep& s) {
      return SourceUnchanged(*store_, from, s, reported);
    });
  }

  int Buffers(int64_t gen) {
    int n = 0;
    for (const auto& k : store_->List()) n += k.generation == gen;
    return n;
  }

  v1::Ptc ptc_;
  v1::Layout from_, to_;
  fs::path dir_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<TaskExecutor> executor_;
  // A device API and store a test opens; they outlive session_ (TearDown).
  std::unique_ptr<DeviceApi> device_api_;
  std::unique_ptr<DeviceBufferStore> device_store_;
  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorSession> session_;
};

// One heartbeat only (the next is an hour away): the prepare starts on it;
// everything after reaches the agent through WaitForTasks.
TEST_F(SessionTest, PreparedOperationRunsItsTransferPhaseAndThePollStartsOperations) {
  v1::HostTask prepare = Task("op-sf", 1, 3);
  prepare.set_prepare(true);
  fake_.Assign("op-sf", prepare);
  StartSession(/*heartbeat_ms=*/3600 * 1000);

  auto prepared = fake_.Final("op-sf", v1::HOST_TASK_STATE_PREPARED);
  ASSERT_TRUE(prepared.has_value());
  EXPECT_TRUE(prepared->checksums().empty());
  ASSERT_GT(prepared->source_checksums_size(), 0);
  EXPECT_GT(prepared->bytes_done(), 0);
  EXPECT_EQ(prepared->bytes_done(), prepared->bytes_total());
  for (const v1::ShardChecksum& c : prepared->source_checksums()) {
    auto old = store_->Get({kJob, 1, c.rank()});
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(c.checksum(), (*old)->checksums()[c.item()]);
  }
  EXPECT_EQ(Buffers(3), 8);  // kept, unsealed
  for (int r = 0; r < 8; ++r) EXPECT_FALSE((*store_->Get({kJob, 3, r}))->sealed());

  // The prepared operation is held: the agent long-polls.
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_waiting_ > 0; }));
  // A new operation reaches the agent through the poll.
  fake_.Assign("op-other", Task("op-other", 1, 4));
  auto other = fake_.Final("op-other", v1::HOST_TASK_STATE_DONE);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(Buffers(4), 8);

  // The cut-over: generation 2 changes two shards; the transfer phase moves
  // only the steps that read them.
  WriteOld(2, {{0, 0}, {4, 2}});
  const v1::HostTask transfer = TransferPhase(prepare, *prepared, 2);
  ASSERT_GT(transfer.plan().steps_size(), 0);
  ASSERT_LT(transfer.plan().steps_size(), prepare.plan().steps_size());
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_waiting_ > 0; }));
  fake_.Assign("op-sf", transfer);
  auto done = fake_.Final("op-sf", v1::HOST_TASK_STATE_DONE);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(fake_.heartbeats(), 1);

  // What a plain transfer of generation 2 writes, byte for byte.
  v1::HostTask plain = Task("op-plain", 2, 5);
  auto want = executor_->Execute(kHost, plain, nullptr, [] { return false; });
  ASSERT_TRUE(want.ok()) << want.status();
  std::map<std::pair<int, int>, uint64_t> got_sums, want_sums;
  for (const auto& c : done->checksums()) got_sums[{c.rank(), c.item()}] = c.checksum();
  for (const auto& c : *want) want_sums[{c.rank(), c.item()}] = c.checksum();
  EXPECT_EQ(got_sums, want_sums);
  for (int r = 0; r < 8; ++r) {
    auto a = store_->Get({kJob, 3, r});
    auto b = store_->Get({kJob, 5, r});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE((*a)->sealed());
    ASSERT_EQ((*a)->size(), (*b)->size());
    EXPECT_EQ(0, std::memcmp((*a)->data(), (*b)->data(), (*a)->size())) << "rank " << r;
  }
  // Each phase reported once.
  EXPECT_EQ(fake_.Finals("op-sf").size(), 2u);
  EXPECT_THAT(fake_.held_named_known(), ::testing::IsEmpty());
}

// No prepared operation anywhere: the long poll is open from registration
// on, and a plain operation assigned later starts through it (one heartbeat,
// at registration; the next is an hour away).
TEST_F(SessionTest, ANewOperationStartsThroughThePollWithoutAHeartbeat) {
  StartSession(/*heartbeat_ms=*/3600 * 1000);
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_waiting_ > 0 && fake_.heartbeats_ == 1; }));
  fake_.Assign("op-new", Task("op-new", 1, 2));
  auto done = fake_.Final("op-new", v1::HOST_TASK_STATE_DONE);
  ASSERT_TRUE(done.has_value());
  EXPECT_GT(done->checksums_size(), 0);
  EXPECT_EQ(Buffers(2), 8);
  EXPECT_EQ(fake_.heartbeats(), 1);
}

// The transfer phase assigned right after the prepare wakes the poll that
// started when the prepare ended: the held operation is never among the
// poll's known_operations (one heartbeat in all).
TEST_F(SessionTest, TheTransferPhaseWakesThePollStartedByThePrepare) {
  v1::HostTask prepare = Task("op-sf", 1, 3);
  prepare.set_prepare(true);
  fake_.Assign("op-sf", prepare);
  StartSession(/*heartbeat_ms=*/3600 * 1000);
  auto prepared = fake_.Final("op-sf", v1::HOST_TASK_STATE_PREPARED);
  ASSERT_TRUE(prepared.has_value());
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_waiting_ > 0; }));
  fake_.Assign("op-sf", TransferPhase(prepare, *prepared, 1));
  ASSERT_TRUE(fake_.Final("op-sf", v1::HOST_TASK_STATE_DONE).has_value());
  EXPECT_THAT(fake_.held_named_known(), ::testing::IsEmpty());
  EXPECT_EQ(fake_.heartbeats(), 1);
}

// A coordinator without WaitForTasks: the agent asks once, then waits for
// heartbeats, which bring the transfer phase as well.
TEST_F(SessionTest, WithoutWaitForTasksTheTransferPhaseComesWithAHeartbeat) {
  fake_.SetWaitForTasks(false);
  v1::HostTask prepare = Task("op-sf", 1, 3);
  prepare.set_prepare(true);
  fake_.Assign("op-sf", prepare);
  StartSession(/*heartbeat_ms=*/100);
  auto prepared = fake_.Final("op-sf", v1::HOST_TASK_STATE_PREPARED);
  ASSERT_TRUE(prepared.has_value());
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_ >= 1; }));
  fake_.Assign("op-sf", TransferPhase(prepare, *prepared, 1));
  auto done = fake_.Final("op-sf", v1::HOST_TASK_STATE_DONE);
  ASSERT_TRUE(done.has_value());
  EXPECT_GT(done->checksums_size(), 0);
  EXPECT_EQ(Buffers(3), 8);
  EXPECT_EQ(fake_.polls(), 1);
}

// An operation aborted after its prepare: the discard drops the prepared
// buffers and the operation is not run again; the long poll stays open (it
// is how the agent learns of every task, docs/agent.md "Told of tasks").
TEST_F(SessionTest, ADiscardDropsThePreparedBuffersAndThePollStaysOpen) {
  v1::HostTask prepare = Task("op-sf", 1, 3);
  prepare.set_prepare(true);
  fake_.Assign("op-sf", prepare);
  StartSession(/*heartbeat_ms=*/100);
  ASSERT_TRUE(fake_.Final("op-sf", v1::HOST_TASK_STATE_PREPARED).has_value());
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_waiting_ > 0; }));
  EXPECT_EQ(Buffers(3), 8);
  fake_.Discard(kJob, 3);
  const int hb = fake_.heartbeats();
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.heartbeats_ >= hb + 2; }));
  EXPECT_EQ(Buffers(3), 0);
  EXPECT_EQ(Buffers(1), 6);  // the old generation is untouched
  const int polls = fake_.polls();
  fake_.WakePolls();
  ASSERT_TRUE(fake_.WaitUntil([&] { return fake_.polls_ > polls && fake_.polls_waiting_ > 0; }));
  // And the operation is not run again.
  EXPECT_EQ(fake_.Finals("op-sf").size(), 1u);
}

// The host an agent registers lists the devices of the device API it uses
// (as `--device fake:2:BYTES` makes it), each with the bytes its device store
// may hold there: the per-device limit when set
// (--device-memory-limit-bytes), else the device's total memory.
TEST_F(SessionTest, AnAgentWithADeviceApiRegistersItsDevicesAndTheirMemory) {
  constexpr int64_t kDeviceBytes = int64_t{64} << 20;
  for (const int64_t limit : {int64_t{3} << 20, int64_t{0}}) {
    SCOPED_TRACE(limit);
    fake_.registered_.clear();  // no session is running
    auto api = MakeDeviceApi(absl::StrCat("fake:2:", kDeviceBytes));
    ASSERT_TRUE(api.ok()) << api.status();
    device_api_ = *std::move(api);
    DeviceBufferStore::Options options;
    options.memory_limit_bytes_per_device = limit;
    auto store = DeviceBufferStore::Open(device_api_.get(), options);
    ASSERT_TRUE(store.ok()) << store.status();
    device_store_ = *std::move(store);
    StartSession(/*heartbeat_ms=*/3600 * 1000, device_api_.get(), device_store_.get());

    const std::optional<v1::Host> host = fake_.Registered();
    ASSERT_TRUE(host.has_value());
    EXPECT_EQ(host->memory_limit_bytes(), int64_t{1} << 30);
    ASSERT_EQ(host->devices_size(), 2);
    for (int i = 0; i < 2; ++i) {
      const v1::Device& d = host->devices(i);
      EXPECT_EQ(d.index(), i);
      EXPECT_EQ(d.kind(), "fake");
      EXPECT_EQ(d.name(), absl::StrCat("fake:", i));
      EXPECT_EQ(d.memory_bytes(), limit > 0 ? limit : kDeviceBytes);
    }
    session_->Stop();
    session_.reset();
  }
}

// Without a device API, state stays in host memory: one "cpu" device that
// carries the host's memory limit.
TEST_F(SessionTest, AnAgentWithoutADeviceApiRegistersOneCpuDevice) {
  StartSession(/*heartbeat_ms=*/3600 * 1000);
  const std::optional<v1::Host> host = fake_.Registered();
  ASSERT_TRUE(host.has_value());
  ASSERT_EQ(host->devices_size(), 1);
  const v1::Device& d = host->devices(0);
  EXPECT_EQ(d.index(), 0);
  EXPECT_EQ(d.kind(), "cpu");
  EXPECT_EQ(d.name(), "cpu");
  EXPECT_EQ(d.memory_bytes(), int64_t{1} << 30);
}

}  // namespace
}  // namespace reshard::agent
