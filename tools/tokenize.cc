// Encodes text to token ids, or decodes ids to text, with a checkpoint's tokenizer (its
// tokenizer.json or tokenizer.model, configured as LitGPT does):
//   bazel run //tools:tokenize -- --checkpoint_dir=DIR --text="Hello world"   # prints ids
//   bazel run //tools:tokenize -- --checkpoint_dir=DIR --ids=15496,995          # prints text
// Ids are printed space-separated on one line. --bos=true|false overrides whether a BOS
// token is prepended (default: as the checkpoint's tokenizer_config.json decides); --eos
// appends an EOS token.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "core/text/tokenizer.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "checkpoint directory with the tokenizer files");
ABSL_FLAG(std::string, text, "", "text to encode");
ABSL_FLAG(std::string, ids, "", "comma-separated token ids to decode, e.g. 1,2,3");
ABSL_FLAG(std::string, bos, "", "true or false: prepend BOS (default: the tokenizer's use_bos)");
ABSL_FLAG(bool, eos, false, "append EOS when encoding");

int main(int argc, char** argv) {
  using namespace lgpt;
  InitTool(argc, argv,
           "tokenize --checkpoint_dir=DIR (--text=TEXT [--bos=true|false] [--eos] | --ids=1,2,3)");
  const std::string checkpoint_dir = ResolvePath(absl::GetFlag(FLAGS_checkpoint_dir));
  if (checkpoint_dir.empty()) Die(absl::InvalidArgumentError("--checkpoint_dir is required"));
  // --text="" is a text (with an empty encoding), so presence is what counts.
  bool has_text = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    has_text = has_text || arg == "--text" || absl::StartsWith(arg, "--text=");
  }
  const bool has_ids = !absl::GetFlag(FLAGS_ids).empty();
  if (has_text == has_ids) Die(absl::InvalidArgumentError("give exactly one of --text and --ids"));
  std::optional<bool> bos;
  const std::string bos_flag = absl::GetFlag(FLAGS_bos);
  if (bos_flag == "true") {
    bos = true;
  } else if (bos_flag == "false") {
    bos = false;
  } else if (!bos_flag.empty()) {
    Die(absl::InvalidArgumentError("--bos must be true or false"));
  }

  const std::unique_ptr<Tokenizer> tokenizer = ValueOrDie(Tokenizer::Load(checkpoint_dir));
  if (has_text) {
    const std::vector<int64_t> ids =
        ValueOrDie(tokenizer->Encode(absl::GetFlag(FLAGS_text), bos, absl::GetFlag(FLAGS_eos)));
    std::printf("%s\n", absl::StrJoin(ids, " ").c_str());
  } else {
    const std::vector<int64_t> ids = ValueOrDie(ParseIds(absl::GetFlag(FLAGS_ids), "ids"));
    const std::string text = ValueOrDie(tokenizer->Decode(ids));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  }
  return 0;
}
