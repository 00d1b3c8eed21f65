#include "server/flags.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crypto/cluster_secret.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/options.h"

namespace ps::server {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Long names of every configurable flag; the variable is PS_ + upper snake case.
const std::vector<std::string>& AllFlagNames() {
  static const std::vector<std::string> kNames = {"host",
                                                  "port",
                                                  "port-file",
                                                  "allow-insecure-remote",
                                                  "max-message-bytes",
                                                  "udp-port",
                                                  "udp-receive-buffer",
                                                  "udp-threads",
                                                  "data-plane",
                                                  "data-port",
                                                  "data-threads",
                                                  "tcp-rto-min-ms",
                                                  "schedule",
                                                  "tls-cert",
                                                  "tls-key",
                                                  "tls-ca",
                                                  "tokens",
                                                  "run-dir",
                                                  "secret-file",
                                                  "insecure",
                                                  "rate-limit",
                                                  "rate-burst",
                                                  "refusal-rate",
                                                  "refusal-burst",
                                                  "refusal-hold-ms",
                                                  "quarantine-ms",
                                                  "worker-timeout-ms",
                                                  "suspicion-window",
                                                  "suspicion-threshold",
                                                  "checkpoint-dir",
                                                  "checkpoint-interval-s",
                                                  "checkpoint-every-rounds",
                                                  "checkpoint-keep",
                                                  "shard-id",
                                                  "num-shards",
                                                  "peers",
                                                  "run-id",
                                                  "workers",
                                                  "max-workers",
                                                  "byzantine",
                                                  "quorum",
                                                  "round-deadline-ms",
                                                  "aggregator",
                                                  "multi-krum-m",
                                                  "krum-neighbours",
                                                  "even-median",
                                                  "device",
                                                  "aggregation-scope",
                                                  "peer-timeout-ms",
                                                  "aggregate-only",
                                                  "lr",
                                                  "momentum",
                                                  "weight-decay",
                                                  "lr-schedule",
                                                  "pull-codec",
                                                  "allowed-codecs",
                                                  "max-decode-ms",
                                                  "threads",
                                                  "max-shard-bytes",
                                                  "max-request-memory-bytes",
                                                  "max-pulls-per-worker",
                                                  "max-cached-decoders",
                                                  "max-connection-idle-ms",
                                                  "max-connections",
                                                  "max-connections-per-source",
                                                  "max-connections-per-client",
                                                  "max-calls-per-client",
                                                  "max-reads-per-client",
                                                  "request-read-timeout-ms",
                                                  "max-streams-per-connection",
                                                  "max-health-watches",
                                                  "max-object-bytes",
                                                  "connection-proof-timeout-ms",
                                                  "drain-timeout-ms",
                                                  "log-level",
                                                  "log-format",
                                                  "metrics-port",
                                                  "health-port"};
  return kNames;
}

std::string EnvFor(const std::string& name) {
  std::string env = "PS_";
  for (char c : name) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

// Clears every variable the parser reads and restores them afterwards, so that the
// tests neither see nor leave behind a PS_* setting.
class FlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> vars = {"PS_CONFIG", "HOSTNAME"};
    for (const std::string& name : AllFlagNames()) vars.push_back(EnvFor(name));
    for (const std::string& var : vars) {
      if (const char* value = std::getenv(var.c_str()))
        saved_[var] = value;
      else
        saved_[var] = std::nullopt;
      unsetenv(var.c_str());
    }
  }

  void TearDown() override {
    for (const auto& [var, value] : saved_) {
      if (value.has_value())
        setenv(var.c_str(), value->c_str(), 1);
      else
        unsetenv(var.c_str());
    }
    for (const std::string& path : files_) std::remove(path.c_str());
  }

  static FlagsResult Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "ps-server");
    std::vector<const char*> argv;
    for (const std::string& arg : args) argv.push_back(arg.c_str());
    return ParseServerFlags(static_cast<int>(argv.size()), argv.data());
  }

  // Parses and expects success; the message explains a failure.
  static ServerOptions ParseOk(std::vector<std::string> args) {
    FlagsResult result = Parse(std::move(args));
    EXPECT_FALSE(result.exit_now) << result.message;
    return result.options;
  }

  static void SetEnv(const std::string& var, const std::string& value) {
    setenv(var.c_str(), value.c_str(), 1);
  }

  // A real file under the test temporary directory, removed in TearDown.
  std::string WriteConfig(const std::string& contents) {
    const std::string path = ::testing::TempDir() + "ps_flags_test_" + std::to_string(getpid()) +
                             "_" + std::to_string(files_.size()) + ".toml";
    std::ofstream(path) << contents;
    files_.push_back(path);
    return path;
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
  std::vector<std::string> files_;
};

// Secure by default: with no way of telling clients apart, the shard uses its run
// directory's secret; only --insecure runs without authentication.
TEST_F(FlagsTest, WithoutAuthenticationFlagsTheRunDirectorySecretIsUsed) {
  const FlagsResult plain = Parse({});
  ASSERT_FALSE(plain.exit_now) << plain.message;
  EXPECT_EQ(plain.options.run_dir, *crypto::DefaultRunDirectory());
  EXPECT_TRUE(plain.options.ClientAuthRequired());
  EXPECT_FALSE(plain.options.insecure);

  const FlagsResult insecure = Parse({"--insecure"});
  ASSERT_FALSE(insecure.exit_now) << insecure.message;
  EXPECT_TRUE(insecure.options.insecure);
  EXPECT_EQ(insecure.options.run_dir, "");
  EXPECT_FALSE(insecure.options.ClientAuthRequired());

  const FlagsResult secret = Parse({"--secret-file", "/some/secret"});
  ASSERT_FALSE(secret.exit_now) << secret.message;
  EXPECT_EQ(secret.options.run_dir, "");

  const FlagsResult both = Parse({"--insecure", "--run-dir", "/tmp/x"});
  EXPECT_TRUE(both.exit_now);
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.message, HasSubstr("contradicts"));

  ServerOptions none;
  EXPECT_THAT(std::string(none.Validate().message()), HasSubstr("--insecure"));
}

