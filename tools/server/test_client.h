// Test helpers for the server: requests to 127.0.0.1 through cpp-httplib's client, streamed
// responses split into their server-sent events, values read off /metrics. Loopback only.
#ifndef LGPT_TOOLS_SERVER_TEST_CLIENT_H_
#define LGPT_TOOLS_SERVER_TEST_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lgpt {

struct HttpReply {
  int status = -1;  // -1: no response (connection refused, reset, timed out)
  std::string body;
  std::string content_type;
  std::string retry_after;
  std::string allow;  // the Allow header (405 replies)
  std::string error;  // the client's error when there was no response
  std::string head;   // status line and headers (HttpRawExchange only)
};

HttpReply HttpGet(int port, const std::string& path, const std::string& api_key = "");
HttpReply HttpPost(int port, const std::string& path, const std::string& body,
                   const std::string& api_key = "");
HttpReply HttpRequest(int port, const std::string& method, const std::string& path);
// Writes `request` as it is (no header added) on a new connection and reads the reply until the
// server closes it or `timeout_s` passes: status and body (status -1 and `error` without a
// status line), for requests an HTTP client library would not send.
HttpReply HttpRawExchange(int port, const std::string& request, int timeout_s = 10);
// Sends `head` on a new connection, then the pieces `next_piece` gives (false: no more), `gap`
// apart, until the server answers or stops reading; then reads the reply as HttpRawExchange.
// Pieces are made as they are sent, so a large body never sits in the client's memory.
struct UploadReply {
  HttpReply reply;
  int64_t body_bytes_sent = 0;
  bool sent_everything = false;
  double seconds = 0;  // from the first byte sent to the end of the reply
};
UploadReply HttpRawUpload(int port, const std::string& head,
                          const std::function<bool(std::string& piece)>& next_piece,
                          std::chrono::milliseconds gap = std::chrono::milliseconds(0),
                          int timeout_s = 20);
// A new connection that has sent `bytes` and is left open (a client still writing its request,
// or one about to leave): its descriptor, to close, or -1 with errno set.
int SendOnNewConnection(int port, const std::string& bytes);

struct StreamReply {
  int status = -1;
  std::string content_type;
  std::vector<std::string> events;  // the payload of each "data: " event, "[DONE]" included
  std::string body;                 // the whole body when it was not an event stream
  std::string error;                // the client's error when the exchange failed
};
// POSTs and reads server-sent events as they arrive; `on_event` returning false closes the
// connection (the client leaves mid-stream).
StreamReply HttpPostStream(int port, const std::string& path, const std::string& body,
                           const std::function<bool(const std::string& event)>& on_event = nullptr);

// The text of completion or chat chunks, concatenated; the finish_reason of the last chunk
// that has one.
std::string StreamedText(const std::vector<std::string>& events);
std::string StreamedFinishReason(const std::vector<std::string>& events);

// The value of a series in Prometheus text ("lgpt_requests_running",
// "lgpt_http_requests_total{endpoint=\"/health\",status=\"200\"}"); -1 when absent.
double MetricValue(const std::string& metrics, const std::string& series);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_TEST_CLIENT_H_
