// Issue #16 units: the --metrics-listen and --log-format settings, the metrics text, the metrics
// listener's bind errors, and the log formats with request ids (the engine's lines included).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "server/config.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/startup.h"

namespace maskd::server {
namespace {

// Cold start (issue #13): each milestone is recorded once, 0 until then, relative to the process's
// start (before this test's own start, and not days before).
TEST(OpsStartup, MilestonesAreRecordedOnceFromTheProcessStart) {
  const auto before = StartupTimes::Clock::now();
  StartupTimes t;
  EXPECT_LE(t.origin(), before);
  EXPECT_LT(std::chrono::duration<double>(before - t.origin()).count(), 3600.0);
  EXPECT_EQ(t.Ms(Milestone::kFirstMask), 0);
  EXPECT_FALSE(t.Reached(Milestone::kListening));
  const auto at = StartupTimes::Clock::now();
  EXPECT_TRUE(t.Mark(Milestone::kListening, at));
  EXPECT_FALSE(t.Mark(Milestone::kListening, at + std::chrono::seconds(5)));  // the first one stays
  const double want = std::chrono::duration<double, std::milli>(at - t.origin()).count();
  EXPECT_NEAR(t.Ms(Milestone::kListening), want, 0.002);
  EXPECT_TRUE(t.Mark(Milestone::kFirstMask, at + std::chrono::milliseconds(250)));
  v1::StartupTimes p;
  t.Fill(&p);
  EXPECT_DOUBLE_EQ(p.listening_ms(), t.Ms(Milestone::kListening));
  EXPECT_NEAR(p.first_mask_ms() - p.listening_ms(), 250.0, 0.002);
  EXPECT_EQ(p.serving_ms(), 0);
  EXPECT_EQ(p.main_ms(), 0);  // MarkProcessMain was not called in this test binary
  EXPECT_STREQ(MilestoneName(Milestone::kWeightsReady), "weights_ready");
}

ConfigParseResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "maskd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseConfig(static_cast<int>(argv.size()), argv.data());
}

TEST(OpsConfig, MetricsListenAndLogFormatParse) {
  ConfigParseResult r = Parse({"--metrics-listen", "127.0.0.1:9090", "--log-format", "json"});
  ASSERT_FALSE(r.exit) << r.output;
  EXPECT_EQ(r.config.metrics_listen, "127.0.0.1:9090");
  EXPECT_EQ(r.config.log_format, "json");
  ConfigParseResult d = Parse({});
  ASSERT_FALSE(d.exit) << d.output;
  EXPECT_EQ(d.config.metrics_listen, "");  // off by default
  EXPECT_EQ(d.config.log_format, "text");
}

TEST(OpsConfig, BadValuesNameTheFlag) {
  ConfigParseResult bad_format = Parse({"--log-format", "xml"});
  EXPECT_TRUE(bad_format.exit);
  EXPECT_NE(bad_format.exit_code, 0);
  EXPECT_NE(bad_format.output.find("--log-format"), std::string::npos) << bad_format.output;

  ServerConfig c;
  c.metrics_listen = "localhost";  // no port
  Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("--metrics-listen = \"localhost\"", 0), 0u) << s.message();
  c.metrics_listen = "127.0.0.1:70000";
  EXPECT_NE(ValidateConfig(c).message().find("--metrics-listen"), std::string::npos);
  c.metrics_listen = "";
  c.log_format = "xml";
  EXPECT_EQ(ValidateConfig(c).code(), StatusCode::kInvalidArgument);
}

