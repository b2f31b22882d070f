#include "core/text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace jinja {
namespace {

absl::Status Error(absl::string_view message) { return absl::InvalidArgumentError(message); }

const char* KindName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kCallable:
      return "callable";
  }
  return "?";
}

// Positional argument `index` or keyword `name`; `fallback` where neither is given.
Value Arg(const CallArgs& args, size_t index, absl::string_view name, Value fallback = Value()) {
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return value;
  }
  if (index < args.positional.size()) return args.positional[index];
  return fallback;
}

bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }

absl::Status CheckString(size_t size, const BuiltinLimits& limits) {
  if (static_cast<int64_t>(size) > limits.max_string_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a string would exceed ",
                                                     limits.max_string_bytes,
                                                     " bytes (TemplateOptions.max_output_bytes)"));
  }
  return absl::OkStatus();
}

// Case mapping as Python's for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other
// code points are kept.
uint32_t UpperCodePoint(uint32_t c) {
  if (c < 0x80) return static_cast<uint32_t>(absl::ascii_toupper(static_cast<char>(c)));
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 0x20;
  if (c == 0xff) return 0x178;
  if (c == 0xb5) return 0x39c;
  if (c >= 0x100 && c <= 0x17f) {
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    if (c == 0x130 || c == 0x138 || c == 0x149) return c;
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    return odd_upper ? (c % 2 == 0 ? c - 1 : c) : (c % 2 == 1 ? c - 1 : c);
  }
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 0x20;
  if (c == 0x3ac) return 0x386;
  if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
  if (c == 0x3cc) return 0x38c;
  if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
  if (c >= 0x430 && c <= 0x44f) return c - 0x20;
  if (c >= 0x450 && c <= 0x45f) return c - 0x50;
  return c;
}

uint32_t LowerCodePoint(uint32_t c) {
  if (c < 0x80) return static_cast<uint32_t>(absl::ascii_tolower(static_cast<char>(c)));
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 0x20;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f) {
    if (c == 0x130 || c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17f) return c;
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    return odd_upper ? (c % 2 == 1 ? c + 1 : c) : (c % 2 == 0 ? c + 1 : c);
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 0x20;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 0x25;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 0x3f;
  if (c >= 0x410 && c <= 0x42f) return c + 0x20;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  return c;
}

bool IsCased(uint32_t c) { return UpperCodePoint(c) != c || LowerCodePoint(c) != c; }

void AppendUpper(uint32_t c, std::vector<uint32_t>* out) {
  if (c == 0xdf) {  // ß
    out->push_back('S');
    out->push_back('S');
  } else {
    out->push_back(UpperCodePoint(c));
  }
}

std::string PythonUpper(absl::string_view s) {
  std::vector<uint32_t> out;
  for (uint32_t c : Utf8ToCodePoints(s)) AppendUpper(c, &out);
  return CodePointsToUtf8(out);
}

std::string PythonLower(absl::string_view s) {
  std::vector<uint32_t> out;
  for (uint32_t c : Utf8ToCodePoints(s)) out.push_back(LowerCodePoint(c));
  return CodePointsToUtf8(out);
}

// The first code point upper case, the rest lower (Python's str.capitalize()).
std::string CapitalizeWord(absl::string_view word) {
  std::vector<uint32_t> cps = Utf8ToCodePoints(word), out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendUpper(cps[i], &out);
    } else {
      out.push_back(LowerCodePoint(cps[i]));
    }
  }
  return CodePointsToUtf8(out);
}

// Python's str.title(): a cased letter after an uncased character is upper case, other
// letters lower.
std::string PythonTitle(absl::string_view s) {
  std::vector<uint32_t> out;
  bool previous_cased = false;
  for (uint32_t c : Utf8ToCodePoints(s)) {
    if (previous_cased) {
      out.push_back(LowerCodePoint(c));
    } else {
      AppendUpper(c, &out);
    }
    previous_cased = IsCased(c);
  }
  return CodePointsToUtf8(out);
}

