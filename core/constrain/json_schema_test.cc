#include "core/constrain/json_schema.h"

#include <random>
#include <string>
#include <vector>

#include "core/base/status_field.h"
#include "core/constrain/matcher.h"
#include "core/constrain/test_util.h"
#include "core/constrain/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace lgpt {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

std::shared_ptr<const Grammar> Compile(const Json& schema) {
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileJsonSchema(schema, "schema");
  EXPECT_TRUE(grammar.ok()) << grammar.status() << "\n" << schema.dump();
  return grammar.ok() ? *grammar : nullptr;
}

// --- A validator for the supported subset, with the grammar's documented extra rules: no
// property outside `properties` unless additionalProperties allows it, and properties in the
// schema's order.

size_t CodePoints(const std::string& s) {
  size_t n = 0, pos = 0;
  uint32_t c;
  while (DecodeUtf8(s, &pos, &c)) ++n;
  return pos == s.size() ? n : std::string::npos;
}

bool Validate(const Json& schema, const Json& value, const Json& root, std::string* why);

bool ValidateType(const std::string& type, const Json& schema, const Json& value, const Json& root,
                  std::string* why) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (!value.is_number_integer()) return false;
    const int64_t v = value.get<int64_t>();
    if (schema.contains("minimum") && v < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && v > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && v <= schema["exclusiveMinimum"].get<double>()) {
      return false;
    }
    if (schema.contains("exclusiveMaximum") && v >= schema["exclusiveMaximum"].get<double>()) {
      return false;
    }
    return true;
  }
  if (type == "string") {
    if (!value.is_string()) return false;
    const std::string s = value.get<std::string>();
    const size_t n = CodePoints(s);
    if (n == std::string::npos) return false;
    if (schema.contains("minLength") && n < schema["minLength"].get<size_t>()) return false;
    if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>()) return false;
    if (schema.contains("pattern") &&
        !RE2::FullMatch(s, RE2(schema["pattern"].get<std::string>()))) {
      return false;
    }
    return true;
  }
  if (type == "array") {
    if (!value.is_array()) return false;
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) {
      return false;
    }
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) {
      return false;
    }
    for (const Json& item : value) {
      if (schema.contains("items") && !Validate(schema["items"], item, root, why)) return false;
    }
    return true;
  }
  if (type == "object") {
    if (!value.is_object()) return false;
    const Json empty = Json::object();
    const Json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (schema.contains("required")) {
      for (const Json& name : schema["required"]) {
        if (!value.contains(name.get<std::string>())) {
          *why = "missing required " + name.dump();
          return false;
        }
      }
    }
    size_t order = 0;  // listed properties must come in the schema's order
    std::vector<std::string> listed;
    for (const auto& [key, sub] : properties.items()) listed.push_back(key);
    for (const auto& [key, item] : value.items()) {
      auto it = std::find(listed.begin(), listed.end(), key);
      if (it != listed.end()) {
        const size_t index = it - listed.begin();
        if (index < order) {
          *why = "property " + key + " out of order";
          return false;
        }
        order = index + 1;
        if (!Validate(properties[key], item, root, why)) return false;
        continue;
      }
      const bool extras = schema.contains("additionalProperties")
                              ? !(schema["additionalProperties"].is_boolean() &&
                                  !schema["additionalProperties"].get<bool>())
                              : !schema.contains("properties");
      if (!extras) {
        *why = "extra property " + key;
        return false;
      }
      if (schema.contains("additionalProperties") &&
          !Validate(schema["additionalProperties"], item, root, why)) {
        return false;
      }
    }
    return true;
  }
  *why = "unknown type " + type;
  return false;
}

