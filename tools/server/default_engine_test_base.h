// A test fixture for the server's tests that serve the embedded default model
// (tools/default_model, in the test's data): the Engine is loaded once per test suite and
// released after it. A test that derives from DefaultEngineTest reads it through engine().
#ifndef LGPT_TOOLS_SERVER_DEFAULT_ENGINE_TEST_BASE_H_
#define LGPT_TOOLS_SERVER_DEFAULT_ENGINE_TEST_BASE_H_

#include <gtest/gtest.h>

#include <memory>

#include "lgpt.h"

namespace lgpt {

inline constexpr char kDefaultModelDir[] = "tools/default_model";

class DefaultEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::shared_ptr<const Engine>> loaded = Engine::Load(kDefaultModelDir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    Slot() = *std::move(loaded);
  }
  static void TearDownTestSuite() { Slot().reset(); }
  void SetUp() override { ASSERT_NE(Slot(), nullptr) << "the default model did not load"; }

  static const std::shared_ptr<const Engine>& engine() { return Slot(); }

 private:
  // Function-local: no static object with a destructor outlives the suite's own reset.
  static std::shared_ptr<const Engine>& Slot() {
    static auto* engine = new std::shared_ptr<const Engine>();
    return *engine;
  }
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_SERVER_DEFAULT_ENGINE_TEST_BASE_H_
