// The Jinja interpreter alone: whitespace control as jinja2 applies it with Hugging Face's
// settings (expected strings from Python's jinja2), expressions, undefined values, errors with
// line:column, raise_exception, and the limits that stop hostile templates. The chat templates
// of the model families are checked byte for byte in chat_template_test.
#include "core/text/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/base/status_field.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace jinja {
namespace {

absl::StatusOr<std::string> Render(const std::string& source, const ValueDict& context = {},
                                   const TemplateOptions& options = {}) {
  auto parsed = Template::Parse(source, options);
  if (!parsed.ok()) return parsed.status();
  return parsed->Render(context);
}

std::string Ok(const std::string& source, const ValueDict& context = {}) {
  auto text = Render(source, context);
  EXPECT_TRUE(text.ok()) << source << ": " << text.status();
  return text.ok() ? *text : "";
}

TEST(JinjaTest, WhitespaceControlAsJinja2) {
  EXPECT_EQ(Ok("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(Ok("a  {%- if true -%}  b  {%- endif %}\n\n c"), "ab\n c");
  EXPECT_EQ(Ok("x {% if true %}y{% endif %} z\n  {{ 'v' }}\n  {# c #}\nw"), "x y z\n  v\nw");
  EXPECT_EQ(Ok("  {%+ if true %}k{% endif +%}\nend\r\nnext\r\n\n"), "  k\nend\nnext\n");
  EXPECT_EQ(Ok("{{- ' a ' -}}\n\n{{ 'b' }}  {#- trimmed -#}  c"), " a bc");
  EXPECT_EQ(Ok("{% for i in [1,2,3] %}\n  {{ i }}{{ ',' if not loop.last }}\n{% endfor %}"),
            "  1,\n  2,\n  3\n");
}

TEST(JinjaTest, Expressions) {
  EXPECT_EQ(Ok("{{ 4 is divisibleby 2 }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1,2,3][1:] }} "
               "{{ 'hello'[::-1] }} {{ 'hello'[-3:] }} {{ [1,2,3,4,5][::2] }} {{ [1,2,3][5:] }}"),
            "True a1NoneTrue [2, 3] olleh llo [1, 3, 5] []");
  EXPECT_EQ(Ok("{% set a, b = [1, 2] %}{{ b }}{{ a }} {{ 'a b c'.split(' ', 1) }} {{ '%s' if 1 }} "
               "{{ 1 if 0 else 2 if 0 else 3 }}"),
            "21 ['a', 'b c'] %s 3");
  EXPECT_EQ(Ok("{{ {'a': {'b': [1, {'c': 'd'}]}}['a'].b[1].c }}"), "d");
  EXPECT_EQ(
      Ok("{{ 'ünï'|length }} {{ 'ünï'[1] }} {{ 'ünï straße'|upper }} {{ 'ÀÉ Ωμέγα Жук'|lower }} "
         "{{ 'élan vital'.title() }} {{ 'élan'|capitalize }}"),
      "3 n ÜNÏ STRASSE àé ωμέγα жук Élan Vital Élan");
}

TEST(JinjaTest, UndefinedValues) {
  // Printing empty, attributes and items of undefined undefined, iterating nothing.
  EXPECT_EQ(Ok("[{{ a }}|{{ a.b.c }}|{{ a['x'][0] }}|{{ a is defined }}|{{ a.b is undefined }}|"
               "{% for x in a %}x{% else %}none{% endfor %}|{{ a|length }}|{{ a|default(1) }}]"),
            "[|||False|True|none|0|1]");
  ValueDict context;
  context.Set("m", Value(ValueDict{{{"role", Value("user")}}, false}));
  EXPECT_EQ(Ok("{{ m.content is defined }} {{ m.get('content') is none }} {{ m.role }}", context),
            "False True user");
}

TEST(JinjaTest, StrftimeNowReadsTheClock) {
  TemplateOptions options;
  options.clock = [] { return std::time_t{0}; };
  auto text = Render("{{ strftime_now('%Y') }}", {}, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(*text == "1970" || *text == "1969") << *text;
}

TEST(JinjaTest, RaiseExceptionCarriesTheMessage) {
  auto text = Render("line\n{{ raise_exception('Roles must alternate: ' ~ 3) }}");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "Roles must alternate: 3");
  EXPECT_TRUE(IsRaisedByTemplate(text.status()));
  // Also from inside a macro.
  auto nested = Render("{% macro f() %}{{ raise_exception('inner') }}{% endmacro %}{{ f() }}");
  EXPECT_EQ(nested.status().message(), "inner");
}

void ExpectError(const std::string& source, const std::string& message) {
  auto text = Render(source);
  ASSERT_FALSE(text.ok()) << source << " rendered " << *text;
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), message) << source;
  EXPECT_FALSE(IsRaisedByTemplate(text.status()));
}

TEST(JinjaTest, SyntaxErrorsNameLineAndColumn) {
  ExpectError("line1\n  {{ x + }}", "template:2:10: unexpected '}}', expected an expression");
  ExpectError("{% if x %}no end",
              "template:1:17: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  ExpectError("{% for x in y %}{% endif %}",
              "template:1:20: unknown or unexpected tag 'endif' (supported: if, for, set, macro, "
              "filter, break, continue, generation)");
  ExpectError("\n\n {% include 'other.jinja' %}",
              "template:3:5: unknown or unexpected tag 'include' (supported: if, for, set, macro, "
              "filter, break, continue, generation)");
  ExpectError("{{ 'abc }}", "template:1:4: unterminated string literal");
  ExpectError("ok {# comment", "template:1:4: missing end of comment tag");
  ExpectError("{{ (1 ] }}", "template:1:7: unexpected ']', expected ')'");
  ExpectError("{{ x ? 1 }}", "template:1:6: unexpected character '?'");
  ExpectError("{% for x in y recursive %}{% endfor %}",
              "template:1:15: recursive for loops are not supported");
}

TEST(JinjaTest, RuntimeErrorsNameLineAndColumn) {
  ExpectError("\n{{ 1 + 'a' }}", "template:2:4: unsupported operand kinds for +: int and string");
  ExpectError("{{ foo() }}", "template:1:7: 'foo' is undefined");
  ExpectError("{{ 'x'|nosuch }}", "template:1:8: unknown filter 'nosuch'");
  ExpectError("{{ 1 is nosuch }}", "template:1:6: unknown test 'nosuch'");
  ExpectError("{% set x = 1 %}{% set x.y = 2 %}",
              "template:1:16: cannot assign attribute 'y' of 'x', which is not a namespace()");
  ExpectError("{{ 1 // 0 }}", "template:1:4: division by zero");
  ExpectError("{% for a, b in [1] %}{% endfor %}", "template:1:1: cannot unpack 1 into 2 names");
  ExpectError("{{ none + 'x' }}", "template:1:4: unsupported operand kinds for +: none and string");
}

void ExpectLimit(const std::string& source, const TemplateOptions& options,
                 const std::string& field) {
  auto text = Render(source, {}, options);
  ASSERT_FALSE(text.ok()) << source.substr(0, 80);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kResourceExhausted) << text.status();
  EXPECT_EQ(ErrorField(text.status()), field) << text.status();
  EXPECT_TRUE(absl::StrContains(text.status().message(), field)) << text.status();
}

