// SegmentStream's session (server/stream_session.h) on a transport of plain threads, against
// maskd's service on a fake engine (its MaskService, pipeline, batchers and pools; no gRPC server). The transport keeps gRPC's callback rules (one read and one write outstanding,
// completions on any thread or inline, Close only after End and every completion) and checks that
// the session keeps them too.
//
// Why not through gRPC: this suite exists for ThreadSanitizer (CI runs it in the TSan tree).
// Debian's gRPC and abseil are not instrumented, so through a real stream TSan sees none of gRPC's
// own synchronisation and reports every hand-over between its threads (RELIABILITY.md). Here every
// hand-over the session depends on is a mutex TSan can see, so a report is a race of maskd's own:
// the session's state between reads, writes, pipeline completions on pool threads, a cancel from
// the client's side and a drain from the shutdown thread. server_service_test covers the same
// session through real gRPC (without TSan).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "maskd/v1/maskd.pb.h"
#include "server/device_worker.h"
#include "server/mask_service.h"
#include "server/metrics.h"
#include "server/pipeline.h"
#include "server/router.h"
#include "server/thread_pool.h"
#include "server/stream_session.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using namespace std::chrono_literals;

// How the client side of a scripted stream ends after its messages.
enum class ClientEnd {
  kHalfClose,  // WritesDone: the next read completes with ok = false
  kStayOpen,   // the next read stays outstanding until the stream is cancelled or ended
};

// One stream's transport: three worker threads run the completions in random order after random
// short delays; a quarter of them run inline inside Read/Write (once bound), as gRPC may do.
class ThreadTransport final : public StreamTransport {
 public:
  ThreadTransport(std::vector<std::string> messages, ClientEnd end, uint64_t seed)
      : messages_(std::move(messages)), client_end_(end), rng_(seed) {
    for (int i = 0; i < 3; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~ThreadTransport() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // The session OpenStream returned; completions run only once it is bound (gRPC holds a
  // reactor's operations until the handler has returned it).
  void Bind(std::unique_ptr<StreamSession> session) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_ = std::move(session);
    }
    cv_.notify_all();
  }

