// spdlog set-up for maskd, request ids, and the bridge from the engine's LogFn to spdlog.
// Every line of a request's life carries its request id ("[rid] ..."), so one grep finds it all.
#pragma once

#include <string>

#include "model/api/engine.h"
#include "model/api/status.h"

namespace maskd::server {

// Logs to stderr; level is one of trace|debug|info|warn|error|critical|off.
Status SetupLogging(const std::string& level);

// Engine log lines, tagged with the device they come from.
LogFn EngineLogger(const std::string& device_label);

// Unique within the process and unlikely to repeat across restarts: "<4 hex random>-<counter>".
std::string NewRequestId();

// A client-chosen id (metadata "x-request-id") if it is short and printable, else NewRequestId().
std::string RequestIdFrom(const std::string& client_value);

}  // namespace maskd::server