TEST(JinjaTest, LimitsStopHostileTemplates) {
  TemplateOptions small;
  small.max_output_bytes = 1000;
  small.max_iterations = 10000;
  ExpectLimit("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", small,
              "TemplateOptions.max_output_bytes");
  ExpectLimit("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", small,
              "TemplateOptions.max_iterations");
  ExpectLimit("{{ range(1000000000) }}", small, "TemplateOptions.max_iterations");
  ExpectLimit("{{ [1] * 1000000000 }}", small, "TemplateOptions.max_iterations");
  const TemplateOptions defaults;
  ExpectLimit(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      defaults, "TemplateOptions.max_output_bytes");
  ExpectLimit("{{ 'x' * 1000000000000 }}", defaults, "TemplateOptions.max_output_bytes");
  ExpectLimit("{{ ('x' * 1000000)|replace('x', 'yyyyyyyyyy') }}", defaults,
              "TemplateOptions.max_output_bytes");
  ExpectLimit("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", defaults,
              "TemplateOptions.max_call_depth");
  // Without a call-depth limit, the evaluation depth still bounds the native stack.
  TemplateOptions deep;
  deep.max_call_depth = 1000000;
  ExpectLimit(
      "{% macro f(n) %}{% if true %}{% for i in [1] %}{{ f(n + 1) }}{% endfor %}{% endif %}"
      "{% endmacro %}{{ f(0) }}",
      deep, "TemplateOptions.max_nesting");
}

