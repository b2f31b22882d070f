#include "core/text/tool_call_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace lgpt {
namespace {

std::vector<std::string> CallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>"};
    case ToolCallFormat::kLlama3:
      return {"<|python_tag|>", "{"};
    case ToolCallFormat::kMistral:
      return {"[TOOL_CALLS]"};
    case ToolCallFormat::kGeneric:
      return {"{"};
  }
  return {"{"};
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t PartialMarkerAtEnd(absl::string_view text, absl::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length) {
    if (absl::EndsWith(text, marker.substr(0, length))) return length;
  }
  return 0;
}

}  // namespace

ToolCallStream::ToolCallStream(ToolCallFormat format)
    : format_(format), markers_(CallMarkers(format)) {}

size_t ToolCallStream::SendableEnd(bool* marker_found) const {
  size_t end = text_.size();
  *marker_found = false;
  for (const std::string& marker : markers_) {
    const size_t found = text_.find(marker, sent_end_);
    if (found == std::string::npos) continue;
    end = std::min(end, found);
    *marker_found = true;
  }
  if (!*marker_found) {
    for (const std::string& marker : markers_) {
      end = std::min(end, text_.size() - PartialMarkerAtEnd(text_, marker));
    }
  }
  // Whitespace before what is held may end the content (trimmed away): it waits.
  while (end > sent_end_ && absl::ascii_isspace(static_cast<unsigned char>(text_[end - 1]))) {
    --end;
  }
  return end;
}

std::string ToolCallStream::Feed(absl::string_view piece) {
  text_.append(piece.data(), piece.size());
  if (holding_) return "";
  if (sent_end_ == content_begin_) {  // nothing sent: the parsed content is trimmed
    while (sent_end_ < text_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(text_[sent_end_]))) {
      ++sent_end_;
    }
    content_begin_ = sent_end_;
  }
  const size_t end = SendableEnd(&holding_);
  std::string out = text_.substr(sent_end_, end - sent_end_);
  sent_end_ = end;
  return out;
}

ParsedToolCalls ToolCallStream::Finish() {
  ParsedToolCalls parsed = ParseToolCalls(text_, format_);
  // What was sent is where the parsed content starts (the content before the first possible
  // call, trimmed on the left, its trailing whitespace held).
  const absl::string_view sent =
      absl::string_view(text_).substr(content_begin_, sent_end_ - content_begin_);
  if (absl::StartsWith(parsed.content, sent)) {
    parsed.content.erase(0, sent.size());
  } else {
    parsed.content.clear();  // not reached: the parsers keep the text before a call
  }
  return parsed;
}

}  // namespace lgpt
