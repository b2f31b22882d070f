// JSON schemas (OpenAI response_format json_schema, vLLM guided_json) compiled to GBNF
// grammars whose sentences are JSON texts valid against the schema.
//
// Supported: type (one or a list): object, array, string, number, integer, boolean, null;
// properties, required, additionalProperties (false, true or a schema); items, minItems,
// maxItems; minLength, maxLength, pattern (core/constrain/regex.h's subset, matching the whole
// string); minimum, maximum, exclusiveMinimum, exclusiveMaximum for integers; enum, const;
// anyOf, oneOf (as anyOf: the grammar does not exclude a value that two branches match), allOf
// of one schema; $ref to "#", "#/$defs/..." and "#/definitions/..." (recursion allowed);
// boolean schemas; and the annotations title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly. Any other keyword is refused with
// InvalidArgument naming its path (`field_path` + ".properties.x.format").
//
// What the grammar allows, beyond plain validity:
//   - Properties come in the order the schema lists them (nlohmann::json sorts keys: pass an
//     ordered_json to keep the schema's order); each optional one may be left out.
//   - With `properties` and no `additionalProperties`, no other property is written (a subset
//     of what the schema allows). With additionalProperties true or a schema, extra keys are
//     any string after the listed ones: an extra key may repeat a listed name.
//   - Whitespace is bounded so that a model cannot wander: between tokens of the JSON text,
//     nothing, one space, or a newline and at most 20 spaces or tabs of indentation; none before
//     the value or after it. So compact, one-line and pretty-printed JSON all fit.
//   - Numbers have at most 16 integer digits, 16 fraction digits and 2 exponent digits.
//   - enum and const values are written compactly (as nlohmann::json::dump()).
//   - \u escapes in strings are never surrogates (so every string is well-formed UTF-8).
#ifndef LGPT_CORE_CONSTRAIN_JSON_SCHEMA_H_
#define LGPT_CORE_CONSTRAIN_JSON_SCHEMA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/constrain/grammar.h"
#include "nlohmann/json.hpp"

namespace lgpt {

// The GBNF text of a schema. InvalidArgument naming the JSON path of the offending keyword,
// starting at `field_path` (say, "response_format.json_schema.schema").
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             absl::string_view field_path);

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, absl::string_view field_path);
// Properties in nlohmann::json's (sorted) key order.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(const nlohmann::json& schema,
                                                                 absl::string_view field_path);

// Any JSON object (OpenAI's response_format {"type": "json_object"}), with the whitespace rule
// above. Compiled once and shared.
std::shared_ptr<const Grammar> AnyJsonObjectGrammar();

}  // namespace lgpt

#endif  // LGPT_CORE_CONSTRAIN_JSON_SCHEMA_H_
