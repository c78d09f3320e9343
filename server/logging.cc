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

namespace {

// Length of the valid UTF-8 sequence at s[i] (1 .. 4), or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid too).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1fu;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0fu;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07u;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3fu);
  }
  const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

}  // namespace

std::string LogSafe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[8];
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++i;
    } else if (n == 1 && (c < 0x20 || c == 0x7f || c == '\\')) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\\': out += "\\\\"; break;
        default:
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
      }
      ++i;
    } else if (n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) {
      // C1 controls (U+0080 .. U+009F): some terminals act on them.
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(text[i + 1]));
      out += buf;
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace maskd::server
