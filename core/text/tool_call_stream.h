// Streams a reply that may hold tool calls: the content before anything that could start a
// call goes out as it is generated; from the first possible call on the text is held, and at
// the end the whole reply is parsed (core/text/tool_calls.h), so the streamed content plus
// Finish()'s content is exactly ParseToolCalls' content and the calls are its calls.
//
// What is held, per format: from "<tool_call>" (Hermes), "[TOOL_CALLS]" (Mistral), the first
// '{' or "<|python_tag|>" (Llama 3), the first '{' (generic, whose calls are bare JSON
// anywhere); a piece's tail that may be the start of such a marker, and whitespace (the
// parsed content is trimmed), wait for the next piece. OpenAI streams a call's name and then
// its arguments; a server sends each call of Finish() that way.
//
//   ToolCallStream stream(format);
//   for (piece : pieces) Send(stream.Feed(piece));
//   ParsedToolCalls rest = stream.Finish();  // rest.content: the content not sent yet
#ifndef LGPT_CORE_TEXT_TOOL_CALL_STREAM_H_
#define LGPT_CORE_TEXT_TOOL_CALL_STREAM_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/text/tool_calls.h"

namespace lgpt {

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format);

  // Appends a generated piece; returns the content that may be sent now (possibly empty).
  std::string Feed(absl::string_view piece);

  // The reply is complete: the content not yet sent and every call. Call once.
  ParsedToolCalls Finish();

  // Whether a possible call has started (the rest of the reply is held).
  bool holding() const { return holding_; }

 private:
  // Where the text can be sent up to now: before a marker (*marker_found), a marker's
  // possible start, or trailing whitespace.
  size_t SendableEnd(bool* marker_found) const;

  ToolCallFormat format_;
  std::vector<std::string> markers_;
  std::string text_;     // the whole reply so far
  size_t sent_end_ = 0;  // text_[0, sent_end_) is decided: sent or skipped leading whitespace
  // Past the leading whitespace: text_[content_begin_, sent_end_) is the content sent.
  size_t content_begin_ = 0;
  bool holding_ = false;
};

}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_TOOL_CALL_STREAM_H_
