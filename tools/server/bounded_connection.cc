#include "tools/server/bounded_connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

namespace lgpt {
namespace {

using Clock = std::chrono::steady_clock;

// How long a refused request's connection keeps discarding what its client still sends.
constexpr auto kLingerAfterRefusal = std::chrono::seconds(2);

int Milliseconds(time_t seconds, time_t microseconds) {
  return static_cast<int>(seconds * 1000 + microseconds / 1000);
}

// poll() for `events` up to `timeout_ms`, through signals.
bool PollFor(int socket, short events, int timeout_ms) {
  pollfd descriptor{socket, events, 0};
  int ready;
  do {
    ready = poll(&descriptor, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}

void NumericAddress(int socket, bool peer, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  sockaddr* raw = reinterpret_cast<sockaddr*>(&address);
  if ((peer ? getpeername(socket, raw, &length) : getsockname(socket, raw, &length)) != 0) return;
  if (address.ss_family == AF_UNIX) {  // a Unix-domain socket: no address a log could name
    ip = "unix";
    port = 0;
    return;
  }
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (getnameinfo(raw, length, host, sizeof(host), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(service);
  }
}

// One connection: buffered reads that stop at the budget of the request's current part.
class BoundedStream : public httplib::Stream {
 public:
  BoundedStream(int socket, int read_timeout_ms, int write_timeout_ms)
      : socket_(socket), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  // A new request: its head may take kMaxRequestHeadBytes.
  void StartRequest() {
    budget_ = kMaxRequestHeadBytes;
    in_body_ = false;
    exceeded_ = false;
    written_ = 0;
  }
  void SetBodyBudget(int64_t bytes) {
    budget_ = std::max<int64_t>(bytes, 0);
    in_body_ = true;
  }
  bool exceeded() const { return exceeded_; }
  bool in_body() const { return in_body_; }
  bool wrote_nothing() const { return written_ == 0; }
  void set_close_after() { close_after_ = true; }
  bool close_after() const { return close_after_; }
  bool has_buffered() const { return offset_ < filled_; }

  bool is_readable() const override {
    return has_buffered() || PollFor(socket_, POLLIN, read_timeout_ms_);
  }
  // Writable, and the peer has not gone (as cpp-httplib's SocketStream).
  bool is_writable() const override {
    if (!PollFor(socket_, POLLOUT, write_timeout_ms_)) return false;
    if (!PollFor(socket_, POLLIN, 0)) return true;
    char byte;
    return recv(socket_, &byte, 1, MSG_PEEK) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (budget_ == 0) {
      exceeded_ = true;
      return -1;
    }
    size = std::min<size_t>(size, static_cast<size_t>(budget_));
    if (!has_buffered() && !Fill()) return -1;
    const size_t n = std::min(size, filled_ - offset_);
    std::copy(buffer_ + offset_, buffer_ + offset_ + n, ptr);
    offset_ += n;
    budget_ -= static_cast<int64_t>(n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t sent;
    do {
      sent = send(socket_, ptr, size, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent > 0) written_ += sent;
    return sent;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    NumericAddress(socket_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    NumericAddress(socket_, false, ip, port);
  }
  int socket() const override { return socket_; }

 private:
  bool Fill() {
    if (!PollFor(socket_, POLLIN, read_timeout_ms_)) return false;
    ssize_t got;
    do {
      got = recv(socket_, buffer_, sizeof(buffer_), 0);
    } while (got < 0 && errno == EINTR);
    if (got <= 0) return false;
    offset_ = 0;
    filled_ = static_cast<size_t>(got);
    return true;
  }

  const int socket_;
  const int read_timeout_ms_;
  const int write_timeout_ms_;
  char buffer_[16384];
  size_t offset_ = 0;
  size_t filled_ = 0;
  int64_t budget_ = kMaxRequestHeadBytes;
  bool in_body_ = false;
  bool exceeded_ = false;
  int64_t written_ = 0;
  bool close_after_ = false;
};

thread_local BoundedStream* t_stream = nullptr;

// Waits up to `timeout_s` for a next request; false once the server stops listening.
bool AwaitRequest(const BoundedStream& stream, const std::atomic<int>& listening,
                  time_t timeout_s) {
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  while (listening != INVALID_SOCKET) {
    if (stream.has_buffered() || PollFor(stream.socket(), POLLIN, 50)) return true;
    if (Clock::now() >= deadline) return false;
  }
  return false;
}

// The reply to a request line and headers over kMaxRequestHeadBytes, which cpp-httplib gives up
// on without answering.
void ReplyHeadTooLarge(BoundedStream& stream) {
  const std::string body =
      std::string(R"({"error":{"message":"the request line and headers exceed )") +
      std::to_string(kMaxRequestHeadBytes) +
      R"( bytes","type":"invalid_request_error","param":null,"code":"request_header_fields_too_large"}})";
  const std::string reply =
      "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < reply.size()) {
    const ssize_t n = stream.write(reply.data() + sent, reply.size() - sent);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Shuts down the sending side and discards what the client still sends for a moment: closing
// a socket with unread bytes resets the connection, and the client could lose the reply.
void LingeringClose(int socket) {
  shutdown(socket, SHUT_WR);
  const auto deadline = Clock::now() + kLingerAfterRefusal;
  char scratch[16384];
  while (Clock::now() < deadline && PollFor(socket, POLLIN, 100)) {
    if (recv(socket, scratch, sizeof(scratch), 0) <= 0) break;
  }
  close(socket);
}

}  // namespace

void BoundedServer::SetBodyBudget(int64_t bytes) {
  if (t_stream != nullptr) t_stream->SetBodyBudget(bytes);
}

bool BoundedServer::HeadTooLarge() {
  return t_stream != nullptr && t_stream->exceeded() && !t_stream->in_body();
}

bool BoundedServer::BodyOverBudget() {
  return t_stream != nullptr && t_stream->exceeded() && t_stream->in_body();
}

void BoundedServer::CloseAfterResponse() {
  if (t_stream != nullptr) t_stream->set_close_after();
}

int BoundedServer::ConnectionSocket() { return t_stream != nullptr ? t_stream->socket() : -1; }

bool BoundedServer::process_and_close_socket(int socket) {
  BoundedStream stream(socket, Milliseconds(read_timeout_sec_, read_timeout_usec_),
                       Milliseconds(write_timeout_sec_, write_timeout_usec_));
  t_stream = &stream;
  bool ok = false;
  for (size_t left = keep_alive_max_count_;
       left > 0 && AwaitRequest(stream, svr_sock_, keep_alive_timeout_sec_); --left) {
    stream.StartRequest();
    bool connection_closed = false;
    ok = process_request(stream, left == 1, connection_closed, nullptr);
    if (!ok && stream.exceeded() && stream.wrote_nothing()) {
      ReplyHeadTooLarge(stream);
      stream.set_close_after();
    }
    if (!ok || connection_closed || stream.close_after()) break;
  }
  t_stream = nullptr;
  if (stream.close_after()) {
    LingeringClose(socket);
  } else {
    shutdown(socket, SHUT_RDWR);
    close(socket);
  }
  return ok;
}

}  // namespace lgpt
