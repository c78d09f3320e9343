// spdlog set-up for maskd, request ids, and the bridge from the engine's LogFn to spdlog.
// Every line of a request's life carries its request id, so one grep (text) or one filter (json)
// finds it all: the RPC's lines through LogRequest, the batchers' and the engine's lines through
// the ids a batcher puts in scope (ScopedRequestIds) while it works for them.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "model/api/engine.h"
#include "model/api/status.h"
#include "server/call_control.h"  // Clock, MicrosSince

namespace maskd::server {

// Logs to stderr; level is one of trace|debug|info|warn|error|critical|off; format "text"
// ("2026-01-02 03:04:05.678 I 1234 [rid] message") or "json" (one object per line: ts (UTC,
// RFC 3339 with milliseconds), level, thread, request_id (one request) or request_ids (a batch of
// several), msg).
Status SetupLogging(const std::string& level, const std::string& format = "text");

// The request ids the lines logged on this thread belong to, while it exists (nested scopes
// replace, then restore, the outer one). Lines logged in scope show them: text "[a] " or
// "[a,b] ", json request_id / request_ids.
class ScopedRequestIds {
 public:
  explicit ScopedRequestIds(std::vector<std::string> ids);
  explicit ScopedRequestIds(std::string id) : ScopedRequestIds(std::vector<std::string>{std::move(id)}) {}
  ~ScopedRequestIds();
  ScopedRequestIds(const ScopedRequestIds&) = delete;
  ScopedRequestIds& operator=(const ScopedRequestIds&) = delete;

 private:
  std::vector<std::string> ids_;
  const std::vector<std::string>* outer_;
};

// One line of request `request_id`'s life.
template <typename... Args>
void LogRequest(spdlog::level::level_enum level, const std::string& request_id,
                spdlog::format_string_t<Args...> format, Args&&... args) {
  if (!spdlog::should_log(level)) return;
  ScopedRequestIds scope(request_id);
  spdlog::log(level, format, std::forward<Args>(args)...);
}

// Engine log lines, tagged with the device they come from.
LogFn EngineLogger(const std::string& device_label);

// Unique within the process and unlikely to repeat across restarts: "<4 hex random>-<counter>".
std::string NewRequestId();

// A client-chosen id (metadata "x-request-id") if it is short and printable, else NewRequestId().
std::string RequestIdFrom(const std::string& client_value);

// The request id of a call: its x-request-id metadata through RequestIdFrom.
std::string ClientRequestId(grpc::CallbackServerContext* context);

// Milliseconds since t0 (access-log latencies).
inline double Millis(Clock::time_point t0) { return static_cast<double>(MicrosSince(t0)) / 1000.0; }

// Text that came from a request (tags, ids, error messages that echo request fields), made safe for
// one log line: control characters (C0, DEL, C1) become \n, \r, \t, \xHH or \u00HH, bytes that are
// not valid UTF-8 become \xHH, and a backslash becomes \\ so that an escape cannot be forged
// either. Every log line that carries such text passes it through here: a newline in request_tag
// must not start a forged log line.
std::string LogSafe(std::string_view text);

}  // namespace maskd::server