TEST_F(FlagsTest, NoArgumentsGiveTheDocumentedDefaults) {
  const FlagsResult result = Parse({});
  ASSERT_FALSE(result.exit_now) << result.message;
  const ServerOptions& o = result.options;
  const ServerOptions d;
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 7070);
  EXPECT_EQ(o.port_file, "");
  EXPECT_FALSE(o.allow_insecure_remote);
  EXPECT_EQ(o.max_message_bytes, 8u << 20);
  EXPECT_EQ(o.udp_port, -1);
  EXPECT_EQ(o.udp_receive_buffer, 8u << 20);
  EXPECT_EQ(o.schedule, Schedule::kPriority);
  EXPECT_EQ(o.shard_id, 0);
  EXPECT_EQ(o.num_shards, 1u);
  EXPECT_THAT(o.peers, IsEmpty());
  EXPECT_EQ(o.num_workers, 1u);
  EXPECT_EQ(o.num_byzantine, 0u);
  EXPECT_EQ(o.quorum, 0u);
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(5000));
  EXPECT_EQ(o.aggregator, "mean");
  EXPECT_EQ(o.multi_krum_m, 0u);
  EXPECT_EQ(o.krum_neighbours, aggregators::KrumNeighbours::kPaper);
  EXPECT_EQ(o.even_median, aggregators::EvenMedian::kMidpoint);
  EXPECT_EQ(o.device, core::Device::kCpu);
  EXPECT_FALSE(o.aggregate_only);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.1f);
  EXPECT_FLOAT_EQ(o.momentum, 0.9f);
  EXPECT_FLOAT_EQ(o.weight_decay, 0.0f);
  EXPECT_EQ(o.lr_schedule, "constant");
  EXPECT_EQ(o.threads, 0u);
  EXPECT_EQ(o.drain_timeout, std::chrono::milliseconds(10000));
  EXPECT_EQ(o.log_level, "info");
  EXPECT_EQ(o.log_format, "plain");
  EXPECT_EQ(o.metrics_port, -1);
  EXPECT_EQ(o.ConsistencySummary(), d.ConsistencySummary());
}

// The same values reach the options whichever source carries them.
std::vector<std::pair<std::string, std::string>> NonDefaultValues() {
  return {{"host", "0.0.0.0"},
          {"port", "0"},
          {"port-file", "/tmp/port"},
          {"allow-insecure-remote", "true"},
          {"max-message-bytes", "1048576"},
          {"udp-port", "0"},
          {"udp-receive-buffer", "65536"},
          {"udp-threads", "3"},
          {"data-plane", "grpc"},
          {"data-port", "7171"},
          {"data-threads", "3"},
          {"tcp-rto-min-ms", "10"},
          {"schedule", "fifo"},
          {"shard-id", "1"},
          {"num-shards", "2"},
          {"peers", "ps-0:7070,ps-1:7071"},
          {"workers", "7"},
          {"byzantine", "2"},
          {"quorum", "6"},
          {"round-deadline-ms", "2500"},
          {"aggregator", "trimmed_mean"},
          {"multi-krum-m", "3"},
          {"krum-neighbours", "byzfl"},
          {"even-median", "lower"},
          {"device", "cuda"},
          {"aggregate-only", "true"},
          {"lr", "0.05"},
          {"momentum", "0.5"},
          {"weight-decay", "0.0001"},
          {"lr-schedule", "inv_sqrt(t0=50)"},
          {"threads", "3"},
          {"drain-timeout-ms", "1500"},
          {"log-level", "debug"},
          {"log-format", "json"},
          {"metrics-port", "9464"}};
}

void ExpectNonDefaultValues(const ServerOptions& o) {
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.port, 0);
  EXPECT_EQ(o.port_file, "/tmp/port");
  EXPECT_TRUE(o.allow_insecure_remote);
  EXPECT_EQ(o.max_message_bytes, 1048576u);
  EXPECT_EQ(o.udp_port, 0);
  EXPECT_EQ(o.udp_receive_buffer, 65536u);
  EXPECT_EQ(o.udp_threads, 3u);
  EXPECT_EQ(o.data_plane, core::DataPlane::kGrpc);
  EXPECT_EQ(o.data_port, 7171);
  EXPECT_EQ(o.data_threads, 3u);
  EXPECT_EQ(o.tcp_rto_min, std::chrono::milliseconds(10));
  EXPECT_EQ(o.schedule, Schedule::kFifo);
  EXPECT_EQ(o.shard_id, 1);
  EXPECT_EQ(o.num_shards, 2u);
  EXPECT_THAT(o.peers, ElementsAre("ps-0:7070", "ps-1:7071"));
  EXPECT_EQ(o.num_workers, 7u);
  EXPECT_EQ(o.num_byzantine, 2u);
  EXPECT_EQ(o.quorum, 6u);
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(2500));
  EXPECT_EQ(o.aggregator, "trimmed_mean");
  EXPECT_EQ(o.multi_krum_m, 3u);
  EXPECT_EQ(o.krum_neighbours, aggregators::KrumNeighbours::kByzFL);
  EXPECT_EQ(o.even_median, aggregators::EvenMedian::kLower);
  EXPECT_EQ(o.device, core::Device::kCuda);
  EXPECT_TRUE(o.aggregate_only);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.05f);
  EXPECT_FLOAT_EQ(o.momentum, 0.5f);
  EXPECT_FLOAT_EQ(o.weight_decay, 0.0001f);
  EXPECT_EQ(o.lr_schedule, "inv_sqrt(t0=50)");
  EXPECT_EQ(o.threads, 3u);
  EXPECT_EQ(o.drain_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.log_level, "debug");
  EXPECT_EQ(o.log_format, "json");
  EXPECT_EQ(o.metrics_port, 9464);
}

