#include "core/cluster_secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace ps::core {
namespace {

using ::testing::HasSubstr;

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
}  // namespace ps::core
