// The executor tests' fixture: two "hosts" in one process (two shard stores
// in temp dirs, two UCX transports over loopback) execute their slices of a
// real plan; every new byte is checked against the global tensors. Shared by
// executor_test.cc and transfer_integrity_test.cc.
#pragma once

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "agent/executor/executor.h"
#include "agent/transfer/local_copy.h"
#include "agent/transfer/ucx_transport.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "tests/agent/executor/vector_buffer.h"
#include "tests/support/jobs.h"

namespace reshard::agent::executor_testing {

namespace fs = std::filesystem;
using test_support::ExecutorPtc;
using test_support::MakeLayoutOnHosts;
using test_support::SetTpSplit;
using test_support::Tensor;

inline constexpr char kJob[] = "job-x";

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte j of global element g of item i (never all zero, so padding shows).
inline uint8_t Pattern(int item, int64_t g, int j) {
  return static_cast<uint8_t>(Mix((uint64_t(item) << 48) ^ (uint64_t(g) << 4) ^ j) | 1);
}

// Fills (or, with `expected`, computes) rank `rank`'s buffer under `layout`
// from the global tensors: pieces get the pattern, padding stays zero.
inline void RenderRank(const v1::Ptc& ptc, const v1::Layout& layout, int rank, int old_world,
                       RankBuffer* buf) {
  planner::HostTable hosts;
  const auto rl = planner::ResolvedLayout::Resolve(layout, ptc.num_layers(), &hosts);
  const planner::RankCoord c = rl.Coord(rank);
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const v1::TensorSpec& t = ptc.tensors(i);
    if (buf->items()[i].bytes == 0) continue;
    const int eb = planner::ElementBytes(t.dtype());
    const planner::CoordShard cs = planner::DeriveCoordShard(t, planner::CoordOfRank(t, rl, c));
    uint8_t* base = buf->item_data(i);
    std::memset(base, 0, buf->items()[i].bytes);
    const int nd = t.shape_size();
    for (const planner::Piece& p : cs.pieces) {
      std::vector<int64_t> idx(nd, 0);
      if (p.global.Empty()) continue;
      for (;;) {
        int64_t g = 0, l = p.local.offset;
        for (int d = 0; d < nd; ++d) {
          g = g * t.shape(d) + p.global.offset[d] + idx[d];
          l += idx[d] * p.local.strides[d];
        }
        for (int j = 0; j < eb; ++j) base[l * eb + j] = Pattern(i, g, j);
        int d = nd - 1;
        while (d >= 0 && ++idx[d] == p.global.size[d]) idx[d--] = 0;
        if (d < 0) break;
      }
    }
  }
  for (int b = 0; b < ptc.blobs_size(); ++b) {
    const int item = ptc.tensors_size() + b;
    const int64_t who = ptc.blobs(b).scope() == v1::BLOB_PER_RANK ? rank % old_world : -1;
    for (int64_t j = 0; j < ptc.blobs(b).size_bytes(); ++j) {
      buf->item_data(item)[j] = Pattern(item, who, static_cast<int>(j));
    }
  }
}

inline v1::HostTask Slice(const v1::HostTask& whole, const std::string& host,
                          const std::map<std::string, std::string>& ucx_addresses) {
  v1::HostTask t = whole;
  const auto old_slots = planner::ExpandPlacement(whole.plan().source_layout().placement());
  const auto new_slots = planner::ExpandPlacement(whole.plan().target_layout().placement());
  t.mutable_plan()->clear_steps();
  t.mutable_plan()->clear_zero_fills();
  for (const auto& s : whole.plan().steps()) {
    if (old_slots[s.src_rank()].host() == host || new_slots[s.dsts(0).rank()].host() == host) {
      *t.mutable_plan()->add_steps() = s;
    }
  }
  for (const auto& f : whole.plan().zero_fills()) {
    if (new_slots[f.rank()].host() == host) *t.mutable_plan()->add_zero_fills() = f;
  }
  for (const auto& [id, addr] : ucx_addresses) {
    if (id == host) continue;
    auto* p = t.add_peers();
    p->set_host_id(id);
    p->set_ucx_address(addr);
  }
  return t;
}

// What the coordinator does at a stop-free cut-over (docs/coordinator.md,
// "Agents prepare"), for tests that play it: `prepare` made into its
// prepared phase from generation `from`, without zero fills and without the
// steps `skip` returns true for.
inline v1::HostTask TransferPhaseOf(const v1::HostTask& prepare, int64_t from,
                                    const std::function<bool(const v1::CopyStep&)>& skip) {
  v1::HostTask t = prepare;
  t.set_prepare(false);
  t.set_prepared(true);
  t.set_from_generation(from);
  t.mutable_plan()->clear_steps();
  t.mutable_plan()->clear_zero_fills();
  for (const v1::CopyStep& s : prepare.plan().steps()) {
    if (!skip(s)) *t.mutable_plan()->add_steps() = s;
  }
  return t;
}