TEST_F(FlagsTest, EveryFlagIsParsed) {
  std::vector<std::string> args;
  for (const auto& [name, value] : NonDefaultValues()) {
    if (value == "true") {
      args.push_back("--" + name);  // a flag without value
    } else {
      args.push_back("--" + name);
      args.push_back(value);
    }
  }
  ExpectNonDefaultValues(ParseOk(args));
}

TEST_F(FlagsTest, EveryFlagIsParsedInEqualsForm) {
  std::vector<std::string> args;
  for (const auto& [name, value] : NonDefaultValues()) args.push_back("--" + name + "=" + value);
  ExpectNonDefaultValues(ParseOk(args));
}

TEST_F(FlagsTest, EveryFlagHasAnEnvironmentVariable) {
  for (const auto& [name, value] : NonDefaultValues()) SetEnv(EnvFor(name), value);
  ExpectNonDefaultValues(ParseOk({}));
}

TEST_F(FlagsTest, EveryFlagIsAConfigKey) {
  std::string toml = "# every key\n";
  for (const auto& [name, value] : NonDefaultValues()) {
    if (name == "peers") {
      toml += "peers = [\"ps-0:7070\", \"ps-1:7071\"]\n";
    } else if (value == "true") {
      toml += name + " = true\n";
    } else if (std::isdigit(static_cast<unsigned char>(value[0])) && name != "host") {
      toml += name + " = " + value + "\n";
    } else {
      toml += name + " = \"" + value + "\"\n";
    }
  }
  ExpectNonDefaultValues(ParseOk({"--config", WriteConfig(toml)}));
}

TEST_F(FlagsTest, ConfigKeysMayUseUnderscores) {
  const ServerOptions o =
      ParseOk({"--config", WriteConfig("round_deadline_ms = 1234\nkrum_neighbours = \"byzfl\"\n"
                                       "aggregate_only = true\n")});
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(1234));
  EXPECT_EQ(o.krum_neighbours, aggregators::KrumNeighbours::kByzFL);
  EXPECT_TRUE(o.aggregate_only);
}

TEST_F(FlagsTest, ConfigFileAcceptsMultiLineArraysAndComments) {
  const ServerOptions o = ParseOk({"--config", WriteConfig("num-shards = 2  # two shards\n"
                                                           "peers = [\n"
                                                           "  \"127.0.0.1:7070\",\n"
                                                           "  \"127.0.0.1:7071\",\n"
                                                           "]\n")});
  EXPECT_EQ(o.num_shards, 2u);
  EXPECT_THAT(o.peers, ElementsAre("127.0.0.1:7070", "127.0.0.1:7071"));
}

TEST_F(FlagsTest, ConfigFileAcceptsOneLineAndEmptyArrays) {
  ServerOptions o = ParseOk(
      {"--config", WriteConfig("num-shards = 2\npeers = [\"a:1\", 'b:2',]  # trailing comma\n")});
  EXPECT_THAT(o.peers, ElementsAre("a:1", "b:2"));
  o = ParseOk({"--config", WriteConfig("peers = []\n")});
  EXPECT_THAT(o.peers, IsEmpty());
}

TEST_F(FlagsTest, PrecedenceIsFlagThenEnvironmentThenFileThenDefault) {
  const std::string config = WriteConfig("workers = 3\nround-deadline-ms = 2000\nbyzantine = 1\n");

  // default only
  EXPECT_EQ(ParseOk({}).num_workers, 1u);
  // file beats default
  ServerOptions o = ParseOk({"--config", config});
  EXPECT_EQ(o.num_workers, 3u);
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(2000));
  // environment beats file, and only for its own key
  SetEnv("PS_WORKERS", "4");
  o = ParseOk({"--config", config});
  EXPECT_EQ(o.num_workers, 4u);
  EXPECT_EQ(o.num_byzantine, 1u);
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(2000));
  // flag beats environment and file
  o = ParseOk({"--config", config, "--workers", "5"});
  EXPECT_EQ(o.num_workers, 5u);
  EXPECT_EQ(o.round_deadline, std::chrono::milliseconds(2000));
  // flag beats file when no variable is set
  unsetenv("PS_WORKERS");
  EXPECT_EQ(ParseOk({"--config", config, "--workers=6"}).num_workers, 6u);
}

TEST_F(FlagsTest, EnvironmentBeatsFileForFlagsAndLists) {
  const std::string config =
      WriteConfig("aggregate-only = true\nnum-shards = 2\npeers = [\"a:1\", \"b:2\"]\n");
  SetEnv("PS_AGGREGATE_ONLY", "false");
  SetEnv("PS_PEERS", "c:3,d:4");
  const ServerOptions o = ParseOk({"--config", config});
  EXPECT_FALSE(o.aggregate_only);
  EXPECT_THAT(o.peers, ElementsAre("c:3", "d:4"));
}

TEST_F(FlagsTest, EmptyEnvironmentVariableCountsAsUnset) {
  SetEnv("PS_WORKERS", "");
  EXPECT_EQ(ParseOk({"--config", WriteConfig("workers = 3\n")}).num_workers, 3u);
}

TEST_F(FlagsTest, ConfigFileFromPsConfigAndFlagBeatsIt) {
  SetEnv("PS_CONFIG", WriteConfig("workers = 3\n"));
  EXPECT_EQ(ParseOk({}).num_workers, 3u);
  EXPECT_EQ(ParseOk({"--config", WriteConfig("workers = 8\n")}).num_workers, 8u);
}

TEST_F(FlagsTest, MissingConfigFileIsAnError) {
  const FlagsResult result = Parse({"--config", "/nonexistent/ps.toml"});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("/nonexistent/ps.toml"));

  SetEnv("PS_CONFIG", "/nonexistent/env.toml");
  const FlagsResult from_env = Parse({});
  EXPECT_EQ(from_env.exit_code, 2);
  EXPECT_THAT(from_env.message, HasSubstr("/nonexistent/env.toml"));
}

TEST_F(FlagsTest, UnknownFlagIsRefused) {
  const FlagsResult result = Parse({"--wokers", "3"});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--wokers"));
}

