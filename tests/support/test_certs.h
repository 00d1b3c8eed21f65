// Certificates for tests: deploy/tls/make-certs.sh run into a fresh temporary directory,
// so that a test serves and presents what an operator would (a private CA, shard-N with
// localhost and 127.0.0.1 among its names, worker-N and admin client certificates, and
// their tokens). The including target defines PS_SOURCE_DIR.
#pragma once

#include <stdlib.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ps::testing {

// A new CA with `shards` shard and `workers` worker certificates, in a new directory
// whose name starts with `tag`. Its path; "" and a test failure when the script fails.
inline std::string MakeTestCerts(const std::string& tag, int shards, int workers) {
  std::string dir = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
  if (::mkdtemp(dir.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << dir;
    return "";
  }
  const std::string cmd = std::string(PS_SOURCE_DIR) + "/deploy/tls/make-certs.sh " + dir + " " +
                          std::to_string(shards) + " " + std::to_string(workers) + " >/dev/null";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << cmd;
    return "";
  }
  return dir;
}

}  // namespace ps::testing