bool Validate(const Json& schema, const Json& value, const Json& root, std::string* why) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"].get<std::string>();
    if (ref == "#") return Validate(root, value, root, why);
    const size_t slash = ref.rfind('/');
    const std::string section = ref.substr(2, slash - 2), name = ref.substr(slash + 1);
    return Validate(root[section][name], value, root, why);
  }
  for (const char* keyword : {"anyOf", "oneOf"}) {
    if (!schema.contains(keyword)) continue;
    int matches = 0;
    for (const Json& branch : schema[keyword]) {
      std::string ignored;
      matches += Validate(branch, value, root, &ignored);
    }
    if (std::string(keyword) == "oneOf" ? matches == 1 : matches >= 1) return true;
    *why = std::string(keyword) + " matched " + std::to_string(matches) + " for " + value.dump();
    return false;
  }
  if (schema.contains("allOf")) return Validate(schema["allOf"][0], value, root, why);
  if (schema.contains("const")) return value == schema["const"];
  if (schema.contains("enum")) {
    for (const Json& option : schema["enum"]) {
      if (value == option) return true;
    }
    *why = value.dump() + " not in enum";
    return false;
  }
  if (!schema.contains("type")) return true;
  std::vector<std::string> types;
  if (schema["type"].is_string()) {
    types.push_back(schema["type"].get<std::string>());
  } else {
    for (const Json& t : schema["type"]) types.push_back(t.get<std::string>());
  }
  for (const std::string& type : types) {
    if (ValidateType(type, schema, value, root, why)) return true;
  }
  if (why->empty()) *why = value.dump() + " is not " + schema["type"].dump();
  return false;
}

// --- Random schemas of the supported subset.

class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint64_t seed) : rng_(seed) {}

  Json Root() {
    Json root = Generate(0);
    if (Chance(0.3)) {  // a recursive definition
      Json schema = Json::object();
      schema["type"] = "object";
      schema["properties"]["v"] = Json{{"type", "integer"}, {"minimum", -3}, {"maximum", 40}};
      schema["properties"]["kids"] =
          Json{{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}, {"maxItems", 2}};
      schema["required"] = Json::array({"v"});
      Json wrapped = Json::object();
      wrapped["type"] = "object";
      wrapped["properties"]["tree"] = Json{{"$ref", "#/$defs/node"}};
      wrapped["properties"]["other"] = root;
      wrapped["required"] = Json::array({"tree"});
      wrapped["$defs"]["node"] = schema;
      return wrapped;
    }
    return root;
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Json Generate(int depth) {
    const int kind = Int(0, depth >= 3 ? 6 : 11);
    Json s = Json::object();
    switch (kind) {
      case 0:
        s["type"] = "string";
        if (Chance(0.5)) s["minLength"] = Int(0, 3);
        if (Chance(0.5)) s["maxLength"] = Int(s.value("minLength", 0), 6);
        break;
      case 1:
        s["type"] = "string";
        s["pattern"] = std::vector<std::string>{"[a-z]{1,4}", R"(\d+-\d)", "(ab|c\"d)+",
                                                "[^x]{0,3}", R"(\w\s?)"}[Int(0, 4)];
        break;
      case 2:
        s["type"] = "integer";
        if (Chance(0.5)) s["minimum"] = Int(-50, 50);
        if (Chance(0.5)) s["maximum"] = s.value("minimum", -60) + Int(0, 1000);
        if (Chance(0.2)) {
          s["exclusiveMinimum"] = s.value("minimum", s.value("maximum", 0)) - Int(1, 100);
        }
        break;
      case 3:
        s["type"] = Chance(0.5) ? "number" : "boolean";
        break;
      case 4:
        s["type"] = Json::array({"string", "null"});
        if (Chance(0.5)) s["maxLength"] = Int(0, 5);
        break;
      case 5:
        s["enum"] = Json::array(
            {"red", 3, nullptr, "gr\u00e9en\"", Json::array({1, "x"}), Json{{"k", true}}});
        if (Chance(0.5)) s["enum"].erase(s["enum"].begin() + Int(0, 5));
        break;
      case 6:
        s["const"] = Chance(0.5) ? Json("fixed \\ value") : Json{{"a", Json::array({1, 2.5})}};
        break;
      case 7: {
        s["type"] = "array";
        if (Chance(0.8)) s["items"] = Generate(depth + 1);
        if (Chance(0.5)) s["minItems"] = Int(0, 2);
        if (Chance(0.5)) s["maxItems"] = s.value("minItems", 0) + Int(0, 3);
        break;
      }
      case 8:
      case 9: {
        s["type"] = "object";
        const int n = Int(0, 4);
        static const char* const kKeys[] = {"a",   "b c",         "q\"uote", "\u00e9t\u00e9",
                                            "x_1", "back\\slash", "ab",      "a2"};
        std::vector<std::string> keys(std::begin(kKeys), std::end(kKeys));
        std::shuffle(keys.begin(), keys.end(), rng_);
        Json required = Json::array();
        for (int i = 0; i < n; ++i) {
          s["properties"][keys[i]] = Generate(depth + 1);
          if (Chance(0.5)) required.push_back(keys[i]);
        }
        if (!required.empty()) s["required"] = required;
        if (n == 0 && Chance(0.5)) {
          s["additionalProperties"] = Chance(0.5) ? Json(true) : Generate(depth + 1);
        } else if (n > 0 && Chance(0.3)) {
          s["additionalProperties"] = false;
        }
        break;
      }
      case 10: {  // branches of distinct types, so that oneOf holds
        const char* key = Chance(0.5) ? "anyOf" : "oneOf";
        s[key] = Json::array({Json{{"type", "integer"}},
                              Json{{"type", "array"}, {"items", Generate(depth + 1)}},
                              Json{{"type", "null"}}});
        break;
      }
      default:
        if (Chance(0.5)) {
          s["type"] = "object";  // any object
        } else {
          s["allOf"] = Json::array({Generate(depth + 1)});
        }
        break;
    }
    if (Chance(0.2)) s["description"] = "annotation";
    return s;
  }

  std::mt19937_64 rng_;
};

