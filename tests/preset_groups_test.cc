#include "tests/preset_groups.h"

#include <map>
#include <string>

#include "core/config/config.h"
#include "core/config/config_presets.h"
#include "gtest/gtest.h"
#include "tests/test_models.h"

namespace lgpt {
namespace {

// The shrunk config of a preset as a test model sees it (names cleared).
std::string Shrunk(const std::string& name) {
  absl::StatusOr<Config> preset = PresetFromName(name);
  EXPECT_TRUE(preset.ok()) << preset.status();
  if (!preset.ok()) return "";
  absl::StatusOr<Config> shrunk = ShrinkConfig(*preset);
  EXPECT_TRUE(shrunk.ok()) << name << ": " << shrunk.status();
  if (!shrunk.ok()) return "";
  shrunk->name = shrunk->hf_org = shrunk->hf_name = "";
  return ConfigToYaml(*shrunk);
}

TEST(ShrunkPresetGroupsTest, EveryPresetInExactlyOneGroupOfEqualStructures) {
  std::map<std::string, int> seen;
  std::map<std::string, std::string> structure_of_group;
  for (const ShrunkPresetGroup& group : ShrunkPresetGroups()) {
    ASSERT_FALSE(group.presets.empty());
    const std::string structure = Shrunk(group.representative());
    for (const std::string& name : group.presets) {
      ++seen[name];
      EXPECT_EQ(Shrunk(name), structure) << name << " is grouped with " << group.representative();
    }
    // Distinct groups hold distinct structures.
    const auto [it, inserted] = structure_of_group.emplace(structure, group.representative());
    EXPECT_TRUE(inserted) << group.representative() << " and " << it->second << " shrink alike";
  }
  EXPECT_EQ(seen.size(), PresetNames().size());
  for (const std::string& name : PresetNames()) EXPECT_EQ(seen[name], 1) << name;
}

TEST(ShrunkPresetGroupsTest, SizesOfOneFamilyShareAGroupAndFamiliesDoNot) {
  bool deduped_with_plain = false;
  for (const ShrunkPresetGroup& group : ShrunkPresetGroups()) {
    bool plain = false, deduped = false;
    for (const std::string& name : group.presets) {
      plain = plain || name == "pythia-6.9b";
      deduped = deduped || name == "pythia-6.9b-deduped";
    }
    deduped_with_plain = deduped_with_plain || (plain && deduped);
  }
  EXPECT_TRUE(deduped_with_plain) << "pythia-6.9b and its deduped twin differ only in name";
  EXPECT_GT(ShrunkPresetGroups().size(), 20u) << "families must keep groups of their own";
  EXPECT_LT(ShrunkPresetGroups().size(), PresetNames().size());
  for (const std::string& name : ShrunkPresetRepresentatives()) {
    ASSERT_NE(ShrunkPresetGroupOf(name), nullptr) << name;
    EXPECT_EQ(ShrunkPresetGroupOf(name)->representative(), name);
  }
  EXPECT_EQ(ShrunkPresetGroupOf("no such preset"), nullptr);
}

}  // namespace
}  // namespace lgpt