TEST_F(FlagsTest, PositionalArgumentIsRefused) {
  const FlagsResult result = Parse({"stray"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("stray"));
}

TEST_F(FlagsTest, UnknownConfigKeyIsRefusedNamingKeyAndFile) {
  const std::string config = WriteConfig("workers = 3\nwokers = 4\n");
  const FlagsResult result = Parse({"--config", config});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, AllOf(HasSubstr("wokers"), HasSubstr(config)));
}

TEST_F(FlagsTest, UnknownConfigKeyIsRefusedEvenWhenItsVariableIsSet) {
  SetEnv("PS_WOKERS", "4");
  const FlagsResult result = Parse({"--config", WriteConfig("wokers = 4\n")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("wokers"));
  unsetenv("PS_WOKERS");
}

TEST_F(FlagsTest, NonConfigurableKeysAreRefused) {
  for (const std::string key : {"config", "help", "version"}) {
    const FlagsResult result = Parse({"--config", WriteConfig(key + " = \"x\"\n")});
    EXPECT_EQ(result.exit_code, 2) << key;
    EXPECT_THAT(result.message, HasSubstr(key));
  }
}

TEST_F(FlagsTest, ConfigTablesAndDottedKeysAreRefused) {
  FlagsResult result = Parse({"--config", WriteConfig("[rounds]\nworkers = 3\n")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("[rounds]"));
  result = Parse({"--config", WriteConfig("rounds.workers = 3\n")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("rounds.workers"));
}

TEST_F(FlagsTest, RepeatedConfigKeyIsRefused) {
  const FlagsResult result =
      Parse({"--config", WriteConfig("workers = 3\nport = 1\nround_deadline_ms = 5\n"
                                     "workers = 4\n")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("\"workers\" is given more than once"));
}

TEST_F(FlagsTest, MalformedNumbersAreRefusedNamingTheFlag) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--workers", "abc"},
                                             {"--workers", "3.5"},
                                             {"--workers", "-1"},
                                             {"--workers", "010"},
                                             {"--workers", "0x10"},
                                             {"--workers", "99999999999"},
                                             {"--port", "70000"},
                                             {"--lr", "fast"},
                                             {"--round-deadline-ms", "1s"}}) {
    const FlagsResult result = Parse(args);
    EXPECT_TRUE(result.exit_now) << args[0] << " " << args[1];
    EXPECT_EQ(result.exit_code, 2) << args[0] << " " << args[1];
    EXPECT_THAT(result.message, HasSubstr(args[0])) << args[1];
  }
}

TEST_F(FlagsTest, BadChoiceIsRefused) {
  const FlagsResult result = Parse({"--krum-neighbours", "sometimes"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, AllOf(HasSubstr("--krum-neighbours"), HasSubstr("sometimes")));
}

TEST_F(FlagsTest, BadEnvironmentValueIsRefusedNamingTheVariable) {
  SetEnv("PS_WORKERS", "many");
  FlagsResult result = Parse({});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, AllOf(HasSubstr("PS_WORKERS"), HasSubstr("many")));
  unsetenv("PS_WORKERS");

  SetEnv("PS_ALLOW_INSECURE_REMOTE", "perhaps");
  result = Parse({});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("PS_ALLOW_INSECURE_REMOTE"));
}

