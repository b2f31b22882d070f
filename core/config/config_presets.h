// Named model configurations: the configs LitGPT's config.py lists, with the same names,
// Hugging Face names and field values, kept as data.
#ifndef LGPT_CORE_CONFIG_CONFIG_PRESETS_H_
#define LGPT_CORE_CONFIG_CONFIG_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config/config.h"

namespace lgpt {

// The finalised config of a preset, looked up like LitGPT's Config.from_name: by its LitGPT
// name (e.g. "Llama-3.2-1B"), else by its Hugging Face name ("Meta-Llama-3-8B") or
// "org/name" ("meta-llama/Meta-Llama-3-8B"). NotFound, with close names, when none matches.
absl::StatusOr<Config> ConfigFromName(absl::string_view name);

// The same preset before Finalize(), as config.py's dict is before Config(**dict): set fields
// on it (from_name's keyword overrides), then call Finalize().
absl::StatusOr<Config> PresetFromName(absl::string_view name);

// Every preset's LitGPT name, in config.py's order.
const std::vector<std::string>& PresetNames();

}  // namespace lgpt

#endif  // LGPT_CORE_CONFIG_CONFIG_PRESETS_H_
