#include "core/constrain/json_schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/constrain/regex.h"

namespace lgpt {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxNesting = 128;  // schemas in schemas: the compiler recurses

// The largest integer the number rules write: 16 digits.
constexpr int64_t kMaxInteger = 9999999999999999;

// The rules every schema grammar shares.
constexpr absl::string_view kBasicRules = R"(
ws ::= (" " | "\n" [ \t]{0,20})?
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws (json-member ("," ws json-member)*)? "}"
json-member ::= json-string ws ":" ws json-value ws
json-array ::= "[" ws (json-value ws ("," ws json-value ws)*)? "]"
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" json-hex4)
json-hex4 ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}
json-integer ::= "-"? json-digits
json-digits ::= "0" | [1-9] [0-9]{0,15}
json-number ::= json-integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?
)";

const std::set<std::string>& Annotations() {
  static const auto* const keys = new std::set<std::string>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *keys;
}

const std::set<std::string>& Keywords() {
  static const auto* const keys = new std::set<std::string>{"type",
                                                            "properties",
                                                            "required",
                                                            "additionalProperties",
                                                            "items",
                                                            "minItems",
                                                            "maxItems",
                                                            "minLength",
                                                            "maxLength",
                                                            "pattern",
                                                            "enum",
                                                            "const",
                                                            "anyOf",
                                                            "oneOf",
                                                            "allOf",
                                                            "$ref",
                                                            "minimum",
                                                            "maximum",
                                                            "exclusiveMinimum",
                                                            "exclusiveMaximum"};
  return *keys;
}

// Decimal numerals without leading zeros of the integers in [lo, hi], 0 <= lo <= hi.
std::string UnsignedRange(int64_t lo, int64_t hi);

// Numerals of one length: lo and hi are digit strings of equal length.
std::string SameLengthRange(const std::string& lo, const std::string& hi) {
  if (lo.size() == 1) return absl::StrCat("[", lo, "-", hi, "]");
  if (lo[0] == hi[0]) {
    return absl::StrCat("\"", lo.substr(0, 1), "\" ", SameLengthRange(lo.substr(1), hi.substr(1)));
  }
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  const std::string zeros(rest_lo.size(), '0'), nines(rest_lo.size(), '9');
  std::vector<std::string> alternatives;
  char first = lo[0], last = hi[0];
  if (rest_lo != zeros) {
    alternatives.push_back(
        absl::StrCat("\"", std::string(1, first), "\" ", SameLengthRange(rest_lo, nines)));
    ++first;
  }
  std::string tail;
  if (rest_hi != nines) {
    tail = absl::StrCat("\"", std::string(1, last), "\" ", SameLengthRange(zeros, rest_hi));
    --last;
  }
  if (first <= last) {
    alternatives.push_back(absl::StrCat("[", std::string(1, first), "-", std::string(1, last),
                                        "] [0-9]{", rest_lo.size(), "}"));
  }
  if (!tail.empty()) alternatives.push_back(tail);
  return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
}