TEST_F(FlagsTest, BadConfigValueIsRefusedNamingKeyAndFile) {
  const std::string config = WriteConfig("workers = 3\nround-deadline-ms = \"soon\"\n");
  const FlagsResult result = Parse({"--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message,
              AllOf(HasSubstr("round-deadline-ms"), HasSubstr(config), HasSubstr("soon")));
}

TEST_F(FlagsTest, OutOfRangeValueIsRefusedByValidation) {
  FlagsResult result = Parse({"--num-shards", "0"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--num-shards=0"));

  SetEnv("PS_MOMENTUM", "1.5");
  result = Parse({});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--momentum=1.5"));
  unsetenv("PS_MOMENTUM");

  result = Parse({"--udp-port=-2"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--udp-port=-2"));
  result = Parse({"--udp-port=70000"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--udp-port=70000"));
  result = Parse({"--metrics-port=-2"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--metrics-port=-2"));
  result = Parse({"--metrics-port=70000"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--metrics-port=70000"));
  result = Parse({"--health-port=-3"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--health-port=-3"));
  result = Parse({"--metrics-port=9464", "--health-port=9464"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must differ from --port and --metrics-port"));
  EXPECT_EQ(ParseOk({"--health-port=7071"}).health_port, 7071);
  result = Parse({"--port=9464", "--metrics-port=9464"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must differ from --port"));
  result = Parse({"--udp-receive-buffer=1000"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("at least 65536"));
  result = Parse({"--udp-threads=0"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must lie in [1, 64]"));
  result = Parse({"--data-plane=udp"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("udp"));
  result = Parse({"--data-plane=tcp", "--port=7000", "--data-port=7000"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must differ from --port"));
  // TCP is the default plane (docs/data-plane.md, migration step 4): the same check
  // without the flag, and none on gRPC's plane, where no data port is opened.
  EXPECT_EQ(ParseOk({}).data_plane, core::DataPlane::kTcp);
  result = Parse({"--port=7000", "--data-port=7000"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must differ from --port"));
  EXPECT_EQ(ParseOk({"--data-plane=grpc", "--port=7000", "--data-port=7000"}).data_plane,
            core::DataPlane::kGrpc);
  // The TCP plane serves TLS with the control port's certificate (docs/data-plane.md).
  const ServerOptions tls =
      ParseOk({"--data-plane=tcp", "--tls-cert=/c.pem", "--tls-key=/k.pem", "--tls-ca=/ca.pem"});
  EXPECT_EQ(tls.data_plane, core::DataPlane::kTcp);
  EXPECT_EQ(tls.tls_cert, "/c.pem");
  result = Parse({"--data-threads=0"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must lie in [1, 64]"));
  EXPECT_EQ(ParseOk({}).tcp_rto_min, std::chrono::milliseconds(-1)) << "auto by default";
  for (const char* bad : {"--tcp-rto-min-ms=-2", "--tcp-rto-min-ms=201"}) {
    result = Parse({bad});
    EXPECT_EQ(result.exit_code, 2) << bad;
    EXPECT_THAT(result.message, HasSubstr("must lie in [-1, 200]")) << bad;
  }
  result = Parse({"--schedule=lifo"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("lifo"));
  // Choices are enums past the flags: a bad spelling never gets that far.
  result = Parse({"--device=gpu"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("gpu"));
  result = Parse({"--aggregation-scope=global"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("global"));
  result = Parse({"--krum-neighbours=all"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("all"));
  result = Parse({"--even-median=mean"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("mean"));
}

TEST_F(FlagsTest, RunIdIsAShortNameAndPartOfTheConsistencyLine) {
  ServerOptions o = ParseOk({"--run-id", "exp-7.b_2"});
  EXPECT_EQ(o.run_id, "exp-7.b_2");
  EXPECT_EQ(o.ConsistencySummary().rfind("run_id=exp-7.b_2 workers=1 ", 0), 0u)
      << o.ConsistencySummary();
  for (const std::string& bad : std::vector<std::string>{"a b", "a/b", std::string(129, 'x')}) {
    FlagsResult result = Parse({"--run-id", bad});
    EXPECT_EQ(result.exit_code, 2) << bad;
    EXPECT_THAT(result.message, HasSubstr("at most 128 letters, digits")) << bad;
  }
}

TEST_F(FlagsTest, MaxWorkersBoundsTheIdsAndMinWorkersIsTheQuorum) {
  ServerOptions o = ParseOk({"--workers", "4", "--max-workers", "8", "--min-workers", "3"});
  EXPECT_EQ(o.num_workers, 4u);
  EXPECT_EQ(o.WorkerIds(), 8u);
  EXPECT_EQ(o.quorum, 3u) << "--min-workers is --quorum's TorchElastic name";
  EXPECT_EQ(ParseOk({"--workers", "4"}).WorkerIds(), 4u) << "0: --workers";
  FlagsResult result = Parse({"--workers", "4", "--max-workers", "3"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--max-workers=3"));
  EXPECT_THAT(result.message, HasSubstr("--workers=4"));
  result = Parse({"--workers", "65537"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("must be at most 65536"));
  result = Parse({"--max-workers", "65537"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("65536"));
}

TEST_F(FlagsTest, ValidationErrorSaysWhereTheValueCameFrom) {
  FlagsResult result = Parse({"--workers=0"});
  EXPECT_THAT(result.message, Not(HasSubstr("[from")));
  SetEnv("PS_WORKERS", "0");
  result = Parse({});
  EXPECT_THAT(result.message, HasSubstr("--workers=0 (num_workers): must be at least 1 "
                                        "[from environment variable PS_WORKERS]"));
  unsetenv("PS_WORKERS");
  const std::string config = WriteConfig("round_deadline_ms = 0\n");
  result = Parse({"--config", config});
  EXPECT_THAT(result.message, HasSubstr("[from config file " + config + "]"));
  result = Parse({"--byzantine", "1"});
  EXPECT_THAT(result.message, HasSubstr("--byzantine=1"));
  SetEnv("HOSTNAME", "ps-server-7");
  result = Parse({"--shard-id=-1"});
  EXPECT_THAT(result.message, HasSubstr("[taken from host name \"ps-server-7\"]"));
}

TEST_F(FlagsTest, HelpListsEveryFlagWithDefaultAndVariable) {
  const FlagsResult result = Parse({"--help"});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 0);
  const std::string& help = result.message;
  for (const std::string& name : AllFlagNames()) {
    EXPECT_THAT(help, HasSubstr("--" + name)) << name;
    EXPECT_THAT(help, HasSubstr("[env: " + EnvFor(name) + "]")) << name;
  }
  for (const std::string flag : {"--config", "--help", "--version"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  for (const std::string group : {"Network:", "Topology:", "Rounds:", "Aggregation:", "Optimizer:",
                                  "Resources:", "Logging:", "Observability:"}) {
    EXPECT_THAT(help, HasSubstr(group));
  }
  // One [default: ...] per configurable flag, with the values of ServerOptions.
  size_t defaults = 0;
  for (size_t pos = help.find("[default: "); pos != std::string::npos;
       pos = help.find("[default: ", pos + 1)) {
    ++defaults;
  }
  EXPECT_EQ(defaults, AllFlagNames().size());
  for (const std::string def :
       {"[default: 127.0.0.1]", "[default: 7070]", "[default: 8388608]", "[default: 5000]",
        "[default: mean]", "[default: paper]", "[default: midpoint]", "[default: 0.1]",
        "[default: 0.9]", "[default: 10000]", "[default: info]", "[default: plain]",
        "[default: false]", "[default: none]"}) {
    EXPECT_THAT(help, HasSubstr(def));
  }
}

TEST_F(FlagsTest, HelpWinsOverOtherFlags) {
  const FlagsResult result = Parse({"--workers", "3", "--help"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.message, HasSubstr("--workers"));
}

TEST_F(FlagsTest, VersionPrintsTheVersion) {
  const FlagsResult result = Parse({"--version"});
  EXPECT_TRUE(result.exit_now);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.message, HasSubstr(ServerVersionString()));
  EXPECT_THAT(ServerVersionString(), HasSubstr("ps-server "));
}

TEST_F(FlagsTest, ShardIdComesFromStatefulSetHostname) {
  SetEnv("HOSTNAME", "ps-server-3");
  const ServerOptions o =
      ParseOk({"--shard-id=-1", "--num-shards", "4", "--peers", "a:1,b:1,c:1,d:1"});
  EXPECT_EQ(o.shard_id, 3);

  SetEnv("PS_SHARD_ID", "-1");
  SetEnv("HOSTNAME", "ps-server-1.ps-server.default.svc.cluster.local");
  EXPECT_EQ(ParseOk({"--num-shards", "2", "--peers", "a:1,b:1"}).shard_id, 1);
}

TEST_F(FlagsTest, ShardIdFromHostnameWithoutIndexIsAClearError) {
  SetEnv("HOSTNAME", "laptop");
  const FlagsResult result = Parse({"--shard-id", "-1"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, AllOf(HasSubstr("--shard-id"), HasSubstr("laptop")));
}

TEST_F(FlagsTest, PodIndexBeyondNumShardsIsRefused) {
  SetEnv("HOSTNAME", "ps-server-5");
  const FlagsResult result = Parse({"--shard-id=-1", "--num-shards=2", "--peers=a:1,b:1"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.message, HasSubstr("--shard-id=5"));
}

TEST(ShardIdFromHostnameTest, ReadsTheTrailingIndex) {
  EXPECT_EQ(*ShardIdFromHostname("ps-server-0"), 0);
  EXPECT_EQ(*ShardIdFromHostname("ps-server-12"), 12);
  EXPECT_EQ(*ShardIdFromHostname("web-3.svc.ns.svc.cluster.local"), 3);
  for (const char* bad : {"", "ps-server", "ps-server-", "ps-server-x3", "ps-server-3a",
                          "ps-server-99999999999", "ps-server-+3", "ps-server-3-.x"}) {
    EXPECT_FALSE(ShardIdFromHostname(bad).ok()) << bad;
  }
}

TEST_F(FlagsTest, NonLoopbackHostNeedsAllowInsecureRemote) {
  for (const std::string host : {"0.0.0.0", "10.1.2.3", "::", "example.com"}) {
    const FlagsResult result = Parse({"--host", host});
    EXPECT_EQ(result.exit_code, 2) << host;
    EXPECT_THAT(result.message, HasSubstr("--allow-insecure-remote")) << host;
    EXPECT_EQ(ParseOk({"--host", host, "--allow-insecure-remote"}).host, host);
  }
  for (const std::string host :
       {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"}) {
    EXPECT_EQ(ParseOk({"--host", host}).host, host);
  }
}

TEST_F(FlagsTest, AllowInsecureRemoteFromEnvironment) {
  SetEnv("PS_HOST", "0.0.0.0");
  SetEnv("PS_ALLOW_INSECURE_REMOTE", "true");
  EXPECT_TRUE(ParseOk({}).allow_insecure_remote);
}

// --- ServerOptions::Validate ---

struct BadOptionsCase {
  const char* name;
  std::function<void(ServerOptions&)> mutate;
  const char* expected;  // substring of the message
};

// Its name in test names: the default printer shows the bytes of the function object,
// which change from build to build, and ctest then cannot find the test again.
void PrintTo(const BadOptionsCase& c, std::ostream* os) { *os << c.name; }

class ValidateTest : public ::testing::TestWithParam<BadOptionsCase> {};

TEST_P(ValidateTest, RefusesWithMessageNamingTheFlag) {
  ServerOptions o;
  o.insecure = true;  // authentication is its own test
  ASSERT_TRUE(o.Validate().ok());
  GetParam().mutate(o);
  const absl::Status status = o.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr(GetParam().expected));
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void TwoShards(ServerOptions& o) {
  o.num_shards = 2;
  o.peers = {"a:1", "b:2"};
}

INSTANTIATE_TEST_SUITE_P(
    Ranges, ValidateTest,
    ::testing::Values(
        BadOptionsCase{"EmptyHost", [](ServerOptions& o) { o.host = ""; }, "--host"},
        BadOptionsCase{"UnknownPullCodec", [](ServerOptions& o) { o.pull_codec = "zip"; },
                       "--pull-codec=zip (pull_codec): unknown codec 'zip'"},
        BadOptionsCase{"UnknownAllowedCodec",
                       [](ServerOptions& o) { o.allowed_codecs = "fp32,zstd"; },
                       "--allowed-codecs=fp32,zstd (allowed_codecs): 'zstd' is not a codec "
                       "stage; known: fp32, fp16"},
        BadOptionsCase{"AllowedCodecTwice",
                       [](ServerOptions& o) { o.allowed_codecs = "fp16, fp16"; },
                       "'fp16' is listed twice"},
        BadOptionsCase{"NegativeDecodeBudget",
                       [](ServerOptions& o) { o.max_decode_ms = -1; },
                       "--max-decode-ms=-1 (max_decode_ms): must be a finite number >= 0"},
        BadOptionsCase{"NanDecodeBudget",
                       [](ServerOptions& o) {
                         o.max_decode_ms = std::numeric_limits<double>::quiet_NaN();
                       },
                       "--max-decode-ms=nan (max_decode_ms)"},
        BadOptionsCase{"PullCodecWithAggregateOnly",
                       [](ServerOptions& o) {
                         o.pull_codec = "fp16";
                         o.aggregate_only = true;
                       },
                       "with --aggregate-only the shard publishes gradients"},
        BadOptionsCase{"RemoteHost", [](ServerOptions& o) { o.host = "0.0.0.0"; },
                       "without TLS needs --tls-cert"},
        BadOptionsCase{"RemoteV6", [](ServerOptions& o) { o.host = "::"; },
                       "without TLS needs --tls-cert"},
        BadOptionsCase{"NotQuiteLoopback", [](ServerOptions& o) { o.host = "128.0.0.1"; },
                       "without TLS needs --tls-cert"},
        BadOptionsCase{"MessageTooSmall",
                       [](ServerOptions& o) { o.max_message_bytes = (64u << 10) - 1; },
                       "--max-message-bytes=65535"},
        BadOptionsCase{"MessageTooLarge",
                       [](ServerOptions& o) { o.max_message_bytes = (1u << 30) + 1; },
                       "--max-message-bytes=1073741825"},
        BadOptionsCase{"ZeroShards", [](ServerOptions& o) { o.num_shards = 0; }, "--num-shards=0"},
        BadOptionsCase{"TooManyShards", [](ServerOptions& o) { o.num_shards = 1025; },
                       "--num-shards=1025"},
        BadOptionsCase{"NegativeShardId", [](ServerOptions& o) { o.shard_id = -1; },
                       "--shard-id=-1"},
        BadOptionsCase{"ShardIdPastEnd",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.shard_id = 2;
                       },
                       "--shard-id=2"},
        BadOptionsCase{"PeersMissing", [](ServerOptions& o) { o.num_shards = 2; }, "--peers"},
        BadOptionsCase{"PeersWrongCount",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers.push_back("c:3");
                       },
                       "has 3 entries but --num-shards=2"},
        BadOptionsCase{"PeersWithOneShard",
                       [](ServerOptions& o) {
                         o.peers = {"a:1", "b:1"};
                       },
                       "--peers"},
        BadOptionsCase{"PeerWithoutPort",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[1] = "b";
                       },
                       "--peers entry 1 \"b\""},
        BadOptionsCase{"PeerPortZero",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[0] = "a:0";
                       },
                       "port out of range"},
        BadOptionsCase{"PeerPortTooLarge",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[0] = "a:65536";
                       },
                       "port out of range"},
        BadOptionsCase{"PeerPortNotNumber",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[0] = "a:http";
                       },
                       "not a number"},
        BadOptionsCase{"PeerEmptyHost",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[0] = ":7070";
                       },
                       "empty host"},
        BadOptionsCase{"PeerBareIpv6",
                       [](ServerOptions& o) {
                         TwoShards(o);
                         o.peers[0] = "::1:7070";
                       },
                       "brackets"},
        BadOptionsCase{"ZeroWorkers", [](ServerOptions& o) { o.num_workers = 0; }, "--workers=0"},
        BadOptionsCase{"ByzantineNotBelowWorkers",
                       [](ServerOptions& o) {
                         o.num_workers = 3;
                         o.num_byzantine = 3;
                       },
                       "--byzantine=3"},
        BadOptionsCase{"QuorumAboveWorkers",
                       [](ServerOptions& o) {
                         o.num_workers = 3;
                         o.quorum = 4;
                       },
                       "--quorum=4"},
        BadOptionsCase{"ZeroDeadline",
                       [](ServerOptions& o) { o.round_deadline = std::chrono::milliseconds(0); },
                       "--round-deadline-ms=0"},
        BadOptionsCase{"NegativeDeadline",
                       [](ServerOptions& o) { o.round_deadline = std::chrono::milliseconds(-5); },
                       "--round-deadline-ms=-5"},
        BadOptionsCase{"EmptyAggregator", [](ServerOptions& o) { o.aggregator = ""; },
                       "--aggregator"},
        BadOptionsCase{"MultiKrumMAboveWorkers",
                       [](ServerOptions& o) {
                         o.num_workers = 4;
                         o.multi_krum_m = 5;
                       },
                       "--multi-krum-m=5"},
        BadOptionsCase{"ZeroLearningRate", [](ServerOptions& o) { o.learning_rate = 0; }, "--lr=0"},
        BadOptionsCase{"NegativeLearningRate", [](ServerOptions& o) { o.learning_rate = -1; },
                       "--lr=-1"},
        BadOptionsCase{"NanLearningRate", [](ServerOptions& o) { o.learning_rate = kNaN; },
                       "--lr=nan"},
        BadOptionsCase{"InfLearningRate", [](ServerOptions& o) { o.learning_rate = kInf; },
                       "--lr=inf"},
        BadOptionsCase{"MomentumOne", [](ServerOptions& o) { o.momentum = 1.0f; }, "--momentum=1"},
        BadOptionsCase{"NegativeMomentum", [](ServerOptions& o) { o.momentum = -0.1f; },
                       "--momentum=-0.1"},
        BadOptionsCase{"NanMomentum", [](ServerOptions& o) { o.momentum = kNaN; },
                       "--momentum=nan"},
        BadOptionsCase{"NegativeWeightDecay", [](ServerOptions& o) { o.weight_decay = -0.5f; },
                       "--weight-decay=-0.5"},
        BadOptionsCase{"InfWeightDecay", [](ServerOptions& o) { o.weight_decay = kInf; },
                       "--weight-decay=inf"},
        BadOptionsCase{"UnknownLrSchedule", [](ServerOptions& o) { o.lr_schedule = "linear"; },
                       "--lr-schedule=linear (lr_schedule): lr schedule 'linear': unknown"},
        BadOptionsCase{"TooManyThreads", [](ServerOptions& o) { o.threads = 100000; },
                       "--threads=100000"},
        BadOptionsCase{"NegativeDrain",
                       [](ServerOptions& o) { o.drain_timeout = std::chrono::milliseconds(-1); },
                       "--drain-timeout-ms=-1"},
        BadOptionsCase{"LogLevel", [](ServerOptions& o) { o.log_level = "verbose"; },
                       "--log-level=verbose"},
        BadOptionsCase{"LogFormat", [](ServerOptions& o) { o.log_format = "xml"; },
                       "--log-format=xml"},
        BadOptionsCase{"RequestMemoryBelowTwoMessages",
                       [](ServerOptions& o) { o.max_request_memory_bytes = 8u << 20; },
                       "--max-request-memory-bytes=8388608"},
        BadOptionsCase{"NoPullStreams", [](ServerOptions& o) { o.max_pulls_per_worker = 0; },
                       "--max-pulls-per-worker=0"},
        BadOptionsCase{"StreamsBeyondAnInt",
                       [](ServerOptions& o) { o.max_streams_per_connection = 0x80000000u; },
                       "--max-streams-per-connection=2147483648"},
        BadOptionsCase{"NoDecoders", [](ServerOptions& o) { o.max_cached_decoders = 0; },
                       "--max-cached-decoders=0"},
        BadOptionsCase{
            "IdleTooShort",
            [](ServerOptions& o) { o.max_connection_idle = std::chrono::milliseconds(10); },
            "--max-connection-idle-ms=10"},
        BadOptionsCase{"NegativeRefusalRate", [](ServerOptions& o) { o.refusal_rate = -1; },
                       "--refusal-rate=-1"},
        BadOptionsCase{"NanRefusalRate", [](ServerOptions& o) { o.refusal_rate = NAN; },
                       "--refusal-rate=nan"},
        BadOptionsCase{"NoRefusalBurst", [](ServerOptions& o) { o.refusal_burst = 0.5; },
                       "--refusal-burst=0.5"},
        BadOptionsCase{"HoldTooLong",
                       [](ServerOptions& o) { o.refusal_hold = std::chrono::milliseconds(60001); },
                       "--refusal-hold-ms=60001"},
        BadOptionsCase{"NegativeQuarantine",
                       [](ServerOptions& o) { o.quarantine = std::chrono::milliseconds(-1); },
                       "--quarantine-ms=-1"},
        BadOptionsCase{"QuarantineTooLong",
                       [](ServerOptions& o) { o.quarantine = std::chrono::milliseconds(3600001); },
                       "--quarantine-ms=3600001"},
        BadOptionsCase{"WorkerTimeoutNegative",
                       [](ServerOptions& o) { o.worker_timeout = std::chrono::milliseconds(-1); },
                       "--worker-timeout-ms=-1"},
        BadOptionsCase{"WorkerTimeoutOverADay",
                       [](ServerOptions& o) { o.worker_timeout = std::chrono::milliseconds(86400001); },
                       "--worker-timeout-ms=86400001"},
        BadOptionsCase{"SuspicionWindowTooLong",
                       [](ServerOptions& o) { o.suspicion_window = 100001; },
                       "--suspicion-window=100001"},
        BadOptionsCase{"SuspicionThresholdZero",
                       [](ServerOptions& o) { o.suspicion_threshold = 0.0; },
                       "--suspicion-threshold=0"},
        BadOptionsCase{"SuspicionThresholdAboveOne",
                       [](ServerOptions& o) { o.suspicion_threshold = 1.5; },
                       "--suspicion-threshold=1.5"}),
    [](const ::testing::TestParamInfo<BadOptionsCase>& info) { return info.param.name; });

TEST(ValidateOkTest, AcceptsBoundaryValues) {
  ServerOptions o;
  o.insecure = true;  // authentication is its own test
  o.num_shards = 1024;
  o.shard_id = 1023;
  for (int i = 0; i < 1024; ++i) o.peers.push_back("ps-" + std::to_string(i) + ":65535");
  o.peers[0] = "[::1]:1";
  o.num_workers = 5;
  o.num_byzantine = 4;
  o.quorum = 5;
  o.multi_krum_m = 5;
  o.momentum = 0.0f;
  o.max_message_bytes = 64u << 10;
  o.drain_timeout = std::chrono::milliseconds(0);
  o.round_deadline = std::chrono::milliseconds(1);
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.max_message_bytes = 1u << 30;
  o.max_request_memory_bytes = 2ull << 30;
  o.quorum = 1;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

TEST(ValidateOkTest, AggregateOnlyIgnoresLearningRate) {
  ServerOptions o;
  o.insecure = true;  // authentication is its own test
  o.aggregate_only = true;
  o.learning_rate = 0.0f;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.aggregate_only = false;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(ValidateOkTest, QuorumBelowNMinusFIsAllowed) {
  ServerOptions o;
  o.insecure = true;  // authentication is its own test
  o.num_workers = 6;
  o.num_byzantine = 1;
  o.quorum = 1;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

TEST(ConsistencySummaryTest, ListsWhatShardsMustAgreeOn) {
  ServerOptions o;
  o.num_workers = 6;
  o.num_byzantine = 1;
  o.aggregator = "trimmed_mean";
  o.num_shards = 2;
  o.host = "10.0.0.1";  // not part of the summary
  o.port = 9999;        // nor this
  o.shard_id = 1;       // nor this
  EXPECT_EQ(o.ConsistencySummary(),
            "workers=6 max_workers=6 f=1 quorum=5 aggregator=trimmed_mean multi_krum_m=0 "
            "krum_neighbours=paper even_median=midpoint aggregation_scope=model "
            "aggregate_only=false lr=0.1 "
            "momentum=0.9 weight_decay=0 num_shards=2 lr_schedule=constant pull_codec=dense "
            "data_plane=tcp");
  // On gRPC's plane the field is left out, so that gRPC shards agree with shards from
  // before it; the planes differ.
  ServerOptions on_grpc = o;
  on_grpc.data_plane = core::DataPlane::kGrpc;
  EXPECT_THAT(on_grpc.ConsistencySummary(), ::testing::EndsWith(" pull_codec=dense"));
  ServerOptions other = o;
  other.shard_id = 0;
  other.port = 7070;
  EXPECT_EQ(other.ConsistencySummary(), o.ConsistencySummary());
  other.learning_rate = 0.01f;
  EXPECT_NE(other.ConsistencySummary(), o.ConsistencySummary());
  other = o;
  other.max_workers = 8;  // the shards must agree on the worker ids they accept
  EXPECT_NE(other.ConsistencySummary(), o.ConsistencySummary());
  // Shards stepping on different schedules would diverge: the schedule is checked too.
  ServerOptions scheduled = o;
  scheduled.lr_schedule = "step(every=100, gamma=0.5)";
  EXPECT_NE(scheduled.ConsistencySummary(), o.ConsistencySummary());
  // Shards pulling with different codecs would publish a model lossy on some slices
  // only, with error feedback on some: the pull codec is checked too.
  ServerOptions compressed = o;
  compressed.pull_codec = "fp16";
  EXPECT_NE(compressed.ConsistencySummary(), o.ConsistencySummary());
  EXPECT_THAT(compressed.ConsistencySummary(), ::testing::HasSubstr(" pull_codec=fp16 "));
}

}  // namespace
}  // namespace ps::server
