#include "server/flags.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "crypto/cluster_secret.h"
#include "server/config_file.h"
#include "server/flags_internal.h"

// The build may pass the project version; the fallback keeps a plain compile working.
#ifndef PS_SERVER_VERSION
#define PS_SERVER_VERSION "0.1.0"
#endif

namespace ps::server {
namespace {

constexpr char kProgram[] = "ps-server";
constexpr int kUsageExitCode = 2;

// The help shows, for every option, its type, its default and its variable; CLI11's
// stock formatter leaves out the default of flags and of empty values.
class HelpFormatter final : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(kNameWidth); }

  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty()) {
      absl::StrAppend(&out, " ", opt->get_type_name());
    }
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    // Words of the description, then the annotations, each kept on one line.
    std::vector<std::string> tokens;
    std::istringstream words(opt->get_description());
    for (std::string word; words >> word;) tokens.push_back(word);
    if (opt->get_configurable()) {
      std::string def = opt->get_default_str();
      if (opt->get_type_size() == 0) {
        def = def.empty() ? "false" : def;
      } else if (def.empty() || def == "[]") {
        def = "none";
      }
      tokens.push_back(absl::StrCat("[default: ", def, "]"));
    }
    if (!opt->get_envname().empty())
      tokens.push_back(absl::StrCat("[env: ", opt->get_envname(), "]"));
    return Wrap(tokens, kDescriptionWidth);
  }

 private:
  static constexpr size_t kNameWidth = 36;
  static constexpr size_t kDescriptionWidth = 100 - kNameWidth;

  // Joins tokens with spaces, breaking lines before `width`; CLI11 indents the lines
  // after each '\n' to the description column.
  static std::string Wrap(const std::vector<std::string>& tokens, size_t width) {
    std::string out;
    size_t line = 0;
    for (const std::string& token : tokens) {
      if (line > 0 && line + 1 + token.size() > width) {
        out += '\n';
        line = 0;
      } else if (line > 0) {
        out += ' ';
        ++line;
      }
      out += token;
      line += token.size();
    }
    return out;
  }
};

// Parses one value for one flag on a fresh parser, to find out whether that value is
// the one CLI11 choked on. Returns the error, or nothing when the value is fine.
std::optional<std::string> CheckAlone(const std::string& name,
                                      const std::vector<std::string>& values) {
  CLI::App app(kProgram);
  ServerOptions scratch;
  RawFlagValues raw;
  DefineFlags(app, scratch, raw, /*with_env=*/false);
  const std::string arg = absl::StrCat("--", name, "=", absl::StrJoin(values, ","));
  const char* const argv[] = {kProgram, arg.c_str()};
  try {
    app.parse(2, argv);
  } catch (const CLI::ParseError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// After a failed parse: the first PS_* variable, then the first config key, whose
// value does not parse alone, as a message naming the variable or key.
std::optional<std::string> BlameSource(const std::vector<std::string>& names,
                                       const ServerConfigReader& reader,
                                       const std::string& config_file) {
  for (const std::string& name : names) {
    const std::string env = EnvName(name);
    const std::optional<std::string> value = GetEnv(env);
    if (!value.has_value()) continue;
    if (auto error = CheckAlone(name, {*value})) {
      return absl::StrCat("environment variable ", env, "=\"", *value, "\": ", *error);
    }
  }
  for (const CLI::ConfigItem& item : reader.used_items()) {
    if (auto error = CheckAlone(item.name, item.inputs)) {
      return absl::StrCat("config file ", config_file, ", key \"", item.name, "\": ", *error);
    }
  }
  return std::nullopt;
}

FlagsResult Exit(int code, std::string message) {
  FlagsResult result;
  result.exit_now = true;
  result.exit_code = code;
  result.message = std::move(message);
  return result;
}

FlagsResult UsageError(absl::string_view what) {
  return Exit(kUsageExitCode,
              absl::StrCat(kProgram, ": ", what, "\nRun with --help for the list of flags.\n"));
}

std::string LocalHostname() {
  if (std::optional<std::string> env = GetEnv("HOSTNAME")) return *env;
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string();
  return std::string(buf);
}

bool HasFlag(int argc, const char* const* argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == flag || (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
                        arg[flag.size()] == '=')) {
      return true;
    }
  }
  return false;
}

