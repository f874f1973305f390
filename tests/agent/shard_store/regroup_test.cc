// A store opened again on files an earlier agent left with a worker group's
// access (before issue 19: group files 0660, sealed 0440) makes them the
// agent's alone: sealed 0400, published unsealed 0600, the agent's own group
// (the old group's access taken away).
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

TEST_F(RegroupTest, AReopenedStoreMakesOlderFilesTheAgentsAlone) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a file another group needs root";
  constexpr gid_t kOld = 4242;
  std::string sealed, published;
  {
    auto store = ShardStore::Open(MakeOptions());
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
  // What an agent from before issue 19 left (a worker group's files), or an
  // operator.
  ASSERT_EQ(::chown(sealed.c_str(), static_cast<uid_t>(-1), kOld), 0);
  ASSERT_EQ(::chown(published.c_str(), static_cast<uid_t>(-1), kOld), 0);
  ASSERT_EQ(::chmod(sealed.c_str(), 0440), 0);
  ASSERT_EQ(::chmod(published.c_str(), 0666), 0);

  auto store = ShardStore::Open(MakeOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(ModeAndGroup(sealed), std::make_pair(mode_t{0400}, ::getegid()));
  EXPECT_EQ(ModeAndGroup(published), std::make_pair(mode_t{0600}, ::getegid()));
  // Both are still the store's, bytes and seal included.
  auto b = (*store)->Get(Key(0));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->sealed());
  EXPECT_EQ((*b)->data()[100], static_cast<uint8_t>(7 + 100 * 7));
  EXPECT_TRUE((*store)->Get(Key(1)).ok());
}

}  // namespace
}  // namespace reshard::agent
