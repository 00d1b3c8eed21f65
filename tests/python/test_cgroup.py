"""ps-server's --threads 0 and --max-shard-bytes 0 follow the limits of its cgroup, as a
container runtime sets them (Kubernetes' resources.limits, Docker's --cpus and
--memory): a real cgroup made by the test (v1 cpu and memory hierarchies, or v2), with
half a CPU and 512 MiB; the shard started in it says it runs 1 aggregation thread and
bounds its model state at 256 MiB, naming the cgroup files. Skipped, saying why, where
the machine cannot (not root, cgroups not writable)."""

import os
import subprocess
import time

import pytest


def own_cgroups():
    """{controller or "": path} of this process (/proc/self/cgroup)."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def make_cgroups(name):
    """Makes the test's cgroup with half a CPU and 512 MiB; returns (the directories a
    process joins by writing its pid to their cgroup.procs, the v1 or v2 tag)."""
    paths = own_cgroups()
    if os.path.exists("/sys/fs/cgroup/cpu/cgroup.procs") and "cpu" in paths and \
            "memory" in paths:
        cpu = f"/sys/fs/cgroup/cpu{paths['cpu'].rstrip('/')}/{name}"
        memory = f"/sys/fs/cgroup/memory{paths['memory'].rstrip('/')}/{name}"
        os.mkdir(cpu)
        os.mkdir(memory)
        with open(f"{cpu}/cpu.cfs_quota_us", "w") as f:
            f.write("50000")  # of the default period, 100000
        with open(f"{memory}/memory.limit_in_bytes", "w") as f:
            f.write(str(512 << 20))
        return [cpu, memory], "v1"
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and "" in paths:
        # v2: a child of this process's cgroup, whose controllers it must enable.
        parent = f"/sys/fs/cgroup{paths[''].rstrip('/')}"
        d = f"{parent}/{name}"
        os.mkdir(d)
        with open(f"{parent}/cgroup.subtree_control", "w") as f:
            f.write("+cpu +memory")
        with open(f"{d}/cpu.max", "w") as f:
            f.write("50000 100000")
        with open(f"{d}/memory.max", "w") as f:
            f.write(str(512 << 20))
        return [d], "v2"
    raise OSError("neither cgroup v1 cpu and memory hierarchies nor cgroup v2")


def test_threads_and_memory_follow_the_cgroup_limits(server_bin):
    if os.geteuid() != 0:
        pytest.skip("making cgroups needs root")
    name = f"ps-test-{os.getpid()}"
    try:
        dirs, version = make_cgroups(name)
    except OSError as e:
        pytest.skip(f"cannot make a cgroup with CPU and memory limits here: {e}")
    try:
        join = "; ".join(f"echo $$ > {d}/cgroup.procs" for d in dirs)
        shard = subprocess.Popen(["sh", "-c", f'{join}; exec "$0" --insecure --port 0',
                                  server_bin], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            line = ""
            for line in shard.stdout:
                if "aggregation threads" in line:
                    break
        finally:
            shard.kill()
            shard.wait()
        print(line.strip())
        assert "1 aggregation threads (--threads 0; CPUs from cgroup " + version in line, line
        assert "model state up to 256 MiB (--max-shard-bytes 0: half; memory from cgroup " + \
            version in line, line
        assert name in line, line
    finally:
        for d in dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:  # the killed shard may still be leaving it
                    time.sleep(0.1)
