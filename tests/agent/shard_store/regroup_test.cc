// A store opened again with another group and mode (an agent restarted with
// another --worker-group / --shard-file-mode) gives the files an earlier
// store left the configured ones: sealed files 0440, published unsealed
// files the file mode; the group in both cases, also back to the agent's
// own group when none is configured any more (access taken away).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

std::pair<mode_t, gid_t> ModeAndGroup(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return {st.st_mode & 07777, st.st_gid};
}

class RegroupTest : public ShardStoreTest {};

TEST_F(RegroupTest, AReopenedStoreGivesOlderFilesTheConfiguredGroupAndMode) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a file another group needs root";
  constexpr gid_t kOld = 4242, kNew = 4343;
  std::string sealed, published;
  {
    ShardStore::Options o = MakeOptions();
    o.file_gid = kOld;
    o.file_mode = 0666;  // a careless earlier configuration
    auto store = ShardStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    auto a = (*store)->CreateAll({Key(0)}, {{4096}});
    ASSERT_TRUE(a.ok()) << a.status();
    Fill(*(*a)[0], 0, 7);
    ASSERT_TRUE((*store)->Seal(Key(0), {}).ok());
    sealed = (*a)[0]->path();
    // A worker's buffer, published but not sealed when the agent stopped.
    auto w = (*store)->CreateAll({Key(1)}, {{4096}}, ShardStore::Backing::kPrefaulted,
                                 ShardStore::Writer::kWorker);
    ASSERT_TRUE(w.ok()) << w.status();
    published = (*w)[0]->path();
  }
  // What another agent, or an operator, may also have left.
  ASSERT_EQ(::chmod(sealed.c_str(), 0444), 0);
  ASSERT_EQ(ModeAndGroup(sealed), std::make_pair(mode_t{0444}, kOld));
  ASSERT_EQ(ModeAndGroup(published), std::make_pair(mode_t{0666}, kOld));

  ShardStore::Options o = MakeOptions();
  o.file_gid = kNew;
  o.file_mode = 0660;
  auto store = ShardStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(ModeAndGroup(sealed), std::make_pair(mode_t{0440}, kNew));
  EXPECT_EQ(ModeAndGroup(published), std::make_pair(mode_t{0660}, kNew));
  // Both are still the store's, bytes and seal included.
  auto b = (*store)->Get(Key(0));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->sealed());
  EXPECT_EQ((*b)->data()[100], static_cast<uint8_t>(7 + 100 * 7));
  EXPECT_TRUE((*store)->Get(Key(1)).ok());
  store->reset();

  // No group configured any more: back to the agent's own.
  auto own = ShardStore::Open(MakeOptions());
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(ModeAndGroup(sealed), std::make_pair(mode_t{0440}, ::getegid()));
  EXPECT_EQ(ModeAndGroup(published), std::make_pair(mode_t{0660}, ::getegid()));
}

}  // namespace
}  // namespace reshard::agent
