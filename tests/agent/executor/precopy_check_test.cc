// The pure part of the pre-copy check (precopy_check.h): the checksum of a
// strided region, which regions a prepare records, and which of them the
// transfer phase reads back, with the DATA_LOSS it answers when one byte of
// a region it skips changed. Records are pruned with their buffers.
#include "agent/executor/precopy_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "agent/transfer/local_copy.h"
#include "tests/agent/executor/vector_buffer.h"

namespace reshard::agent {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using executor_testing::VectorBuffer;

// An in-memory rank buffer of items of `item_bytes`, every byte known.
std::unique_ptr<VectorBuffer> MemoryBuffer(const std::vector<int64_t>& item_bytes) {
  int64_t total = 0;
  const std::vector<ItemSlot> items = LayoutItems(item_bytes, &total);
  auto buf = std::make_unique<VectorBuffer>(items, total);
  for (int64_t i = 0; i < total; ++i) buf->data()[i] = static_cast<uint8_t>(i * 131 + 7);
  return buf;
}

PrecopyRegion Region(int64_t offset, std::vector<int64_t> strides, std::vector<int64_t> shape,
                     int element_bytes) {
  PrecopyRegion r;
  r.offset = offset;
  r.strides = std::move(strides);
  r.shape = std::move(shape);
  r.element_bytes = element_bytes;
  return r;
}

// The checksum of a region is XXH3 of its bytes packed in row-major order,
// whatever its strides: contiguous, rows of a box, a column (inner stride
// not 1), a scalar, empty.
TEST(PrecopyCheckTest, RegionChecksumIsTheChecksumOfThePackedRegion) {
  const auto b = MemoryBuffer({4 * 6 * 5 * 2});  // one item: a 4x6x5 array of 2-byte elements
  LocalCopier copier(1);
  const std::vector<PrecopyRegion> regions = {
      Region(0, {30, 5, 1}, {4, 6, 5}, 2),   // the whole item
      Region(37, {30, 5, 1}, {2, 3, 3}, 2),  // a box: runs of 3 elements
      Region(4, {5, 1}, {6, 1}, 2),          // a column of one element per row
      Region(3, {1, 5}, {5, 6}, 2),          // transposed: inner stride 5
      Region(11, {}, {}, 2),                 // one element
      Region(0, {30, 5, 1}, {4, 0, 5}, 2),   // nothing
  };
  for (const PrecopyRegion& r : regions) {
    std::vector<uint8_t> packed(static_cast<size_t>(r.bytes()));
    copier.Pack(StridedView{b->item_data(0), r.offset, r.strides}, r.shape, r.element_bytes,
                packed.data());
    EXPECT_EQ(RegionChecksum(b->item_data(0), r), Checksum(packed.data(), packed.size()))
        << "offset " << r.offset << " shape " << r.shape.size();
  }
}

class VerifyPrecopyTest : public ::testing::Test {
 protected:
  // A host with new ranks 4 and 5: step 7 copies a 2x3 box of item 0 into
  // both (a local copy), step 9 receives 8 elements of item 1 into rank 4,
  // and a zero fill covers the end of item 1 of rank 4.
  void SetUp() override {
    auto* w = plan_.add_items();
    w->set_name("layers.0.w");
    w->set_element_bytes(4);
    auto* o = plan_.add_items();
    o->set_name("optimizer.o");
    o->set_element_bytes(1);
    v1::CopyStep local;
    local.set_index(7);
    local.set_item(0);
    local.set_src_rank(1);
    local.add_shape(2);
    local.add_shape(3);
    for (int rank : {4, 5}) {
      auto* d = local.add_dsts();
      d->set_rank(rank);
      d->mutable_region()->set_offset(rank == 4 ? 5 : 0);
      d->mutable_region()->add_strides(4);
      d->mutable_region()->add_strides(1);
    }
    v1::CopyStep received;
    received.set_index(9);
    received.set_item(1);
    received.set_src_rank(3);
    received.add_shape(8);
    auto* d = received.add_dsts();
    d->set_rank(4);
    d->mutable_region()->set_offset(0);
    d->mutable_region()->add_strides(1);
    v1::ZeroFill fill;
    fill.set_item(1);
    fill.set_rank(4);
    fill.set_offset(8);
    fill.set_count(4);
    *plan_.add_steps() = local;
    *plan_.add_steps() = received;
    *plan_.add_zero_fills() = fill;
    hs_.new_ranks = {4, 5};
    hs_.locals.push_back(&plan_.steps(0));
    hs_.remotes.push_back(RemoteStep{&plan_.steps(1), /*is_send=*/false, "h1"});
    hs_.fills.push_back(&plan_.zero_fills(0));
    // Item 0: 4x4 floats; item 1: 12 bytes.
    for (int i = 0; i < 2; ++i) {
      bufs_.push_back(MemoryBuffer({64, 12}));
    }
    std::memset(bufs_[0]->item_data(1) + 8, 0, 4);  // the zero fill's bytes
    regions_ = PrecopyRegions(plan_, hs_);
    ChecksumRegions(buffer_, 2, &regions_);
  }