  // The client cancels: OnCancel, and the outstanding operations complete with ok = false.
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_posted_) return;  // over already
    cancelled_ = true;
    ++in_flight_;  // OnDone comes after OnCancel
    Post([this] {
      session_ptr()->OnCancel();
      Completed();
    });
    ReleaseParkedReadLocked();
  }

  // Blocks until the session is closed; false after `timeout` (a stream that never ends).
  bool WaitClosed(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return closed_cv_.wait_for(lock, timeout, [this] { return closed_; });
  }

  // Blocks until `n` responses were written (or the stream closed).
  void WaitWritten(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    closed_cv_.wait_for(lock, 20s, [&] { return written_.size() >= n || closed_; });
  }

  void Read(grpc::ByteBuffer* into) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (read_outstanding_) violations_.push_back("a second read started while one was outstanding");
    if (ended_) violations_.push_back("a read started after End");
    read_outstanding_ = true;
    ++in_flight_;
    into_ = into;
    PostOrInline(std::move(lock), [this] { CompleteRead(); });
  }

  void Write(const grpc::ByteBuffer* message) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (write_outstanding_) violations_.push_back("a second write started while one was outstanding");
    if (ended_) violations_.push_back("a write started after End");
    write_outstanding_ = true;
    ++in_flight_;
    PostOrInline(std::move(lock), [this, message] {
      std::vector<grpc::Slice> slices;
      v1::SegmentResponse r;
      bool ok;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ok = !cancelled_;
        if (ok) {
          std::string bytes;
          if (message->Dump(&slices).ok()) {
            for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
          }
          if (!r.ParseFromString(bytes)) violations_.push_back("a written message did not parse");
          written_.push_back(std::move(r));
        }
        write_outstanding_ = false;
      }
      closed_cv_.notify_all();
      session_ptr()->OnWriteDone(ok);
      Completed();
    });
  }

  void End(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) violations_.push_back("End called twice");
    ended_ = true;
    status_ = status;
    ReleaseParkedReadLocked();  // gRPC completes an outstanding read once the call is finished
    MaybeCloseLocked();
  }

  // After WaitClosed.
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  std::vector<v1::SegmentResponse> written() {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
  }
  size_t delivered() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_message_;
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }

 private:
  StreamSession* session_ptr() {
    std::lock_guard<std::mutex> lock(mu_);
    return session_.get();
  }

  // Requires mu_.
  void Post(std::function<void()> f) {
    std::uniform_int_distribution<int> delay_us(0, 300);
    tasks_.push_back({std::move(f), delay_us(rng_)});
    cv_.notify_one();
  }

  // `lock` holds mu_. An inline completion runs in the caller's thread after mu_ is released (the
  // session starts operations holding no lock of its own).
  void PostOrInline(std::unique_lock<std::mutex> lock, std::function<void()> f) {
    if (session_ != nullptr && std::uniform_int_distribution<int>(0, 3)(rng_) == 0) {
      lock.unlock();
      f();
      return;
    }
    Post(std::move(f));
  }

  void CompleteRead() {
    bool ok = false, park = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_ && !ended_ && next_message_ < messages_.size()) {
        grpc::Slice slice(messages_[next_message_++]);
        *into_ = grpc::ByteBuffer(&slice, 1);
        ok = true;
      } else if (!cancelled_ && !ended_ && client_end_ == ClientEnd::kStayOpen) {
        park = true;  // completes on Cancel or End
        parked_read_ = true;
      }
      if (!park) read_outstanding_ = false;
    }
    if (park) return;
    session_ptr()->OnReadDone(ok);
    Completed();
  }

  // Requires mu_.
  void ReleaseParkedReadLocked() {
    if (!parked_read_) return;
    parked_read_ = false;
    Post([this] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        read_outstanding_ = false;
      }
      session_ptr()->OnReadDone(false);
      Completed();
    });
  }

  void Completed() {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    MaybeCloseLocked();
  }

  // Requires mu_. Close runs on a worker, as gRPC's OnDone does.
  void MaybeCloseLocked() {
    if (!ended_ || in_flight_ > 0 || close_posted_) return;
    close_posted_ = true;
    Post([this] {
      std::unique_ptr<StreamSession> s;
      {
        std::lock_guard<std::mutex> lock(mu_);
        s = std::move(session_);
      }
      StreamSession::Close(std::move(s));
      {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
      }
      closed_cv_.notify_all();
    });
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || (session_ != nullptr && !tasks_.empty()); });
      if (stop_) return;
      std::uniform_int_distribution<size_t> pick(0, tasks_.size() - 1);
      auto it = tasks_.begin() + static_cast<std::ptrdiff_t>(pick(rng_));
      Task t = std::move(*it);
      tasks_.erase(it);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(t.delay_us));
      t.run();
      lock.lock();
    }
  }

 private:
  struct Task {
    std::function<void()> run;
    int delay_us = 0;
  };

  const std::vector<std::string> messages_;
  const ClientEnd client_end_;

  std::mutex mu_;
  std::condition_variable cv_, closed_cv_;
  std::mt19937_64 rng_;
  std::deque<Task> tasks_;
  std::vector<std::thread> workers_;
  std::unique_ptr<StreamSession> session_;
  grpc::ByteBuffer* into_ = nullptr;
  size_t next_message_ = 0;
  int in_flight_ = 0;
  bool read_outstanding_ = false, write_outstanding_ = false, parked_read_ = false;
  bool cancelled_ = false, ended_ = false, close_posted_ = false, closed_ = false, stop_ = false;
  grpc::Status status_;
  std::vector<v1::SegmentResponse> written_;
  std::vector<std::string> violations_;
};

