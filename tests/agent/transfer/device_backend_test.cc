// The backend seam with a device API loaded (backend.h): it says what the
// device moves (host and CUDA memory, within this host) and is still not
// advertised, since no execution path uses it yet.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/device/fake_device.h"
#include "agent/transfer/backend.h"
#include "agent/transfer/fake_comm.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;

TEST(DeviceBackendTest, TheFakeDeviceStatesItsCapabilities) {
  FakeDeviceApi fake(FakeDeviceApi::Options{3, 4096});
  const BackendCapabilities c = DeviceBackendCapabilities(fake);
  EXPECT_EQ(c.name, "fake");
  EXPECT_THAT(c.memory_kinds, ElementsAre(MemoryKind::kHost, MemoryKind::kCuda));
  EXPECT_TRUE(c.local);
  EXPECT_FALSE(c.remote);
  EXPECT_FALSE(c.notifications);
  EXPECT_TRUE(c.used_by_executor);  // the executor's device routes
  EXPECT_EQ(c.devices, 3);
  EXPECT_TRUE(c.ipc);
  EXPECT_TRUE(c.peer_copy);
}

TEST(DeviceBackendTest, ALoadedDeviceIsListedAndAdvertised) {
  FakeDeviceApi fake(FakeDeviceApi::Options{});
  // (--device-ipc none: the IPC entry is device_ipc_steps_test.cc's)
  const std::vector<BackendCapabilities> loaded = LoadedBackends(nullptr, &fake, nullptr, false);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].name, "local");
  EXPECT_EQ(loaded[1].name, "fake");
  EXPECT_EQ(loaded[1].devices, 1);
  EXPECT_THAT(AdvertisedTransports(loaded), ElementsAre("local", "fake"));
  // Without a device API nothing device-side is listed.
  for (const BackendCapabilities& c : LoadedBackends(nullptr)) EXPECT_EQ(c.devices, 0) << c.name;
}

// A device communicator backend (device_comm.h) moves CUDA memory between
// hosts for the executor's cross-host device steps: advertised under the
// name every peer's route looks for ("fake-nccl" for the fake, so that it
// never meets a real NCCL), and only beside a device API.
TEST(DeviceBackendTest, ACommunicatorBackendIsAdvertisedBesideItsDevice) {
  FakeDeviceApi fake(FakeDeviceApi::Options{});
  FakeCommFactory comm(&fake);
  const BackendCapabilities c = DeviceCommBackendCapabilities(comm);
  EXPECT_EQ(c.name, "fake-nccl");
  EXPECT_THAT(c.memory_kinds, ElementsAre(MemoryKind::kCuda));
  EXPECT_TRUE(c.remote);
  EXPECT_FALSE(c.local);
  EXPECT_FALSE(c.notifications);
  EXPECT_TRUE(c.used_by_executor);
  EXPECT_THAT(AdvertisedTransports(LoadedBackends(nullptr, &fake, &comm, /*device_ipc=*/false)),
              ElementsAre("local", "fake", "fake-nccl"));
  EXPECT_THAT(AdvertisedTransports(LoadedBackends(nullptr, nullptr, &comm)), ElementsAre("local"));
}

}  // namespace
}  // namespace reshard::agent
