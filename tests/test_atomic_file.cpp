// core/atomic_file.h's publish_dir_atomic, the one way a new directory is published (export,
// export --format hf, import): the files appear under the final name only whole, fsynced, with the
// parent directory fsynced after the rename; any failure leaves nothing beside the target.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "error_test_util.h"
#include "temp_dir.h"

using namespace jtok;
namespace fs = std::filesystem;

namespace {

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Fills a directory as an export does: two files and a subdirectory with one.
void fill_files(const std::string& tmp) {
  write_file_atomic(tmp + "/model.bin", "weights");
  fs::create_directories(tmp + "/sub");
  write_file_atomic(tmp + "/sub/a.json", "{}\n");
}

// One fsync of a directory as publish_dir_atomic asked for it: the path, and whether the target
// existed at that moment (the parent's fsync must come after the rename).
struct SyncCall {
  std::string dir;
  bool target_existed;
};

}  // namespace

TEST(PublishDir, PublishesWholeAndFsyncsTheParentAfterTheRename) {
  const std::string parent = jtok::testing::fresh_temp_dir("publish_ok");
  fs::create_directories(parent);
  const std::string out = parent + "/copy";
  std::vector<SyncCall> calls;
  std::string seen_tmp;
  publish_dir_atomic(
      out,
      [&](const std::string& tmp) {
        seen_tmp = tmp;
        EXPECT_FALSE(fs::exists(out)) << "the target appears only at the rename";
        fill_files(tmp);
      },
      [&](const std::string& d) {
        calls.push_back({d, fs::exists(out)});
        fsync_dir(d);
      });
  EXPECT_EQ(fs::path(seen_tmp).parent_path(), fs::path(out).parent_path()) << "the temporary directory lies beside the target";
  EXPECT_EQ(read_file(out + "/model.bin"), "weights");
  EXPECT_EQ(read_file(out + "/sub/a.json"), "{}\n");
  EXPECT_EQ(entries(parent), std::set<std::string>{"copy"}) << "no temporary entry left";
  // The subdirectory and the temporary directory before the rename, the parent last, after it.
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(fs::path(calls[0].dir), fs::path(seen_tmp) / "sub");
  EXPECT_EQ(fs::path(calls[1].dir), fs::path(seen_tmp));
  EXPECT_FALSE(calls[1].target_existed);
  EXPECT_EQ(fs::path(calls[2].dir), fs::absolute(parent).lexically_normal());
  EXPECT_TRUE(calls[2].target_existed) << "the parent must be fsynced after the rename";
}

TEST(PublishDir, AFailingFillLeavesNoTemporaryDirectory) {
  const std::string parent = jtok::testing::fresh_temp_dir("publish_fail");
  fs::create_directories(parent);
  write_file_atomic(parent + "/other.txt", "kept");
  const std::string out = parent + "/copy";
  int syncs = 0;
  EXPECT_THROW(publish_dir_atomic(
                   out,
                   [&](const std::string& tmp) {
                     fill_files(tmp);
                     throw std::runtime_error("injected: disk full half way");
                   },
                   [&](const std::string&) { ++syncs; }),
               std::runtime_error);
  EXPECT_EQ(entries(parent), std::set<std::string>{"other.txt"}) << "a temporary directory was left";
  EXPECT_EQ(syncs, 0) << "nothing was published, nothing to fsync";
}

TEST(PublishDir, AFailingFsyncLeavesNoTemporaryDirectoryAndNoTarget) {
  const std::string parent = jtok::testing::fresh_temp_dir("publish_fsync");
  fs::create_directories(parent);
  const std::string out = parent + "/copy";
  jtok::testing::expect_error(
      [&] {
        publish_dir_atomic(out, fill_files, [&](const std::string& d) {
          if (fs::path(d).filename() == "copy.tmp") fail("cannot fsync directory ", d, ": Input/output error (injected)");
        });
      },
      {"cannot fsync directory", "copy.tmp"});
  EXPECT_TRUE(entries(parent).empty()) << "left: " << *entries(parent).begin();
}

TEST(PublishDir, RefusesAnExistingTargetAndReplacesAStaleTemporary) {
  const std::string parent = jtok::testing::fresh_temp_dir("publish_exists");
  fs::create_directories(parent + "/copy");
  write_file_atomic(parent + "/copy/mine", "x");
  bool filled = false;
  jtok::testing::expect_error([&] { publish_dir_atomic(parent + "/copy", [&](const std::string&) { filled = true; }); },
                        {parent + "/copy", "exists"});
  EXPECT_FALSE(filled);
  EXPECT_EQ(read_file(parent + "/copy/mine"), "x");
  // A leftover of an interrupted publish (its files stale) is removed first; "new/" is "new".
  fs::create_directories(parent + "/new.tmp");
  write_file_atomic(parent + "/new.tmp/stale", "old");
  publish_dir_atomic(parent + "/new/", fill_files);
  EXPECT_EQ(entries(parent + "/new"), (std::set<std::string>{"model.bin", "sub"}));
  EXPECT_EQ(entries(parent), (std::set<std::string>{"copy", "new"}));
}
