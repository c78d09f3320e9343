// Issue #14, finding 3: settings that parse but leave the API unusable are refused at start-up, with
// a message naming the flag, the value and what is expected.
#include <gtest/gtest.h>

#include <cmath>

#include "server/config.h"

namespace maskd::server {
namespace {

ConfigParseResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "maskd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseConfig(static_cast<int>(argv.size()), argv.data());
}

void ExpectRefused(const std::vector<std::string>& args, const std::vector<std::string>& mentions) {
  ConfigParseResult r = Parse(args);
  EXPECT_TRUE(r.exit) << args[0];
  EXPECT_NE(r.exit_code, 0) << args[0];
  for (const auto& m : mentions) {
    EXPECT_NE(r.output.find(m), std::string::npos) << "\"" << m << "\" missing from: " << r.output;
  }
}

TEST(HardeningConfig, ZeroByteLimitsAreRefused) {
  ExpectRefused({"--max-image-bytes", "0"}, {"--max-image-bytes", "= 0", "expected at least 1 byte"});
  ExpectRefused({"--cache-device-bytes", "0"}, {"--cache-device-bytes", "= 0", "expected at least"});
  ExpectRefused({"--result-store-bytes", "0B"}, {"--result-store-bytes", "= 0", "expected at least"});
  ExpectRefused({"--max-inflight-bytes", "0"}, {"--max-inflight-bytes", "= 0", "expected at least"});
  EXPECT_EQ(Parse({"--max-inflight-bytes", "3GiB"}).config.max_inflight_bytes, uint64_t{3} << 30);
  // The host tier may be off.
  EXPECT_FALSE(Parse({"--cache-host-bytes", "0"}).exit);
  EXPECT_FALSE(Parse({"--max-image-bytes", "1"}).exit);
}

TEST(HardeningConfig, NanGracePeriodIsRefused) {
  ExpectRefused({"--shutdown-grace-s", "nan"}, {"--shutdown-grace-s", "nan", "expected", "3600"});
  ExpectRefused({"--shutdown-grace-s", "-1"}, {"--shutdown-grace-s"});
  auto ok = Parse({"--shutdown-grace-s", "0"});
  EXPECT_FALSE(ok.exit) << ok.output;
}

TEST(HardeningConfig, BooleansAreBooleanWords) {
  ExpectRefused({"--warmup", "2"}, {"--warmup", "\"2\"", "expected true, false"});
  ExpectRefused({"--access-log", "maybe"}, {"--access-log", "maybe"});
  for (const char* yes : {"true", "1", "on", "yes"}) {
    auto r = Parse({"--warmup", yes});
    EXPECT_FALSE(r.exit) << yes << ": " << r.output;
    EXPECT_TRUE(r.config.warmup) << yes;
  }
  for (const char* no : {"false", "0", "off", "no"}) {
    auto r = Parse({"--warmup", no});
    EXPECT_FALSE(r.exit) << no << ": " << r.output;
    EXPECT_FALSE(r.config.warmup) << no;
  }
}

TEST(HardeningConfig, ValidateConfigCatchesProgrammaticConfigsToo) {
  ServerConfig c;
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.result_store_bytes = 0;
  EXPECT_EQ(ValidateConfig(c).code(), StatusCode::kInvalidArgument);
  c = ServerConfig();
  c.shutdown_grace_s = std::nan("");
  Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--shutdown-grace-s = nan"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace maskd::server