// maskd's service over a fake engine as MaskServer::Load builds it (worker with its batchers, cache
// and result store, 2 decode and 2 post-processing threads, the pipeline), without the gRPC server:
// its threads' abseil mutexes, uninstrumented, would be reported against themselves.
struct Server {
  Server() {
    spdlog::set_level(spdlog::level::err);
    FakeEngineOptions fo;
    fo.device = "cpu";
    WorkerOptions wo;
    wo.encoder.max_batch_weight = 4;
    wo.decoder.max_batch_weight = 16;
    wo.decoder.max_group_weight = 4;
    worker = std::make_unique<DeviceWorker>(0, "cpu", std::make_unique<FakeEngine>(fo), wo);
    router = std::make_unique<Router>(std::vector<DeviceWorker*>{worker.get()});
    decode_pool = std::make_unique<ThreadPool>("decode", 2, 256);
    post_pool = std::make_unique<ThreadPool>("postprocess", 2, 0);
    PipelineOptions po;
    pipeline = std::make_unique<Pipeline>(po, worker->engine().description().identity, router.get(),
                                          decode_pool.get(), post_pool.get());
    ServiceOptions so;
    so.metrics = &metrics;
    so.max_stream_in_flight = 8;  // below a script's length: reads wait for answers
    service = std::make_unique<MaskService>(so);
    service->SetBackend(Backend{pipeline.get(), {worker.get()}});
  }
  ~Server() {
    service->BeginDrain();
    EXPECT_TRUE(service->WaitIdle(std::chrono::steady_clock::now() + 20s));
    worker->Stop();
    decode_pool->Stop();
    post_pool->Stop();
  }
  Metrics metrics;  // before the service, which records into it
  std::unique_ptr<DeviceWorker> worker;
  std::unique_ptr<Router> router;
  std::unique_ptr<ThreadPool> decode_pool, post_pool;
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<MaskService> service;
};

// Opens a stream of `messages` on a new transport.
std::unique_ptr<ThreadTransport> Open(MaskService& service, std::vector<std::string> messages,
                                      ClientEnd end, uint64_t seed) {
  auto t = std::make_unique<ThreadTransport>(std::move(messages), end, seed);
  StreamCallInfo call;
  call.request_id = "stream" + std::to_string(seed);
  call.peer = "test";
  StatusOr<std::unique_ptr<StreamSession>> s = service.OpenStream(t.get(), call);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) t->Bind(std::move(*s));
  return t;
}

// Message i of a script has a NaN point (answered INVALID_ARGUMENT in-band). Never one that names
// an image: the messages after it would fail with it.
bool Invalid(size_t i) { return i % 7 == 3 && i % 8 != 0; }

