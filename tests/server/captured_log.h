// CapturedLog: the default spdlog logger's lines, captured for a test.
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ps::server {

// Captures the default logger's lines at debug and above while alive.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%l %v");
    auto logger = std::make_shared<spdlog::logger>("captured", sink);
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  // Lines at `level` ("warning", "error", "debug") containing `text`.
  int Count(const std::string& level, const std::string& text) const {
    std::istringstream in(out_.str());
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(level + " ", 0) == 0 && line.find(text) != std::string::npos) ++n;
    }
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace ps::server