// Every sentence a matcher samples is JSON valid against its schema.
void CheckWalks(const Json& schema, const std::shared_ptr<const TokenVocabulary>& vocabulary,
                int walks, int max_tokens, std::mt19937_64* rng, int* finished) {
  std::shared_ptr<const Grammar> grammar = Compile(schema);
  ASSERT_NE(grammar, nullptr);
  GrammarMatcher matcher(grammar, vocabulary);
  for (int walk = 0; walk < walks; ++walk) {
    std::optional<std::string> text = RandomWalk(matcher.Fork(), rng, max_tokens);
    if (!text) continue;
    ++*finished;
    const Json value = Json::parse(*text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << "not JSON: " << *text << "\nschema " << schema.dump();
    std::string why;
    EXPECT_TRUE(Validate(schema, value, schema, &why))
        << why << "\ntext " << *text << "\nschema " << schema.dump();
  }
}

TEST(JsonSchemaTest, RandomSchemasSyntheticVocabulary) {
  auto vocabulary =
      SyntheticVocabulary(21, 4000, "{}[]\":,\\ \n\tabcdefkqrux_0123456789.-+eE\xC3\xA9ntl");
  std::mt19937_64 rng(99);
  int finished = 0, total = 0;
  for (uint64_t seed = 0; seed < 120; ++seed) {
    const Json schema = SchemaGenerator(seed).Root();
    SCOPED_TRACE(schema.dump());
    CheckWalks(schema, vocabulary, 8, 1500, &rng, &finished);
    total += 8;
  }
  EXPECT_GT(finished, total * 3 / 4);
}

TEST(JsonSchemaTest, RandomSchemasGpt2Vocabulary) {
  auto vocabulary = Gpt2Vocabulary();
  std::mt19937_64 rng(7);
  int finished = 0;
  for (uint64_t seed = 1000; seed < 1012; ++seed) {
    const Json schema = SchemaGenerator(seed).Root();
    SCOPED_TRACE(schema.dump());
    CheckWalks(schema, vocabulary, 2, 3000, &rng, &finished);
  }
  EXPECT_GT(finished, 8);
}

// The mask equals trying every token on a copy, on schema grammars.
TEST(JsonSchemaTest, MaskEqualsBruteForce) {
  auto vocabulary = SyntheticVocabulary(5, 700, "{}[]\":, \nabq0123456789.-e\xC3\xA9tl");
  std::mt19937_64 rng(3);
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const Json schema = SchemaGenerator(seed + 500).Root();
    std::shared_ptr<const Grammar> grammar = Compile(schema);
    ASSERT_NE(grammar, nullptr);
    GrammarMatcher m(grammar, vocabulary);
    for (int step = 0; step < 40 && !m.IsComplete(); ++step) {
      const std::vector<bool> mask = m.NextTokenMask();
      std::vector<int64_t> allowed;
      for (int64_t id = 0; id < vocabulary->size(); ++id) {
        GrammarMatcher copy = m;
        const bool ok = copy.AcceptToken(id).ok();
        ASSERT_EQ(mask[id], ok) << schema.dump() << " token " << id;
        if (ok) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      const int64_t id = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(id).ok());
      if (vocabulary->is_eos(id)) break;
    }
  }
}

