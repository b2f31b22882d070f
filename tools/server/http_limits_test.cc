// The server's limits hold however a request is framed or encoded: bodies over --max_body_bytes
// (plain, chunked, gzip, deflate, a gzip bomb, chunked + gzip, trickled chunks, endless trailers)
// are refused at the first byte past the limit with the server's peak RSS asserted; malformed
// Content-Length values are refused at once; request heads stop at 64 KiB. Also run under
// AddressSanitizer (tag "asan").
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/server/default_engine_test_base.h"
#include "tools/server/http_server.h"
#include "tools/server/test_client.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

constexpr int64_t kLimit = 64 << 10;  // --max_body_bytes of these tests
constexpr int64_t kMiB = 1 << 20;
// What an attack may add to the process's peak RSS: the limit, buffers and connection threads.
// Buffering any attack below would add 64 MiB.
constexpr int64_t kMostPeakGrowthMiB = 24;
// A refusal "at once": well inside the server's 30 s read timeout.
constexpr double kAtOnceS = 5;
constexpr char kValidBody[] = R"({"prompt": "And God said", "max_tokens": 2, "temperature": 0})";

int64_t StatusKib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, field + ":")) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

// The growth of the process's peak RSS from construction on (the peak is reset first).
class PeakRssGrowth {
 public:
  PeakRssGrowth() {
    std::ofstream("/proc/self/clear_refs") << "5";
    start_kib_ = StatusKib("VmRSS");
  }
  int64_t MiB() const { return (StatusKib("VmHWM") - start_kib_) / 1024; }

 private:
  int64_t start_kib_ = 0;
};

// `prefix`, `spaces` spaces and `suffix`, compressed as gzip or as zlib's deflate (HTTP's).
std::string Compress(const std::string& prefix, int64_t spaces, const std::string& suffix,
                     bool gzip) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, 9, Z_DEFLATED, gzip ? 31 : 15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out;
  char buffer[1 << 16];
  const std::string blank(kMiB, ' ');
  auto feed = [&](const std::string& data, int flush) {
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    stream.avail_in = static_cast<uInt>(data.size());
    do {
      stream.next_out = reinterpret_cast<Bytef*>(buffer);
      stream.avail_out = sizeof(buffer);
      deflate(&stream, flush);
      out.append(buffer, sizeof(buffer) - stream.avail_out);
    } while (stream.avail_out == 0);
  };
  feed(prefix, Z_NO_FLUSH);
  for (int64_t left = spaces; left > 0; left -= kMiB) {
    feed(blank.substr(0, static_cast<size_t>(std::min(left, kMiB))), Z_NO_FLUSH);
  }
  feed(suffix, Z_FINISH);
  deflateEnd(&stream);
  return out;
}

// `data` as one HTTP chunk.
std::string Chunk(const std::string& data) {
  return absl::StrFormat("%x\r\n%s\r\n", data.size(), data);
}

// Pieces of `data`, `size` bytes each, as chunks when `chunked` (then the last chunk).
std::function<bool(std::string&)> Pieces(std::string data, size_t size, bool chunked) {
  auto offset = std::make_shared<size_t>(0);
  auto ended = std::make_shared<bool>(false);
  return [data = std::move(data), size, chunked, offset, ended](std::string& piece) {
    if (*offset >= data.size()) {
      if (!chunked || *ended) return false;
      *ended = true;
      piece = "0\r\n\r\n";
      return true;
    }
    const std::string part = data.substr(*offset, size);
    *offset += part.size();
    piece = chunked ? Chunk(part) : part;
    return true;
  };
}

// `total` bytes of `byte`, made as they are sent, `size` at a time (as chunks when `chunked`).
std::function<bool(std::string&)> Endless(int64_t total, size_t size, char byte, bool chunked) {
  auto left = std::make_shared<int64_t>(total);
  return [left, size, byte, chunked](std::string& piece) {
    if (*left <= 0) return false;
    const std::string part(static_cast<size_t>(std::min<int64_t>(*left, size)), byte);
    *left -= static_cast<int64_t>(part.size());
    piece = chunked ? Chunk(part) : part;
    return true;
  };
}

std::string Head(const std::string& framing, const std::string& path = "/v1/completions") {
  return absl::StrCat("POST ", path,
                      " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\n",
                      framing, "\r\n");
}