FlagsResult ParseOrExit(int argc, const char* const* argv) {
  FlagsResult result;
  RawFlagValues raw;
  CLI::App app(
      "ps-server: one shard of a parameter server with Byzantine-robust aggregation.\n"
      "Every flag can also be set by its PS_* environment variable or by its long name as\n"
      "a key in the --config TOML file; precedence is flag > environment > file > default.",
      kProgram);
  app.formatter(std::make_shared<HelpFormatter>());
  app.set_version_flag("--version", ServerVersionString(), "Print the version and exit");
  app.get_help_ptr()->description("Print this help and exit");

  const std::vector<std::string> names = DefineFlags(app, result.options, raw, /*with_env=*/true);
  auto reader =
      std::make_shared<ServerConfigReader>(std::set<std::string>(names.begin(), names.end()));
  app.config_formatter(reader);
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "TOML file with flag values (keys: long flag names); see docs/configuration.md")
      ->envname("PS_CONFIG")
      ->type_name("FILE");

  // CLI11 reads the config file before it looks at the environment, so it would never
  // see PS_CONFIG; passing it as the flag (when the flag is absent) keeps the same
  // precedence and makes a missing file an error, as with --config.
  std::vector<const char*> args(argv, argv + std::max(argc, 0));
  if (args.empty()) args.push_back(kProgram);
  const std::optional<std::string> env_config = GetEnv("PS_CONFIG");
  if (env_config.has_value() && !HasFlag(static_cast<int>(args.size()), args.data(), "--config")) {
    args.push_back("--config");
    args.push_back(env_config->c_str());
  }

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp&) {
    return Exit(0, app.help());
  } catch (const CLI::CallForAllHelp&) {
    return Exit(0, app.help("", CLI::AppFormatMode::All));
  } catch (const CLI::CallForVersion& e) {
    return Exit(0, absl::StrCat(e.what(), "\n"));
  } catch (const CLI::ExtrasError&) {
    return UsageError(
        absl::StrCat("unknown flag or unexpected argument: ", absl::StrJoin(app.remaining(), " ")));
  } catch (const CLI::FileError& e) {
    return UsageError(absl::StrCat("--config: ", e.what()));
  } catch (const CLI::ParseError& e) {
    std::string config_file;
    if (const CLI::Option* config = app.get_config_ptr();
        config != nullptr && config->count() > 0) {
      config_file = config->as<std::string>();
    }
    if (dynamic_cast<const CLI::ConfigError*>(&e) != nullptr) {
      return UsageError(absl::StrCat("config file ", config_file, ": ", e.what()));
    }
    if (std::optional<std::string> blamed = BlameSource(names, *reader, config_file)) {
      return UsageError(*blamed);
    }
    return UsageError(e.what());
  }

  ServerOptions& o = result.options;
  ApplyRawFlagValues(raw, o);

  // Secure by default: without any way of telling clients apart, and unless told to run
  // insecure, the shard uses (and on first start makes) the secret of its run directory.
  if (!o.insecure && !o.ClientAuthRequired()) {
    absl::StatusOr<std::string> dir = crypto::DefaultRunDirectory();
    if (!dir.ok()) return UsageError(dir.status().message());
    o.run_dir = *dir;
  }

  std::string resolved_from;
  if (o.shard_id == -1) {
    const std::string hostname = LocalHostname();
    absl::StatusOr<int> id = ShardIdFromHostname(hostname);
    if (!id.ok()) return UsageError(absl::StrCat("--shard-id=-1: ", id.status().message()));
    o.shard_id = *id;
    resolved_from = absl::StrCat("taken from host name \"", hostname, "\"");
  }

  if (absl::Status status = o.Validate(); !status.ok()) {
    // Validate names the flag ("--momentum=1.5 ..."); say where the value came from,
    // since with a ConfigMap and a Deployment's env the operator may not know.
    const std::string message(status.message());
    std::string source;
    if (absl::StartsWith(message, "--")) {
      const std::string name = message.substr(2, message.find_first_of("= ") - 2);
      const bool from_reader =
          std::any_of(reader->used_items().begin(), reader->used_items().end(),
                      [&](const CLI::ConfigItem& item) { return item.name == name; });
      if (name == "shard-id" && !resolved_from.empty()) {
        source = resolved_from;
      } else if (HasFlag(argc, argv, "--" + name)) {
        source = "";  // on the command line: the user just typed it
      } else if (GetEnv(EnvName(name)).has_value()) {
        source = absl::StrCat("from environment variable ", EnvName(name));
      } else if (from_reader && app.get_config_ptr()->count() > 0) {
        source = absl::StrCat("from config file ", app.get_config_ptr()->as<std::string>());
      } else {
        source = "the default";
      }
    }
    return UsageError(absl::StrCat("invalid configuration: ", message,
                                   source.empty() ? "" : absl::StrCat(" [", source, "]")));
  }
  return result;
}

}  // namespace

absl::StatusOr<int> ShardIdFromHostname(std::string_view hostname) {
  // A pod's FQDN is <pod>.<service>.<namespace>...; the index is on the first label.
  const std::string_view label = hostname.substr(0, hostname.find('.'));
  const size_t dash = label.rfind('-');
  const std::string_view suffix =
      dash == std::string_view::npos ? std::string_view() : label.substr(dash + 1);
  int id = 0;
  const bool numeric =
      !suffix.empty() && suffix.size() <= 9 &&
      std::all_of(suffix.begin(), suffix.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      absl::SimpleAtoi(absl::string_view(suffix.data(), suffix.size()), &id);
  if (!numeric) {
    return absl::InvalidArgumentError(
        absl::StrCat("host name \"", std::string(hostname),
                     "\" does not end in -N (a StatefulSet pod index such as ps-server-3); pass "
                     "--shard-id explicitly"));
  }
  return id;
}

std::string ServerVersionString() { return absl::StrCat(kProgram, " ", PS_SERVER_VERSION); }

FlagsResult ParseServerFlags(int argc, const char* const* argv) {
  try {
    return ParseOrExit(argc, argv);
  } catch (const std::exception& e) {
    // CLI11 construction errors and allocation failures: report, never propagate.
    return UsageError(absl::StrCat("internal error while parsing flags: ", e.what()));
  }
}

}  // namespace ps::server