TEST(OpsMetrics, SerializeCountsCallsWithBoundedLabels) {
  Metrics m;
  m.ObserveCall("Segment", StatusCode::kOk, 0.02);
  m.ObserveCall("Segment", StatusCode::kOk, 0.03);
  m.ObserveCall("Segment", StatusCode::kNotFound, 0.001);
  m.ObserveEncoderBatch("cpu", 3);
  m.ObserveStage("cpu", Stage::kEncoderCompute, 1500);
  const std::string text = m.Serialize();
  EXPECT_NE(text.find("# TYPE maskd_requests_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("maskd_requests_total{code=\"OK\",method=\"Segment\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("maskd_requests_total{code=\"NOT_FOUND\",method=\"Segment\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("maskd_request_duration_seconds_count{method=\"Segment\"} 3"), std::string::npos)
      << text;
  EXPECT_NE(text.find("maskd_encoder_batch_size_sum{device=\"cpu\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("maskd_stage_duration_seconds_sum{device=\"cpu\",stage=\"encoder_compute\"} 0.0015"),
            std::string::npos)
      << text;
  // No info source yet: no scrape-time families.
  EXPECT_EQ(text.find("maskd_model_info"), std::string::npos);
}

TEST(OpsMetrics, ListenerOnATakenPortIsUnavailableNamingTheFlag) {
  Metrics m;
  StatusOr<std::unique_ptr<MetricsListener>> first = MetricsListener::Start("127.0.0.1:0", m);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const int port = (*first)->port();
  ASSERT_GT(port, 0);
  const std::string taken = "127.0.0.1:" + std::to_string(port);
  StatusOr<std::unique_ptr<MetricsListener>> second = MetricsListener::Start(taken, m);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--metrics-listen = \"" + taken + "\""), std::string::npos)
      << second.status().message();
}

// SetupLogging's formatter goes to every registered logger, so a test logger registered before it
// and made the default afterwards shows exactly what maskd would write.
class CapturedLog {
 public:
  explicit CapturedLog(const std::string& format) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    logger_ = std::make_shared<spdlog::logger>("ops_unit_test_capture", sink);
    spdlog::register_logger(logger_);
    EXPECT_TRUE(SetupLogging("debug", format).ok());
    logger_->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger_);
  }
  ~CapturedLog() {
    spdlog::drop("ops_unit_test_capture");
    spdlog::set_default_logger(spdlog::get("maskd"));
  }
  std::vector<std::string> Lines() {
    logger_->flush();
    std::vector<std::string> lines;
    std::istringstream in(out_.str());
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> logger_;
};

TEST(OpsLogs, TextLinesCarryTheIdsInScope) {
  CapturedLog log("text");
  LogRequest(spdlog::level::info, "rid-1", "access method={}", "Segment");
  {
    ScopedRequestIds batch(std::vector<std::string>{"rid-1", "rid-2"});
    EngineLogger("cpu")(LogLevel::kWarning, "slow pass");
  }
  spdlog::info("not a request");
  const std::vector<std::string> lines = log.Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find(" I "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("[rid-1] access method=Segment"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("[rid-1,rid-2] [engine cpu] slow pass"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2].find('['), std::string::npos) << lines[2];  // the scope ended
}

TEST(OpsLogs, JsonLinesAreObjectsWithTheIdsAsFields) {
  CapturedLog log("json");
  LogRequest(spdlog::level::info, "q\"uote\\d", "access {}", "line\nbreak");
  {
    ScopedRequestIds batch(std::vector<std::string>{"a", "b"});
    EngineLogger("cuda:0")(LogLevel::kError, "out of memory");
    // A nested scope (a request line inside a batch) wins, then the batch's ids are back.
    LogRequest(spdlog::level::debug, "c", "inner");
    spdlog::info("batch again");
  }
  spdlog::info("bad utf-8 \xff here");
  const std::vector<std::string> lines = log.Lines();
  ASSERT_EQ(lines.size(), 5u);
  std::vector<nlohmann::json> o;
  for (const std::string& l : lines) {
    ASSERT_NO_THROW(o.push_back(nlohmann::json::parse(l))) << l;
    for (const char* key : {"ts", "level", "thread", "msg"}) EXPECT_TRUE(o.back().contains(key)) << l;
  }
  EXPECT_EQ(o[0]["request_id"], "q\"uote\\d");
  EXPECT_EQ(o[0]["msg"], "access line\nbreak");
  EXPECT_EQ(o[0]["level"], "info");
  EXPECT_EQ(o[1]["request_ids"], nlohmann::json::array({"a", "b"}));
  EXPECT_EQ(o[1]["msg"], "[engine cuda:0] out of memory");
  EXPECT_EQ(o[1]["level"], "error");
  EXPECT_EQ(o[2]["request_id"], "c");
  EXPECT_EQ(o[3]["request_ids"], nlohmann::json::array({"a", "b"}));
  EXPECT_FALSE(o[4].contains("request_id"));
  EXPECT_FALSE(o[4].contains("request_ids"));
}

}  // namespace
}  // namespace maskd::server
