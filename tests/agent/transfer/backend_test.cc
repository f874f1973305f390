// The backend registry: what this build compiled, what loads, what the agent
// advertises (never "nccl": no execution path uses it yet).
#include "agent/transfer/backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "agent/transfer/transport.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;

// A transport that moves nothing: LoadedBackends only asks whether one is there.
class NullTransport : public Transport {
 public:
  std::string name() const override { return "ucx"; }
  std::string LocalAddress() const override { return ""; }
  absl::Status Connect(const std::string&, const std::string&) override { return absl::OkStatus(); }
  void Send(const std::string&, uint64_t, const void*, size_t, TransferDone) override {}
  void Receive(uint64_t, void*, size_t, TransferDone) override {}
  void CancelTags(uint64_t, uint64_t) override {}
  void Shutdown() override {}
};

std::vector<std::string> Names(const std::vector<BackendCapabilities>& backends) {
  std::vector<std::string> names;
  for (const BackendCapabilities& b : backends) names.push_back(b.name);
  return names;
}

bool Has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(BackendTest, CompiledBackendsFollowTheBuildConfiguration) {
#ifdef RESHARD_HAVE_CUDA
  EXPECT_THAT(CompiledBackends(), ElementsAre("local", "ucx", "nccl"));
#else
  EXPECT_THAT(CompiledBackends(), ElementsAre("local", "ucx"));
#endif
}

TEST(BackendTest, CapabilitiesSayWhatEachBackendMoves) {
  const BackendCapabilities local = LocalCopyCapabilities();
  EXPECT_EQ(local.name, "local");
  EXPECT_THAT(local.memory_kinds, ElementsAre(MemoryKind::kHost));
  EXPECT_TRUE(local.local);
  EXPECT_FALSE(local.remote);
  EXPECT_TRUE(local.used_by_executor);

  const BackendCapabilities ucx = UcxCapabilities();
  EXPECT_EQ(ucx.name, "ucx");
  EXPECT_THAT(ucx.memory_kinds, ElementsAre(MemoryKind::kHost));
  EXPECT_TRUE(ucx.remote);
  EXPECT_TRUE(ucx.notifications);
  EXPECT_TRUE(ucx.used_by_executor);

  const BackendCapabilities nccl = NcclCapabilities();
  EXPECT_EQ(nccl.name, "nccl");
  EXPECT_THAT(nccl.memory_kinds, ElementsAre(MemoryKind::kCuda));
  EXPECT_TRUE(nccl.local);
  EXPECT_FALSE(nccl.remote);
  EXPECT_FALSE(nccl.used_by_executor);
}

TEST(BackendTest, WithoutUcxOnlyTheLocalCopierLoads) {
  const std::vector<std::string> loaded = Names(LoadedBackends(nullptr));
  EXPECT_TRUE(Has(loaded, "local"));
  EXPECT_FALSE(Has(loaded, "ucx"));
  EXPECT_THAT(AdvertisedTransports(LoadedBackends(nullptr)), ElementsAre("local"));
}

TEST(BackendTest, LoadedBackendsAreCompiledOnes) {
  NullTransport ucx;
  const std::vector<std::string> compiled = CompiledBackends();
  const std::vector<std::string> loaded = Names(LoadedBackends(&ucx));
  EXPECT_TRUE(Has(loaded, "local"));
  EXPECT_TRUE(Has(loaded, "ucx"));
  for (const std::string& name : loaded) EXPECT_TRUE(Has(compiled, name)) << name;
#ifdef RESHARD_HAVE_CUDA
  EXPECT_EQ(Has(loaded, "nccl"), CudaDeviceCount() > 0);
#else
  EXPECT_FALSE(Has(loaded, "nccl"));
#endif
}

TEST(BackendTest, AgentAdvertisesLocalAndUcxOnly) {
  NullTransport ucx;
  EXPECT_THAT(AdvertisedTransports(LoadedBackends(&ucx)), ElementsAre("local", "ucx"));
}

TEST(BackendTest, BackendsNoExecutionPathUsesAreNotAdvertised) {
  // As on a GPU host of a CUDA build, where NCCL loads: still not advertised.
  EXPECT_THAT(
      AdvertisedTransports({LocalCopyCapabilities(), UcxCapabilities(), NcclCapabilities()}),
      ElementsAre("local", "ucx"));
}

}  // namespace
}  // namespace reshard::agent