// jinja2's title filter: words begin after '-', whitespace, '(', '{', '[' or '<'.
std::string JinjaTitle(absl::string_view s) {
  std::string out;
  size_t i = 0;
  auto separator = [](char c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || c == '\t' ||
           c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (i < s.size()) {
    size_t j = i;
    if (separator(s[i])) {
      while (j < s.size() && separator(s[j])) ++j;
      absl::StrAppend(&out, s.substr(i, j - i));
    } else {
      while (j < s.size() && !separator(s[j])) ++j;
      absl::StrAppend(&out, CapitalizeWord(s.substr(i, j - i)));
    }
    i = j;
  }
  return out;
}

std::string Capitalize(absl::string_view s) { return CapitalizeWord(s); }

absl::StatusOr<Value> Split(const std::string& s, const Value& sep, const Value& maxsplit_value) {
  int64_t maxsplit =
      maxsplit_value.is_undefined() || maxsplit_value.is_none() ? -1 : maxsplit_value.as_int();
  ValueList parts;
  if (sep.is_undefined() || sep.is_none()) {
    std::vector<uint32_t> cps = Utf8ToCodePoints(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t end = cps.size();
        while (end > i && IsPythonSpace(cps[end - 1])) --end;
        parts.push_back(Value(CodePointsToUtf8({cps.begin() + i, cps.begin() + end})));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      parts.push_back(Value(CodePointsToUtf8({cps.begin() + i, cps.begin() + j})));
      i = j;
    }
    return Value(std::move(parts));
  }
  if (!sep.is_string()) return Error("split() separator must be a string");
  const std::string& d = sep.as_string();
  if (d.empty()) return Error("split(): empty separator");
  size_t start = 0;
  while (true) {
    size_t at = s.find(d, start);
    if (at == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
      parts.push_back(Value(s.substr(start)));
      break;
    }
    parts.push_back(Value(s.substr(start, at - start)));
    start = at + d.size();
  }
  return Value(std::move(parts));
}

absl::StatusOr<Value> Replace(const std::string& s, const Value& old_value, const Value& new_value,
                              const Value& count_value, const BuiltinLimits& limits) {
  if (!old_value.is_string() || !new_value.is_string()) {
    return Error("replace() arguments must be strings");
  }
  const std::string& from = old_value.as_string();
  const std::string& to = new_value.as_string();
  int64_t count = count_value.is_undefined() || count_value.is_none() ? -1 : count_value.as_int();
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before each character and at the end.
    std::vector<uint32_t> cps = Utf8ToCodePoints(s);
    int64_t done = 0;
    for (uint32_t cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += CodePointsToUtf8({cp});
      RETURN_IF_ERROR(CheckString(out.size(), limits));
    }
    if (count < 0 || done < count) out += to;
    return Value(std::move(out));
  }
  size_t start = 0;
  int64_t done = 0;
  while (true) {
    size_t at = (count >= 0 && done >= count) ? std::string::npos : s.find(from, start);
    if (at == std::string::npos) {
      out.append(s, start, std::string::npos);
      break;
    }
    out.append(s, start, at - start);
    out += to;
    RETURN_IF_ERROR(CheckString(out.size(), limits));
    start = at + from.size();
    ++done;
  }
  RETURN_IF_ERROR(CheckString(out.size(), limits));
  return Value(std::move(out));
}

// startswith/endswith with a string or a tuple of strings.
absl::StatusOr<Value> Affix(const std::string& s, const Value& what, bool start) {
  auto one = [&](const Value& v) -> absl::StatusOr<bool> {
    if (!v.is_string()) return Error("startswith()/endswith() take strings");
    return start ? absl::StartsWith(s, v.as_string()) : absl::EndsWith(s, v.as_string());
  };
  if (what.is_list()) {
    for (const Value& v : what.as_list()) {
      ASSIGN_OR_RETURN(bool hit, one(v));
      if (hit) return Value(true);
    }
    return Value(false);
  }
  ASSIGN_OR_RETURN(bool hit, one(what));
  return Value(hit);
}

