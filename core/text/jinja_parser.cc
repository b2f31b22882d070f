#include "core/text/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace jinja {
namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind = Tok::kEof;
  std::string text;
  Position position;
  int64_t int_value = 0;
  double float_value = 0;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

class Lexer {
 public:
  Lexer(absl::string_view raw, const ParseOptions& options) : options_(options) {
    // As jinja2: \r\n and \r become \n, and one trailing newline is dropped.
    source_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        source_.push_back('\n');
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        source_.push_back(raw[i]);
      }
    }
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    std::vector<Token> tokens;
    const std::string& s = source_;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t start = pos;
      while (true) {
        start = s.find('{', start);
        if (start == std::string::npos || start + 1 >= s.size()) {
          start = std::string::npos;
          break;
        }
        char c = s[start + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        AddText(pos, s.substr(pos), &tokens);
        break;
      }
      char type = s[start + 1];
      char sign = 0;
      if (start + 2 < s.size() && (s[start + 2] == '-' || s[start + 2] == '+')) {
        sign = s[start + 2];
      }
      std::string text = s.substr(pos, start - pos);
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && options_.lstrip_blocks && type != '{') {
        size_t line_start = text.rfind('\n');
        line_start = line_start == std::string::npos ? 0 : line_start + 1;
        bool line_starting = pos == 0 || s[pos - 1] == '\n';
        if (line_start > 0 || line_starting) {
          bool blank = line_start < text.size();
          for (size_t i = line_start; i < text.size(); ++i) blank = blank && IsSpace(text[i]);
          if (blank) text.resize(line_start);
        }
      }
      AddText(pos, std::move(text), &tokens);
      size_t p = start + 2 + (sign != 0 ? 1 : 0);
      if (type == '#') {
        size_t end = s.find("#}", p);
        if (end == std::string::npos) return Error(start, "missing end of comment tag");
        char end_sign = end > p ? s[end - 1] : 0;
        pos = AfterTagEnd(end + 2, end_sign == '-' ? '-' : end_sign == '+' ? '+' : 0, true);
        continue;
      }
      bool block = type == '%';
      tokens.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, "", At(start)});
      ASSIGN_OR_RETURN(pos, LexTag(p, block, &tokens));
    }
    tokens.push_back(Token{Tok::kEof, "", At(s.size())});
    return tokens;
  }

 private:
  Position At(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = it - line_starts_.begin();
    return Position{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  absl::Status Error(size_t offset, absl::string_view message) const {
    Position p = At(offset);
    return absl::InvalidArgumentError(
        absl::StrCat(options_.name, ":", p.line, ":", p.column, ": ", message));
  }

  void AddText(size_t offset, std::string text, std::vector<Token>* tokens) const {
    if (text.empty()) return;
    tokens->push_back(Token{Tok::kText, std::move(text), At(offset)});
  }

  // The offset after a tag's end marker at `after`, with its whitespace control applied.
  size_t AfterTagEnd(size_t after, char sign, bool block) const {
    if (sign == '-') {
      while (after < source_.size() && IsSpace(source_[after])) ++after;
    } else if (sign != '+' && block && options_.trim_blocks && after < source_.size() &&
               source_[after] == '\n') {
      ++after;
    }
    return after;
  }

  // Lexes the inside of a {{ }} or {% %} tag from `p`; returns the offset after its end.
  absl::StatusOr<size_t> LexTag(size_t p, bool block, std::vector<Token>* tokens) {
    const std::string& s = source_;
    const char* end_marker = block ? "%}" : "}}";
    auto at = [&](size_t i, absl::string_view what) {
      return s.compare(i, what.size(), what.data(), what.size()) == 0;
    };
    std::string balance;  // the closing brackets awaited
    while (true) {
      // jinja2 tries the end of the tag before anything else, whitespace included, unless a
      // bracket is open.
      if (!balance.empty() && p < s.size()) {
        // Inside brackets: no end of tag.
      } else if (at(p, absl::StrCat("-", end_marker))) {
        tokens->push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", At(p)});
        return AfterTagEnd(p + 3, '-', block);
      }
      if (balance.empty() && block && at(p, "+%}")) {
        tokens->push_back(Token{Tok::kBlockEnd, "", At(p)});
        return AfterTagEnd(p + 3, '+', block);
      }
      if (balance.empty() && at(p, end_marker)) {
        tokens->push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", At(p)});
        return AfterTagEnd(p + 2, 0, block);
      }
      if (p >= s.size()) {
        return Error(p, absl::StrCat("unexpected end of template, expected '", end_marker, "'"));
      }
      char c = s[p];
      if (IsSpace(c)) {
        ++p;
        continue;
      }
      Token token;
      token.position = At(p);
      if (IsNameStart(c)) {
        size_t e = p;
        while (e < s.size() && IsNameChar(s[e])) ++e;
        token.kind = Tok::kName;
        token.text = s.substr(p, e - p);
        p = e;
      } else if (absl::ascii_isdigit(c)) {
        size_t e = p;
        auto digits = [&]() {
          while (e < s.size() && (absl::ascii_isdigit(s[e]) || s[e] == '_')) ++e;
        };
        digits();
        bool is_float = false;
        if (e + 1 < s.size() && s[e] == '.' && absl::ascii_isdigit(s[e + 1])) {
          ++e;
          digits();
          is_float = true;
        }
        if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
          size_t f = e + 1;
          if (f < s.size() && (s[f] == '+' || s[f] == '-')) ++f;
          if (f < s.size() && absl::ascii_isdigit(s[f])) {
            e = f;
            digits();
            is_float = true;
          }
        }
        std::string number;
        for (size_t i = p; i < e; ++i) {
          if (s[i] != '_') number.push_back(s[i]);
        }
        token.text = s.substr(p, e - p);
        if (is_float) {
          token.kind = Tok::kFloat;
          token.float_value = std::strtod(number.c_str(), nullptr);
        } else {
          token.kind = Tok::kInt;
          errno = 0;
          token.int_value = std::strtoll(number.c_str(), nullptr, 10);
          if (errno == ERANGE) return Error(p, "integer literal out of range");
        }
        p = e;
      } else if (c == '\'' || c == '"') {
        ASSIGN_OR_RETURN(p, LexString(p, &token.text));
        token.kind = Tok::kString;
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ".",  ",",  ":",  "|", ";"};
        const char* op = nullptr;
        for (const char* candidate : kOps) {
          if (at(p, candidate)) {
            op = candidate;
            break;
          }
        }
        if (op == nullptr)
          return Error(p, absl::StrCat("unexpected character '", s.substr(p, 1), "'"));
        token.kind = Tok::kOp;
        token.text = op;
        if (token.text == "(" || token.text == "[" || token.text == "{") {
          balance.push_back(token.text == "(" ? ')' : token.text == "[" ? ']' : '}');
        } else if (token.text == ")" || token.text == "]" || token.text == "}") {
          if (balance.empty()) return Error(p, absl::StrCat("unexpected '", token.text, "'"));
          if (balance.back() != token.text[0]) {
            return Error(p, absl::StrCat("unexpected '", token.text, "', expected '",
                                         std::string(1, balance.back()), "'"));
          }
          balance.pop_back();
        }
        p += token.text.size();
      }
      tokens->push_back(std::move(token));
    }
  }

  // A quoted string literal at `p` with Python's escapes; returns the offset after it.
  absl::StatusOr<size_t> LexString(size_t p, std::string* out) const {
    const std::string& s = source_;
    char quote = s[p];
    size_t i = p + 1;
    while (true) {
      if (i >= s.size()) return Error(p, "unterminated string literal");
      char c = s[i];
      if (c == quote) return i + 1;
      if (c != '\\') {
        out->push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= s.size()) return Error(p, "unterminated string literal");
      char e = s[i + 1];
      i += 2;
      auto hex = [&](int count) -> std::optional<uint32_t> {
        if (i + count > s.size()) return std::nullopt;
        uint32_t v = 0;
        for (int k = 0; k < count; ++k) {
          char h = s[i + k];
          if (!absl::ascii_isxdigit(h)) return std::nullopt;
          v = v * 16 + (absl::ascii_isdigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10);
        }
        i += count;
        return v;
      };
      switch (e) {
        case 'n':
          out->push_back('\n');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 'a':
          out->push_back('\a');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'v':
          out->push_back('\v');
          break;
        case '\\':
        case '\'':
        case '"':
          out->push_back(e);
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          auto v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (!v.has_value() || *v > 0x10ffff) return Error(i - 2, "invalid escape in string");
          out->append(CodePointsToUtf8({*v}));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k, ++i) {
              v = v * 8 + (s[i] - '0');
            }
            out->append(CodePointsToUtf8({v}));
          } else {
            out->push_back('\\');
            out->push_back(e);
          }
      }
    }
  }

  const ParseOptions& options_;
  std::string source_;
  std::vector<size_t> line_starts_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& options)
      : tokens_(std::move(tokens)), options_(options) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  // Counts nesting; an error past options.max_nesting.
  class Depth {
   public:
    explicit Depth(int* depth) : depth_(depth) { ++*depth_; }
    ~Depth() { --*depth_; }

   private:
    int* depth_;
  };

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& t = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return t;
  }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }

  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Tok::kText:
        return "template text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kEof:
        return "end of template";
      case Tok::kString:
        return "string literal";
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }

  absl::Status ErrorAt(const Position& p, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.name, ":", p.line, ":", p.column, ": ", message));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return ErrorAt(Peek().position,
                   absl::StrCat("unexpected ", Describe(Peek()), ", expected ", expected));
  }
  // One more level of a left-nested chain (a + b + c, a.b.c, a|f|g): counted with the nesting
  // until the enclosing parse returns, so the tree's depth stays bounded.
  class Chain {
   public:
    explicit Chain(int* depth) : depth_(depth) {}
    ~Chain() { *depth_ -= count_; }
    absl::Status Add(const Parser& parser, const Position& p) {
      ++*depth_;
      ++count_;
      return parser.CheckDepth(p);
    }

   private:
    int* depth_;
    int count_ = 0;
  };

  absl::Status CheckDepth(const Position& p) const {
    if (depth_ > options_.max_nesting) {
      return FieldError(absl::StatusCode::kResourceExhausted, "TemplateOptions.max_nesting",
                        absl::StrCat(options_.name, ":", p.line, ":", p.column,
                                     ": nested deeper than TemplateOptions.max_nesting (",
                                     options_.max_nesting, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind != Tok::kBlockEnd) return Unexpected("'%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) return Unexpected("a name");
    return Next().text;
  }

  static ExprPtr MakeExpr(Expr::Kind kind, const Position& p) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->position = p;
    return e;
  }
  static NodePtr MakeNode(Node::Kind kind, const Position& p) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->position = p;
    return n;
  }

  // Statements up to one of the block tags `ends` (consumed with its name, stored in *end).
  absl::StatusOr<Body> ParseBody(const std::vector<std::string>& ends, std::string* end) {
    Depth depth(&depth_);
    RETURN_IF_ERROR(CheckDepth(Peek().position));
    Body body;
    while (true) {
      const Token& t = Peek();
      switch (t.kind) {
        case Tok::kText: {
          auto node = MakeNode(Node::Kind::kText, t.position);
          node->text = t.text;
          body.push_back(std::move(node));
          Next();
          break;
        }
        case Tok::kVarBegin: {
          auto node = MakeNode(Node::Kind::kOutput, t.position);
          Next();
          ASSIGN_OR_RETURN(node->expr, ParseExpression(true));
          if (Peek().kind != Tok::kVarEnd) return Unexpected("'}}'");
          Next();
          body.push_back(std::move(node));
          break;
        }
        case Tok::kBlockBegin: {
          const Token& name = Peek(1);
          if (name.kind != Tok::kName) {
            Next();
            return Unexpected("a block tag name");
          }
          if (std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
            Next();
            *end = Next().text;
            return body;
          }
          ASSIGN_OR_RETURN(NodePtr node, ParseStatement());
          body.push_back(std::move(node));
          break;
        }
        case Tok::kEof:
          if (!ends.empty()) {
            return ErrorAt(t.position, absl::StrCat("unexpected end of template, expected '",
                                                    absl::StrJoin(ends, "' or '"), "'"));
          }
          return body;
        default:
          return Unexpected("template text or a tag");
      }
    }
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    Position position = Next().position;  // {%
    const Token& name_token = Next();
    const std::string name = name_token.text;
    std::string end;
    if (name == "if") {
      auto node = MakeNode(Node::Kind::kIf, position);
      ASSIGN_OR_RETURN(ExprPtr condition, ParseExpression(true));
      RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
        node->branches.emplace_back(std::move(condition), std::move(body));
        if (end == "elif") {
          ASSIGN_OR_RETURN(condition, ParseExpression(true));
          RETURN_IF_ERROR(ExpectBlockEnd());
          continue;
        }
        if (end == "else") {
          RETURN_IF_ERROR(ExpectBlockEnd());
          ASSIGN_OR_RETURN(Body else_body, ParseBody({"endif"}, &end));
          node->branches.emplace_back(nullptr, std::move(else_body));
        }
        RETURN_IF_ERROR(ExpectBlockEnd());
        return node;
      }
    }
    if (name == "for") {
      auto node = MakeNode(Node::Kind::kFor, position);
      do {
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        node->targets.push_back(target);
        if (!IsOp(",")) break;
        Next();
      } while (true);
      if (!IsName("in")) return Unexpected("'in'");
      Next();
      ASSIGN_OR_RETURN(node->expr, ParseExpression(false));
      if (IsName("if")) {
        Next();
        ASSIGN_OR_RETURN(node->condition, ParseExpression(true));
      }
      if (IsName("recursive")) {
        return ErrorAt(Peek().position, "recursive for loops are not supported");
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(node->body, ParseBody({"else", "endfor"}, &end));
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(node->else_body, ParseBody({"endfor"}, &end));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "set") {
      auto node = MakeNode(Node::Kind::kSet, position);
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      node->targets.push_back(target);
      if (IsOp(".")) {
        Next();
        ASSIGN_OR_RETURN(node->attribute, ExpectName());
      } else {
        while (IsOp(",")) {
          Next();
          ASSIGN_OR_RETURN(target, ExpectName());
          node->targets.push_back(target);
        }
      }
      if (Peek().kind == Tok::kBlockEnd && node->targets.size() == 1 && node->attribute.empty()) {
        Next();
        node->kind = Node::Kind::kSetBlock;
        ASSIGN_OR_RETURN(node->body, ParseBody({"endset"}, &end));
        RETURN_IF_ERROR(ExpectBlockEnd());
        return node;
      }
      RETURN_IF_ERROR(ExpectOp("="));
      ASSIGN_OR_RETURN(node->expr, ParseTuple());
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "macro") {
      auto node = MakeNode(Node::Kind::kMacro, position);
      ASSIGN_OR_RETURN(node->name, ExpectName());
      RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        ASSIGN_OR_RETURN(std::string param, ExpectName());
        ExprPtr default_value;
        if (IsOp("=")) {
          Next();
          ASSIGN_OR_RETURN(default_value, ParseExpression(true));
        }
        node->params.emplace_back(param, std::move(default_value));
        if (!IsOp(",")) break;
        Next();
      }
      RETURN_IF_ERROR(ExpectOp(")"));
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(node->body, ParseBody({"endmacro"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "break" || name == "continue") {
      auto node = MakeNode(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, position);
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "generation") {
      // Hugging Face's AssistantTracker extension: the body renders in place.
      auto node = MakeNode(Node::Kind::kScope, position);
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(node->body, ParseBody({"endgeneration"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (name == "filter") {
      auto node = MakeNode(Node::Kind::kFilterBlock, position);
      ExprPtr chain;
      do {
        if (chain != nullptr) Next();  // |
        ASSIGN_OR_RETURN(chain, ParseFilter(std::move(chain)));
      } while (IsOp("|"));
      node->expr = std::move(chain);
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(node->body, ParseBody({"endfilter"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    return ErrorAt(name_token.position,
                   absl::StrCat("unknown or unexpected tag '", name,
                                "' (supported: if, for, set, "
                                "macro, filter, break, continue, generation)"));
  }

  // An expression, or several separated by commas (a tuple, as a list).
  absl::StatusOr<ExprPtr> ParseTuple() {
    Position p = Peek().position;
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
    if (!IsOp(",")) return first;
    auto list = MakeExpr(Expr::Kind::kList, p);
    list->children.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == Tok::kBlockEnd || Peek().kind == Tok::kVarEnd) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      list->children.push_back(std::move(item));
    }
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condition) {
    Depth depth(&depth_);
    RETURN_IF_ERROR(CheckDepth(Peek().position));
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (with_condition && IsName("if")) {
      Position p = Next().position;
      auto cond = MakeExpr(Expr::Kind::kCondition, p);
      ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(expr));
      cond->children.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr Binary(absl::string_view op, ExprPtr left, ExprPtr right) {
    auto e = MakeExpr(Expr::Kind::kBinary, left->position);
    e->name = std::string(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary("or", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary("and", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Depth depth(&depth_);
      RETURN_IF_ERROR(CheckDepth(Peek().position));
      auto e = MakeExpr(Expr::Kind::kUnary, Next().position);
      e->name = "not";
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      e->children.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr compare;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == Tok::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                 t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (compare == nullptr) {
        compare = MakeExpr(Expr::Kind::kCompare, first->position);
        compare->children.push_back(std::move(first));
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      compare->ops.push_back(op);
      compare->children.push_back(std::move(operand));
    }
    return compare != nullptr ? std::move(compare) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      std::string op = Next().text;
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = Binary("~", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      std::string op = Next().text;
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    Chain chain(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary("**", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Depth depth(&depth_);
    RETURN_IF_ERROR(CheckDepth(Peek().position));
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeExpr(Expr::Kind::kUnary, Peek().position);
      node->name = Next().text;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node->children.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    Position p = t.position;
    switch (t.kind) {
      case Tok::kName: {
        std::string name = Next().text;
        auto e = MakeExpr(Expr::Kind::kLiteral, p);
        if (name == "true" || name == "True") {
          e->value = Value(true);
        } else if (name == "false" || name == "False") {
          e->value = Value(false);
        } else if (name == "none" || name == "None") {
          e->value = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = name;
        }
        return e;
      }
      case Tok::kString: {
        std::string text;
        while (Peek().kind == Tok::kString) text += Next().text;
        auto e = MakeExpr(Expr::Kind::kLiteral, p);
        e->value = Value(std::move(text));
        return e;
      }
      case Tok::kInt: {
        auto e = MakeExpr(Expr::Kind::kLiteral, p);
        e->value = Value(Next().int_value);
        return e;
      }
      case Tok::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, p);
        e->value = Value(Next().float_value);
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kList, p);
          }
          ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
          if (IsOp(",")) {
            auto list = MakeExpr(Expr::Kind::kList, p);
            list->children.push_back(std::move(first));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
              list->children.push_back(std::move(item));
            }
            first = std::move(list);
          }
          RETURN_IF_ERROR(ExpectOp(")"));
          return first;
        }
        if (t.text == "[") {
          Next();
          auto list = MakeExpr(Expr::Kind::kList, p);
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            list->children.push_back(std::move(item));
            if (!IsOp(",")) break;
            Next();
          }
          RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (t.text == "{") {
          Next();
          auto dict = MakeExpr(Expr::Kind::kDict, p);
          while (!IsOp("}")) {
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            dict->children.push_back(std::move(key));
            dict->children.push_back(std::move(value));
            if (!IsOp(",")) break;
            Next();
          }
          RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  absl::Status ParseCallArgs(Expr* call) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        call->kwargs.emplace_back(key, std::move(value));
      } else {
        if (!call->kwargs.empty()) return Unexpected("a keyword argument");
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        call->children.push_back(std::move(value));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    Chain chain(&depth_);
    while (true) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      if (IsOp(".")) {
        Position p = Next().position;
        if (Peek().kind == Tok::kInt) {
          auto e = MakeExpr(Expr::Kind::kGetItem, p);
          auto index = MakeExpr(Expr::Kind::kLiteral, p);
          index->value = Value(Next().int_value);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(index));
          node = std::move(e);
          continue;
        }
        auto e = MakeExpr(Expr::Kind::kGetAttr, p);
        ASSIGN_OR_RETURN(e->name, ExpectName());
        e->children.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        Position p = Next().position;
        ExprPtr start, stop, step;
        if (!IsOp(":")) {
          ASSIGN_OR_RETURN(start, ParseExpression(true));
        }
        if (IsOp(":")) {
          Next();
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(stop, ParseExpression(true));
          }
          if (IsOp(":")) {
            Next();
            if (!IsOp("]")) {
              ASSIGN_OR_RETURN(step, ParseExpression(true));
            }
          }
          auto e = MakeExpr(Expr::Kind::kSlice, p);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(start));
          e->children.push_back(std::move(stop));
          e->children.push_back(std::move(step));
          node = std::move(e);
        } else {
          auto e = MakeExpr(Expr::Kind::kGetItem, p);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(start));
          node = std::move(e);
        }
        RETURN_IF_ERROR(ExpectOp("]"));
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::Kind::kCall, Peek().position);
        e->children.push_back(std::move(node));
        RETURN_IF_ERROR(ParseCallArgs(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  // name[(args)] applied to `operand` (null in a filter block).
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr operand) {
    auto e = MakeExpr(Expr::Kind::kFilter, Peek().position);
    ASSIGN_OR_RETURN(e->name, ExpectName());
    e->children.push_back(std::move(operand));
    if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    Chain chain(&depth_);
    while (true) {
      RETURN_IF_ERROR(chain.Add(*this, Peek().position));
      if (IsOp("|")) {
        Next();
        ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
      } else if (IsName("is")) {
        auto e = MakeExpr(Expr::Kind::kTest, Next().position);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        ASSIGN_OR_RETURN(e->name, ExpectName());
        e->children.push_back(std::move(node));
        const Token& t = Peek();
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(e.get()));
        } else if ((t.kind == Tok::kName || t.kind == Tok::kString || t.kind == Tok::kInt ||
                    t.kind == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return ErrorAt(t.position, "tests cannot be chained with 'is'");
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          e->children.push_back(std::move(arg));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::Kind::kCall, Peek().position);
        e->children.push_back(std::move(node));
        RETURN_IF_ERROR(ParseCallArgs(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  const ParseOptions& options_;
  size_t index_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source, const ParseOptions& options) {
  Lexer lexer(source, options);
  ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens), options);
  return parser.ParseAll();
}

}  // namespace jinja
}  // namespace lgpt
