#include "server/logging.h"

#include <atomic>
#include <cstdio>
#include <random>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace maskd::server {

Status SetupLogging(const std::string& level) {
  const spdlog::level::level_enum l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") {
    return InvalidArgument("--log-level = \"" + level +
                           "\" (expected trace, debug, info, warn, error, critical or off)");
  }
  auto logger = spdlog::get("maskd");
  if (!logger) logger = spdlog::stderr_color_mt("maskd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %t %v");
  spdlog::set_level(l);
  spdlog::flush_on(spdlog::level::warn);
  return Status::Ok();
}

LogFn EngineLogger(const std::string& device_label) {
  return [device_label](LogLevel level, std::string_view message) {
    spdlog::level::level_enum l = spdlog::level::info;
    switch (level) {
      case LogLevel::kDebug: l = spdlog::level::debug; break;
      case LogLevel::kInfo: l = spdlog::level::info; break;
      case LogLevel::kWarning: l = spdlog::level::warn; break;
      case LogLevel::kError: l = spdlog::level::err; break;
    }
    spdlog::log(l, "[engine {}] {}", device_label, message);
  };
}

std::string NewRequestId() {
  static const unsigned prefix = [] {
    std::random_device rd;
    return rd() & 0xffffu;
  }();
  static std::atomic<uint64_t> counter{0};
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x-%llu", prefix,
                static_cast<unsigned long long>(counter.fetch_add(1) + 1));  // NOLINT
  return buf;
}

std::string RequestIdFrom(const std::string& client_value) {
  if (client_value.empty() || client_value.size() > 64) return NewRequestId();
  for (char c : client_value) {
    if (c < 0x21 || c > 0x7e) return NewRequestId();
  }
  return client_value;
}

std::string ClientRequestId(grpc::CallbackServerContext* context) {
  const auto& md = context->client_metadata();
  auto it = md.find("x-request-id");
  return RequestIdFrom(it == md.end() ? std::string() : std::string(it->second.data(), it->second.size()));
}

}  // namespace maskd::server
