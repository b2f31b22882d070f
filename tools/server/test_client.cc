#include "tools/server/test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

httplib::Client Client(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(120, 0);
  client.set_write_timeout(30, 0);
  return client;
}

httplib::Headers AuthHeaders(const std::string& api_key) {
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  return headers;
}

HttpReply FromResult(const httplib::Result& result) {
  HttpReply reply;
  if (!result) {
    reply.error = httplib::to_string(result.error());
    return reply;
  }
  reply.status = result->status;
  reply.body = result->body;
  reply.content_type = result->get_header_value("Content-Type");
  reply.retry_after = result->get_header_value("Retry-After");
  reply.allow = result->get_header_value("Allow");
  return reply;
}

}  // namespace

HttpReply HttpGet(int port, const std::string& path, const std::string& api_key) {
  httplib::Client client = Client(port);
  return FromResult(client.Get(path.c_str(), AuthHeaders(api_key)));
}

HttpReply HttpPost(int port, const std::string& path, const std::string& body,
                   const std::string& api_key) {
  httplib::Client client = Client(port);
  return FromResult(client.Post(path.c_str(), AuthHeaders(api_key), body, "application/json"));
}

HttpReply HttpRequest(int port, const std::string& method, const std::string& path) {
  httplib::Client client = Client(port);
  httplib::Request request;
  request.method = method;
  request.path = path;
  return FromResult(client.send(request));
}

int SendOnNewConnection(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

namespace {

// Reads a raw reply on `fd` until the server closes it or `timeout_s` passes, and closes `fd`.
HttpReply ReadRawReply(int fd, int timeout_s) {
  HttpReply reply;
  timeval timeout{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string received;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) received.append(buffer, n);
  if (n < 0) reply.error = std::strerror(errno);  // timed out
  ::close(fd);
  // "HTTP/1.1 411 Length Required\r\n...\r\n\r\nbody"
  const size_t head_end = received.find("\r\n\r\n");
  if (!absl::StartsWith(received, "HTTP/1.") || received.size() < 12 ||
      head_end == std::string::npos) {
    return reply;
  }
  reply.status = std::atoi(received.substr(9, 3).c_str());
  reply.head = received.substr(0, head_end);
  reply.body = received.substr(head_end + 4);
  return reply;
}

}  // namespace

HttpReply HttpRawExchange(int port, const std::string& request, int timeout_s) {
  const int fd = SendOnNewConnection(port, request);
  if (fd < 0) {
    HttpReply reply;
    reply.error = std::strerror(errno);
    return reply;
  }
  return ReadRawReply(fd, timeout_s);
}

UploadReply HttpRawUpload(int port, const std::string& head,
                          const std::function<bool(std::string& piece)>& next_piece,
                          std::chrono::milliseconds gap, int timeout_s) {
  UploadReply upload;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(timeout_s);
  const int fd = SendOnNewConnection(port, head);
  if (fd < 0) {
    upload.reply.error = std::strerror(errno);
    return upload;
  }
  std::string piece;
  size_t offset = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (offset == piece.size()) {
      if (upload.body_bytes_sent > 0 && gap.count() > 0) std::this_thread::sleep_for(gap);
      piece.clear();
      offset = 0;
      if (!next_piece(piece)) {
        upload.sent_everything = true;
        break;
      }
    }
    pollfd connection{fd, POLLIN | POLLOUT, 0};
    if (::poll(&connection, 1, 100) <= 0) continue;
    if ((connection.revents & (POLLIN | POLLHUP | POLLERR)) != 0) break;  // answered, or gone
    const ssize_t sent =
        ::send(fd, piece.data() + offset, piece.size() - offset, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno != EAGAIN && errno != EINTR) break;
    if (sent > 0) {
      offset += static_cast<size_t>(sent);
      upload.body_bytes_sent += sent;
    }
  }
  upload.reply = ReadRawReply(fd, timeout_s);
  upload.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return upload;
}

StreamReply HttpPostStream(int port, const std::string& path, const std::string& body,
                           const std::function<bool(const std::string& event)>& on_event) {
  httplib::Client client = Client(port);
  StreamReply reply;
  std::string pending;
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  request.response_handler = [&](const httplib::Response& response) {
    reply.status = response.status;
    reply.content_type = response.get_header_value("Content-Type");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    if (reply.content_type != "text/event-stream") {
      reply.body.append(data, length);
      return true;
    }
    pending.append(data, length);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!absl::StartsWith(event, "data: ")) continue;
      event.erase(0, 6);
      reply.events.push_back(event);
      if (on_event && !on_event(event)) return false;
    }
    return true;
  };
  const httplib::Result result = client.send(request);
  if (!result) reply.error = httplib::to_string(result.error());
  return reply;
}

std::string StreamedText(const std::vector<std::string>& events) {
  std::string text;
  for (const std::string& event : events) {
    if (event == "[DONE]") continue;
    const nlohmann::json chunk = nlohmann::json::parse(event, nullptr, false);
    if (!chunk.is_object() || !chunk.contains("choices")) continue;
    for (const nlohmann::json& choice : chunk["choices"]) {
      if (choice.contains("text")) text += choice["text"].get<std::string>();
      if (choice.contains("delta") && choice["delta"].contains("content")) {
        text += choice["delta"]["content"].get<std::string>();
      }
    }
  }
  return text;
}

std::string StreamedFinishReason(const std::vector<std::string>& events) {
  std::string reason;
  for (const std::string& event : events) {
    const nlohmann::json chunk = nlohmann::json::parse(event, nullptr, false);
    if (!chunk.is_object() || !chunk.contains("choices")) continue;
    for (const nlohmann::json& choice : chunk["choices"]) {
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        reason = choice["finish_reason"].get<std::string>();
      }
    }
  }
  return reason;
}

double MetricValue(const std::string& metrics, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(), nullptr);
    }
  }
  return -1;
}

}  // namespace lgpt