class HttpLimitsTest : public DefaultEngineTest {
 protected:
  void SetUp() override {
    DefaultEngineTest::SetUp();
    if (HasFatalFailure()) return;
    ServerOptions options;
    options.port = 0;
    options.access_log = false;
    options.max_body_bytes = kLimit;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(engine(), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    thread_ = std::thread([this] { server_->Run(); });
  }
  void TearDown() override {
    server_->Shutdown();
    thread_.join();
  }
  int port() const { return server_->port(); }

  // An upload over the limit: 413 naming it, sent well short of everything, with the peak RSS
  // bounded.
  UploadReply ExpectRefusedOverLimit(const std::string& head,
                                     const std::function<bool(std::string&)>& body,
                                     std::chrono::milliseconds gap = std::chrono::milliseconds(0)) {
    PeakRssGrowth growth;
    const UploadReply upload = HttpRawUpload(port(), head, body, gap);
    EXPECT_EQ(upload.reply.status, 413) << upload.reply.body << upload.reply.error;
    EXPECT_TRUE(absl::StrContains(upload.reply.body, std::to_string(kLimit))) << upload.reply.body;
    EXPECT_LT(growth.MiB(), kMostPeakGrowthMiB) << "sent " << upload.body_bytes_sent;
    return upload;
  }

  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST_F(HttpLimitsTest, PlainBodyOverTheLimitIsRefusedBeforeItIsSent) {
  PeakRssGrowth growth;
  const UploadReply upload =
      HttpRawUpload(port(), Head(absl::StrCat("Content-Length: ", 64 * kMiB, "\r\n")),
                    Endless(64 * kMiB, 1 << 16, ' ', false));
  EXPECT_EQ(upload.reply.status, 413) << upload.reply.body << upload.reply.error;
  EXPECT_LT(upload.seconds, kAtOnceS);
  EXPECT_FALSE(upload.sent_everything);
  EXPECT_LT(growth.MiB(), kMostPeakGrowthMiB);
  // Curl's Expect: 100-continue gets the 413 instead of a 100.
  const HttpReply expect =
      HttpRawExchange(port(), Head("Content-Length: 100000000\r\nExpect: 100-continue\r\n"));
  EXPECT_EQ(expect.status, 413) << expect.body << expect.error;
}

TEST_F(HttpLimitsTest, BadContentLengthIsA400AtOnce) {
  for (const char* length : {"-1", "-100", "abc", "1e3", "0x10", "99999999999999999999"}) {
    const auto start = std::chrono::steady_clock::now();
    const HttpReply reply =
        HttpRawExchange(port(), Head(absl::StrCat("Content-Length: ", length, "\r\n")));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(reply.status, 400) << length << ": " << reply.body << reply.error;
    EXPECT_TRUE(absl::StrContains(reply.body, "Content-Length")) << reply.body;
    EXPECT_LT(seconds, kAtOnceS) << length;
  }
}

TEST_F(HttpLimitsTest, ChunkedBodyStopsAtTheLimit) {
  EXPECT_FALSE(ExpectRefusedOverLimit(Head("Transfer-Encoding: chunked\r\n"),
                                      Endless(64 * kMiB, 1 << 16, ' ', true))
                   .sent_everything);
  // Within the limit, a chunked body is served.
  const UploadReply fits =
      HttpRawUpload(port(), Head("Transfer-Encoding: chunked\r\n"), Pieces(kValidBody, 7, true));
  EXPECT_EQ(fits.reply.status, 200) << fits.reply.body << fits.reply.error;
}

TEST_F(HttpLimitsTest, TrickledChunksStopAtTheLimit) {
  const UploadReply trickled =
      ExpectRefusedOverLimit(Head("Transfer-Encoding: chunked\r\n"),
                             Endless(4 * kMiB, 4096, ' ', true), std::chrono::milliseconds(2));
  EXPECT_FALSE(trickled.sent_everything);
}

// cpp-httplib 0.11 takes no trailer: the first ends the request as malformed, unread beyond.
TEST_F(HttpLimitsTest, EndlessTrailersAreRefused) {
  auto trailers = std::make_shared<int64_t>(0);
  PeakRssGrowth growth;
  const UploadReply upload =
      HttpRawUpload(port(), Head("Transfer-Encoding: chunked\r\n"), [trailers](std::string& piece) {
        if (*trailers >= 64 * kMiB) return false;
        piece = *trailers == 0 ? absl::StrCat(Chunk(kValidBody), "0\r\n") : "";
        for (int i = 0; i < 4096; ++i) piece += "X-T: y\r\n";
        *trailers += static_cast<int64_t>(piece.size());
        return true;
      });
  EXPECT_EQ(upload.reply.status, 400) << upload.reply.body << upload.reply.error;
  EXPECT_FALSE(upload.sent_everything);
  EXPECT_LT(growth.MiB(), kMostPeakGrowthMiB);
}

TEST_F(HttpLimitsTest, CompressedBodiesAreInflatedAndServed) {
  for (const bool gzip : {true, false}) {
    const std::string body = Compress(kValidBody, 1000, "", gzip);
    const UploadReply reply =
        HttpRawUpload(port(),
                      Head(absl::StrCat("Content-Encoding: ", gzip ? "gzip" : "deflate",
                                        "\r\nContent-Length: ", body.size(), "\r\n")),
                      Pieces(body, body.size(), false));
    ASSERT_EQ(reply.reply.status, 200) << reply.reply.body << reply.reply.error;
    EXPECT_EQ(json::parse(reply.reply.body)["usage"]["completion_tokens"], 2);
  }
}

TEST_F(HttpLimitsTest, CompressionBombsStopInflatingAtTheLimit) {
  for (const bool gzip : {true, false}) {
    SCOPED_TRACE(gzip ? "gzip" : "deflate");
    // 48 MiB of JSON in about 47 KiB on the wire: a Content-Length within the limit.
    const std::string bomb = Compress(R"({"prompt": "x", "max_tokens": 2)", 48 * kMiB, "}", gzip);
    ASSERT_LT(static_cast<int64_t>(bomb.size()), kLimit);
    const std::string encoding = gzip ? "gzip" : "deflate";
    ExpectRefusedOverLimit(Head(absl::StrCat("Content-Encoding: ", encoding,
                                             "\r\nContent-Length: ", bomb.size(), "\r\n")),
                           Pieces(bomb, 4096, false));
    ExpectRefusedOverLimit(
        Head(absl::StrCat("Content-Encoding: ", encoding, "\r\nTransfer-Encoding: chunked\r\n")),
        Pieces(bomb, 1000, true));
  }
}

TEST_F(HttpLimitsTest, BodiesNotToBeReadAreRefusedUnread) {
  const std::string bomb = Compress("{", 48 * kMiB, "}", true);
  // A body on a path that takes none: 404 at once, never inflated.
  PeakRssGrowth growth;
  const UploadReply elsewhere = HttpRawUpload(
      port(), Head("Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", "/v1/moderations"),
      Pieces(bomb, 1000, true));
  EXPECT_EQ(elsewhere.reply.status, 404) << elsewhere.reply.body << elsewhere.reply.error;
  EXPECT_LT(elsewhere.seconds, kAtOnceS);
  EXPECT_LT(growth.MiB(), kMostPeakGrowthMiB);
  const HttpReply encoding = HttpRawExchange(
      port(), absl::StrCat(Head("Content-Encoding: compress\r\nContent-Length: 2\r\n"), "{}"));
  EXPECT_EQ(encoding.status, 415) << encoding.body;
  // JSON labelled multipart is still JSON (cpp-httplib would parse it as a form).
  const HttpReply multipart = HttpRawExchange(
      port(), absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: ",
                           std::string(kValidBody).size(), "\r\n\r\n", kValidBody));
  EXPECT_EQ(multipart.status, 200) << multipart.body << multipart.error;
}

TEST_F(HttpLimitsTest, RequestHeadsStopAt64KiB) {
  {
    // One header line that never ends.
    PeakRssGrowth growth;
    const UploadReply line =
        HttpRawUpload(port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Long: ",
                      Endless(64 * kMiB, 1 << 16, 'a', false));
    EXPECT_EQ(line.reply.status, 431) << line.reply.body << line.reply.error;
    EXPECT_FALSE(line.sent_everything);
    EXPECT_LT(growth.MiB(), kMostPeakGrowthMiB);
  }
  // Header lines without end, each short.
  auto lines = std::make_shared<int>(0);
  const UploadReply many =
      HttpRawUpload(port(), "GET /health HTTP/1.1\r\nHost: x\r\n", [lines](std::string& piece) {
        if (++*lines > 100000) return false;
        piece = absl::StrCat("X-", *lines, ": y\r\n");
        return true;
      });
  EXPECT_EQ(many.reply.status, 431) << many.reply.body << many.reply.error;
  // A request line that never ends.
  const UploadReply target =
      HttpRawUpload(port(), "GET /", Endless(64 * kMiB, 1 << 16, 'a', false));
  EXPECT_EQ(target.reply.status, 431) << target.reply.body << target.reply.error;
  // The server still answers.
  EXPECT_EQ(HttpGet(port(), "/health").status, 200);
}

}  // namespace
}  // namespace lgpt
