#include "tools/peft_flags.h"

#include <cmath>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "tools/tool_util.h"

ABSL_FLAG(std::vector<std::string>, lora, {},
          "DIR[:SCALE]: a LoRA fine-tune (lit_model.pth.lora) applied over the checkpoint "
          "without merging, its update times SCALE (default 1); repeat it, or separate by "
          "commas, to stack adapters");

namespace lgpt {
namespace {

// The values of every --lora in argv, in order.
std::vector<std::string> LoraValuesInArgv(int argc, char** argv) {
  std::vector<std::string> values;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is positional
    if (!absl::ConsumePrefix(&arg, "--")) {
      if (!absl::ConsumePrefix(&arg, "-")) continue;
    }
    if (absl::ConsumePrefix(&arg, "lora=")) {
      values.emplace_back(arg);
    } else if (arg == "lora" && i + 1 < argc) {
      values.emplace_back(argv[++i]);
    }
  }
  return values;
}

}  // namespace

absl::StatusOr<LoraAdapterSpec> ParseLoraFlag(absl::string_view text) {
  LoraAdapterSpec spec;
  absl::string_view dir = text;
  const size_t colon = text.rfind(':');
  if (colon != absl::string_view::npos) {
    dir = text.substr(0, colon);
    const absl::string_view scale = text.substr(colon + 1);
    if (!absl::SimpleAtod(scale, &spec.scale)) {
      return absl::InvalidArgumentError(absl::StrCat("--lora=", text, ": scale '", scale,
                                                     "' is not a number (--lora=DIR[:SCALE])"));
    }
    if (!std::isfinite(spec.scale) || spec.scale < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora=", text, ": the scale must be finite and >= 0, got ", scale));
    }
  }
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora='", text, "' names no directory (--lora=DIR[:SCALE])"));
  }
  spec.dir = ResolvePath(std::string(dir));
  return spec;
}

absl::StatusOr<ServeLoraFlags> ServeLoras(int argc, char** argv) {
  std::vector<std::string> values;
  for (const std::string& value : LoraValuesInArgv(argc, argv)) {
    if (value.empty()) return absl::InvalidArgumentError("--lora is empty (--lora=[NAME=]DIR)");
    for (absl::string_view item : absl::StrSplit(value, ',')) values.emplace_back(item);
  }
  if (values.empty()) values = absl::GetFlag(FLAGS_lora);
  ServeLoraFlags flags;
  for (const std::string& value : values) {
    const size_t equals = value.find('=');
    const absl::string_view path = equals == std::string::npos
                                       ? absl::string_view(value)
                                       : absl::string_view(value).substr(equals + 1);
    ASSIGN_OR_RETURN(LoraAdapterSpec spec, ParseLoraFlag(path));
    if (equals == std::string::npos) {
      flags.loras.push_back(std::move(spec));
    } else if (equals == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora=", value, " names no adapter (--lora=NAME=DIR[:SCALE])"));
    } else {
      flags.adapters.push_back({value.substr(0, equals), std::move(spec)});
    }
  }
  return flags;
}

absl::StatusOr<std::vector<LoraAdapterSpec>> LoraFlags(int argc, char** argv) {
  std::vector<std::string> values;
  for (const std::string& value : LoraValuesInArgv(argc, argv)) {
    if (value.empty()) return absl::InvalidArgumentError("--lora is empty (--lora=DIR[:SCALE])");
    for (absl::string_view item : absl::StrSplit(value, ',')) values.emplace_back(item);
  }
  if (values.empty()) values = absl::GetFlag(FLAGS_lora);
  std::vector<LoraAdapterSpec> specs;
  for (const std::string& value : values) {
    ASSIGN_OR_RETURN(LoraAdapterSpec spec, ParseLoraFlag(value));
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::vector<std::string> ModelInputDirs(const std::string& checkpoint_dir,
                                        const std::vector<LoraAdapterSpec>& loras) {
  std::vector<std::string> dirs = {checkpoint_dir};
  for (const LoraAdapterSpec& lora : loras) dirs.push_back(lora.dir);
  return dirs;
}

}  // namespace lgpt
