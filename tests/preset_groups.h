// Presets grouped by the structure they shrink to: tests whose outcome depends only on the
// shrunk config (ShrinkConfig of tests/test_models.h, random weights from a seed) run once
// per distinct structure instead of once per preset. Presets that differ only in size (the
// 7B and 13B of one family) or in name (a base model and its instruct tune) shrink alike.
#ifndef LGPT_TESTS_PRESET_GROUPS_H_
#define LGPT_TESTS_PRESET_GROUPS_H_

#include <string>
#include <vector>

namespace lgpt {

// Every preset that shrinks to one structure, in PresetNames() order; the first one stands
// for the group. A preset that cannot be shrunk forms a group of its own (its test then
// reports why).
struct ShrunkPresetGroup {
  std::vector<std::string> presets;  // non-empty
  const std::string& representative() const { return presets.front(); }
};

// Every preset of PresetNames() in exactly one group, groups in the order of their first
// preset. Computed once.
const std::vector<ShrunkPresetGroup>& ShrunkPresetGroups();

// The representative of each group (values for a parameterised test).
std::vector<std::string> ShrunkPresetRepresentatives();

// The group whose representative is `name`; nullptr if `name` represents none.
const ShrunkPresetGroup* ShrunkPresetGroupOf(const std::string& name);

}  // namespace lgpt

#endif  // LGPT_TESTS_PRESET_GROUPS_H_