Value StringMethod(const Value& receiver, absl::string_view name) {
  static const char* const kMethods[] = {"strip",    "lstrip",  "rstrip",    "split", "startswith",
                                         "endswith", "upper",   "lower",     "title", "capitalize",
                                         "replace",  "find",    "count",     "join",  "isdigit",
                                         "isalpha",  "isspace", "splitlines"};
  bool known = false;
  for (const char* m : kMethods) known = known || name == m;
  if (!known) return Value();
  std::string method(name);
  return Value::MakeCallable(
      absl::StrCat("str.", method), [receiver, method](CallArgs& args) -> absl::StatusOr<Value> {
        const std::string& s = receiver.as_string();
        if (method == "strip") return Value(PythonStrip(s, Arg(args, 0, "chars"), 'b'));
        if (method == "lstrip") return Value(PythonStrip(s, Arg(args, 0, "chars"), 'l'));
        if (method == "rstrip") return Value(PythonStrip(s, Arg(args, 0, "chars"), 'r'));
        if (method == "split") return Split(s, Arg(args, 0, "sep"), Arg(args, 1, "maxsplit"));
        if (method == "startswith") return Affix(s, Arg(args, 0, "prefix"), true);
        if (method == "endswith") return Affix(s, Arg(args, 0, "suffix"), false);
        if (method == "upper") return Value(PythonUpper(s));
        if (method == "lower") return Value(PythonLower(s));
        if (method == "title") return Value(PythonTitle(s));
        if (method == "capitalize") return Value(Capitalize(s));
        if (method == "replace") {
          return Replace(s, Arg(args, 0, "old"), Arg(args, 1, "new"), Arg(args, 2, "count"),
                         BuiltinLimits{});
        }
        if (method == "find" || method == "count") {
          Value sub = Arg(args, 0, "sub");
          if (!sub.is_string()) return Error(absl::StrCat(method, "() takes a string"));
          if (method == "find") {
            size_t at = s.find(sub.as_string());
            if (at == std::string::npos) return Value(-1);
            return Value(static_cast<int64_t>(Utf8ToCodePoints(s.substr(0, at)).size()));
          }
          if (sub.as_string().empty()) {
            return Value(static_cast<int64_t>(Utf8ToCodePoints(s).size()) + 1);
          }
          int64_t n = 0;
          for (size_t at = s.find(sub.as_string()); at != std::string::npos;
               at = s.find(sub.as_string(), at + sub.as_string().size())) {
            ++n;
          }
          return Value(n);
        }
        if (method == "join") {
          ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(Arg(args, 0, "iterable")));
          std::string out;
          for (size_t i = 0; i < items.size(); ++i) {
            if (!items[i].is_string()) return Error("join() takes strings");
            if (i > 0) out += s;
            out += items[i].as_string();
            RETURN_IF_ERROR(CheckString(out.size(), BuiltinLimits{}));
          }
          return Value(std::move(out));
        }
        if (method == "splitlines") {
          ValueList lines;
          size_t start = 0;
          while (start < s.size()) {
            size_t at = s.find('\n', start);
            if (at == std::string::npos) at = s.size();
            std::string line = s.substr(start, at - start);
            if (!line.empty() && line.back() == '\r') line.pop_back();
            lines.push_back(Value(std::move(line)));
            start = at + 1;
          }
          return Value(std::move(lines));
        }
        bool all = !s.empty();
        for (char c : s) {
          if (method == "isdigit") all = all && absl::ascii_isdigit(c);
          if (method == "isalpha") all = all && absl::ascii_isalpha(c);
          if (method == "isspace") all = all && absl::ascii_isspace(c);
        }
        return Value(all);
      });
}

Value ItemsOf(const ValueDict& dict) {
  ValueList items;
  items.reserve(dict.items.size());
  for (const auto& [k, v] : dict.items) items.push_back(Value(ValueList{Value(k), v}));
  return Value(std::move(items));
}

Value DictMethod(const Value& receiver, absl::string_view name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return Value();
  std::string method(name);
  return Value::MakeCallable(
      absl::StrCat("dict.", method), [receiver, method](CallArgs& args) -> absl::StatusOr<Value> {
        const ValueDict& d = receiver.as_dict();
        if (method == "items") return ItemsOf(d);
        if (method == "get") {
          Value key = Arg(args, 0, "key");
          const Value* found = key.is_string() ? d.Find(key.as_string()) : nullptr;
          if (found != nullptr) return *found;
          return Arg(args, 1, "default", Value::None());
        }
        ValueList out;
        for (const auto& [k, v] : d.items) out.push_back(method == "keys" ? Value(k) : v);
        return Value(std::move(out));
      });
}

