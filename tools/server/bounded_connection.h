// cpp-httplib's server with every byte a connection reads counted against a budget. cpp-httplib
// 0.11 reads a header line whole before it checks its length, takes any number of header and
// trailer lines, and checks its payload limit against Content-Length only: a chunked body is
// read to its end. BoundedServer serves each connection through its own stream, whose reads stop
// (read() returns -1) once the budget of the request's current part is spent:
//   - the request line and headers: kMaxRequestHeadBytes, set before each request;
//   - the body: what the pre-routing handler sets with SetBodyBudget (Content-Length, or a bound
//     on chunked framing and trailers).
// A request whose head overflows gets a 431 (written here when cpp-httplib cannot answer it).
// After a refused request the connection closes (CloseAfterResponse): its unread body must not be
// parsed as a next request. The close shuts down the sending side first and discards what the
// client still sends for a moment, so the client reads the reply instead of a reset.
#ifndef LGPT_TOOLS_SERVER_BOUNDED_CONNECTION_H_
#define LGPT_TOOLS_SERVER_BOUNDED_CONNECTION_H_

#include <cstdint>

#include "httplib.h"

namespace lgpt {

// The request line and headers of one request, together.
inline constexpr int64_t kMaxRequestHeadBytes = 64 << 10;

class BoundedServer : public httplib::Server {
 public:
  // On the thread serving a request (handlers): the bytes its body may take on the wire from
  // now on (framing and trailers included).
  static void SetBodyBudget(int64_t bytes);
  // Whether the request being served ran out of its head's budget, or of its body's.
  static bool HeadTooLarge();
  static bool BodyOverBudget();
  // The connection closes once the response is written.
  static void CloseAfterResponse();
  // The socket of the connection the request being served came on; -1 off such a thread.
  static int ConnectionSocket();

 private:
  bool process_and_close_socket(int socket) override;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_BOUNDED_CONNECTION_H_
