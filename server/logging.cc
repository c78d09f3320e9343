#include "server/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace maskd::server {

namespace {

// The ids of the innermost ScopedRequestIds of this thread (null: none). spdlog's loggers here
// are synchronous, so a formatter runs on the thread that logged and sees that thread's scope.
thread_local const std::vector<std::string>* t_request_ids = nullptr;

// %R in the text pattern: "[id] " or "[a,b] " in scope, nothing outside.
class RequestIdFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (t_request_ids == nullptr || t_request_ids->empty()) return;
    dest.push_back('[');
    for (size_t i = 0; i < t_request_ids->size(); ++i) {
      if (i > 0) dest.push_back(',');
      const std::string& id = (*t_request_ids)[i];
      dest.append(id.data(), id.data() + id.size());
    }
    dest.append(std::string_view("] "));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RequestIdFlag>();
  }
};

// One JSON object per line. nlohmann's dump escapes what a log shipper's parser must not see raw
// (quotes, control characters) and replaces invalid UTF-8 instead of throwing.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
    std::tm utc{};
    gmtime_r(&secs, &utc);
    char ts[40];
    const size_t n = std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &utc);
    std::snprintf(ts + n, sizeof ts - n, ".%03dZ", static_cast<int>(millis));
    nlohmann::ordered_json line;  // ts, level, ... in this order, as people read them
    line["ts"] = ts;
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["thread"] = msg.thread_id;
    if (t_request_ids != nullptr && t_request_ids->size() == 1) {
      line["request_id"] = t_request_ids->front();
    } else if (t_request_ids != nullptr && t_request_ids->size() > 1) {
      line["request_ids"] = *t_request_ids;
    }
    line["msg"] = std::string(msg.payload.data(), msg.payload.size());
    const std::string text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

ScopedRequestIds::ScopedRequestIds(std::vector<std::string> ids)
    : ids_(std::move(ids)), outer_(t_request_ids) {
  t_request_ids = &ids_;
}

ScopedRequestIds::~ScopedRequestIds() { t_request_ids = outer_; }

Status SetupLogging(const std::string& level, const std::string& format) {
  const spdlog::level::level_enum l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") {
    return InvalidArgument("--log-level = \"" + level +
                           "\" (expected trace, debug, info, warn, error, critical or off)");
  }
  if (format != "text" && format != "json") {
    return InvalidArgument("--log-format = \"" + format + "\" (expected text or json)");
  }
  auto logger = spdlog::get("maskd");
  if (!logger) logger = spdlog::stderr_color_mt("maskd");
  spdlog::set_default_logger(logger);
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  } else {
    auto text = std::make_unique<spdlog::pattern_formatter>();
    text->add_flag<RequestIdFlag>('R').set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %t %R%v");
    spdlog::set_formatter(std::move(text));
  }
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