// Stream `stream`'s messages: every 8th names an image (one of 3 pictures, so streams also share
// cache entries), the rest prompt the current image; the Invalid ones have a NaN point.
std::vector<v1::SegmentRequest> Script(int stream, int n) {
  std::vector<v1::SegmentRequest> out;
  for (int i = 0; i < n; ++i) {
    v1::SegmentRequest r;
    r.set_request_tag("s" + std::to_string(stream) + ".m" + std::to_string(i));
    if (i % 8 == 0) *r.mutable_image() = EncodedPicture(24 + 8 * ((stream + i / 8) % 3), 16, (stream + i / 8) % 3);
    *r.add_prompts() = Point(3.0f + static_cast<float>(i % 5), 4.0f);
    if (Invalid(static_cast<size_t>(i))) r.mutable_prompts(0)->mutable_points(0)->set_x(std::nanf(""));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> Bytes(const std::vector<v1::SegmentRequest>& msgs) {
  std::vector<std::string> out;
  for (const auto& m : msgs) out.push_back(Serialized(m));
  return out;
}

// Responses are a prefix of the script, in order, each answered as the script says.
void ExpectAnsweredInOrder(const std::vector<v1::SegmentResponse>& got,
                           const std::vector<v1::SegmentRequest>& sent) {
  ASSERT_LE(got.size(), sent.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].request_tag(), sent[i].request_tag()) << "response " << i;
    if (Invalid(i)) {
      ASSERT_TRUE(got[i].has_error()) << sent[i].request_tag();
      EXPECT_EQ(got[i].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    } else {
      EXPECT_FALSE(got[i].has_error()) << sent[i].request_tag() << ": " << got[i].error().message();
      EXPECT_EQ(got[i].results_size(), 1) << sent[i].request_tag();
    }
  }
}

constexpr int kStreams = 6;
constexpr int kMessages = 40;

// kStreams scripted streams of kMessages each, opened at once; `corrupt` may change a stream's
// bytes before it opens.
struct Streams {
  std::vector<std::vector<v1::SegmentRequest>> scripts;
  std::vector<std::unique_ptr<ThreadTransport>> transports;
};
Streams OpenAll(MaskService& service, ClientEnd end, uint64_t seed,
                const std::function<void(int, std::vector<std::string>&)>& corrupt = nullptr) {
  Streams out;
  for (int s = 0; s < kStreams; ++s) {
    out.scripts.push_back(Script(s, kMessages));
    std::vector<std::string> bytes = Bytes(out.scripts.back());
    if (corrupt) corrupt(s, bytes);
    out.transports.push_back(Open(service, std::move(bytes), end, seed + static_cast<uint64_t>(s)));
  }
  return out;
}

TEST(StreamSession, ManyStreamsAnswerEveryMessageInOrder) {
  Server srv;
  auto [scripts, streams] = OpenAll(*srv.service, ClientEnd::kHalfClose, 100);
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(streams[s]->WaitClosed(60s)) << "stream " << s << " never ended";
    EXPECT_TRUE(streams[s]->status().ok()) << streams[s]->status().error_message();
    const auto got = streams[s]->written();
    EXPECT_EQ(got.size(), static_cast<size_t>(kMessages)) << "stream " << s;
    ExpectAnsweredInOrder(got, scripts[s]);
    EXPECT_TRUE(streams[s]->violations().empty()) << streams[s]->violations().front();
  }
  EXPECT_EQ(srv.service->active_calls(), 0);
}

TEST(StreamSession, CancelledStreamsEndCancelledWithAnOrderedPrefix) {
  Server srv;
  Streams all = OpenAll(*srv.service, ClientEnd::kStayOpen, 200);
  auto& scripts = all.scripts;
  auto& streams = all.transports;  // (not structured bindings: the cancellers capture it)
  // Cancelled at different points: before anything was answered, mid-way, after all were read.
  std::mt19937 rng(7);
  std::vector<std::thread> cancellers;
  for (int s = 0; s < kStreams; ++s) {
    const size_t after = std::uniform_int_distribution<size_t>(0, kMessages)(rng);
    cancellers.emplace_back([&, s, after] {
      streams[s]->WaitWritten(after);
      streams[s]->Cancel();
    });
  }
  for (auto& t : cancellers) t.join();
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(streams[s]->WaitClosed(60s)) << "stream " << s << " never ended";
    // The client never sees this status. The read that fails when it cancels may reach the session
    // before OnCancel (gRPC does not order them either), and then the stream ends as for a
    // half-close; the access log and metrics say CANCELLED either way (below).
    const grpc::StatusCode code = streams[s]->status().error_code();
    EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::OK)
        << streams[s]->status().error_message();
    ExpectAnsweredInOrder(streams[s]->written(), scripts[s]);
    EXPECT_TRUE(streams[s]->violations().empty()) << streams[s]->violations().front();
  }
  EXPECT_EQ(srv.service->active_calls(), 0);
  const std::string metrics = srv.metrics.Serialize();
  EXPECT_NE(metrics.find("maskd_requests_total{code=\"CANCELLED\",method=\"SegmentStream\"} " +
                         std::to_string(kStreams)),
            std::string::npos)
      << metrics;
}

