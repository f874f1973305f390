#include "agent/shard_store/sidecar.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;

TEST(SidecarTest, RoundTripsSealedAndUnsealed) {
  Sidecar s;
  s.host_id = "host a\n";
  s.key.job_id = "job \"x\"";
  s.key.generation = 12;
  s.key.rank = 3;
  s.item_bytes = {0, 5, int64_t{1} << 40};
  absl::StatusOr<Sidecar> back = ParseSidecar(SerializeSidecar(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host_id, s.host_id);
  EXPECT_EQ(back->key, s.key);
  EXPECT_EQ(back->item_bytes, s.item_bytes);
  EXPECT_FALSE(back->sealed);
  EXPECT_TRUE(back->checksums.empty());

  s.sealed = true;
  s.checksums = {0, 0xffffffffffffffffull, 0x0123456789abcdefull};
  back = ParseSidecar(SerializeSidecar(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->sealed);
  EXPECT_THAT(back->checksums, ElementsAre(0, 0xffffffffffffffffull, 0x0123456789abcdefull));
}

TEST(SidecarTest, MalformedTextIsInvalidArgument) {
  Sidecar s;
  s.key.job_id = "j";
  s.item_bytes = {1, 2};
  const std::string good = SerializeSidecar(s);
  EXPECT_EQ(ParseSidecar("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSidecar("garbage").status().code(), absl::StatusCode::kInvalidArgument);
  // Truncated: no "end" line.
  EXPECT_EQ(ParseSidecar(good.substr(0, good.size() - 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string negative = good;
  negative.replace(negative.find("item 2"), 6, "item -2");
  EXPECT_EQ(ParseSidecar(negative).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::agent
