// spdlog set-up for maskd, request ids, and the bridge from the engine's LogFn to spdlog.
// Every line of a request's life carries its request id ("[rid] ..."), so one grep finds it all.
#pragma once

#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "model/api/engine.h"
#include "model/api/status.h"
#include "server/call_control.h"  // Clock, MicrosSince

namespace maskd::server {

// Logs to stderr; level is one of trace|debug|info|warn|error|critical|off.
Status SetupLogging(const std::string& level);

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
