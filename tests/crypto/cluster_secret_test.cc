#include "crypto/cluster_secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace ps::crypto {
namespace {

using ::testing::HasSubstr;
using core::CheckToken;
using core::Identity;
using core::ReadTokenFile;

class ClusterSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / "ps-secret-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ClusterSecretTest, DerivedTokensVerifyOnlyUnderTheirSecret) {
  const std::string secret = *NewSecret(), other = *NewSecret();
  ASSERT_EQ(secret.size(), kSecretBytes);
  const Identity w3{Identity::Kind::kWorker, 3};
  const std::string token = DeriveToken(secret, w3);
  EXPECT_THAT(token, ::testing::StartsWith("worker-3."));
  EXPECT_TRUE(CheckToken(token).ok());
  ASSERT_TRUE(VerifyDerivedToken(secret, token).has_value());
  EXPECT_EQ(*VerifyDerivedToken(secret, token), w3);
  EXPECT_FALSE(VerifyDerivedToken(other, token).has_value());
  // Another identity's name on this token's MAC, a flipped digit, a cut token.
  std::string renamed = "worker-4" + token.substr(8);
  EXPECT_FALSE(VerifyDerivedToken(secret, renamed).has_value());
  std::string flipped = token;
  flipped.back() = flipped.back() == 'a' ? 'b' : 'a';
  EXPECT_FALSE(VerifyDerivedToken(secret, flipped).has_value());
  EXPECT_FALSE(VerifyDerivedToken(secret, token.substr(0, token.size() - 1)).has_value());
  EXPECT_FALSE(VerifyDerivedToken(secret, "no-dot-at-all").has_value());
  EXPECT_NE(DeriveToken(secret, Identity{Identity::Kind::kShard, 3}), token);
}

