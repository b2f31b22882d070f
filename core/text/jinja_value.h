// The values of the Jinja interpreter (core/text/jinja.h): undefined, none, bool, int, float,
// string, list, dict (string keys, ordered as inserted) and callable, with Python's semantics
// where a chat template can see them: truthiness, equality, str() and repr() of each kind, and
// Hugging Face's `tojson` (json.dumps with ensure_ascii=False, keys in insertion order).
//
// Lists and dicts are shared, immutable once built; only a namespace() dict is assigned to
// (`{% set ns.found = true %}`), and every holder sees the change, as in Python.
#ifndef LGPT_CORE_TEXT_JINJA_VALUE_H_
#define LGPT_CORE_TEXT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace jinja {

class Value;

// The deepest JSON that Value::FromJson converts.
inline constexpr int kMaxJsonDepth = 256;

using ValueList = std::vector<Value>;

// A dict with string keys in insertion order.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): attributes may be assigned

  const Value* Find(absl::string_view key) const;
  void Set(const std::string& key, Value value);
};

// The arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<absl::StatusOr<Value>(CallArgs& args)>;

struct Callable {
  std::string name;  // for messages and repr
  Function function;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value None();
  Value(bool b);          // NOLINT(runtime/explicit)
  Value(int v);           // NOLINT(runtime/explicit)
  Value(int64_t v);       // NOLINT(runtime/explicit)
  Value(double v);        // NOLINT(runtime/explicit)
  Value(std::string s);   // NOLINT(runtime/explicit)
  Value(const char* s);   // NOLINT(runtime/explicit)
  Value(ValueList list);  // NOLINT(runtime/explicit)
  Value(ValueDict dict);  // NOLINT(runtime/explicit)
  static Value List(std::shared_ptr<ValueList> list);
  static Value Dict(std::shared_ptr<ValueDict> dict);
  static Value MakeCallable(std::string name, Function function);

  // JSON to values: objects keep their key order (ordered_json) or nlohmann's (json). Arrays
  // and objects nested deeper than kMaxJsonDepth become none (callers reject such input first).
  static Value FromJson(const nlohmann::ordered_json& json);
  static Value FromJson(const nlohmann::json& json);

  Kind kind() const { return kind_; }
  // How deeply lists and dicts nest in this value: 0 for a scalar or a namespace, 1 + the
  // deepest element for a list or dict.
  int depth() const { return depth_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  // ints, bools and floats as a double.
  double as_double() const;
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& mutable_dict() const { return *dict_; }
  const Callable& as_callable() const { return *callable_; }

  // Python's bool(): false for undefined, none, False, 0, 0.0, "", [] and {}.
  bool Truthy() const;
  // Python's ==: 1 == 1.0 == True; lists and dicts compare element by element; undefined
  // equals only undefined.
  bool Equals(const Value& other) const;
  // Python's str(): undefined is "", none "None", True "True", floats as repr, containers as
  // repr.
  std::string Str() const;
  // Python's repr(): strings quoted as Python quotes them.
  std::string Repr() const;
  // Python's len() of a string (code points), list or dict; nullopt for other kinds.
  std::optional<int64_t> Length() const;

  // json.dumps(value, ensure_ascii=False, indent=indent) (indent < 0: none). Fails for
  // undefined and callables.
  absl::StatusOr<std::string> ToJson(int indent = -1) const;
  // The value as nlohmann JSON (object keys keep their order); fails as ToJson.
  absl::StatusOr<nlohmann::ordered_json> ToJsonValue() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  int depth_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Callable> callable_;
};

// Python's repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string PythonFloatRepr(double v);
// Python's repr() of a string.
std::string PythonStringRepr(absl::string_view s);
// The code points of a UTF-8 string (invalid bytes as themselves) and back.
std::vector<uint32_t> Utf8ToCodePoints(absl::string_view s);
std::string CodePointsToUtf8(const std::vector<uint32_t>& code_points);

}  // namespace jinja
}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_JINJA_VALUE_H_