// The same with GPT-2's vocabulary, replaying a JSON answer, so that the walks skip whole
// subtrees inside strings (bounded and unbounded ones).
TEST(JsonSchemaTest, MaskEqualsBruteForceGpt2) {
  auto vocabulary = Gpt2Vocabulary();
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 30},
      "notes": {"type": "array", "items": {"type": "string"}},
      "n": {"type": "integer", "minimum": 0, "maximum": 500}}, "required": ["name"]})");
  GrammarMatcher m(Compile(schema), vocabulary);
  const std::string answer =
      R"({"name": "Grace Brewster Hopper", "notes": ["COBOL", "compilers and debugging", "a)"
      R"( nanosecond wire", "é€"], "n": 117})";
  std::vector<int64_t> allowed;
  for (size_t pos = 0; pos < answer.size();) {
    const std::vector<bool> mask = m.NextTokenMask();
    int64_t longest = -1;
    for (int64_t id = 0; id < vocabulary->size(); ++id) {
      GrammarMatcher copy = m;
      const bool ok = copy.AcceptToken(id).ok();
      ASSERT_EQ(mask[id], ok) << "token " << id << " \"" << vocabulary->token_bytes(id)
                              << "\" after \"" << answer.substr(0, pos) << "\"";
      const std::string& bytes = vocabulary->token_bytes(id);
      if (ok && !bytes.empty() && answer.compare(pos, bytes.size(), bytes) == 0 &&
          (longest < 0 || bytes.size() > vocabulary->token_bytes(longest).size())) {
        longest = id;
      }
    }
    ASSERT_GE(longest, 0) << answer.substr(0, pos);
    ASSERT_TRUE(m.AcceptToken(longest).ok());
    pos += vocabulary->token_bytes(longest).size();
  }
  EXPECT_TRUE(m.IsComplete());
}

TEST(JsonSchemaTest, AcceptsAndRejects) {
  auto g = Compile(Json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 3},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name"]})"));
  for (const char* ok : {R"({"name":"Bo"})", R"({"name": "Bo", "age": 7})",
                         "{\n  \"name\": \"\\u00e9\",\n  \"tags\": [\"a\", \"b\"]\n}",
                         R"({ "name":"", "age":120, "tags":[] })"}) {
    EXPECT_TRUE(GrammarAccepts(g, ok)) << ok;
  }
  for (const char* bad :
       {R"({"age": 7})", R"({"name":"Boba"})", R"({"age": 7, "name": "Bo"})",
        R"({"name":"Bo","age":121})", R"({"name":"Bo","age":-1})", R"({"name":"Bo","age":07})",
        R"({"name":"Bo","tags":["a","b","a"]})", R"({"name":"Bo","x":1})", R"( {"name":"Bo"})",
        R"({"name":"Bo"} )", R"({"name":"Bo",})", "{\"name\":\"\\ud800\"}", "{\"name\":\"a\nb\"}",
        R"({"name":  "Bo"})"}) {
    EXPECT_FALSE(GrammarAccepts(g, bad)) << bad;
  }
  auto any = AnyJsonObjectGrammar();
  EXPECT_TRUE(GrammarAccepts(any, R"({"a": [1, -2.5e3, {"b": null}], "c": true})"));
  EXPECT_TRUE(GrammarAccepts(any, "{}"));
  EXPECT_FALSE(GrammarAccepts(any, "[]"));
  EXPECT_FALSE(GrammarAccepts(any, R"({"a": 01})"));
}