TEST(JinjaTest, DeepSourcesFailWithoutExhaustingTheStack) {
  for (const std::string& source :
       {"{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
        "{{ " + std::string(100000, '-') + "1 }}",
        "{{ not " +
            [] {
              std::string s;
              for (int i = 0; i < 100000; ++i) s += "not ";
              return s;
            }() +
            "1 }}",
        [] {
          std::string s = "{{ 1";
          for (int i = 0; i < 100000; ++i) s += " ~ 1";
          return s + " }}";
        }(),
        [] {
          std::string s = "{{ x";
          for (int i = 0; i < 100000; ++i) s += ".a";
          return s + " }}";
        }(),
        [] {
          std::string s;
          for (int i = 0; i < 100000; ++i) s += "{% if true %}";
          return s;
        }()}) {
    auto parsed = Template::Parse(source);
    ASSERT_FALSE(parsed.ok()) << source.substr(0, 40);
    EXPECT_EQ(ErrorField(parsed.status()), "TemplateOptions.max_nesting") << parsed.status();
  }
  // A realistic depth still parses.
  EXPECT_EQ(Ok("{{ ((((((((1)))))))) + 1 - -1 }}"), "3");
}

TEST(JinjaTest, DeepValuesAndCyclesAreSafe) {
  auto deep = Render(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x }}");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(ErrorField(deep.status()), "TemplateOptions.max_nesting") << deep.status();
  // A namespace holding itself: printed, compared and freed without recursing.
  EXPECT_EQ(Ok("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self == ns }} "
               "{{ [ns] }} {{ ns.self.self.self is defined }}"),
            "True [<Namespace>] True");
  EXPECT_FALSE(Render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns|tojson }}").ok());
  // JSON nested past kMaxJsonDepth is cut off, not recursed into.
  nlohmann::ordered_json json = nlohmann::ordered_json::array();
  for (int i = 0; i < 1000; ++i) json = nlohmann::ordered_json::array({json});
  EXPECT_EQ(Value::FromJson(json).depth(), kMaxJsonDepth);
}

TEST(JinjaTest, BreakContinueAndLoopVariables) {
  EXPECT_EQ(Ok("{% for x in 'abcdef' if x != 'b' %}{% if x == 'e' %}{% break %}{% endif %}"
               "{% if x == 'c' %}{% continue %}{% endif %}{{ loop.index }}{{ x }}"
               "{{ loop.revindex }}{{ loop.previtem or '-' }}{{ loop.nextitem }};{% endfor %}"),
            "1a5-c;3d3ce;");
}

TEST(JinjaTest, ScopesAsJinja2) {
  // Expected strings from Python's jinja2: a loop body's sets last one iteration, an if's
  // reach the enclosing scope, a macro sees the template's variables when it is called.
  EXPECT_EQ(Ok("{% for i in [1,2,3] %}{% if i == 1 %}{% set x = 'a' %}{% endif %}[{{ x }}]"
               "{% endfor %}|{{ x }}"),
            "[a][][]|");
  EXPECT_EQ(Ok("{% set x = 0 %}{% for i in [1,2,3] %}{% set x = x + i %}[{{ x }}]{% endfor %}|"
               "{{ x }}"),
            "[1][2][3]|0");
  EXPECT_EQ(Ok("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = 7 %}[{{ x }}]{% endfor %}"),
            "[5][7][5][7]");
  EXPECT_EQ(Ok("{% macro m() %}{{ y }}{% endmacro %}{% set y = 3 %}{{ m() }}"), "3");
  EXPECT_EQ(Ok("{% if true %}{% set z = 1 %}{% endif %}{{ z }}"), "1");
}

TEST(JinjaTest, MacrosWithDefaultsAndKeywords) {
  EXPECT_EQ(Ok("{% macro m(a, b='B', c=a ~ '!') %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
               "{{ m(1) }} {{ m(1, c='C') }} {{ m(b=2, a=3) }}"),
            "1B1! 1BC 323!");
  ExpectError("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
              "template:1:1: macro 'm' takes 1 arguments, got 2");
}

}  // namespace
}  // namespace jinja
}  // namespace lgpt