// Whether step `s` reads a shard that is, in generation `from` of `store`,
// what the prepare reported it read: same checksum and bytes. `reported`
// maps (rank, item) to the prepare's source checksums.
inline bool SourceUnchanged(ShardStore& store, int64_t from, const v1::CopyStep& s,
                            const std::map<std::pair<int, int>, v1::ShardChecksum>& reported) {
  auto it = reported.find({s.src_rank(), s.item()});
  EXPECT_NE(it, reported.end()) << "no source checksum for step " << s.index();
  auto now = store.Get({kJob, from, s.src_rank()});
  EXPECT_TRUE(now.ok()) << now.status();
  return it != reported.end() && now.ok() &&
         it->second.checksum() == (*now)->checksums()[s.item()] &&
         it->second.bytes() == (*now)->items()[s.item()].bytes;
}

// What a run reports it waits on (Execute's `waiting`), for a test to wait
// for a condition of it with a deadline rather than sleep. Outlives the run.
class WaitingOn {
 public:
  // The `waiting` callback to hand to Execute.
  std::function<void(const std::string&)> Callback() {
    return [this](const std::string& what) {
      std::lock_guard<std::mutex> l(mu_);
      if (!what.empty()) last_ = what;
      cv_.notify_all();
    };
  }
  // Called once the run returned: WaitFor stops waiting.
  void Finished() {
    std::lock_guard<std::mutex> l(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  // Waits up to `timeout` until the last non-empty report satisfies `ok` (or
  // the run finished); that report ("" when none came).
  std::string WaitFor(const std::function<bool(const std::string&)>& ok,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return finished_ || ok(last_); });
    return last_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string last_;
  bool finished_ = false;
};

struct Host {
  std::string id;
  fs::path dir;
  std::unique_ptr<ShardStore> store;
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<Transport> wrapper;  // what the executor uses, when set
  std::unique_ptr<TaskExecutor> executor;
};

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    ptc_ = ExecutorPtc(64);
    from_ = MakeLayoutOnHosts(2, 1, 3, 3);  // h0: ranks 0-2, h1: ranks 3-5
    to_ = MakeLayoutOnHosts(4, 1, 2, 4);    // h0: ranks 0-3, h1: ranks 4-7
  }
  void TearDown() override {
    for (auto& h : hosts_) {
      if (h.transport) h.transport->Shutdown();
      h.executor.reset();
      h.wrapper.reset();
      h.store.reset();
      std::error_code ec;
      fs::remove_all(h.dir, ec);
    }
  }

  void MakeHosts(int64_t memory_limit = int64_t{1} << 30,
                 int64_t chunk_bytes = TaskExecutor::Options().chunk_bytes) {
    for (int i = 0; i < 2; ++i) {
      Host h;
      h.id = "h" + std::to_string(i);
      h.dir = fs::temp_directory_path() /
              ("reshard-exec-test-" + std::to_string(getpid()) + "-" + h.id);
      fs::create_directories(h.dir);
      ShardStore::Options so;
      so.shm_dir = h.dir.string();
      so.host_id = h.id;
      so.memory_limit_bytes = memory_limit;
      auto store = ShardStore::Open(so);
      ASSERT_TRUE(store.ok()) << store.status();
      h.store = std::move(*store);
      UcxOptions uo{"lo", "tcp,self"};
      auto t = MakeUcxTransportImpl(uo);
      ASSERT_TRUE(t.ok()) << t.status();
      h.transport = std::move(*t);
      TaskExecutor::Options eo;
      eo.copy_threads = 2;
      eo.max_inflight_bytes = 64 << 10;  // several windows' worth of traffic
      eo.chunk_bytes = chunk_bytes;
      eo.local_chunk_bytes = chunk_bytes;
      eo.proof_timeout_ms = proof_timeout_ms_;
      eo.seal_timeout_ms = seal_timeout_ms_;
      Transport* used = h.transport.get();
      if (wrap_transport_ && (h.wrapper = wrap_transport_(h.id, used))) used = h.wrapper.get();
      h.executor = std::make_unique<TaskExecutor>(h.store.get(), used, eo);
      hosts_.push_back(std::move(h));
    }
  }

  // Creates and fills the old generation's buffers (skipping `skip_rank`).
  void FillOld(int skip_rank = -1) {
    const auto slots = planner::ExpandPlacement(from_.placement());
    for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
      if (r == skip_rank) continue;
      Host& h = hosts_[slots[r].host() == "h0" ? 0 : 1];
      auto bufs = h.store->CreateAll({RankBufferKey{kJob, 1, r}}, {RankItemBytes(ptc_, from_, r)});
      ASSERT_TRUE(bufs.ok()) << bufs.status();
      RenderRank(ptc_, from_, r, 6, (*bufs)[0].get());
      ASSERT_TRUE(h.store->Seal({kJob, 1, r}, {}).ok());
    }
  }

  v1::HostTask WholeTask() {
    absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(ptc_, from_, to_, {});
    EXPECT_TRUE(plan.ok()) << plan.status();
    v1::HostTask t;
    t.set_operation_id("op-1");
    t.set_job_id(kJob);
    t.set_from_generation(1);
    t.set_to_generation(2);
    *t.mutable_ptc() = ptc_;
    *t.mutable_plan() = *plan;
    return t;
  }

  std::map<std::string, std::string> Addresses() {
    std::map<std::string, std::string> a;
    for (auto& h : hosts_) a[h.id] = h.transport->LocalAddress();
    return a;
  }

  using Results = std::vector<absl::StatusOr<std::vector<v1::ShardChecksum>>>;

  // Runs every host's slice of `whole` at once and returns each host's
  // result, in host order; h0's progress goes to `progress0`. With
  // `abort_on_failure` a failing host cancels the others, as the
  // coordinator's abort would.
  Results RunHosts(const v1::HostTask& whole, bool abort_on_failure = true,
                   const std::function<void(int64_t, int64_t)>& progress0 = nullptr) {
    const auto addrs = Addresses();
    std::atomic<bool> aborted{false};
    std::vector<std::future<absl::StatusOr<std::vector<v1::ShardChecksum>>>> runs;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      Host& h = hosts_[i];
      const v1::HostTask task = Slice(whole, h.id, addrs);
      auto progress = i == 0 ? progress0 : nullptr;
      runs.push_back(
          std::async(std::launch::async, [&h, task, progress, &aborted, abort_on_failure] {
            auto r = h.executor->Execute(h.id, task, progress, [&] { return aborted.load(); });
            if (!r.ok() && abort_on_failure) aborted = true;
            return r;
          }));
    }
    Results out;
    for (auto& r : runs) out.push_back(r.get());
    return out;
  }

  // Runs `task` on `h` alone, so that it waits on its peer; checks it is
  // still running once it reports what it waits on (within 30 s), cancels
  // it, and returns how it ended (it must end within 30 s).
  absl::Status CancelWhileWaiting(Host& h, const v1::HostTask& task) {
    WaitingOn waiting_on;
    std::atomic<bool> cancel{false};
    auto run = std::async(std::launch::async, [&] {
      auto r = h.executor->Execute(
          h.id, task, nullptr, [&] { return cancel.load(); }, waiting_on.Callback());
      waiting_on.Finished();
      return r;
    });
    const std::string what = waiting_on.WaitFor([](const std::string& w) { return !w.empty(); });
    EXPECT_NE(what, "") << "the run never said what it waits on";
    EXPECT_EQ(run.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << what;
    cancel = true;
    EXPECT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return run.get().status();
  }

  int NewBuffers(const Host& h) {
    int n = 0;
    for (const auto& k : h.store->List()) n += k.generation == 2;
    return n;
  }

  // Runs both hosts' slices of `whole` at once and checks every new rank's
  // bytes against the global tensors, and its checksums.
  void ExpectResharded(const v1::HostTask& whole, int old_world) {
    const auto addrs = Addresses();
    std::vector<std::future<absl::StatusOr<std::vector<v1::ShardChecksum>>>> runs;
    std::atomic<int> reports{0};
    for (auto& h : hosts_) {
      v1::HostTask task = Slice(whole, h.id, addrs);
      runs.push_back(std::async(std::launch::async, [&h, task, &reports] {
        return h.executor->Execute(
            h.id, task, [&](int64_t done, int64_t total) { reports += done <= total; },
            [] { return false; });
      }));
    }
    const auto new_slots = planner::ExpandPlacement(to_.placement());
    for (size_t i = 0; i < hosts_.size(); ++i) {
      auto result = runs[i].get();
      ASSERT_TRUE(result.ok()) << hosts_[i].id << ": " << result.status();
      // Every new rank of the host, byte for byte, and its checksums.
      std::map<std::pair<int, int>, v1::ShardChecksum> sums;
      for (const auto& c : *result) sums[{c.rank(), c.item()}] = c;
      for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
        if (new_slots[r].host() != hosts_[i].id) continue;
        auto got = hosts_[i].store->Get({kJob, 2, r});
        ASSERT_TRUE(got.ok()) << got.status();
        VectorBuffer want((*got)->items(), (*got)->size());
        RenderRank(ptc_, to_, r, old_world, &want);
        for (size_t item = 0; item < want.items().size(); ++item) {
          const int64_t n = want.items()[item].bytes;
          ASSERT_EQ(0, std::memcmp(want.item_data(item), (*got)->item_data(item), n))
              << "rank " << r << " item " << item;
          if (n == 0) continue;
          auto it = sums.find({r, static_cast<int>(item)});
          ASSERT_NE(it, sums.end()) << "no checksum for rank " << r << " item " << item;
          EXPECT_EQ(it->second.checksum(), Checksum(want.item_data(item), n));
          EXPECT_EQ(it->second.bytes(), n);
        }
        EXPECT_TRUE((*got)->sealed());
      }
    }
    EXPECT_GT(reports.load(), 0);
  }

  v1::Ptc ptc_;
  v1::Layout from_, to_;
  std::vector<Host> hosts_;
  int64_t proof_timeout_ms_ = 60000;
  int64_t seal_timeout_ms_ = 60000;
  // If set, the transport each host's executor uses: a wrapper of the host's
  // own (a fault in flight); null keeps the host's own.
  std::function<std::unique_ptr<Transport>(const std::string& host, Transport* own)>
      wrap_transport_;
};

}  // namespace reshard::agent::executor_testing
