// The fixture of the shard store's unit tests: a store in a fresh directory
// under /dev/shm, removed after each test.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "agent/shard_store/shard_store.h"
#include "gtest/gtest.h"

namespace reshard::agent {

class ShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/reshard-shard-store-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ShardStore::Options MakeOptions(int64_t limit = int64_t{1} << 30) const {
    ShardStore::Options o;
    o.shm_dir = dir_;
    o.host_id = "host-a";
    o.memory_limit_bytes = limit;
    return o;
  }

  std::unique_ptr<ShardStore> OpenStore(int64_t limit = int64_t{1} << 30) {
    absl::StatusOr<std::unique_ptr<ShardStore>> s = ShardStore::Open(MakeOptions(limit));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  int FilesInDir() const {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      (void)e;
      ++n;
    }
    return n;
  }

  static RankBufferKey Key(int rank, int64_t generation = 1, const std::string& job = "job-1") {
    RankBufferKey k;
    k.job_id = job;
    k.generation = generation;
    k.rank = rank;
    return k;
  }

  static void Fill(RankBuffer& b, int item, uint8_t seed) {
    uint8_t* p = b.item_data(item);
    for (int64_t i = 0; i < b.items()[item].bytes; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  }

  std::string dir_;
};

}  // namespace reshard::agent
