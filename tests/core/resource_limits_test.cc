// The CPUs and memory a process may use (core/resource_limits.h), read from cgroup
// trees made by the test: v2 with limits on the process's cgroup and on an ancestor, v1
// with the cpu,cpuacct hierarchy, no limits, and the machine's bounds. The real cgroups
// of a running ps-server: tests/python/test_cgroup.py.
#include "core/resource_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace ps::core {
namespace {

using ::testing::HasSubstr;

class ResourceLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("resource_limits_" + std::string(
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
  }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  ResourceLimits Read(unsigned cpus = 16, uint64_t memory = uint64_t{64} << 30) {
    return ReadResourceLimits(root_.string(), cpus, memory);
  }
  std::filesystem::path root_;
};

TEST_F(ResourceLimitsTest, CgroupV2LimitsOfTheCgroupAndItsAncestors) {
  Write("proc/self/cgroup", "0::/kubepods/pod1/ctr");
  Write("sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000");
  Write("sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000");  // 1.5 CPUs: 2 threads
  Write("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "1073741824");
  Write("sys/fs/cgroup/kubepods/memory.max", "max");
  const ResourceLimits r = Read();
  EXPECT_EQ(r.cpus, 2u);
  EXPECT_THAT(r.cpus_from, HasSubstr("cgroup v2 " + root_.string() +
                                     "/sys/fs/cgroup/kubepods/pod1/cpu.max: 150000 100000"));
  EXPECT_EQ(r.memory_bytes, uint64_t{1} << 30);
  EXPECT_THAT(r.memory_from, HasSubstr("pod1/ctr/memory.max"));
}

TEST_F(ResourceLimitsTest, CgroupV1QuotaAndMemoryLimit) {
  Write("proc/self/cgroup",
        "4:memory:/job/7\n3:cpu,cpuacct:/job/7\n1:name=systemd:/\n");
  Write("sys/fs/cgroup/cpu,cpuacct/cgroup.procs", "");
  Write("sys/fs/cgroup/cpu,cpuacct/job/7/cpu.cfs_quota_us", "-1");  // none here
  Write("sys/fs/cgroup/cpu,cpuacct/job/7/cpu.cfs_period_us", "100000");
  Write("sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "300000");  // 3 CPUs above it
  Write("sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000");
  Write("sys/fs/cgroup/memory/job/7/memory.limit_in_bytes", "9223372036854771712");
  Write("sys/fs/cgroup/memory/job/memory.limit_in_bytes", "536870912");
  const ResourceLimits r = Read();
  EXPECT_EQ(r.cpus, 3u);
  EXPECT_THAT(r.cpus_from, HasSubstr("cgroup v1"));
  EXPECT_EQ(r.memory_bytes, uint64_t{512} << 20);
}

TEST_F(ResourceLimitsTest, NoLimitsOrNoFilesMeanTheMachine) {
  Write("proc/self/cgroup", "0::/");
  Write("sys/fs/cgroup/cpu.max", "max 100000");
  Write("sys/fs/cgroup/memory.max", "max");
  ResourceLimits r = Read(4, uint64_t{8} << 30);
  EXPECT_EQ(r.cpus, 4u);
  EXPECT_EQ(r.memory_bytes, uint64_t{8} << 30);
  EXPECT_EQ(r.cpus_from, "the machine");
  std::filesystem::remove_all(root_);  // not even /proc/self/cgroup
  r = Read(4, uint64_t{8} << 30);
  EXPECT_EQ(r.cpus, 4u);
  EXPECT_EQ(r.memory_from, "the machine");
}

TEST_F(ResourceLimitsTest, TheMachineBoundsAndAtLeastOneCpu) {
  Write("proc/self/cgroup", "0::/a");
  Write("sys/fs/cgroup/a/cpu.max", "3200000 100000");  // 32 CPUs on a 16-CPU machine
  Write("sys/fs/cgroup/a/memory.max", "999999999999999");
  ResourceLimits r = Read();
  EXPECT_EQ(r.cpus, 16u);
  EXPECT_EQ(r.memory_bytes, uint64_t{64} << 30);
  Write("sys/fs/cgroup/a/cpu.max", "10000 100000");  // a tenth of a CPU
  Write("sys/fs/cgroup/a/memory.max", "garbage");
  r = Read();
  EXPECT_EQ(r.cpus, 1u);
  EXPECT_EQ(r.memory_bytes, uint64_t{64} << 30) << "an unreadable limit is none";
}

}  // namespace
}  // namespace ps::core