// jinja2's attribute getter for map/selectattr/sort/join: dotted paths, integer parts as
// indexes.
Value AttributePath(const Value& item, const Value& attribute) {
  if (IsIntLike(attribute)) return GetItem(item, attribute);
  if (!attribute.is_string()) return Value();
  Value current = item;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    int64_t index;
    if (absl::SimpleAtoi(part, &index)) {
      current = GetItem(current, Value(index));
    } else {
      current = GetItem(current, Value(std::string(part)));
    }
  }
  return current;
}

// Three-way comparison for sort: numbers, strings (case-insensitive unless asked), else error.
absl::StatusOr<int> Order(const Value& a, const Value& b, bool case_sensitive) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    std::string x = case_sensitive ? a.as_string() : absl::AsciiStrToLower(a.as_string());
    std::string y = case_sensitive ? b.as_string() : absl::AsciiStrToLower(b.as_string());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return Error(absl::StrCat("cannot order ", KindName(a), " and ", KindName(b)));
}

absl::StatusOr<int64_t> ToInt(const Value& v, int64_t fallback) {
  switch (v.kind()) {
    case Value::Kind::kInt:
    case Value::Kind::kBool:
      return v.as_int();
    case Value::Kind::kFloat:
      if (!std::isfinite(v.as_double())) return fallback;
      return static_cast<int64_t>(std::trunc(v.as_double()));
    case Value::Kind::kString: {
      std::string s = PythonStrip(v.as_string(), Value(), 'b');
      int64_t i;
      if (absl::SimpleAtoi(s, &i)) return i;
      double d;
      if (absl::SimpleAtod(s, &d) && std::isfinite(d)) return static_cast<int64_t>(std::trunc(d));
      return fallback;
    }
    default:
      return fallback;
  }
}

// Runs the test named by `args.positional[first]` (with the rest as its arguments) on `v`.
absl::StatusOr<bool> TestFromArgs(const Value& v, const CallArgs& args, size_t first) {
  if (args.positional.size() <= first) return v.Truthy();
  const Value& test = args.positional[first];
  if (!test.is_string()) return Error("the test name must be a string");
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + first + 1, args.positional.end());
  return ApplyTest(test.as_string(), v, test_args);
}

absl::StatusOr<Value> SelectOrReject(const Value& value, const CallArgs& args, bool select,
                                     bool by_attribute) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    size_t first = 0;
    if (by_attribute) {
      if (args.positional.empty()) return Error("selectattr/rejectattr need an attribute");
      subject = AttributePath(item, args.positional[0]);
      first = 1;
    }
    ASSIGN_OR_RETURN(bool hit, TestFromArgs(subject, args, first));
    if (hit == select) out.push_back(item);
  }
  return Value(std::move(out));
}

double PythonRound(double value, int64_t precision) {
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = value * scale;
  double rounded = std::nearbyint(scaled);
  return rounded / scale;
}

}  // namespace

