#include "core/text/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lgpt {
namespace jinja {

const Value* ValueDict::Find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int v) : kind_(Kind::kInt), i_(v) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(const char* s) : Value(std::string(s)) {}
namespace {

int ListDepth(const ValueList& list) {
  int depth = 0;
  for (const Value& item : list) depth = std::max(depth, item.depth());
  return depth + 1;
}

int DictDepth(const ValueDict& dict) {
  if (dict.is_namespace) return 0;
  int depth = 0;
  for (const auto& [key, item] : dict.items) depth = std::max(depth, item.depth());
  return depth + 1;
}

}  // namespace

Value::Value(ValueList list)
    : kind_(Kind::kList),
      depth_(ListDepth(list)),
      list_(std::make_shared<ValueList>(std::move(list))) {}
Value::Value(ValueDict dict)
    : kind_(Kind::kDict),
      depth_(DictDepth(dict)),
      dict_(std::make_shared<ValueDict>(std::move(dict))) {}

Value Value::List(std::shared_ptr<ValueList> list) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = ListDepth(*list);
  v.list_ = std::move(list);
  return v;
}

Value Value::Dict(std::shared_ptr<ValueDict> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = DictDepth(*dict);
  v.dict_ = std::move(dict);
  return v;
}

Value Value::MakeCallable(std::string name, Function function) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(function)});
  return v;
}

namespace {

template <typename Json>
Value FromJsonImpl(const Json& json, int depth) {
  if (depth > kMaxJsonDepth) return Value::None();
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(json.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList list;
      list.reserve(json.size());
      for (const auto& item : json) list.push_back(FromJsonImpl(item, depth + 1));
      return Value(std::move(list));
    }
    case nlohmann::json::value_t::object: {
      ValueDict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict.items.emplace_back(it.key(), FromJsonImpl(it.value(), depth + 1));
      }
      return Value(std::move(dict));
    }
    default:
      return Value();
  }
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: value nested deeper than 512");
  auto newline = [&](int level) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError("tojson: an undefined value is not JSON serializable");
    case Value::Kind::kCallable:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: ", v.as_callable().name, " is not JSON serializable"));
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      double d = v.as_double();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(PythonFloatRepr(d));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const ValueList& list = v.as_list();
      if (list.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out->append(indent >= 0 ? "," : ", ");
        if (indent >= 0) newline(depth + 1);
        auto status = AppendJson(list[i], indent, depth + 1, out);
        if (!status.ok()) return status;
      }
      if (indent >= 0) newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.as_dict().is_namespace) {
        return absl::InvalidArgumentError("tojson: a namespace is not JSON serializable");
      }
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(indent >= 0 ? "," : ", ");
        if (indent >= 0) newline(depth + 1);
        AppendJsonString(items[i].first, out);
        out->append(": ");
        auto status = AppendJson(items[i].second, indent, depth + 1, out);
        if (!status.ok()) return status;
      }
      if (indent >= 0) newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& json) { return FromJsonImpl(json, 1); }
Value Value::FromJson(const nlohmann::json& json) { return FromJsonImpl(json, 1); }

double Value::as_double() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

bool Value::Equals(const Value& other) const {
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(*this) && numeric(other)) {
    if (kind_ != Kind::kFloat && other.kind_ != Kind::kFloat) return as_int() == other.as_int();
    return as_double() == other.as_double();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *s_ == *other.s_;
    case Kind::kList: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      // A namespace equals only itself (Python compares them by identity).
      if (dict_->is_namespace || other.dict_->is_namespace) return dict_ == other.dict_;
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* w = other.dict_->Find(k);
        if (w == nullptr || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Kind::kCallable:
      return callable_ == other.callable_;
    default:
      return false;
  }
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return PythonFloatRepr(f_);
    case Kind::kString:
      return PythonStringRepr(*s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out.append(", ");
        out.append((*list_)[i].Repr());
      }
      return out + "]";
    }
    case Kind::kDict: {
      if (dict_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i > 0) out.append(", ");
        absl::StrAppend(&out, PythonStringRepr(dict_->items[i].first), ": ",
                        dict_->items[i].second.Repr());
      }
      return out + "}";
    }
    case Kind::kCallable:
      return absl::StrCat("<function ", callable_->name, ">");
  }
  return "";
}

std::optional<int64_t> Value::Length() const {
  switch (kind_) {
    case Kind::kString:
      return static_cast<int64_t>(Utf8ToCodePoints(*s_).size());
    case Kind::kList:
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->items.size());
    default:
      return std::nullopt;
  }
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  auto status = AppendJson(*this, indent, 0, &out);
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<nlohmann::ordered_json> Value::ToJsonValue() const {
  auto text = ToJson();
  if (!text.ok()) return text.status();
  return nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
}

std::string PythonFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest digits that read back as v.
  char buffer[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, v);
    if (std::strtod(buffer, nullptr) == v) break;
  }
  std::string text(buffer);
  bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  size_t e = text.find('e');
  int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exponent + 1;
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    absl::StrAppendFormat(&out, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return out;
}

std::string PythonStringRepr(absl::string_view s) {
  bool has_single = s.find('\'') != absl::string_view::npos;
  bool has_double = s.find('"') != absl::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

std::vector<uint32_t> Utf8ToCodePoints(absl::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    if (c >= 0x80 && c < 0xc0) extra = 0;
    if (extra == 0 || i + extra >= s.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    uint32_t cp = c & (0x3f >> extra);
    bool valid = true;
    for (int k = 1; k <= extra; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) {
        valid = false;
        break;
      }
      cp = (cp << 6) | (d & 0x3f);
    }
    if (!valid) {
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string CodePointsToUtf8(const std::vector<uint32_t>& code_points) {
  std::string out;
  for (uint32_t cp : code_points) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

}  // namespace jinja
}  // namespace lgpt
