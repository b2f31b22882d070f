#include "tools/spm_tools.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lgpt {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

absl::Status Run(const std::string& command, const std::string& what) {
  const int status = std::system(command.c_str());
  if (status != 0) {
    return absl::InternalError(absl::StrCat(what, " failed (status ", status, "): ", command));
  }
  return absl::OkStatus();
}

// The last non-empty line of a tool's error output that is not the "terminated" trailer, up
// to 600 bytes (spm_train's reason, e.g. a vocabulary too small for the corpus's characters).
std::string ReasonFromLog(const std::string& log_file) {
  std::ifstream in(log_file);
  std::string line, reason;
  while (std::getline(in, line)) {
    if (!line.empty() && line.find("Program terminated") == std::string::npos) reason = line;
  }
  if (reason.size() > 600) reason = reason.substr(reason.size() - 600);
  return reason;
}

}  // namespace

absl::Status TrainSentencePiece(const std::string& text_file, const std::string& model_prefix,
                                int64_t vocab_size) {
  // spm_train writes under a private prefix, renamed into place once whole: a run stopped
  // while it writes leaves no truncated tokenizer.model for --resume to pick up.
  const std::string scratch = absl::StrCat(model_prefix, ".tmp-", ::getpid());
  const std::string log_file = scratch + ".log";
  absl::Status status =
      Run(absl::StrCat("spm_train --input=", Quote(text_file), " --model_prefix=", Quote(scratch),
                       " --vocab_size=", vocab_size,
                       " --model_type=bpe --byte_fallback=true --character_coverage=1.0"
                       " --normalization_rule_name=identity --num_threads=2"
                       " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1"
                       " --input_sentence_size=2000000 --shuffle_input_sentence=true"
                       " --minloglevel=2 >/dev/null 2>",
                       Quote(log_file)),
          "spm_train");
  if (!status.ok()) {
    const std::string reason = ReasonFromLog(log_file);
    if (!reason.empty()) {
      status = absl::InternalError(absl::StrCat(status.message(), "; spm_train said: ", reason));
    }
  }
  std::remove(log_file.c_str());
  for (const char* suffix : {".vocab", ".model"}) {  // the model last: it marks a whole run
    const std::string from = scratch + suffix, to = model_prefix + suffix;
    if (status.ok() && std::rename(from.c_str(), to.c_str()) != 0) {
      status = absl::InternalError(absl::StrCat("cannot rename ", from, " to ", to));
    }
    std::remove(from.c_str());
  }
  return status;
}

absl::StatusOr<std::vector<int64_t>> EncodeLinesWithBosEos(const std::string& model_file,
                                                           const std::string& text_file) {
  const std::string out = model_file + ".ids.tmp";
  if (absl::Status s = Run(absl::StrCat("spm_encode --model=", Quote(model_file),
                                        " --output_format=id < ", Quote(text_file), " > ",
                                        Quote(out)),
                           "spm_encode");
      !s.ok()) {
    return s;
  }
  std::ifstream in(out);
  std::vector<int64_t> ids;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ids.push_back(1);
    for (absl::string_view piece : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(piece, &id)) {
        return absl::InternalError(absl::StrCat("spm_encode printed '", piece, "'"));
      }
      ids.push_back(id);
    }
    ids.push_back(2);
  }
  std::remove(out.c_str());
  return ids;
}

}  // namespace lgpt