std::string PythonStrip(absl::string_view s, const Value& chars, char which) {
  std::vector<uint32_t> cps = Utf8ToCodePoints(s);
  std::vector<uint32_t> set;
  bool whitespace = chars.is_undefined() || chars.is_none() || !chars.is_string();
  if (!whitespace) set = Utf8ToCodePoints(chars.as_string());
  auto strip = [&](uint32_t c) {
    return whitespace ? IsPythonSpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (which != 'r') {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (which != 'l') {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return CodePointsToUtf8({cps.begin() + begin, cps.begin() + end});
}

Value GetAttribute(const Value& obj, absl::string_view name) {
  if (obj.is_dict()) {
    const ValueDict& d = obj.as_dict();
    if (!d.is_namespace) {
      Value method = DictMethod(obj, name);
      if (!method.is_undefined()) return method;
    }
    const Value* found = d.Find(name);
    return found != nullptr ? *found : Value();
  }
  if (obj.is_string()) return StringMethod(obj, name);
  return Value();
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (!key.is_string()) return Value();
    const Value* found = obj.as_dict().Find(key.as_string());
    if (found != nullptr) return *found;
    return GetAttribute(obj, key.as_string());
  }
  if ((obj.is_list() || obj.is_string()) && IsIntLike(key)) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return obj.as_list()[i];
    }
    std::vector<uint32_t> cps = Utf8ToCodePoints(obj.as_string());
    int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value(CodePointsToUtf8({cps[i]}));
  }
  if (key.is_string()) return GetAttribute(obj, key.as_string());
  return Value();
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start_value, const Value& stop_value,
                            const Value& step_value) {
  auto bound = [](const Value& v) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!IsIntLike(v)) return Error("slice indices must be integers");
    return std::optional<int64_t>(v.as_int());
  };
  ASSIGN_OR_RETURN(std::optional<int64_t> start, bound(start_value));
  ASSIGN_OR_RETURN(std::optional<int64_t> stop, bound(stop_value));
  ASSIGN_OR_RETURN(std::optional<int64_t> step_opt, bound(step_value));
  int64_t step = step_opt.value_or(1);
  if (step == 0) return Error("slice step cannot be zero");
  if (obj.is_undefined()) return Value();
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else if (obj.is_string()) {
    cps = Utf8ToCodePoints(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else {
    return Error(absl::StrCat("cannot slice a ", KindName(obj)));
  }
  auto adjust = [n, step](std::optional<int64_t> v, bool is_start) -> int64_t {
    if (!v.has_value()) {
      if (step > 0) return is_start ? 0 : n;
      return is_start ? n - 1 : -1;
    }
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step > 0 ? 0 : -1;
    } else if (i >= n) {
      i = step > 0 ? n : n - 1;
    }
    return i;
  };
  int64_t begin = adjust(start, true), end = adjust(stop, false);
  std::vector<int64_t> indexes;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) indexes.push_back(i);
  if (obj.is_list()) {
    ValueList out;
    out.reserve(indexes.size());
    for (int64_t i : indexes) out.push_back(obj.as_list()[i]);
    return Value(std::move(out));
  }
  std::vector<uint32_t> out;
  out.reserve(indexes.size());
  for (int64_t i : indexes) out.push_back(cps[i]);
  return Value(CodePointsToUtf8(out));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>();
    case Value::Kind::kList:
      return value.as_list();
    case Value::Kind::kDict: {
      if (value.as_dict().is_namespace) return Error("a namespace is not iterable");
      std::vector<Value> keys;
      for (const auto& [k, v] : value.as_dict().items) keys.push_back(Value(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (uint32_t cp : Utf8ToCodePoints(value.as_string())) {
        chars.push_back(Value(CodePointsToUtf8({cp})));
      }
      return chars;
    }
    default:
      return Error(absl::StrCat("a ", KindName(value), " is not iterable"));
  }
}

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               const BuiltinLimits& limits) {
  if (op == "~") {
    std::string out = a.Str() + b.Str();
    RETURN_IF_ERROR(CheckString(out.size(), limits));
    return Value(std::move(out));
  }
  auto unsupported = [&]() {
    return Error(absl::StrCat("unsupported operand kinds for ", op, ": ", KindName(a), " and ",
                              KindName(b)));
  };
  bool numbers = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      RETURN_IF_ERROR(CheckString(a.as_string().size() + b.as_string().size(), limits));
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      if (static_cast<int64_t>(out.size()) > limits.max_items) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "a list would exceed ", limits.max_items, " items (TemplateOptions.max_iterations)"));
      }
      return Value(std::move(out));
    }
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
      return Value(r);
    }
    if (numbers) return Value(a.as_double() + b.as_double());
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
      return Value(r);
    }
    if (numbers) return Value(a.as_double() - b.as_double());
    return unsupported();
  }
  if (op == "*") {
    const Value* sequence = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = sequence == &a ? &b : &a;
    if ((sequence->is_string() || sequence->is_list()) && IsIntLike(*count)) {
      int64_t n = std::max<int64_t>(0, count->as_int());
      if (sequence->is_string()) {
        if (n > 0 &&
            static_cast<int64_t>(sequence->as_string().size()) > limits.max_string_bytes / n) {
          return CheckString(static_cast<size_t>(limits.max_string_bytes) + 1, limits);
        }
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += sequence->as_string();
        return Value(std::move(out));
      }
      if (n > 0 && static_cast<int64_t>(sequence->as_list().size()) > limits.max_items / n) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "a list would exceed ", limits.max_items, " items (TemplateOptions.max_iterations)"));
      }
      ValueList out;
      for (int64_t i = 0; i < n; ++i) {
        out.insert(out.end(), sequence->as_list().begin(), sequence->as_list().end());
      }
      return Value(std::move(out));
    }
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
      return Value(r);
    }
    if (numbers) return Value(a.as_double() * b.as_double());
    return unsupported();
  }
  if (!numbers) return unsupported();
  if (op == "/") {
    if (b.as_double() == 0) return Error("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) return Error("division by zero");
      if (x == INT64_MIN && y == -1) return Error("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    double x = a.as_double(), y = b.as_double();
    if (y == 0) return Error("division by zero");
    double q = std::floor(x / y);
    return Value(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; --e) {
        if (__builtin_mul_overflow(result, base, &result)) return Error("integer overflow");
        if (result == 0 || result == 1) break;
      }
      return Value(result);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  return Error(absl::StrCat("unknown operator ", op));
}

absl::StatusOr<bool> Compare(absl::string_view op, const Value& a, const Value& b) {
  if (op == "==") return a.Equals(b);
  if (op == "!=") return !a.Equals(b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) return Error("'in <string>' requires a string on the left");
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      for (const Value& item : b.as_list()) found = found || item.Equals(a);
    } else if (b.is_dict() && !b.as_dict().is_namespace) {
      found = a.is_string() && b.as_dict().Find(a.as_string()) != nullptr;
    } else if (!b.is_undefined()) {
      return Error(absl::StrCat("a ", KindName(b), " is not a container"));
    }
    return op == "in" ? found : !found;
  }
  int order;
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (!a.is_float() && !b.is_float()) {
      order = a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    } else {
      order = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
    }
  } else if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    order = c < 0 ? -1 : c > 0 ? 1 : 0;
  } else {
    return Error(absl::StrCat("cannot compare ", KindName(a), " and ", KindName(b), " with ", op));
  }
  if (op == "<") return order < 0;
  if (op == "<=") return order <= 0;
  if (op == ">") return order > 0;
  if (op == ">=") return order >= 0;
  return Error(absl::StrCat("unknown comparison ", op));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, CallArgs& args) {
  Value other = Arg(args, 0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number() || v.is_bool();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.as_dict().is_namespace;
  if (name == "iterable") {
    return v.is_undefined() || v.is_list() || v.is_string() ||
           (v.is_dict() && !v.as_dict().is_namespace);
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_list() || v.is_string() ||
           (v.is_dict() && !v.as_dict().is_namespace);
  }
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    const std::string& s = v.as_string();
    bool cased = false;
    for (char c : s) {
      if (absl::ascii_isalpha(c)) {
        cased = true;
        if (name == "lower" ? absl::ascii_isupper(c) : absl::ascii_islower(c)) return false;
      }
    }
    return cased;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!IsIntLike(v)) return Error(absl::StrCat("the ", name, " test needs an integer"));
    if (name == "divisibleby") {
      Value by = Arg(args, 0, "num");
      if (!IsIntLike(by) || by.as_int() == 0) return Error("divisibleby needs a nonzero integer");
      return v.as_int() % by.as_int() == 0;
    }
    bool even = v.as_int() % 2 == 0;
    return name == "even" ? even : !even;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    return v.Equals(other);
  }
  if (name == "ne" || name == "!=") return !v.Equals(other);
  if (name == "lt" || name == "<" || name == "lessthan") return Compare("<", v, other);
  if (name == "le" || name == "<=") return Compare("<=", v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(">", v, other);
  if (name == "ge" || name == ">=") return Compare(">=", v, other);
  if (name == "in") return Compare("in", v, Arg(args, 0, "seq"));
  return Error(absl::StrCat("unknown test '", name, "'"));
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value, CallArgs& args,
                                  const BuiltinLimits& limits) {
  auto need_string = [&]() -> absl::Status {
    if (value.is_string()) return absl::OkStatus();
    return Error(absl::StrCat("the ", name, " filter needs a string, got ", KindName(value)));
  };
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return value;
    std::string s = value.Str(), out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out.push_back(c);
      }
    }
    RETURN_IF_ERROR(CheckString(out.size(), limits));
    return Value(std::move(out));
  }
  if (name == "trim") {
    return Value(PythonStrip(value.Str(), Arg(args, 0, "chars"), 'b'));
  }
  if (name == "length" || name == "count") {
    if (value.is_undefined()) return Value(0);
    auto n = value.Length();
    if (!n.has_value()) return Error(absl::StrCat("a ", KindName(value), " has no length"));
    return Value(*n);
  }
  if (name == "tojson") {
    Value indent = Arg(args, 0, "indent");
    int n = -1;
    if (IsIntLike(indent)) {
      n = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
    } else if (!indent.is_undefined() && !indent.is_none()) {
      return Error("tojson's indent must be an integer");
    }
    ASSIGN_OR_RETURN(std::string json, value.ToJson(n));
    RETURN_IF_ERROR(CheckString(json.size(), limits));
    return Value(std::move(json));
  }
  if (name == "upper") return Value(PythonUpper(value.Str()));
  if (name == "lower") return Value(PythonLower(value.Str()));
  if (name == "capitalize") return Value(Capitalize(value.Str()));
  if (name == "title") return Value(JinjaTitle(value.Str()));
  if (name == "string") return Value(value.Str());
  if (name == "default" || name == "d") {
    Value fallback = Arg(args, 0, "default_value", Value(""));
    bool boolean = Arg(args, 1, "boolean", Value(false)).Truthy();
    if (value.is_undefined() || (boolean && !value.Truthy())) return fallback;
    return value;
  }
  if (name == "items") {
    if (value.is_undefined()) return Value(ValueList{});
    if (!value.is_dict()) return Error("the items filter needs a mapping");
    return ItemsOf(value.as_dict());
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    return Value(std::move(items));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Value separator = Arg(args, 0, "d", Value(""));
    Value attribute = Arg(args, 1, "attribute");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += separator.Str();
      out += attribute.is_undefined() ? items[i].Str() : AttributePath(items[i], attribute).Str();
      RETURN_IF_ERROR(CheckString(out.size(), limits));
    }
    return Value(std::move(out));
  }
  if (name == "int") {
    ASSIGN_OR_RETURN(int64_t i, ToInt(value, Arg(args, 0, "default", Value(0)).as_int()));
    return Value(i);
  }
  if (name == "float") {
    if (value.is_number() || value.is_bool()) return Value(value.as_double());
    double d;
    if (value.is_string() && absl::SimpleAtod(PythonStrip(value.as_string(), Value(), 'b'), &d)) {
      return Value(d);
    }
    return Value(Arg(args, 0, "default", Value(0.0)).as_double());
  }
  if (name == "abs") {
    if (value.is_int() || value.is_bool()) {
      if (value.as_int() == INT64_MIN) return Error("integer overflow");
      return Value(std::abs(value.as_int()));
    }
    if (value.is_float()) return Value(std::fabs(value.as_double()));
    return Error("the abs filter needs a number");
  }
  if (name == "round") {
    if (!value.is_number() && !value.is_bool()) return Error("the round filter needs a number");
    int64_t precision = Arg(args, 0, "precision", Value(0)).as_int();
    Value method = Arg(args, 1, "method", Value("common"));
    double x = value.as_double(), scale = std::pow(10.0, static_cast<double>(precision));
    if (method.is_string() && method.as_string() == "ceil")
      return Value(std::ceil(x * scale) / scale);
    if (method.is_string() && method.as_string() == "floor") {
      return Value(std::floor(x * scale) / scale);
    }
    return Value(PythonRound(x, precision));
  }
  if (name == "replace") {
    RETURN_IF_ERROR(need_string());
    return Replace(value.as_string(), Arg(args, 0, "old"), Arg(args, 1, "new"),
                   Arg(args, 2, "count"), limits);
  }
  if (name == "reverse") {
    if (value.is_string()) {
      std::vector<uint32_t> cps = Utf8ToCodePoints(value.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value(CodePointsToUtf8(cps));
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort") {
    bool reverse = Arg(args, 0, "reverse", Value(false)).Truthy();
    bool case_sensitive = Arg(args, 1, "case_sensitive", Value(false)).Truthy();
    Value attribute = Arg(args, 2, "attribute");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    absl::Status status;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      Value x = attribute.is_undefined() ? a : AttributePath(a, attribute);
      Value y = attribute.is_undefined() ? b : AttributePath(b, attribute);
      auto order = Order(x, y, case_sensitive);
      if (!order.ok()) {
        status = order.status();
        return false;
      }
      return reverse ? *order > 0 : *order < 0;
    });
    RETURN_IF_ERROR(status);
    return Value(std::move(items));
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    ValueList out;
    for (const Value& item : items) {
      bool seen = false;
      for (const Value& kept : out) seen = seen || kept.Equals(item);
      if (!seen) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    Value attribute = Arg(args, 9999, "attribute");
    ValueList out;
    if (!attribute.is_undefined()) {
      Value fallback = Arg(args, 9999, "default");
      for (const Value& item : items) {
        Value v = AttributePath(item, attribute);
        out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
      }
      return Value(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return Error("map needs a filter name or attribute=");
    }
    CallArgs filter_args;
    filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
    filter_args.keyword = args.keyword;
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v,
                       ApplyFilter(args.positional[0].as_string(), item, filter_args, limits));
      out.push_back(std::move(v));
    }
    return Value(std::move(out));
  }
  if (name == "select") return SelectOrReject(value, args, true, false);
  if (name == "reject") return SelectOrReject(value, args, false, false);
  if (name == "selectattr") return SelectOrReject(value, args, true, true);
  if (name == "rejectattr") return SelectOrReject(value, args, false, true);
  if (name == "indent") {
    Value width = Arg(args, 0, "width", Value(4));
    bool first = Arg(args, 1, "first", Value(false)).Truthy();
    bool blank = Arg(args, 2, "blank", Value(false)).Truthy();
    std::string pad = width.is_string()
                          ? width.as_string()
                          : std::string(std::clamp<int64_t>(width.as_int(), 0, 256), ' ');
    std::string s = value.Str(), out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      size_t at = s.find('\n', start);
      std::string line = s.substr(start, at == std::string::npos ? std::string::npos : at - start);
      bool indent_it = first_line ? first : (blank || !PythonStrip(line, Value(), 'b').empty());
      if (indent_it) out += pad;
      out += line;
      RETURN_IF_ERROR(CheckString(out.size(), limits));
      if (at == std::string::npos) break;
      out += '\n';
      start = at + 1;
      first_line = false;
    }
    return Value(std::move(out));
  }
  if (name == "sum") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    Value attribute = Arg(args, 0, "attribute");
    Value total = Arg(args, 1, "start", Value(0));
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(
          total,
          BinaryOp("+", total, attribute.is_undefined() ? item : AttributePath(item, attribute),
                   limits));
    }
    return total;
  }
  if (name == "min" || name == "max") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    if (items.empty()) return Value();
    Value best = items[0];
    for (size_t i = 1; i < items.size(); ++i) {
      ASSIGN_OR_RETURN(int order, Order(items[i], best, false));
      if (name == "min" ? order < 0 : order > 0) best = items[i];
    }
    return best;
  }
  if (name == "wordcount") {
    ASSIGN_OR_RETURN(Value words, Split(value.Str(), Value(), Value()));
    return Value(static_cast<int64_t>(words.as_list().size()));
  }
  return Error(absl::StrCat("unknown filter '", name, "'"));
}

}  // namespace jinja
}  // namespace lgpt
