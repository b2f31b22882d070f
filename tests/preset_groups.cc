#include "tests/preset_groups.h"

#include <map>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

// What a test of the shrunk model sees: the shrunk config without the fields that only name
// it; a preset that does not shrink keys a group of its own.
std::string StructureKey(const std::string& name) {
  absl::StatusOr<Config> preset = PresetFromName(name);
  if (!preset.ok()) return absl::StrCat("unknown preset ", name);
  absl::StatusOr<Config> shrunk = ShrinkConfig(*preset);
  if (!shrunk.ok()) return absl::StrCat("unshrinkable preset ", name);
  shrunk->name.clear();
  shrunk->hf_org.clear();
  shrunk->hf_name.clear();
  return ConfigToYaml(*shrunk);
}

std::vector<ShrunkPresetGroup> GroupPresets() {
  std::vector<ShrunkPresetGroup> groups;
  std::map<std::string, size_t> group_of_key;
  for (const std::string& name : PresetNames()) {
    const auto [it, inserted] = group_of_key.emplace(StructureKey(name), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].presets.push_back(name);
  }
  return groups;
}

}  // namespace

const std::vector<ShrunkPresetGroup>& ShrunkPresetGroups() {
  static const auto* const groups = new std::vector<ShrunkPresetGroup>(GroupPresets());
  return *groups;
}

std::vector<std::string> ShrunkPresetRepresentatives() {
  std::vector<std::string> names;
  for (const ShrunkPresetGroup& group : ShrunkPresetGroups()) {
    names.push_back(group.representative());
  }
  return names;
}

const ShrunkPresetGroup* ShrunkPresetGroupOf(const std::string& name) {
  for (const ShrunkPresetGroup& group : ShrunkPresetGroups()) {
    if (group.representative() == name) return &group;
  }
  return nullptr;
}

}  // namespace lgpt
