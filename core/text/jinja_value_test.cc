// Values: Python's str()/repr() of each kind, float repr, truthiness, equality and Hugging
// Face's tojson (insertion order, non-ASCII kept, indent).
#include "core/text/jinja_value.h"

#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"

namespace lgpt {
namespace jinja {
namespace {

TEST(JinjaValueTest, PythonFloatRepr) {
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(-2.5), "-2.5");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(0.00001), "1e-05");
  EXPECT_EQ(PythonFloatRepr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(PythonFloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(1.5e300), "1.5e+300");
}

TEST(JinjaValueTest, StrAndRepr) {
  EXPECT_EQ(Value().Str(), "");
  EXPECT_EQ(Value::None().Str(), "None");
  EXPECT_EQ(Value(true).Str(), "True");
  EXPECT_EQ(Value(int64_t{-3}).Str(), "-3");
  EXPECT_EQ(Value("it's").Repr(), "\"it's\"");
  EXPECT_EQ(Value("a\nb\\").Repr(), "'a\\nb\\\\'");
  auto json = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, "x", null, true], "a": {}})");
  EXPECT_EQ(Value::FromJson(json).Str(), "{'b': [1, 2.5, 'x', None, True], 'a': {}}");
}

TEST(JinjaValueTest, TruthinessAndEquality) {
  EXPECT_FALSE(Value().Truthy());
  EXPECT_FALSE(Value("").Truthy());
  EXPECT_FALSE(Value(ValueList{}).Truthy());
  EXPECT_TRUE(Value(ValueList{Value(0)}).Truthy());
  EXPECT_TRUE(Value(1).Equals(Value(1.0)));
  EXPECT_TRUE(Value(true).Equals(Value(1)));
  EXPECT_FALSE(Value().Equals(Value::None()));
  auto a = nlohmann::ordered_json::parse(R"({"x": 1, "y": [1]})");
  auto b = nlohmann::ordered_json::parse(R"({"y": [1.0], "x": 1})");
  EXPECT_TRUE(Value::FromJson(a).Equals(Value::FromJson(b)));
}

TEST(JinjaValueTest, ToJsonAsHuggingFace) {
  auto json = nlohmann::ordered_json::parse(
      R"({"z": "é\n\"q\"", "a": [1, 2.0, {"k": null}], "e": [], "o": {}})");
  Value v = Value::FromJson(json);
  EXPECT_EQ(*v.ToJson(),
            "{\"z\": \"é\\n\\\"q\\\"\", \"a\": [1, 2.0, {\"k\": null}], \"e\": [], \"o\": {}}");
  EXPECT_EQ(*v.ToJson(2),
            "{\n  \"z\": \"é\\n\\\"q\\\"\",\n  \"a\": [\n    1,\n    2.0,\n    {\n      \"k\": "
            "null\n    }\n  ],\n  \"e\": [],\n  \"o\": {}\n}");
  EXPECT_FALSE(Value().ToJson().ok());
}

TEST(JinjaValueTest, CodePoints) {
  std::string s = "aé€😀";
  EXPECT_EQ(Utf8ToCodePoints(s).size(), 4u);
  EXPECT_EQ(CodePointsToUtf8(Utf8ToCodePoints(s)), s);
  EXPECT_EQ(*Value(s).Length(), 4);
}

}  // namespace
}  // namespace jinja
}  // namespace lgpt
