#include "core/text/jinja.h"

#include <gtest/gtest.h>

namespace lgpt {
namespace jinja {
namespace {

TEST(JinjaTest, Smoke) {
  auto t = Template::Parse("{{ x ~ '!' }}");
  ASSERT_TRUE(t.ok()) << t.status();
  ValueDict context;
  context.Set("x", Value("hi"));
  EXPECT_EQ(*t->Render(context), "hi!");
}

}  // namespace
}  // namespace jinja
}  // namespace lgpt
