// The address an agent advertises over UCX (ucx_address.h).
#include "agent/transfer/ucx_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

namespace reshard::agent {
namespace {

TEST(UcxAddressTest, LoopbackListensOnItsAddress) {
  const std::optional<in_addr> ip = ListenIpFor("lo");
  ASSERT_TRUE(ip.has_value());
  EXPECT_EQ(ip->s_addr, htonl(INADDR_LOOPBACK));
  // The first entry naming an interface counts; device:port entries name none.
  const std::optional<in_addr> listed = ListenIpFor("mlx5_0:1,lo");
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(listed->s_addr, htonl(INADDR_LOOPBACK));
}

TEST(UcxAddressTest, DevicesWithoutAnInterfaceAddressListenNowhere) {
  EXPECT_FALSE(ListenIpFor("mlx5_0:1").has_value());
  EXPECT_FALSE(ListenIpFor("no-such-interface0").has_value());
}

TEST(UcxAddressTest, FormatAndParseRoundTrip) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(41255);
  ASSERT_EQ(inet_pton(AF_INET, "10.1.2.3", &at.sin_addr), 1);
  const std::string a = FormatListenerAddress(at, 0xd4e219477d16f560ULL);
  EXPECT_EQ(a, "ucx-listener:10.1.2.3:41255/d4e219477d16f560");
  EXPECT_TRUE(IsListenerAddress(a));
  absl::StatusOr<sockaddr_in> back = ParseListenerAddress(a);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sin_family, AF_INET);
  EXPECT_EQ(back->sin_port, at.sin_port);
  EXPECT_EQ(back->sin_addr.s_addr, at.sin_addr.s_addr);
  // Two incarnations on the same port are two addresses.
  EXPECT_NE(a, FormatListenerAddress(at, 1));
}

TEST(UcxAddressTest, WorkerAddressesAreNotListenerAddresses) {
  EXPECT_FALSE(IsListenerAddress(std::string("\x00\x01\xfe\xff", 4)));
  EXPECT_FALSE(IsListenerAddress(""));
}

TEST(UcxAddressTest, MalformedListenerAddressesNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"ucx-listener:10.1.2.3:41255", "no incarnation"},
      {"ucx-listener:10.1.2.3/ab", "no port"},
      {"ucx-listener:10.1.2.3:0/ab", "bad port"},
      {"ucx-listener:10.1.2.3:70000/ab", "bad port"},
      {"ucx-listener:10.1.2:41255/ab", "bad IPv4 address"},
      {"tcp:10.1.2.3:41255/ab", "no prefix"},
  };
  for (const auto& [address, why] : cases) {
    absl::StatusOr<sockaddr_in> parsed = ParseListenerAddress(address);
    ASSERT_FALSE(parsed.ok()) << address;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos) << parsed.status();
    EXPECT_NE(parsed.status().message().find(address), std::string::npos) << parsed.status();
  }
}

}  // namespace
}  // namespace reshard::agent