std::string UnsignedRange(int64_t lo, int64_t hi) {
  std::vector<std::string> alternatives;
  int64_t bottom = 0, top = 9;  // the numerals of one length
  for (int digits = 1; digits <= 17 && bottom <= hi; ++digits) {
    const int64_t a = std::max(lo, bottom), b = std::min(hi, top);
    if (a <= b) alternatives.push_back(SameLengthRange(std::to_string(a), std::to_string(b)));
    bottom = digits == 1 ? 10 : bottom * 10;
    top = top * 10 + 9;
  }
  return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, absl::string_view path) : root_(root), root_path_(path) {}

  absl::StatusOr<std::string> Compile() {
    ASSIGN_OR_RETURN(std::string rule, Visit(root_, root_path_));
    std::string out = absl::StrCat("root ::= ", rule, "\n");
    for (const auto& [name, body] : rules_) absl::StrAppend(&out, name, " ::= ", body, "\n");
    return absl::StrCat(out, kBasicRules);
  }

 private:
  absl::Status Error(const std::string& path, absl::string_view message) {
    return InvalidFieldError(path, absl::StrCat(path, ": ", message));
  }

  // A new rule with `body`; returns its name.
  std::string AddRule(std::string body) {
    std::string name = absl::StrCat("s", rules_.size());
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  absl::StatusOr<std::string> Visit(const Json& schema, const std::string& path) {
    if (depth_ >= kMaxNesting) {
      return Error(path, absl::StrCat("schemas nest deeper than ", kMaxNesting));
    }
    ++depth_;
    absl::StatusOr<std::string> rule = VisitNested(schema, path);
    --depth_;
    return rule;
  }

  absl::StatusOr<std::string> VisitNested(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) return schema.get<bool>() ? std::string("json-value") : "([])";
    if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (!Keywords().count(key) && !Annotations().count(key)) {
        return Error(absl::StrCat(path, ".", key),
                     absl::StrCat("the JSON schema keyword ", key, " is not supported"));
      }
    }
    const auto only_with = [&](absl::string_view keyword) -> absl::Status {
      for (const auto& [key, value] : schema.items()) {
        if (key != keyword && !Annotations().count(key)) {
          return Error(absl::StrCat(path, ".", key),
                       absl::StrCat(key, " is not supported next to ", keyword));
        }
      }
      return absl::OkStatus();
    };
    if (schema.contains("$ref")) {
      RETURN_IF_ERROR(only_with("$ref"));
      return Ref(schema["$ref"], path + ".$ref");
    }
    for (const char* keyword : {"anyOf", "oneOf", "allOf"}) {
      if (!schema.contains(keyword)) continue;
      RETURN_IF_ERROR(only_with(keyword));
      const std::string at = absl::StrCat(path, ".", keyword);
      const Json& list = schema[keyword];
      if (!list.is_array() || list.empty()) return Error(at, "must be a non-empty array");
      if (std::string(keyword) == "allOf" && list.size() != 1) {
        return Error(at, "allOf is supported with one schema only");
      }
      std::vector<std::string> alternatives;
      for (size_t i = 0; i < list.size(); ++i) {
        ASSIGN_OR_RETURN(std::string rule, Visit(list[i], absl::StrCat(at, "[", i, "]")));
        alternatives.push_back(rule);
      }
      return AddRule(absl::StrJoin(alternatives, " | "));
    }
    if (schema.contains("const")) {
      RETURN_IF_ERROR(only_with("const"));
      return AddRule(GbnfLiteral(schema["const"].dump()));
    }
    if (schema.contains("enum")) {
      for (const auto& [key, value] : schema.items()) {
        if (key != "enum" && key != "type" && !Annotations().count(key)) {
          return Error(absl::StrCat(path, ".", key),
                       absl::StrCat(key, " is not supported next to enum"));
        }
      }
      const Json& values = schema["enum"];
      if (!values.is_array() || values.empty()) {
        return Error(path + ".enum", "must be a non-empty array");
      }
      std::vector<std::string> alternatives;
      for (const Json& value : values) alternatives.push_back(GbnfLiteral(value.dump()));
      return AddRule(absl::StrJoin(alternatives, " | "));
    }

    std::vector<std::string> types;
    if (schema.contains("type")) {
      const Json& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const Json& t : type) {
          if (!t.is_string()) return Error(path + ".type", "must be a string or strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Error(path + ".type", "must be a string or a non-empty array of strings");
      }
    } else {
      const auto has = [&](std::initializer_list<const char*> keys) {
        for (const char* key : keys) {
          if (schema.contains(key)) return true;
        }
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
        types.push_back("integer");
      }
      if (types.empty()) return std::string("json-value");
    }
    std::vector<std::string> alternatives;
    for (const std::string& type : types) {
      std::string rule;
      if (type == "object") {
        ASSIGN_OR_RETURN(rule, Object(schema, path));
      } else if (type == "array") {
        ASSIGN_OR_RETURN(rule, Array(schema, path));
      } else if (type == "string") {
        ASSIGN_OR_RETURN(rule, String(schema, path));
      } else if (type == "integer") {
        ASSIGN_OR_RETURN(rule, Integer(schema, path));
      } else if (type == "number") {
        for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
          if (schema.contains(key)) {
            return Error(absl::StrCat(path, ".", key),
                         absl::StrCat(key, " is supported for integers only"));
          }
        }
        rule = "json-number";
      } else if (type == "boolean") {
        rule = "(\"true\" | \"false\")";
      } else if (type == "null") {
        rule = "\"null\"";
      } else {
        return Error(path + ".type", absl::StrCat("unknown type \"", type, "\""));
      }
      alternatives.push_back(rule);
    }
    return AddRule(absl::StrJoin(alternatives, " | "));
  }

  absl::StatusOr<int64_t> Count(const Json& schema, const char* key, const std::string& path,
                                int64_t otherwise) {
    if (!schema.contains(key)) return otherwise;
    const Json& value = schema[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return Error(absl::StrCat(path, ".", key), "must be a non-negative integer");
    }
    if (value.get<int64_t>() > 100000) {
      return Error(absl::StrCat(path, ".", key), "counts above 100000 are not supported");
    }
    return value.get<int64_t>();
  }

  // `item` repeated min to max times (max < 0: unbounded), separated by "," ws.
  static std::string CommaList(const std::string& item, int64_t min, int64_t max) {
    if (max == 0) return "\"\"";
    const std::string more = absl::StrCat("(\",\" ws ", item, ")");
    std::string rest;
    const int64_t rest_min = std::max<int64_t>(min - 1, 0);
    if (max < 0) {
      rest = absl::StrCat(more, "{", rest_min, ",}");
    } else {
      rest = absl::StrCat(more, "{", rest_min, ",", max - 1, "}");
    }
    std::string list = absl::StrCat(item, " ", rest);
    return min == 0 ? absl::StrCat("(", list, ")?") : list;
  }

  absl::StatusOr<std::string> Array(const Json& schema, const std::string& path) {
    std::string item = "json-value";
    if (schema.contains("items")) {
      ASSIGN_OR_RETURN(item, Visit(schema["items"], path + ".items"));
    }
    ASSIGN_OR_RETURN(int64_t min, Count(schema, "minItems", path, 0));
    ASSIGN_OR_RETURN(int64_t max, Count(schema, "maxItems", path, -1));
    if (max >= 0 && max < min) return Error(path + ".maxItems", "is below minItems");
    return AddRule(absl::StrCat("\"[\" ws ", CommaList(item + " ws", min, max), " \"]\""));
  }

  absl::StatusOr<std::string> String(const Json& schema, const std::string& path) {
    if (schema.contains("pattern")) {
      for (const char* key : {"minLength", "maxLength"}) {
        if (schema.contains(key)) {
          return Error(absl::StrCat(path, ".", key),
                       absl::StrCat(key, " is not supported together with pattern"));
        }
      }
      if (!schema["pattern"].is_string()) return Error(path + ".pattern", "must be a string");
      ASSIGN_OR_RETURN(std::string body, RegexToGbnf(schema["pattern"].get<std::string>(),
                                                     path + ".pattern", RegexText::kJsonString));
      return AddRule(absl::StrCat("\"\\\"\" ", body, " \"\\\"\""));
    }
    ASSIGN_OR_RETURN(int64_t min, Count(schema, "minLength", path, 0));
    ASSIGN_OR_RETURN(int64_t max, Count(schema, "maxLength", path, -1));
    if (max >= 0 && max < min) return Error(path + ".maxLength", "is below minLength");
    if (min == 0 && max < 0) return std::string("json-string");
    return AddRule(absl::StrCat("\"\\\"\" json-char{", min, ",",
                                max >= 0 ? std::to_string(max) : "", "} \"\\\"\""));
  }

  absl::StatusOr<std::string> Integer(const Json& schema, const std::string& path) {
    int64_t lo = -kMaxInteger, hi = kMaxInteger;
    bool bounded = false;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!schema.contains(key)) continue;
      const Json& value = schema[key];
      const std::string at = absl::StrCat(path, ".", key);
      if (!value.is_number()) return Error(at, "must be a number");
      const double v = value.get<double>();
      if (std::abs(v) > static_cast<double>(kMaxInteger)) {
        return Error(at, "bounds beyond 16 digits are not supported");
      }
      const std::string k = key;
      bounded = true;
      if (k == "minimum") lo = std::max(lo, static_cast<int64_t>(std::ceil(v)));
      if (k == "exclusiveMinimum") lo = std::max(lo, static_cast<int64_t>(std::floor(v)) + 1);
      if (k == "maximum") hi = std::min(hi, static_cast<int64_t>(std::floor(v)));
      if (k == "exclusiveMaximum") hi = std::min(hi, static_cast<int64_t>(std::ceil(v)) - 1);
    }
    if (!bounded) return std::string("json-integer");
    if (lo > hi) return Error(path, "no integer lies within the bounds");
    std::vector<std::string> alternatives;
    if (lo < 0)
      alternatives.push_back(
          absl::StrCat("\"-\" ", UnsignedRange(std::max<int64_t>(1, hi < 0 ? -hi : 1), -lo)));
    if (hi >= 0) alternatives.push_back(UnsignedRange(std::max<int64_t>(0, lo), hi));
    return AddRule(absl::StrJoin(alternatives, " | "));
  }

  absl::StatusOr<std::string> Object(const Json& schema, const std::string& path) {
    struct Property {
      std::string key_literal, value;
      bool required;
    };
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& list = schema["required"];
      if (!list.is_array()) return Error(path + ".required", "must be an array of strings");
      for (const Json& name : list) {
        if (!name.is_string()) return Error(path + ".required", "must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    std::vector<Property> properties;
    std::set<std::string> listed;
    if (schema.contains("properties")) {
      const Json& map = schema["properties"];
      if (!map.is_object()) return Error(path + ".properties", "must be an object");
      for (const auto& [key, value] : map.items()) {
        ASSIGN_OR_RETURN(std::string rule, Visit(value, absl::StrCat(path, ".properties.", key)));
        properties.push_back({GbnfLiteral(Json(key).dump()), rule, required.count(key) > 0});
        listed.insert(key);
      }
    }
    std::optional<std::string> additional;  // the extra values' rule, when extras are allowed
    if (schema.contains("additionalProperties")) {
      const Json& extra = schema["additionalProperties"];
      if (!(extra.is_boolean() && !extra.get<bool>())) {
        ASSIGN_OR_RETURN(additional, Visit(extra, path + ".additionalProperties"));
      }
    } else if (!schema.contains("properties")) {
      additional = "json-value";
    }
    for (const std::string& name : required) {
      if (!listed.count(name)) {
        return Error(path + ".required",
                     absl::StrCat("names \"", name,
                                  "\", which is not in properties (required extra properties "
                                  "are not supported)"));
      }
    }
    // tail(i, comma): the members from property i on, after a member (comma) or none.
    const size_t n = properties.size();
    std::vector<std::array<std::string, 2>> tail(n + 1);
    const std::string extra_member =
        additional ? AddRule(absl::StrCat("json-string ws \":\" ws ", *additional, " ws")) : "";
    tail[n][0] = additional
                     ? AddRule(absl::StrCat("(", extra_member, " (\",\" ws ", extra_member, ")*)?"))
                     : "\"\"";
    tail[n][1] = additional ? AddRule(absl::StrCat("(\",\" ws ", extra_member, ")*")) : "\"\"";
    for (size_t i = n; i-- > 0;) {
      const std::string member = AddRule(
          absl::StrCat(properties[i].key_literal, " ws \":\" ws ", properties[i].value, " ws"));
      for (int comma = 0; comma < 2; ++comma) {
        std::string body = absl::StrCat(comma ? "\",\" ws " : "", member, " ", tail[i + 1][1]);
        if (!properties[i].required) absl::StrAppend(&body, " | ", tail[i + 1][comma]);
        tail[i][comma] = AddRule(body);
      }
    }
    return AddRule(absl::StrCat("\"{\" ws ", tail[0][0], " \"}\""));
  }

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Error(path, "must be a string");
    const std::string target = ref.get<std::string>();
    auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    const Json* schema = nullptr;
    std::string schema_path = root_path_;
    if (target == "#") {
      schema = &root_;
    } else {
      for (const char* section : {"$defs", "definitions"}) {
        const std::string prefix = absl::StrCat("#/", section, "/");
        if (target.rfind(prefix, 0) != 0) continue;
        std::string name;  // JSON pointer unescaping: ~1 is '/', ~0 is '~'
        for (size_t i = prefix.size(); i < target.size(); ++i) {
          if (target[i] == '~' && i + 1 < target.size() &&
              (target[i + 1] == '0' || target[i + 1] == '1')) {
            name += target[++i] == '0' ? '~' : '/';
          } else if (target[i] == '/') {
            name.clear();
            break;
          } else {
            name += target[i];
          }
        }
        if (!name.empty() && root_.contains(section) && root_[section].contains(name)) {
          schema = &root_[section][name];
          schema_path = absl::StrCat(root_path_, ".", section, ".", name);
        }
      }
    }
    if (schema == nullptr) {
      return Error(path, absl::StrCat("the reference \"", target,
                                      "\" is not supported or not found (supported: \"#\", "
                                      "\"#/$defs/NAME\", \"#/definitions/NAME\")"));
    }
    const std::string name = absl::StrCat("ref", refs_.size());
    refs_[target] = name;
    ASSIGN_OR_RETURN(std::string rule, Visit(*schema, schema_path));
    rules_.emplace_back(name, rule);
    return name;
  }

  const Json& root_;
  const std::string root_path_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> refs_;
  int depth_ = 0;  // of nested schemas
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             absl::string_view field_path) {
  return SchemaCompiler(schema, field_path).Compile();
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, absl::string_view field_path) {
  ASSIGN_OR_RETURN(std::string gbnf, JsonSchemaToGbnf(schema, field_path));
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = CompileGbnf(gbnf);
  if (!grammar.ok()) {  // left recursion through $ref, say
    return InvalidFieldError(field_path,
                             absl::StrCat(field_path, ": ", grammar.status().message()));
  }
  return grammar;
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(const nlohmann::json& schema,
                                                                 absl::string_view field_path) {
  return CompileJsonSchema(nlohmann::ordered_json::parse(schema.dump()), field_path);
}

std::shared_ptr<const Grammar> AnyJsonObjectGrammar() {
  static const auto* const grammar = new std::shared_ptr<const Grammar>(
      CompileGbnf(absl::StrCat("root ::= json-object\n", kBasicRules)).value());
  return *grammar;
}

}  // namespace lgpt