TEST(JsonSchemaTest, IntegerBoundsExactly) {
  const std::pair<int, int> bounds[] = {{0, 0},     {-5, 5},       {3, 117}, {-120, -7},
                                        {90, 1000}, {-1000, 1000}, {10, 99}, {-9, 0}};
  for (const auto& [lo, hi] : bounds) {
    auto g = Compile(Json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    for (int k = -1500; k <= 1500; ++k) {
      EXPECT_EQ(GrammarAccepts(g, std::to_string(k)), k >= lo && k <= hi)
          << k << " " << lo << ".." << hi;
    }
    EXPECT_FALSE(GrammarAccepts(g, "-0"));
  }
  auto exclusive =
      Compile(Json{{"type", "integer"}, {"exclusiveMinimum", 2.5}, {"exclusiveMaximum", 10}});
  for (int k = 0; k <= 12; ++k)
    EXPECT_EQ(GrammarAccepts(exclusive, std::to_string(k)), k >= 3 && k <= 9) << k;
  auto open = Compile(Json{{"type", "integer"}, {"minimum", 42}});
  EXPECT_TRUE(GrammarAccepts(open, "9999999999999999"));
  EXPECT_TRUE(GrammarAccepts(open, "42"));
  EXPECT_FALSE(GrammarAccepts(open, "41"));
}

TEST(JsonSchemaTest, PropertyOrderFollowsTheSchema) {
  const Json schema = Json::parse(R"({"properties": {"z": {"type": "integer"},
                                                     "a": {"type": "integer"}}})");
  auto g = Compile(schema);
  EXPECT_TRUE(GrammarAccepts(g, R"({"z":1,"a":2})"));
  EXPECT_FALSE(GrammarAccepts(g, R"({"a":2,"z":1})"));
  // nlohmann::json sorts the keys.
  auto sorted = CompileJsonSchema(nlohmann::json(nlohmann::json::parse(schema.dump())), "s");
  ASSERT_TRUE(sorted.ok());
  EXPECT_TRUE(GrammarAccepts(*sorted, R"({"a":2,"z":1})"));
}

TEST(JsonSchemaTest, RefusalsNameTheKeywordPath) {
  const auto error = [](const char* text) {
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
        CompileJsonSchema(Json::parse(text), "response_format.json_schema.schema");
    EXPECT_FALSE(grammar.ok()) << text;
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
    return std::make_pair(ErrorField(grammar.status()).value_or(""),
                          std::string(grammar.status().message()));
  };
  EXPECT_EQ(error(R"({"properties": {"x": {"type": "string", "format": "date"}}})").first,
            "response_format.json_schema.schema.properties.x.format");
  EXPECT_THAT(error(R"({"properties": {"x": {"type": "string", "format": "date"}}})").second,
              HasSubstr("schema.properties.x.format: the JSON schema keyword format is not "
                        "supported"));
  EXPECT_EQ(error(R"({"anyOf": [{"type": "integer"}, {"type": "number", "minimum": 1}]})").first,
            "response_format.json_schema.schema.anyOf[1].minimum");
  EXPECT_EQ(error(R"({"$ref": "#/components/x"})").first,
            "response_format.json_schema.schema.$ref");
  EXPECT_EQ(error(R"({"items": {"type": "strin"}})").first,
            "response_format.json_schema.schema.items.type");
  EXPECT_EQ(error(R"j({"type": "string", "pattern": "a(?=b)"})j").first,
            "response_format.json_schema.schema.pattern");
  EXPECT_EQ(error(R"({"type": "object", "required": ["x"]})").first,
            "response_format.json_schema.schema.required");
  EXPECT_EQ(error(R"({"$defs": {"a": {"uniqueItems": true}}, "$ref": "#/$defs/a"})").first,
            "response_format.json_schema.schema.$defs.a.uniqueItems");
  EXPECT_EQ(error(R"({"type": "array", "minItems": 3, "maxItems": 2})").first,
            "response_format.json_schema.schema.maxItems");
  EXPECT_THAT(error(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                        "$ref": "#/$defs/a"})")
                  .second,
              HasSubstr("left-recursive"));
}

}  // namespace
}  // namespace lgpt
