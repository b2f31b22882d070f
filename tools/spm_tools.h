// SentencePiece training and bulk encoding through Debian's `spm_train` and `spm_encode`
// programs. libsentencepiece cannot share a process with LibTorch: it carries its own copy
// of protobuf 3.14, whose symbols collide with the protobuf 3.21 LibTorch loads (a crash
// at start-up), so the tools run it out of process.
#ifndef LGPT_TOOLS_SPM_TOOLS_H_
#define LGPT_TOOLS_SPM_TOOLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lgpt {

// spm_train --input=text_file --model_prefix=prefix --vocab_size=N (BPE, byte fallback,
// identity normalisation, <unk>=0 <s>=1 </s>=2).
absl::Status TrainSentencePiece(const std::string& text_file, const std::string& model_prefix,
                                int64_t vocab_size);

// Every non-empty line of text_file as <s> pieces </s>, concatenated.
absl::StatusOr<std::vector<int64_t>> EncodeLinesWithBosEos(const std::string& model_file,
                                                           const std::string& text_file);

}  // namespace lgpt

#endif  // LGPT_TOOLS_SPM_TOOLS_H_
