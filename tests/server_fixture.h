// The shared fixture of the in-process server tests (hardening_server_test, hardening_corpus_test,
// server_service_test, server_embedding_test, server_http_front_test, server_security_test,
// client_embedding_test): a whole maskd (MaskServer) on fake engines on an ephemeral loopback port,
// a client connected to it, and small request builders. Everything goes through real gRPC.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "maskd/v1/maskd.pb.h"
#include "model/io/image_codec.h"
#include "server/config.h"
#include "server/server.h"
#include "tests/fake_engine.h"

namespace maskd::server {

using client::Client;
using client::ClientOptions;
using fake::FakeEngine;
using fake::FakeEngineOptions;

inline v1::Image EncodedPicture(int w, int h, int seed) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) {
    im.pixels[i] = static_cast<uint8_t>((i * 13 + static_cast<size_t>(seed) * 57) & 0xff);
  }
  v1::Image out;
  out.set_encoded(*EncodePngRgb(im));
  return out;
}

inline v1::Prompt Point(float x, float y) {
  v1::Prompt p;
  auto* pt = p.add_points();
  pt->set_x(x);
  pt->set_y(y);
  pt->set_label(v1::POINT_LABEL_FOREGROUND);
  return p;
}

// `threads` decode and postprocess threads each; `shutdown_grace_s` as the config field.
inline ServerConfig TestConfig(int threads = 1, int shutdown_grace_s = 2) {
  ServerConfig c;
  c.listen = "127.0.0.1:0";
  c.models_dir = "/nonexistent-maskd-test-models";
  c.device = "cpu:0";
  c.encoder_queue_delay_us = 0;
  c.decoder_queue_delay_us = 0;
  c.decode_threads = threads;
  c.postprocess_threads = threads;
  c.shutdown_grace_s = shutdown_grace_s;
  return c;
}

// `made`, when given, receives the (last) engine made, for tests that read its counters.
inline EngineFactory FakeFactory(FakeEngineOptions options = {}, std::atomic<FakeEngine*>* made = nullptr) {
  return [options, made](const EngineOptions& eo) -> StatusOr<std::unique_ptr<Engine>> {
    FakeEngineOptions fo = options;
    fo.device = eo.device;
    auto engine = std::make_unique<FakeEngine>(fo);
    if (made) made->store(engine.get());
    return std::unique_ptr<Engine>(std::move(engine));
  };
}

// A loaded server with fake engines and a client connected to it.
struct TestServer {
  explicit TestServer(ServerConfig c = TestConfig(), FakeEngineOptions fo = {})
      : server(c, FakeFactory(fo, &engine), 0) {
    spdlog::set_level(spdlog::level::err);
    Status s = server.Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
    ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server.port());
    co.timeout = std::chrono::milliseconds(20000);
    client = std::make_unique<Client>(co);
  }
  ~TestServer() { server.Shutdown(); }
  std::atomic<FakeEngine*> engine{nullptr};  // before `server`, whose factory writes it
  MaskServer server;
  std::unique_ptr<Client> client;
};

// What the server logs (spdlog's default logger) while one of these is alive, one "<level letter>
// <message>" line per record. Its text may be read while server threads still log: the sink's own
// lock guards it. `level` is the lowest level kept (tests that check a secret never reaches the log
// pass trace, so no level hides it).
class CapturedLog {
 public:
  explicit CapturedLog(spdlog::level::level_enum level = spdlog::level::debug)
      : old_(spdlog::default_logger()), sink_(std::make_shared<StringSink>()) {
    sink_->set_pattern("%L %v");
    auto logger = std::make_shared<spdlog::logger>("test-capture", sink_);
    logger->set_level(level);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(old_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() { return sink_->text(); }

 private:
  class StringSink final : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t formatted;
      formatter_->format(msg, formatted);
      text_.append(formatted.data(), formatted.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };

  std::shared_ptr<spdlog::logger> old_;
  std::shared_ptr<StringSink> sink_;
};

inline grpc::ByteBuffer Wire(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

inline std::string Serialized(const v1::SegmentRequest& r) {
  std::string out;
  EXPECT_TRUE(r.SerializeToString(&out));
  return out;
}

}  // namespace maskd::server