  absl::Status Verify(const std::set<int64_t>& rewritten) {
    return VerifyPrecopy(regions_, rewritten, buffer_, plan_, "job-x", 3, 2);
  }

  v1::TransferPlan plan_;
  HostSteps hs_;
  std::vector<std::unique_ptr<VectorBuffer>> bufs_;
  BufferOfRank buffer_ = [this](int rank) -> RankBuffer* { return bufs_[rank - 4].get(); };
  std::vector<PrecopyRegion> regions_;
};

TEST_F(VerifyPrecopyTest, RecordsEveryDestinationAndFill) {
  ASSERT_EQ(regions_.size(), 4u);
  EXPECT_EQ(regions_[0].step, 7);
  EXPECT_EQ(regions_[0].rank, 4);
  EXPECT_EQ(regions_[1].rank, 5);
  EXPECT_EQ(regions_[0].bytes(), 24);
  EXPECT_EQ(regions_[2].step, 9);
  EXPECT_THAT(regions_[2].what, HasSubstr("received from host \"h1\""));
  EXPECT_EQ(regions_[3].step, -1);
  EXPECT_EQ(regions_[3].bytes(), 4);
  EXPECT_TRUE(Verify({}).ok());
}

// One byte flipped inside the second row of step 7's box in rank 5: a
// transfer phase that skips step 7 refuses with DATA_LOSS naming job,
// generation, rank, item and step; one that writes step 7 again does not
// read it back.
TEST_F(VerifyPrecopyTest, AFlippedByteOfASkippedStepIsDataLoss) {
  bufs_[1]->item_data(0)[(4 + 2) * 4 + 1] ^= 0x01;
  absl::Status s = Verify({9});
  ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("job \"job-x\" generation 3 rank 5 item 0 (\"layers.0.w\")"),
                    HasSubstr("24 bytes of step 7"), HasSubstr("local copy")));
  EXPECT_TRUE(Verify({7, 9}).ok());
}

// A byte outside every region (between the box's rows) is no step's: not
// read. A byte of the zero fill is always read back (fills never move again).
TEST_F(VerifyPrecopyTest, ZeroFillsAreAlwaysCheckedGapsNever) {
  bufs_[0]->item_data(0)[(5 + 3) * 4] ^= 0x80;  // element 8: right of the first row
  EXPECT_TRUE(Verify({}).ok());
  bufs_[0]->item_data(1)[10] = 0xff;
  absl::Status s = Verify({7, 9});
  ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("rank 4 item 1 (\"optimizer.o\")"), HasSubstr("zero fill")));
}

// A record goes when its buffers do (or once they are sealed).
TEST(PrecopyRecordsTest, PrunedWithTheirBuffers) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("reshard-precopy-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    ShardStore::Options so;
    so.shm_dir = dir.string();
    so.host_id = "h0";
    so.memory_limit_bytes = 1 << 20;
    auto store = ShardStore::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateAll({RankBufferKey{"j", 3, 0}}, {std::vector<int64_t>{64}}).ok());
    ASSERT_TRUE((*store)->CreateAll({RankBufferKey{"j", 4, 0}}, {std::vector<int64_t>{64}}).ok());
    PrecopyRecords records;
    records.Put("h0", "op-a", PrecopyRecords::Record{"j", 3, {0}, {}});
    records.Put("h0", "op-b", PrecopyRecords::Record{"j", 4, {0}, {}});
    records.Put("h0", "op-c", PrecopyRecords::Record{"j", 5, {0}, {}});  // never made
    records.Prune(**store);
    EXPECT_EQ(records.size(), 2u);
    EXPECT_EQ(records.Find("h0", "op-c"), nullptr);
    ASSERT_NE(records.Find("h0", "op-a"), nullptr);
    EXPECT_EQ(records.Find("h1", "op-a"), nullptr);
    (*store)->Drop({"j", 3, 0});
    ASSERT_TRUE((*store)->Seal({"j", 4, 0}, {}).ok());
    records.Prune(**store);
    EXPECT_EQ(records.size(), 0u);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace reshard::agent