TEST_F(ClusterSecretTest, RunDirectorySecretIsMadeOnceAndSharedByConcurrentShards) {
  const std::string run = dir_ + "/run";
  std::vector<std::string> got(8);
  std::vector<std::thread> shards;
  for (int i = 0; i < 8; ++i) {
    shards.emplace_back([&, i] {
      absl::StatusOr<std::string> s = LoadOrCreateSecret(run);
      ASSERT_TRUE(s.ok()) << s.status();
      got[i] = *s;
    });
  }
  for (auto& t : shards) t.join();
  for (const std::string& s : got) EXPECT_EQ(s, got[0]);
  EXPECT_EQ(*LoadOrCreateSecret(run), got[0]);
  EXPECT_EQ(*ReadSecretFile(run + "/secret"), got[0]);
  struct stat st {};
  ASSERT_EQ(stat(run.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((run + "/secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(run)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST_F(ClusterSecretTest, DirectoriesAndSecretsOpenToOthersAreRefused) {
  const std::string open = dir_ + "/open";
  ASSERT_EQ(mkdir(open.c_str(), 0755), 0);
  absl::StatusOr<std::string> s = LoadOrCreateSecret(open);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.status().message(), HasSubstr("chmod 700"));

  const std::string file = dir_ + "/secret";
  {
    std::ofstream out(file);
    out << std::string(64, 'a') << "\n";
  }
  chmod(file.c_str(), 0644);
  EXPECT_THAT(ReadSecretFile(file).status().message(), HasSubstr("chmod 600"));
  chmod(file.c_str(), 0600);
  EXPECT_TRUE(ReadSecretFile(file).ok());
  {
    std::ofstream out(file);
    out << "not hex at all\n";
  }
  EXPECT_THAT(ReadSecretFile(file).status().message(), HasSubstr("64 hex digits"));
  EXPECT_EQ(ReadSecretFile(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterSecretTest, TokenFilesAreReadableByTheWorkerOnly) {
  const Identity w0{Identity::Kind::kWorker, 0};
  const std::string token = DeriveToken(*NewSecret(), w0);
  absl::StatusOr<std::string> path = WriteTokenFile(dir_, w0, token);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, TokenFilePath(dir_, w0));
  EXPECT_EQ(*ReadTokenFile(*path), token);
  struct stat st {};
  ASSERT_EQ(stat(path->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Finding 4 of issue 45: "--run-dir DIR/" with a trailing slash made lstat follow a
// symbolic link at DIR, so the shard used (and wrote its secret and tokens into) the
// directory the link points to, which another user may control.
TEST_F(ClusterSecretTest, ASymlinkedRunDirectoryIsRefusedWithOrWithoutTrailingSlash) {
  const std::string target = dir_ + "/elsewhere";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  const std::string link = dir_ + "/run";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  for (const std::string& given : {link, link + "/", link + "//", link + "/."}) {
    absl::StatusOr<std::string> s = LoadOrCreateSecret(given);
    ASSERT_FALSE(s.ok()) << given;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << given;
    EXPECT_THAT(s.status().message(), HasSubstr("is a symbolic link")) << given;
    EXPECT_FALSE(WriteTokenFile(given, Identity{Identity::Kind::kWorker, 0}, std::string(20, 't'))
                     .ok())
        << given;
    EXPECT_FALSE(ReadRunDirectoryToken(given, Identity{Identity::Kind::kAdmin, 0}).ok()) << given;
  }
  // Nothing was written through the link.
  EXPECT_TRUE(std::filesystem::is_empty(target));
}

TEST_F(ClusterSecretTest, RunDirectoryPathsAreCanonical) {
  EXPECT_EQ(CanonicalRunDirectory("/a/b/"), "/a/b");
  EXPECT_EQ(CanonicalRunDirectory("/a/b///"), "/a/b");
  EXPECT_EQ(CanonicalRunDirectory("/a//b/."), "/a/b");
  EXPECT_EQ(CanonicalRunDirectory("a/./b"), "a/b");
  EXPECT_EQ(CanonicalRunDirectory("/"), "/");
  EXPECT_EQ(CanonicalRunDirectory("./"), ".");
  EXPECT_EQ(TokenFilePath("/r/", Identity{Identity::Kind::kAdmin, 0}), "/r/token-admin");
  // A trailing slash on a real directory is fine: the same directory.
  const std::string run = dir_ + "/run";
  absl::StatusOr<std::string> a = LoadOrCreateSecret(run + "/");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*LoadOrCreateSecret(run), *a);
}

// The directory is checked once and used through its descriptor: swapping another one in
// under its name afterwards does not redirect the files.
TEST_F(ClusterSecretTest, FilesGoToTheDirectoryThatWasCheckedEvenIfItIsSwapped) {
  const std::string run = dir_ + "/run";
  absl::StatusOr<RunDirectory> opened = RunDirectory::Open(run, /*create=*/true);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const std::string moved = dir_ + "/moved";
  ASSERT_EQ(rename(run.c_str(), moved.c_str()), 0);
  ASSERT_EQ(mkdir(run.c_str(), 0700), 0);  // the swapped-in directory
  const Identity w0{Identity::Kind::kWorker, 0};
  ASSERT_TRUE(opened->WriteToken(w0, std::string(20, 't')).ok());
  ASSERT_TRUE(opened->LoadOrCreateSecret().ok());
  EXPECT_TRUE(std::filesystem::exists(moved + "/token-worker-0"));
  EXPECT_TRUE(std::filesystem::exists(moved + "/secret"));
  EXPECT_TRUE(std::filesystem::is_empty(run));
  EXPECT_EQ(*opened->ReadToken(w0), std::string(20, 't'));
}

TEST_F(ClusterSecretTest, TokenFilesAreReadOnlyIfPrivateAndNotLinks) {
  const Identity admin{Identity::Kind::kAdmin, 0};
  const std::string token(24, 'k');
  ASSERT_TRUE(WriteTokenFile(dir_, admin, token).ok());
  EXPECT_EQ(*ReadRunDirectoryToken(dir_ + "/", admin), token);
  const std::string path = TokenFilePath(dir_, admin);
  chmod(path.c_str(), 0644);
  EXPECT_THAT(ReadRunDirectoryToken(dir_, admin).status().message(), HasSubstr("chmod 600"));
  // A link in place of the file (to a file of the same user's, even) is refused.
  const std::string real = dir_ + "/real-token";
  ASSERT_EQ(rename(path.c_str(), real.c_str()), 0);
  chmod(real.c_str(), 0600);
  ASSERT_EQ(symlink(real.c_str(), path.c_str()), 0);
  EXPECT_THAT(ReadRunDirectoryToken(dir_, admin).status().message(),
              HasSubstr("is a symbolic link"));
  EXPECT_EQ(ReadRunDirectoryToken(dir_ + "/missing", admin).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DefaultRunDirectoryTest, FollowsXdgThenHome) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
  EXPECT_EQ(*DefaultRunDirectory(), "/run/user/7/ps-server");
  unsetenv("XDG_RUNTIME_DIR");
  setenv("HOME", "/home/x", 1);
  EXPECT_EQ(*DefaultRunDirectory(), "/home/x/.ps-server");
  unsetenv("HOME");
  EXPECT_EQ(DefaultRunDirectory().status().code(), absl::StatusCode::kNotFound);
  if (xdg) setenv("XDG_RUNTIME_DIR", saved_xdg.c_str(), 1);
  if (home) setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace
}  // namespace ps::crypto
