#include "core/text/jinja.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"
#include "core/text/jinja_builtins.h"
#include "core/text/jinja_parser.h"

namespace lgpt {
namespace jinja {
namespace {

// Evaluation frames (nested expressions, blocks, macro calls) allowed per level of
// TemplateOptions.max_nesting: bounds the native stack whatever the template.
constexpr int kFramesPerNesting = 8;

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const TemplateOptions& options) : options_(options) {
    limits_.max_string_bytes = options.max_output_bytes;
    limits_.max_items = options.max_iterations;
  }

  absl::StatusOr<std::string> Run(const Body& body, const ValueDict& context) {
    Scope globals;
    AddGlobals(&globals);
    Scope root;
    root.parent = &globals;
    for (const auto& [name, value] : context.items) root.vars[name] = value;
    root_ = &root;
    std::string out;
    absl::Status status = Exec(body, &root, &out).status();
    for (const auto& ns : namespaces_) ns->items.clear();
    namespaces_.clear();
    if (!status.ok()) return status;
    return out;
  }

 private:
  // Counts a frame of evaluation for the depth limit.
  class Frame {
   public:
    explicit Frame(int* frames) : frames_(frames) { ++*frames_; }
    ~Frame() { --*frames_; }

   private:
    int* frames_;
  };

  absl::Status ErrorAt(const Position& p, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.name, ":", p.line, ":", p.column, ": ", message));
  }

  absl::Status LimitError(absl::string_view field, const Position& p,
                          absl::string_view message) const {
    return FieldError(absl::StatusCode::kResourceExhausted, field,
                      absl::StrCat(options_.name, ":", p.line, ":", p.column, ": ", message));
  }

  // `status` (from a builtin or a call) with the position of the expression that failed; a
  // status that has one, and raise_exception's, are kept.
  absl::Status Locate(const absl::Status& status, const Position& p) const {
    if (status.ok() || IsRaisedByTemplate(status) || ErrorField(status).has_value()) {
      return status;
    }
    std::string prefix = absl::StrCat(options_.name, ":");
    absl::string_view message = status.message();
    if (absl::StartsWith(message, prefix) && message.size() > prefix.size() &&
        absl::ascii_isdigit(message[prefix.size()])) {
      return status;
    }
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      for (absl::string_view field :
           {"TemplateOptions.max_output_bytes", "TemplateOptions.max_iterations"}) {
        if (absl::StrContains(message, field)) return LimitError(field, p, message);
      }
    }
    return absl::Status(status.code(), absl::StrCat(prefix, p.line, ":", p.column, ": ", message));
  }

  absl::Status CheckFrames(const Position& p) const {
    const int64_t max_frames = int64_t{kFramesPerNesting} * options_.max_nesting;
    if (frames_ > max_frames) {
      return LimitError("TemplateOptions.max_nesting", p,
                        absl::StrCat("evaluation nested deeper than TemplateOptions.max_nesting x ",
                                     kFramesPerNesting, " (", max_frames,
                                     " frames of blocks, expressions and macro calls)"));
    }
    return absl::OkStatus();
  }

  absl::Status Append(std::string* out, absl::string_view text, const Position& p) const {
    if (static_cast<int64_t>(out->size() + text.size()) > options_.max_output_bytes) {
      return LimitError("TemplateOptions.max_output_bytes", p,
                        absl::StrCat("the rendered text exceeds TemplateOptions.max_output_bytes (",
                                     options_.max_output_bytes, " bytes)"));
    }
    out->append(text.data(), text.size());
    return absl::OkStatus();
  }

  absl::Status CountIteration(const Position& p) {
    if (++iterations_ > options_.max_iterations) {
      return LimitError("TemplateOptions.max_iterations", p,
                        absl::StrCat("loops ran past TemplateOptions.max_iterations (",
                                     options_.max_iterations, " iterations)"));
    }
    return absl::OkStatus();
  }

  void AddGlobals(Scope* globals) {
    const TemplateOptions& options = options_;
    globals->vars["range"] =
        Value::MakeCallable("range", [&options](CallArgs& args) -> absl::StatusOr<Value> {
          std::vector<int64_t> bounds;
          for (const Value& v : args.positional) {
            if (!v.is_int() && !v.is_bool())
              return absl::InvalidArgumentError("range() takes integers");
            bounds.push_back(v.as_int());
          }
          if (bounds.empty() || bounds.size() > 3) {
            return absl::InvalidArgumentError("range() takes 1 to 3 integers");
          }
          int64_t start = bounds.size() == 1 ? 0 : bounds[0];
          int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
          int64_t step = bounds.size() == 3 ? bounds[2] : 1;
          if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
          double count = step > 0 ? (static_cast<double>(stop) - start) / step
                                  : (static_cast<double>(start) - stop) / -step;
          if (count > static_cast<double>(options.max_iterations)) {
            return absl::ResourceExhaustedError(
                absl::StrCat("range() longer than TemplateOptions.max_iterations (",
                             options.max_iterations, ")"));
          }
          ValueList out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            out.push_back(Value(i));
          return Value(std::move(out));
        });
    auto make_dict = [this](CallArgs& args, bool is_namespace) -> absl::StatusOr<Value> {
      auto dict = std::make_shared<ValueDict>();
      dict->is_namespace = is_namespace;
      for (const Value& v : args.positional) {
        if (!v.is_dict()) return absl::InvalidArgumentError("expected a mapping argument");
        for (const auto& [k, item] : v.as_dict().items) dict->Set(k, item);
      }
      for (const auto& [k, item] : args.keyword) dict->Set(k, item);
      // A namespace may come to hold itself ({% set ns.self = ns %}): Run empties them all
      // at the end, which frees such cycles.
      if (is_namespace) namespaces_.push_back(dict);
      return Value::Dict(std::move(dict));
    };
    globals->vars["namespace"] = Value::MakeCallable(
        "namespace", [make_dict](CallArgs& args) { return make_dict(args, true); });
    globals->vars["dict"] =
        Value::MakeCallable("dict", [make_dict](CallArgs& args) { return make_dict(args, false); });
    globals->vars["raise_exception"] =
        Value::MakeCallable("raise_exception", [](CallArgs& args) -> absl::StatusOr<Value> {
          std::string message = args.positional.empty() ? "" : args.positional[0].Str();
          absl::Status status = absl::InvalidArgumentError(message);
          status.SetPayload(kRaisedPayloadUrl, absl::Cord("1"));
          return status;
        });
    globals->vars["strftime_now"] =
        Value::MakeCallable("strftime_now", [&options](CallArgs& args) -> absl::StatusOr<Value> {
          if (args.positional.empty() || !args.positional[0].is_string()) {
            return absl::InvalidArgumentError("strftime_now() takes a format string");
          }
          const std::string& format = args.positional[0].as_string();
          if (format.size() > 256)
            return absl::InvalidArgumentError("strftime_now(): format too long");
          std::time_t now = options.clock ? options.clock() : std::time(nullptr);
          std::tm local{};
          localtime_r(&now, &local);
          char buffer[1024];
          size_t n = std::strftime(buffer, sizeof(buffer), format.c_str(), &local);
          return Value(std::string(buffer, n));
        });
  }

  void Bind(Scope* scope, const std::vector<std::string>& targets, const Value& value,
            absl::Status* status, const Position& p) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = value;
      return;
    }
    auto items = Iterate(value);
    if (!items.ok() || items->size() != targets.size()) {
      *status = ErrorAt(
          p, absl::StrCat("cannot unpack ", value.Repr(), " into ", targets.size(), " names"));
      return;
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = (*items)[i];
  }

  absl::StatusOr<Flow> Exec(const Body& body, Scope* scope, std::string* out) {
    for (const NodePtr& node : body) {
      ASSIGN_OR_RETURN(Flow flow, ExecNode(*node, scope, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<std::string> Capture(const Body& body, Scope* scope) {
    std::string text;
    RETURN_IF_ERROR(Exec(body, scope, &text).status());
    return text;
  }

  absl::StatusOr<Flow> ExecNode(const Node& node, Scope* scope, std::string* out) {
    Frame frame(&frames_);
    RETURN_IF_ERROR(CheckFrames(node.position));
    switch (node.kind) {
      case Node::Kind::kText:
        RETURN_IF_ERROR(Append(out, node.text, node.position));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        RETURN_IF_ERROR(Append(out, v.Str(), node.position));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          bool take = true;
          if (condition != nullptr) {
            ASSIGN_OR_RETURN(Value v, Eval(*condition, scope));
            take = v.Truthy();
          }
          if (take) return Exec(body, scope, out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor:
        return ExecFor(node, scope, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        if (!node.attribute.empty()) {
          const Value* target = scope->Find(node.targets[0]);
          if (target == nullptr || !target->is_dict() || !target->as_dict().is_namespace) {
            return ErrorAt(node.position,
                           absl::StrCat("cannot assign attribute '", node.attribute, "' of '",
                                        node.targets[0], "', which is not a namespace()"));
          }
          target->mutable_dict().Set(node.attribute, std::move(v));
          return Flow::kNormal;
        }
        absl::Status status;
        Bind(scope, node.targets, v, &status, node.position);
        RETURN_IF_ERROR(status);
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(node.body, scope));
        scope->vars[node.targets[0]] = Value(std::move(text));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        const Node* macro = &node;
        scope->vars[node.name] =
            Value::MakeCallable(node.name, [this, macro](CallArgs& args) -> absl::StatusOr<Value> {
              return CallMacro(*macro, args);
            });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kScope:
        return Exec(node.body, scope, out);
      case Node::Kind::kFilterBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(node.body, scope));
        block_input_ = Value(std::move(text));
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        RETURN_IF_ERROR(Append(out, v.Str(), node.position));
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecFor(const Node& node, Scope* scope, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr, scope));
    auto listed = Iterate(iterable);
    if (!listed.ok()) return Locate(listed.status(), node.expr->position);
    std::vector<Value> items = std::move(listed).value();
    // As jinja2, each iteration starts from the enclosing variables: what the body sets lasts
    // for that iteration only.
    absl::Status status;
    if (node.condition != nullptr) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        RETURN_IF_ERROR(CountIteration(node.position));
        Scope loop_scope;
        loop_scope.parent = scope;
        Bind(&loop_scope, node.targets, item, &status, node.position);
        RETURN_IF_ERROR(status);
        ASSIGN_OR_RETURN(Value keep, Eval(*node.condition, &loop_scope));
        if (keep.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(node.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(CountIteration(node.position));
      Scope loop_scope;
      loop_scope.parent = scope;
      Bind(&loop_scope, node.targets, items[i], &status, node.position);
      RETURN_IF_ERROR(status);
      ValueDict loop;
      loop.items = {{"index", Value(i + 1)},
                    {"index0", Value(i)},
                    {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"depth", Value(1)},
                    {"depth0", Value(0)},
                    {"previtem", i > 0 ? items[i - 1] : Value()},
                    {"nextitem", i + 1 < n ? items[i + 1] : Value()}};
      loop.is_namespace = true;  // attributes only: no dict methods
      const int64_t index = i;
      loop.items.emplace_back(
          "cycle",
          Value::MakeCallable("loop.cycle", [index](CallArgs& args) -> absl::StatusOr<Value> {
            if (args.positional.empty())
              return absl::InvalidArgumentError("loop.cycle() needs values");
            return args.positional[index % args.positional.size()];
          }));
      loop_scope.vars["loop"] = Value(std::move(loop));
      ASSIGN_OR_RETURN(Flow flow, Exec(node.body, &loop_scope, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> CallMacro(const Node& macro, CallArgs& args) {
    if (call_depth_ >= options_.max_call_depth) {
      return LimitError("TemplateOptions.max_call_depth", macro.position,
                        absl::StrCat("macro calls nested deeper than "
                                     "TemplateOptions.max_call_depth (",
                                     options_.max_call_depth, ")"));
    }
    if (args.positional.size() > macro.params.size()) {
      return ErrorAt(macro.position,
                     absl::StrCat("macro '", macro.name, "' takes ", macro.params.size(),
                                  " arguments, got ", args.positional.size()));
    }
    Scope scope;
    scope.parent = root_;
    for (const auto& [key, value] : args.keyword) {
      bool known = false;
      for (const auto& param : macro.params) known = known || param.first == key;
      if (!known) {
        return ErrorAt(macro.position,
                       absl::StrCat("macro '", macro.name, "' has no argument '", key, "'"));
      }
    }
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [param, default_value] = macro.params[i];
      Value v;
      bool given = false;
      if (i < args.positional.size()) {
        v = args.positional[i];
        given = true;
      }
      for (const auto& [key, value] : args.keyword) {
        if (key == param) {
          v = value;
          given = true;
        }
      }
      if (!given && default_value != nullptr) {
        ASSIGN_OR_RETURN(v, Eval(*default_value, &scope));
      }
      scope.vars[param] = std::move(v);
    }
    ++call_depth_;
    auto text = Capture(macro.body, &scope);
    --call_depth_;
    if (!text.ok()) return text.status();
    return Value(std::move(text).value());
  }

  absl::Status EvalArgs(const Expr& e, size_t first, Scope* scope, CallArgs* args) {
    for (size_t i = first; i < e.children.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.children[i], scope));
      args->positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
      args->keyword.emplace_back(key, std::move(v));
    }
    return absl::OkStatus();
  }

  static std::string Describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return absl::StrCat("'", e.name, "'");
    if (e.kind == Expr::Kind::kGetAttr) return absl::StrCat("'", e.name, "'");
    return "the value";
  }

  // Evaluates `e`; a list or dict nested deeper than the nesting limit is an error (walking
  // and freeing values recurses).
  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope) {
    ASSIGN_OR_RETURN(Value v, EvalUnchecked(e, scope));
    const int max_depth = std::max(options_.max_nesting, kMaxJsonDepth);
    if (v.depth() > max_depth) {
      return LimitError(
          "TemplateOptions.max_nesting", e.position,
          absl::StrCat("a value nests lists and dicts deeper than ", max_depth,
                       " (TemplateOptions.max_nesting, at least ", kMaxJsonDepth, ")"));
    }
    return v;
  }

  absl::StatusOr<Value> EvalUnchecked(const Expr& e, Scope* scope) {
    Frame frame(&frames_);
    RETURN_IF_ERROR(CheckFrames(e.position));
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = scope->Find(e.name);
        return v != nullptr ? *v : Value();
      }
      case Expr::Kind::kList: {
        ValueList list;
        for (const ExprPtr& child : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*child, scope));
          list.push_back(std::move(v));
        }
        return Value(std::move(list));
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.children[i], scope));
          if (!key.is_string()) {
            return ErrorAt(e.children[i]->position, "dict keys must be strings");
          }
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], scope));
          dict.Set(key.as_string(), std::move(v));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        return GetAttribute(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], scope));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        Value bounds[3];
        for (int i = 0; i < 3; ++i) {
          if (e.children[i + 1] != nullptr) {
            ASSIGN_OR_RETURN(bounds[i], Eval(*e.children[i + 1], scope));
          }
        }
        auto sliced = Slice(obj, bounds[0], bounds[1], bounds[2]);
        if (!sliced.ok()) return Locate(sliced.status(), e.position);
        return sliced;
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.children[0], scope));
        if (!callee.is_callable()) {
          return ErrorAt(e.position, absl::StrCat(Describe(*e.children[0]),
                                                  callee.is_undefined() ? " is undefined"
                                                                        : " is not callable"));
        }
        CallArgs args;
        RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
        auto result = callee.as_callable().function(args);
        if (!result.ok()) return Locate(result.status(), e.position);
        return result;
      }
      case Expr::Kind::kFilter: {
        Value operand;
        if (e.children[0] != nullptr) {
          ASSIGN_OR_RETURN(operand, Eval(*e.children[0], scope));
        } else {
          operand = block_input_;
        }
        CallArgs args;
        RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
        auto result = ApplyFilter(e.name, operand, args, limits_);
        if (!result.ok()) return Locate(result.status(), e.position);
        return result;
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0], scope));
        CallArgs args;
        RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
        auto result = ApplyTest(e.name, operand, args);
        if (!result.ok()) return Locate(result.status(), e.position);
        return Value(*result != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
        if (e.name == "not") return Value(!v.Truthy());
        if (v.is_int() || v.is_bool()) {
          if (e.name == "+") return Value(v.as_int());
          if (v.as_int() == INT64_MIN) return ErrorAt(e.position, "integer overflow");
          return Value(-v.as_int());
        }
        if (v.is_float()) return Value(e.name == "-" ? -v.as_double() : v.as_double());
        return ErrorAt(e.position, absl::StrCat("bad operand for unary ", e.name, ": ", v.Repr()));
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
        if (e.name == "and") {
          if (!left.Truthy()) return left;
          return Eval(*e.children[1], scope);
        }
        if (e.name == "or") {
          if (left.Truthy()) return left;
          return Eval(*e.children[1], scope);
        }
        ASSIGN_OR_RETURN(Value right, Eval(*e.children[1], scope));
        auto result = BinaryOp(e.name, left, right, limits_);
        if (!result.ok()) return Locate(result.status(), e.position);
        return result;
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], scope));
          auto holds = Compare(e.ops[i], left, right);
          if (!holds.ok()) return Locate(holds.status(), e.position);
          if (!*holds) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition: {
        ASSIGN_OR_RETURN(Value test, Eval(*e.children[0], scope));
        if (test.Truthy()) return Eval(*e.children[1], scope);
        if (e.children[2] != nullptr) return Eval(*e.children[2], scope);
        return Value();
      }
    }
    return Value();
  }

  const TemplateOptions& options_;
  BuiltinLimits limits_;
  Scope* root_ = nullptr;
  Value block_input_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  int frames_ = 0;
  std::vector<std::shared_ptr<ValueDict>> namespaces_;
};

}  // namespace

bool IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(kRaisedPayloadUrl).has_value();
}

absl::StatusOr<Template> Template::Parse(absl::string_view source, const TemplateOptions& options) {
  ParseOptions parse_options;
  parse_options.name = options.name;
  parse_options.trim_blocks = options.trim_blocks;
  parse_options.lstrip_blocks = options.lstrip_blocks;
  parse_options.max_nesting = options.max_nesting;
  ASSIGN_OR_RETURN(Body body, ParseTemplate(source, parse_options));
  return Template(std::make_shared<const Body>(std::move(body)), options);
}

absl::StatusOr<std::string> Template::Render(const ValueDict& context) const {
  Renderer renderer(options_);
  return renderer.Run(*body_, context);
}

}  // namespace jinja
}  // namespace lgpt