TEST(StreamSession, ADrainAnswersWhatWasReadThenEndsUnavailable) {
  auto srv = std::make_unique<Server>();
  auto [scripts, streams] = OpenAll(*srv->service, ClientEnd::kStayOpen, 300);
  streams[0]->WaitWritten(3);
  srv->service->BeginDrain();  // as MaskServer::Shutdown does, while the streams run
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(streams[s]->WaitClosed(60s)) << "stream " << s << " never ended";
    EXPECT_EQ(streams[s]->status().error_code(), grpc::StatusCode::UNAVAILABLE)
        << streams[s]->status().error_message();
    const auto got = streams[s]->written();
    // Every message read before the drain is answered, but for the one whose read was completing
    // as the drain began (the session no longer accepts it); none is read after.
    EXPECT_LE(got.size(), streams[s]->delivered()) << "stream " << s;
    EXPECT_GE(got.size() + 1, streams[s]->delivered()) << "stream " << s;
    ExpectAnsweredInOrder(got, scripts[s]);
    EXPECT_TRUE(streams[s]->violations().empty()) << streams[s]->violations().front();
  }
  EXPECT_EQ(srv->service->active_calls(), 0);
  srv.reset();
}

// Streams opened from 4 threads while the service begins to drain: each is refused UNAVAILABLE
// or opens and ends UNAVAILABLE, never with an operation after its end (a first read started after
// a drain had already ended the stream would be one), and no call is left open.
TEST(StreamSession, StreamsOpenedAsADrainBeginsEndCleanly) {
  auto srv = std::make_unique<Server>();
  constexpr int kThreads = 4, kEach = 40;
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadTransport>> opened;
  int refused = 0;
  std::atomic<int> started{0};
  std::vector<std::thread> openers;
  for (int t = 0; t < kThreads; ++t) {
    openers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto tr = std::make_unique<ThreadTransport>(Bytes(Script(t, 3)), ClientEnd::kStayOpen,
                                                    500 + t * kEach + i);
        StatusOr<std::unique_ptr<StreamSession>> s = srv->service->OpenStream(tr.get(), {});
        started.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        if (s.ok()) {
          tr->Bind(std::move(*s));
          opened.push_back(std::move(tr));
        } else {
          EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
          srv->service->RefusedStreamEnded();
          ++refused;
        }
      }
    });
  }
  while (started.load() < kThreads * kEach / 2) std::this_thread::yield();
  srv->service->BeginDrain();
  for (auto& t : openers) t.join();
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened.size(), 0u);
  for (auto& tr : opened) {
    ASSERT_TRUE(tr->WaitClosed(60s)) << "a stream never ended";
    EXPECT_EQ(tr->status().error_code(), grpc::StatusCode::UNAVAILABLE) << tr->status().error_message();
    EXPECT_TRUE(tr->violations().empty()) << tr->violations().front();
  }
  EXPECT_EQ(srv->service->active_calls(), 0);
}

TEST(StreamSession, AMalformedMessageEndsTheStreamAfterTheEarlierAnswers) {
  Server srv;
  auto [scripts, streams] = OpenAll(*srv.service, ClientEnd::kHalfClose, 400, [](int s, std::vector<std::string>& b) {
    b[static_cast<size_t>(10 + s)] = std::string("\x0a\xff\xff\xff", 4);  // a length-delimited field cut short
  });
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(streams[s]->WaitClosed(60s)) << "stream " << s << " never ended";
    const grpc::Status st = streams[s]->status();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("message " + std::to_string(10 + s)), std::string::npos)
        << st.error_message();
    const auto got = streams[s]->written();
    EXPECT_EQ(got.size(), static_cast<size_t>(10 + s));
    ExpectAnsweredInOrder(got, scripts[s]);
    EXPECT_TRUE(streams[s]->violations().empty()) << streams[s]->violations().front();
  }
  EXPECT_EQ(srv.service->active_calls(), 0);
}

}  // namespace
}  // namespace maskd::server
