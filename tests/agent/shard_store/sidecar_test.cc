#include "agent/shard_store/sidecar.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

TEST(SidecarTest, RoundTripsRegeneratedItems) {
  Sidecar s;
  s.host_id = "h";
  s.key.job_id = "j";
  s.key.generation = 2;
  s.key.rank = 1;
  s.item_bytes = {8, 0, 64, 16};
  s.regenerated = {2, 3};
  std::string text = SerializeSidecar(s);
  EXPECT_THAT(text, HasSubstr("\nregenerated 2 3\n"));
  absl::StatusOr<Sidecar> back = ParseSidecar(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->regenerated, ElementsAre(2, 3));
  EXPECT_FALSE(back->sealed);

  s.sealed = true;
  s.checksums = {1, 2, 3, 4};
  back = ParseSidecar(SerializeSidecar(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->regenerated, ElementsAre(2, 3));
  EXPECT_THAT(back->checksums, ElementsAre(1, 2, 3, 4));

  // Nothing regenerated: no line at all, so the text is what agents without
  // the field wrote and read.
  s.regenerated.clear();
  EXPECT_THAT(SerializeSidecar(s), Not(HasSubstr("regenerated")));
}

// Sidecars written before the optional lines existed still load: without
// "published" (version 1) and without "regenerated".
TEST(SidecarTest, OlderSidecarsLoadWithNothingRegenerated) {
  const std::string v1 =
      "reshard-rank-buffer 1\nhost h\njob j\ngeneration 3\nrank 0\nsealed 1\nitems 2\n"
      "item 8 00000000000000ff\nitem 0 0000000000000000\nend\n";
  absl::StatusOr<Sidecar> back = ParseSidecar(v1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->published);
  EXPECT_TRUE(back->regenerated.empty());
  EXPECT_THAT(back->checksums, ElementsAre(0xff, 0));

  const std::string v2 =
      "reshard-rank-buffer 1\nhost h\njob j\ngeneration 3\nrank 0\nsealed 0\npublished 1\n"
      "items 1\nitem 8 -\nend\n";
  back = ParseSidecar(v2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->published);
  EXPECT_TRUE(back->regenerated.empty());
}

TEST(SidecarTest, MalformedRegeneratedItemsAreInvalidArgument) {
  Sidecar s;
  s.key.job_id = "j";
  s.item_bytes = {1, 2, 3};
  s.regenerated = {1};
  const std::string good = SerializeSidecar(s);
  ASSERT_TRUE(ParseSidecar(good).ok());
  for (const char* bad : {"regenerated 2 1", "regenerated 1 1", "regenerated -1", "regenerated x",
                          "regenerated ", "regenerated 3"}) {
    std::string text = good;
    text.replace(text.find("regenerated 1"), 13, bad);
    absl::StatusOr<Sidecar> back = ParseSidecar(text);
    EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(back.status().message(), HasSubstr("regenerated")) << bad;
  }
}

}  // namespace
}  // namespace reshard::agent
