// The CUDA runtime and NCCL are loaded at run time (built only with
// RESHARD_CUDA): in CI they come from the wheels in the project's venv and
// load on a machine with no GPU driver; with a device they also see it.
#include "agent/device/cuda_libraries.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "agent/transfer/backend.h"
#include "agent/transfer/nccl_comm.h"

namespace reshard::agent {
namespace {

TEST(CudaLibrariesTest, RuntimeAndNcclLoadWithoutADevice) {
  const CudaLibraryState& s = CudaLibraries::Get().state();
  ASSERT_TRUE(s.cudart_loaded) << s.error << " (searched " << CudaLibraries::Get().Describe()
                               << ")";
  ASSERT_TRUE(s.nccl_loaded) << s.error;
  EXPECT_EQ(s.error, "");
  EXPECT_GE(s.runtime_version, 12000) << s.cudart_path;  // cudaRuntimeGetVersion
  EXPECT_GE(s.nccl_version, 21800) << s.nccl_path;       // ncclGetVersion, NCCL >= 2.18
  EXPECT_NE(s.cudart_path, "");
  EXPECT_NE(s.nccl_path, "");
}

TEST(CudaLibrariesTest, DeviceCountAgreesWithTheRegistry) {
  // backend.cc counts devices through its own dlopen; both see the same host.
  EXPECT_EQ(CudaLibraries::Get().state().device_count, CudaDeviceCount());
  // Without a device NCCL is loaded but not usable, and says so.
  if (CudaLibraries::Get().state().device_count == 0) {
    std::string why;
    EXPECT_EQ(MakeNcclCommFactory(&why), nullptr);
    EXPECT_EQ(why.rfind("NCCL not usable: no CUDA device (cudart ", 0), 0u) << why;
  }
}

TEST(CudaLibrariesTest, TheBuildCompiledTheNcclBackend) {
  const std::vector<std::string> compiled = CompiledBackends();
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), "nccl"), compiled.end());
}

TEST(CudaLibrariesTest, DescribeNamesBothVersions) {
  const CudaLibraryState& s = CudaLibraries::Get().state();
  const std::string d = CudaLibraries::Get().Describe();
  EXPECT_EQ(d.rfind("cudart " + std::to_string(s.runtime_version / 1000) + ".", 0), 0u) << d;
  EXPECT_NE(d.find("nccl " + std::to_string(s.nccl_version / 10000) + "."), std::string::npos)
      << d;
}

}  // namespace
}  // namespace reshard::agent
