// The OpenAI API's depth over HTTP on the embedded default model: n choices (indexed, seeded as
// separate requests, streamed per index), logprobs in both endpoints' shapes and streamed,
// lists of prompts, truncate_prompt_tokens, vLLM's /tokenize and /detokenize, CORS
// (allowed origins, preflight, off by default), and speculative_config (its errors; and, in
// SpeculativeServingTest, replies, usage and /metrics through the serving engine).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "peft/lora.h"
#include "tests/random_lora.h"
#include "tools/server/default_engine_test_base.h"
#include "tools/server/http_server.h"
#include "tools/server/test_client.h"

namespace lgpt {
namespace {

using json = nlohmann::json;

class OpenAIFieldsTest : public DefaultEngineTest {
 protected:
  void Serve(ServerOptions options = {}) {
    options.port = 0;
    options.access_log = false;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(engine(), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    thread_ = std::thread([this] { server_->Run(); });
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  json Post(const std::string& path, const std::string& body, int status = 200) {
    const HttpReply reply = HttpPost(server_->port(), path, body);
    EXPECT_EQ(reply.status, status) << path << " " << body << "\n" << reply.body << reply.error;
    const json parsed = json::parse(reply.body, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << reply.body;
    return parsed;
  }

  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST_F(OpenAIFieldsTest, ChoicesEqualSeparateSeededRequests) {
  Serve();
  const json together = Post("/v1/completions",
                             R"({"prompt": "And God said", "max_tokens": 8, "temperature": 1,
                                 "n": 3, "seed": 50})");
  ASSERT_EQ(together["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(together["choices"][i]["index"], i);
    const json alone =
        Post("/v1/completions", absl::StrCat(R"({"prompt": "And God said", "max_tokens": 8,
                                             "temperature": 1, "seed": )",
                                             50 + i, "}"));
    EXPECT_EQ(together["choices"][i]["text"], alone["choices"][0]["text"]) << "choice " << i;
  }
  EXPECT_EQ(together["usage"]["completion_tokens"], 24);
  // Streamed: every index's pieces concatenate to its whole choice, and each finishes.
  std::map<int, std::string> texts;
  std::map<int, std::string> finishes;
  const StreamReply stream = HttpPostStream(
      server_->port(), "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "n": 2, "seed": 4,
          "stream": true})");
  for (const std::string& event : stream.events) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    for (const json& choice : chunk["choices"]) {
      const int index = choice["index"];
      if (choice["delta"].contains("content")) texts[index] += choice["delta"]["content"];
      if (!choice["finish_reason"].is_null()) finishes[index] = choice["finish_reason"];
    }
  }
  const json whole = Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 6,
                              "n": 2, "seed": 4})");
  ASSERT_EQ(texts.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(texts[i], whole["choices"][i]["message"]["content"]) << i;
    EXPECT_EQ(finishes[i], whole["choices"][i]["finish_reason"]) << i;
  }
}

TEST_F(OpenAIFieldsTest, LogprobsWholeAndStreamed) {
  Serve();
  const char* body = R"({"prompt": "And God said", "max_tokens": 10, "temperature": 0,
                         "logprobs": 2, "return_tokens_as_token_ids": true})";
  const json whole = Post("/v1/completions", body);
  const json& logprobs = whole["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const std::string token = logprobs["tokens"][i];
    ASSERT_TRUE(absl::StartsWith(token, "token_id:")) << token;
    // Greedy: the chosen token is the likeliest of the top two.
    const json& top = logprobs["top_logprobs"][i];
    ASSERT_EQ(top.size(), 2u);
    EXPECT_DOUBLE_EQ(top[token].get<double>(), logprobs["token_logprobs"][i].get<double>());
    for (const auto& [other, value] : top.items())
      EXPECT_LE(value.get<double>(), top[token].get<double>());
  }
  // Streamed: the same tokens, in pieces.
  std::vector<std::string> streamed;
  const StreamReply stream =
      HttpPostStream(server_->port(), "/v1/completions",
                     absl::StrCat(std::string(body).substr(0, std::string(body).size() - 1),
                                  R"(, "stream": true})"));
  for (const std::string& event : stream.events) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
    for (const json& token : chunk["choices"][0]["logprobs"]["tokens"]) streamed.push_back(token);
  }
  EXPECT_EQ(json(streamed), logprobs["tokens"]);
  // As text: the tokens are the completion's pieces, and text_offset says where each starts.
  const json text = Post("/v1/completions", R"({"prompt": "And God said", "max_tokens": 10,
                                                "temperature": 0, "logprobs": 0,
                                                "ignore_eos": true})");
  const json& pieces = text["choices"][0]["logprobs"];
  std::string joined;
  for (size_t i = 0; i < pieces["tokens"].size(); ++i) {
    EXPECT_EQ(pieces["text_offset"][i], joined.size()) << i;
    joined += pieces["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, text["choices"][0]["text"]);
}

TEST_F(OpenAIFieldsTest, PromptListsAndTruncation) {
  Serve();
  const json listed = Post("/v1/completions",
                           R"({"prompt": ["And God said", [10, 11, 12]], "max_tokens": 4,
                               "temperature": 0})");
  ASSERT_EQ(listed["choices"].size(), 2u);
  const json first =
      Post("/v1/completions", R"({"prompt": "And God said", "max_tokens": 4, "temperature": 0})");
  const json second =
      Post("/v1/completions", R"({"prompt": [10, 11, 12], "max_tokens": 4, "temperature": 0})");
  EXPECT_EQ(listed["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(listed["choices"][1]["text"], second["choices"][0]["text"]);
  EXPECT_EQ(listed["usage"]["prompt_tokens"], first["usage"]["prompt_tokens"].get<int>() + 3);
  // truncate_prompt_tokens keeps the last tokens.
  const json truncated = Post("/v1/completions",
                              R"({"prompt": [7, 8, 10, 11, 12], "max_tokens": 4, "temperature": 0,
                                  "truncate_prompt_tokens": 3})");
  EXPECT_EQ(truncated["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(truncated["choices"][0]["text"], second["choices"][0]["text"]);
  const json error = Post("/v1/completions", R"({"prompt": ["a", 5]})", 400);
  EXPECT_EQ(error["error"]["param"], "prompt[1]");
}

TEST_F(OpenAIFieldsTest, TokenizeAndDetokenize) {
  Serve();
  const json tokens = Post("/tokenize", R"({"prompt": "And God said"})");
  absl::StatusOr<std::vector<int64_t>> expected = engine()->Encode("And God said");
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(tokens["tokens"], json(*expected));
  EXPECT_EQ(tokens["count"], expected->size());
  EXPECT_EQ(tokens["max_model_len"], engine()->config().block_size);
  const json text = Post("/detokenize", json{{"tokens", *expected}}.dump());
  EXPECT_EQ(text["prompt"], "And God said");
  const json chat = Post("/tokenize", R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_GT(chat["count"].get<int>(), 1);
  EXPECT_EQ(Post("/tokenize", R"({"prompt": 5})", 400)["error"]["param"], "prompt");
  EXPECT_EQ(Post("/tokenize", R"({})", 400)["error"]["param"], "prompt");
  EXPECT_EQ(Post("/detokenize", R"({"tokens": [1, "x"]})", 400)["error"]["param"], "tokens[1]");
  EXPECT_EQ(Post("/detokenize", R"({"tokens": [99999999]})", 400)["error"]["param"], "tokens");
  Post("/tokenize", R"({"prompt": "x", "model": "gpt-4"})", 404);
}

// A copy of the default model whose tokenizer_config.json carries a ChatML chat template with
// tools (Hermes' <tool_call> format).
std::string CheckpointWithTemplate() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "templated";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kDefaultModelDir)) {
    fs::copy_file(entry.path(), dir / entry.path().filename(),
                  fs::copy_options::overwrite_existing);
  }
  const json config = {
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"chat_template",
       "{% if tools %}<|im_start|>system\nTools: {{ tools | map(attribute='function') | "
       "map(attribute='name') | join(', ') }}<|im_end|>\n{% endif %}"
       "{% for m in messages %}<|im_start|>{{ m.role }}\n"
       "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \""
       "{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
       "</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return dir.string();
}

TEST_F(OpenAIFieldsTest, ChatRendersThroughTheCheckpointsTemplate) {
  absl::StatusOr<std::shared_ptr<const Engine>> templated = Engine::Load(CheckpointWithTemplate());
  ASSERT_TRUE(templated.ok()) << templated.status();
  ServerOptions options;
  options.port = 0;
  options.access_log = false;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(*templated, options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::thread serving([&] { (*server)->Run(); });
  const int port = (*server)->port();
  const std::string turns = R"({"messages": [{"role": "user", "content": "Add 2 and 3."},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "5"}]})";
  const HttpReply tokens = HttpPost(port, "/tokenize", turns);
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  const std::string expected =
      "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n<tool_call>{\"name\": "
      "\"add\", \"arguments\": {\"a\": 2, \"b\": 3}}</tool_call><|im_end|>\n"
      "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n";
  absl::StatusOr<std::vector<int64_t>> ids = (*templated)->tokenizer()->Encode(expected, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(json::parse(tokens.body)["tokens"], json(*ids));
  // The same conversation is a chat request's prompt.
  const HttpReply reply = HttpPost(
      port, "/v1/chat/completions",
      absl::StrCat(turns.substr(0, turns.size() - 1), R"(, "max_tokens": 3, "temperature": 0})"));
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(json::parse(reply.body)["usage"]["prompt_tokens"], ids->size());
  (*server)->Shutdown();
  serving.join();
  // Without a template, tool messages are refused naming the message.
  Serve();
  const json refused = Post("/v1/chat/completions", turns, 400);
  EXPECT_EQ(refused["error"]["param"], "messages[2].role");
  // An assistant's calls alone are refused too, not rendered as an empty turn.
  const json calls = Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "x"},
                              {"role": "assistant", "tool_calls": [{"id": "c1", "type":
                               "function", "function": {"name": "add", "arguments": "{}"}}]},
                              {"role": "user", "content": "y"}]})",
                          400);
  EXPECT_EQ(calls["error"]["param"], "messages[1].tool_calls");
}

TEST_F(OpenAIFieldsTest, EmbeddingsFloatAndBase64) {
  Serve();
  const json floats = Post("/v1/embeddings", R"({"input": ["Amen.", [10, 11, 12]]})");
  ASSERT_EQ(floats["data"].size(), 2u);
  absl::StatusOr<at::Tensor> expected = engine()->Embed({*engine()->Encode("Amen."), {10, 11, 12}});
  ASSERT_TRUE(expected.ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(floats["data"][i]["index"], i);
    const std::vector<float> values = floats["data"][i]["embedding"];
    ASSERT_EQ(values.size(), static_cast<size_t>(engine()->config().n_embd));
    for (size_t j = 0; j < values.size(); ++j) {
      ASSERT_NEAR(values[j], (*expected)[i][j].item<float>(), 1e-6) << i << " " << j;
    }
  }
  EXPECT_EQ(floats["usage"]["prompt_tokens"], engine()->Encode("Amen.")->size() + 3);
  // base64: the same float32 values, little-endian.
  const json encoded =
      Post("/v1/embeddings", R"({"input": [10, 11, 12], "encoding_format": "base64"})");
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(encoded["data"][0]["embedding"].get<std::string>(), &bytes));
  ASSERT_EQ(bytes.size(), 4u * engine()->config().n_embd);
  float first;
  std::memcpy(&first, bytes.data(), 4);
  EXPECT_EQ(first, floats["data"][1]["embedding"][0].get<float>());
  EXPECT_EQ(Post("/v1/embeddings", R"({"input": []})", 400)["error"]["param"], "input");
  EXPECT_EQ(Post("/v1/embeddings", R"({"input": ["a", 3]})", 400)["error"]["param"], "input[1]");
  EXPECT_EQ(Post("/v1/embeddings", R"({"input": "a", "dimensions": 7})", 400)["error"]["param"],
            "dimensions");
  EXPECT_EQ(
      Post("/v1/embeddings", R"({"input": "a", "encoding_format": "int8"})", 400)["error"]["param"],
      "encoding_format");
  EXPECT_EQ(Post("/v1/embeddings", R"({"input": ["a", [1, 99999999]]})", 400)["error"]["param"],
            "input[1]");
}

// The reply of a chat request (its message's content) as JSON; discarded when not JSON.
json ContentJson(const json& reply, int choice = 0) {
  const json& content = reply["choices"][choice]["message"]["content"];
  if (!content.is_string()) return json(json::value_t::discarded);
  return json::parse(content.get<std::string>(), nullptr, false);
}

// Whether `value` holds what kSchema asks (a validator written for it).
bool ValidPerson(const json& value) {
  if (!value.is_object() || !value.contains("name") || !value.contains("age") ||
      !value.contains("tags")) {
    return false;
  }
  for (const auto& [key, field] : value.items()) {
    if (key != "name" && key != "age" && key != "tags" && key != "role" && key != "admin") {
      return false;  // additionalProperties: false
    }
  }
  const json& name = value["name"];
  if (!name.is_string() || name.get<std::string>().size() > 12) return false;
  if (!value["age"].is_number_integer() || value["age"] < 0 || value["age"] > 120) return false;
  const json& tags = value["tags"];
  if (!tags.is_array() || tags.size() < 1 || tags.size() > 3) return false;
  for (const json& tag : tags) {
    if (!tag.is_string() || tag.get<std::string>().size() > 6) return false;
  }
  if (value.contains("role") && value["role"] != "king" && value["role"] != "prophet") return false;
  if (value.contains("admin") && !value["admin"].is_boolean()) return false;
  return true;
}

constexpr char kSchema[] = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1,
             "maxItems": 3},
    "role": {"enum": ["king", "prophet"]},
    "admin": {"type": "boolean"}},
  "required": ["name", "age", "tags"], "additionalProperties": false})";

TEST_F(OpenAIFieldsTest, JsonSchemaOutputsValidateForEverySeed) {
  Serve();
  for (int seed = 0; seed < 6; ++seed) {
    const json reply =
        Post("/v1/chat/completions",
             absl::StrCat(R"({"messages": [{"role": "user", "content": "Who?"}], "max_tokens": 200,
                        "temperature": 1.0, "n": 2, "seed": )",
                          seed, R"(, "response_format": {"type": "json_schema", "json_schema":
                        {"name": "person", "strict": true, "schema": )",
                          kSchema, "}}}"));
    for (int choice = 0; choice < 2; ++choice) {
      const json value = ContentJson(reply, choice);
      EXPECT_TRUE(ValidPerson(value)) << "seed " << seed << ": " << reply["choices"][choice];
      EXPECT_EQ(reply["choices"][choice]["finish_reason"], "stop");
    }
  }
  // Properties come in the schema's order.
  const json ordered =
      Post("/v1/completions", absl::StrCat(R"({"prompt": "x", "max_tokens": 200, "seed": 3,
                                            "guided_json": )",
                                           kSchema, "}"));
  const std::string text = ordered["choices"][0]["text"];
  EXPECT_LT(text.find("\"name\""), text.find("\"age\"")) << text;
  EXPECT_LT(text.find("\"age\""), text.find("\"tags\"")) << text;
}

TEST_F(OpenAIFieldsTest, OtherOutputFormatsHold) {
  Serve();
  for (int seed = 0; seed < 4; ++seed) {
    const std::string common =
        absl::StrCat(R"("max_tokens": 120, "temperature": 1, "seed": )", seed);
    const json object =
        Post("/v1/chat/completions",
             absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", common,
                          R"(, "response_format": {"type": "json_object"}})"));
    const json parsed = ContentJson(object);
    // A reply cut by max_tokens may be unfinished; a finished one is an object.
    if (object["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(parsed.is_object()) << object;
    }
    const json regex = Post(
        "/v1/completions",
        absl::StrCat(R"({"prompt": "x", )", common, R"(, "guided_regex": "[0-9]{3}-[a-z]{2,4}"})"));
    EXPECT_TRUE(std::regex_match(regex["choices"][0]["text"].get<std::string>(),
                                 std::regex("[0-9]{3}-[a-z]{2,4}")))
        << regex;
    const json choice = Post("/v1/completions",
                             absl::StrCat(R"({"prompt": "x", )", common,
                                          R"(, "guided_choice": ["Moses", "Aaron", "Miriam"]})"));
    const std::string picked = choice["choices"][0]["text"];
    EXPECT_TRUE(picked == "Moses" || picked == "Aaron" || picked == "Miriam") << picked;
    const json grammar = Post(
        "/v1/completions", absl::StrCat(R"({"prompt": "x", )", common,
                                        R"(, "grammar": "root ::= (\"yea\" | \"nay\") \"!\""})"));
    const std::string said = grammar["choices"][0]["text"];
    EXPECT_TRUE(said == "yea!" || said == "nay!") << said;
  }
}

TEST_F(OpenAIFieldsTest, BadOutputFormatsNameTheirField) {
  Serve();
  const char* user = R"("messages": [{"role": "user", "content": "x"}])";
  const auto param = [&](const std::string& fields) {
    return Post("/v1/chat/completions", absl::StrCat("{", user, ", ", fields, "}"),
                400)["error"]["param"];
  };
  EXPECT_EQ(param(R"("response_format": {"type": "json_schema", "json_schema": {"schema":
                      {"type": "object", "properties": {"x": {"type": "string",
                      "format": "email"}}}}})"),
            "response_format.json_schema.schema.properties.x.format");
  EXPECT_EQ(param(R"("guided_regex": "a(b")"), "guided_regex");
  EXPECT_EQ(param(R"("grammar": "root ::= (")"), "grammar");
  EXPECT_EQ(param(R"("guided_regex": "a", "guided_choice": ["b"])"), "guided_regex");
  EXPECT_EQ(param(R"("response_format": {"type": "xml"})"), "response_format.type");
  EXPECT_EQ(param(R"("guided_json": "{not json")"), "guided_json");
}

constexpr char kTools[] = R"([{"type": "function", "function": {"name": "census",
    "description": "Count a tribe", "parameters": {"type": "object", "properties": {
      "tribe": {"enum": ["Judah", "Levi", "Dan"]}, "year": {"type": "integer", "minimum": 1,
      "maximum": 40}}, "required": ["tribe", "year"]}}},
  {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}])";

TEST_F(OpenAIFieldsTest, ForcedToolCallsParseAndValidate) {
  Serve();
  for (int seed = 0; seed < 4; ++seed) {
    for (const std::string& choice :
         {std::string(R"("required")"),
          std::string(R"({"type": "function", "function": {"name": "census"}})")}) {
      const json reply =
          Post("/v1/chat/completions",
               absl::StrCat(R"({"messages": [{"role": "user", "content": "Count Dan."}],
                          "max_tokens": 120, "temperature": 1, "seed": )",
                            seed, R"(, "tools": )", kTools, R"(, "tool_choice": )", choice, "}"));
      const json& message = reply["choices"][0]["message"];
      ASSERT_TRUE(message.contains("tool_calls")) << reply;
      EXPECT_EQ(reply["choices"][0]["finish_reason"], "tool_calls");
      ASSERT_EQ(message["tool_calls"].size(), 1u) << reply;
      const json& call = message["tool_calls"][0];
      EXPECT_EQ(call["type"], "function");
      EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "call_")) << call;
      const std::string name = call["function"]["name"];
      const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
      if (choice != R"("required")") {
        EXPECT_EQ(name, "census");
      }
      if (name == "census") {
        EXPECT_TRUE(arguments["tribe"] == "Judah" || arguments["tribe"] == "Levi" ||
                    arguments["tribe"] == "Dan")
            << arguments;
        EXPECT_TRUE(arguments["year"].is_number_integer() && arguments["year"] >= 1 &&
                    arguments["year"] <= 40)
            << arguments;
      } else {
        EXPECT_EQ(name, "weather");
        EXPECT_TRUE(arguments["city"].is_string()) << arguments;
      }
    }
  }
  // Streamed as OpenAI streams calls: a delta with the call's index, id, type and name (empty
  // arguments), then its arguments; together the call of the same request unstreamed.
  const std::string forced = absl::StrCat(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 120, "seed": 1,
          "tools": )",
      kTools, R"(, "tool_choice": {"type": "function", "function": {"name": "weather"}})");
  const json whole = Post("/v1/chat/completions", forced + "}");
  const StreamReply stream =
      HttpPostStream(server_->port(), "/v1/chat/completions", forced + R"(, "stream": true})");
  std::string name, arguments, finish, id;
  int call_deltas = 0;
  for (const std::string& event : stream.events) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("tool_calls")) {
      const json& call = choice["delta"]["tool_calls"][0];
      EXPECT_EQ(call["index"], 0);
      if (call_deltas++ == 0) {
        EXPECT_EQ(call["type"], "function");
        id = call["id"];
        name = call["function"]["name"];
        EXPECT_EQ(call["function"]["arguments"], "");
      } else {
        EXPECT_FALSE(call.contains("id")) << call;
        arguments += call["function"]["arguments"].get<std::string>();
      }
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(call_deltas, 2) << absl::StrJoin(stream.events, "\n");
  EXPECT_TRUE(absl::StartsWith(id, "call_")) << id;
  EXPECT_EQ(name, "weather");
  const json& whole_call = whole["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(arguments, whole_call["function"]["arguments"]) << whole;
  EXPECT_EQ(finish, "tool_calls");
  // tool_choice with response_format: refused.
  const json both = Post(
      "/v1/chat/completions",
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": )", kTools,
                   R"(, "tool_choice": "required", "response_format": {"type": "json_object"}})"),
      400);
  EXPECT_EQ(both["error"]["param"], "tool_choice");
}

TEST_F(OpenAIFieldsTest, ARequestPicksItsLoraAdapterByModel) {
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.query = lora.value = lora.mlp = true;
  absl::StatusOr<std::string> dir = WriteRandomLoraFineTune(
      kDefaultModelDir, engine()->config(), lora,
      (std::filesystem::path(std::getenv("TEST_TMPDIR")) / "psalms").string(), 3);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EngineOptions options;
  options.adapters = {{"psalms", {*dir, 1.0}}};
  absl::StatusOr<std::shared_ptr<const Engine>> multi = Engine::Load(kDefaultModelDir, options);
  ASSERT_TRUE(multi.ok()) << multi.status();
  ServerOptions server_options;
  server_options.port = 0;
  server_options.access_log = false;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(*multi, server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::thread serving([&] { (*server)->Run(); });
  const int port = (*server)->port();
  const json models = json::parse(HttpGet(port, "/v1/models").body);
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "psalms");
  EXPECT_EQ(models["data"][1]["parent"], engine()->config().name);
  EXPECT_EQ(HttpGet(port, "/v1/models/psalms").status, 200);
  for (const std::string& adapter : {std::string("psalms"), std::string()}) {
    const std::string model =
        adapter.empty() ? "" : absl::StrCat(R"("model": ")", adapter, R"(", )");
    const HttpReply reply =
        HttpPost(port, "/v1/completions", absl::StrCat("{", model, R"("prompt": "And God said",
                                                  "max_tokens": 10, "temperature": 0})"));
    ASSERT_EQ(reply.status, 200) << reply.body;
    RequestOptions request;
    request.max_new_tokens = 10;
    request.sampling = {0, 0, 1};
    request.adapter = adapter;
    absl::StatusOr<Completion> expected = (*multi)->Generate("And God said", request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const json body = json::parse(reply.body);
    EXPECT_EQ(body["choices"][0]["text"], expected->text) << adapter;
    if (!adapter.empty()) {
      EXPECT_EQ(body["model"], adapter);
    }
  }
  EXPECT_EQ(HttpPost(port, "/v1/completions", R"({"model": "hymns", "prompt": "x"})").status, 404);
  const HttpReply embeddings =
      HttpPost(port, "/v1/embeddings", R"({"model": "psalms", "input": "x"})");
  EXPECT_EQ(embeddings.status, 400);
  EXPECT_EQ(json::parse(embeddings.body)["error"]["param"], "model");
  (*server)->Shutdown();
  serving.join();
}

TEST_F(OpenAIFieldsTest, CorsIsOffByDefault) {
  Serve();
  const HttpReply reply = HttpRawExchange(server_->port(),
                                          "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: "
                                          "https://app.example\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.status, 200);
  EXPECT_FALSE(absl::StrContains(reply.head, "Access-Control-Allow-Origin")) << reply.head;
}

TEST_F(OpenAIFieldsTest, CorsAllowsItsOriginAndAnswersPreflights) {
  ServerOptions options;
  options.cors_allow_origin = "https://app.example";
  options.api_key = "k";
  Serve(options);
  const HttpReply preflight = HttpRawExchange(
      server_->port(),
      "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n"
      "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, "
      "content-type\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(preflight.status, 204) << preflight.head;  // before the API key check
  EXPECT_TRUE(absl::StrContains(preflight.head, "Access-Control-Allow-Origin: https://app.example"))
      << preflight.head;
  EXPECT_TRUE(absl::StrContains(preflight.head, "Access-Control-Allow-Methods: GET, POST, OPTIONS"))
      << preflight.head;
  EXPECT_TRUE(absl::StrContains(preflight.head,
                                "Access-Control-Allow-Headers: authorization, content-type"))
      << preflight.head;
  const HttpReply allowed =
      HttpRawExchange(server_->port(),
                      "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n"
                      "Authorization: Bearer k\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(allowed.status, 200);
  EXPECT_TRUE(absl::StrContains(allowed.head, "Access-Control-Allow-Origin: https://app.example"))
      << allowed.head;
  const HttpReply other =
      HttpRawExchange(server_->port(),
                      "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n"
                      "Authorization: Bearer k\r\nConnection: close\r\n\r\n");
  EXPECT_FALSE(absl::StrContains(other.head, "Access-Control-Allow-Origin")) << other.head;
}

// speculative_config over HTTP, what the server checks before the engine sees a request: bad
// values are 400s naming their field, "draft" needs a draft model, "none" runs plainly.
TEST_F(OpenAIFieldsTest, BadSpeculativeConfigsNameTheirField) {
  Serve();
  struct Case {
    const char* config;
    const char* param;
  };
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const std::string input = absl::StrContains(path, "chat")
                                  ? R"("messages": [{"role": "user", "content": "x"}])"
                                  : R"("prompt": "x")";
    for (const Case& bad : std::vector<Case>{
             {R"([1])", "speculative_config"},
             {R"({"method": "medusa"})", "speculative_config.method"},
             {R"({"method": "ngram", "num_speculative_tokens": 0})",
              "speculative_config.num_speculative_tokens"},
             {R"({"method": "ngram", "num_speculative_tokens": "4"})",
              "speculative_config.num_speculative_tokens"},
             {R"({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2})",
              "speculative_config.prompt_lookup_max"},
             {R"({"method": "ngram", "prompt_lookup_min": 9})",
              "speculative_config.prompt_lookup_max"},  // above the default's max (4)
             {R"({"num_speculative_tokens": 2})", "speculative_config.method"},
             {R"({"method": "ngram", "draft_model": "x"})", "speculative_config.draft_model"},
             // This server loaded no draft model.
             {R"({"method": "draft"})", "speculative_config.method"},
         }) {
      const json error = Post(
          path,
          absl::StrCat("{", input, R"(, "max_tokens": 2, "speculative_config": )", bad.config, "}"),
          400);
      EXPECT_EQ(error["error"]["type"], "invalid_request_error") << path << " " << bad.config;
      EXPECT_EQ(error["error"]["param"], bad.param) << path << " " << bad.config << "\n" << error;
    }
    // "none" is plain decoding: no speculative statistics.
    const json plain = Post(path, absl::StrCat("{", input, R"(, "max_tokens": 2,
                                                "speculative_config": {"method": "none"}})"));
    EXPECT_FALSE(plain["usage"].contains("speculative")) << plain;
  }
  const json draft =
      Post("/v1/completions", R"({"prompt": "x", "speculative_config": {"method": "draft"}})", 400);
  EXPECT_TRUE(absl::StrContains(draft["error"]["message"].get<std::string>(), "no draft model"))
      << draft;
}

TEST_F(OpenAIFieldsTest, AServerDefaultSpeculationIsChecked) {
  ServerOptions options;
  options.port = 0;
  options.access_log = false;
  options.speculative.method = "draft";  // the engine has no draft model
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(engine(), options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  options.speculative.method = "ngram";
  options.speculative.num_speculative_tokens = 0;
  server = HttpServer::Create(engine(), options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
}

// ---------------------------------------------------------------------------------------------
// SpeculativeServingTest: speculative decoding through the serving engine, end to end. These
// need Engine::Submit (the continuous-batching scheduler) to accept RequestOptions.speculative;
// until it does, it answers Unimplemented (400 here) and these tests fail. Run them alone with
//   bazel test //tools/server:openai_fields_test --test_filter='SpeculativeServingTest.*'
// ---------------------------------------------------------------------------------------------
class SpeculativeServingTest : public OpenAIFieldsTest {
 protected:
  // A prompt that repeats itself: the n-gram proposer finds what follows.
  static constexpr char kPrompt[] =
      "And God said, Let there be light: and there was light. And God said, Let there be "
      "light: and there was light. And God said, Let there be";
  static constexpr char kNgram[] =
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
          "prompt_lookup_max": 3})";

  // A greedy request's body on `path`, with `extra` fields (", ..." or empty).
  static std::string Body(const std::string& path, const std::string& extra) {
    const std::string input =
        absl::StrContains(path, "chat")
            ? absl::StrCat(R"("messages": [{"role": "user", "content": ")", kPrompt, R"("}])")
            : absl::StrCat(R"("prompt": ")", kPrompt, R"(")");
    return absl::StrCat("{", input, R"(, "max_tokens": 32, "temperature": 0)", extra, "}");
  }
  // Whether `reply` is a completion (not an error), with its usage.
  static bool Replied(const json& reply) {
    return reply.is_object() && reply.contains("choices") && reply["choices"].size() == 1 &&
           reply.contains("usage");
  }
  static std::string Text(const json& reply) {
    const json& choice = reply["choices"][0];
    return choice.contains("message") ? choice["message"].value("content", "")
                                      : choice.value("text", "");
  }
  static int64_t Stat(const json& usage, const char* name) {
    return usage.contains("speculative") ? usage["speculative"].value(name, int64_t{-1}) : -1;
  }
  // The statistics of a speculative reply: present, consistent, and proposals made.
  static void ExpectSpeculated(const json& usage) {
    ASSERT_TRUE(usage.is_object() && usage.contains("speculative")) << usage;
    const int64_t proposed = Stat(usage, "proposed_tokens");
    const int64_t accepted = Stat(usage, "accepted_tokens");
    const int64_t steps = Stat(usage, "verify_steps");
    EXPECT_GT(proposed, 0) << usage;
    EXPECT_GT(steps, 0) << usage;
    EXPECT_GE(accepted, 0) << usage;
    EXPECT_LE(accepted, proposed) << usage;
    // Each verification step yields one token of the model's own beside those accepted.
    EXPECT_LE(accepted + steps, usage.value("completion_tokens", int64_t{0})) << usage;
  }
};

TEST_F(SpeculativeServingTest, GreedyRepliesEqualPlainReplies) {
  Serve();
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    const json plain = Post(path, Body(path, ""));
    ASSERT_TRUE(Replied(plain)) << plain;
    EXPECT_FALSE(plain["usage"].contains("speculative")) << plain;
    const json speculative =
        Post(path, Body(path, absl::StrCat(R"(, "speculative_config": )", kNgram)));
    ASSERT_TRUE(Replied(speculative)) << speculative;
    EXPECT_EQ(Text(speculative), Text(plain)) << path;
    EXPECT_EQ(speculative["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);
    ExpectSpeculated(speculative["usage"]);
    // Streamed, with the usage chunk: the same text, the statistics in the last chunk.
    const StreamReply stream = HttpPostStream(
        server_->port(), path,
        Body(path, absl::StrCat(R"(, "stream": true, "stream_options": {"include_usage": true},
                                   "speculative_config": )",
                                kNgram)));
    ASSERT_EQ(stream.status, 200) << stream.body << stream.error;
    EXPECT_EQ(StreamedText(stream.events), Text(plain)) << path;
    ASSERT_GE(stream.events.size(), 2u);
    const json usage_chunk = json::parse(stream.events[stream.events.size() - 2], nullptr, false);
    ASSERT_TRUE(usage_chunk.is_object() && usage_chunk.contains("usage")) << usage_chunk;
    ExpectSpeculated(usage_chunk["usage"]);
  }
}

TEST_F(SpeculativeServingTest, TheServerDefaultAppliesAndRequestsOverrideIt) {
  ServerOptions options;
  options.speculative.method = "ngram";
  options.speculative.num_speculative_tokens = 4;
  options.speculative.prompt_lookup_min = 1;
  options.speculative.prompt_lookup_max = 3;
  Serve(options);
  const std::string path = "/v1/completions";
  const json plain = Post(path, Body(path, R"(, "speculative_config": {"method": "none"})"));
  ASSERT_TRUE(Replied(plain)) << plain;
  EXPECT_FALSE(plain["usage"].contains("speculative")) << plain;
  const json by_default = Post(path, Body(path, ""));
  ASSERT_TRUE(Replied(by_default)) << by_default;
  EXPECT_EQ(Text(by_default), Text(plain));
  ExpectSpeculated(by_default["usage"]);
  // One field changed: one token proposed per step at most.
  const json one =
      Post(path, Body(path, R"(, "speculative_config": {"num_speculative_tokens": 1})"));
  ASSERT_TRUE(Replied(one)) << one;
  EXPECT_EQ(Text(one), Text(plain));
  ExpectSpeculated(one["usage"]);
  EXPECT_LE(Stat(one["usage"], "proposed_tokens"), Stat(one["usage"], "verify_steps")) << one;
}

TEST_F(SpeculativeServingTest, MetricsCountTheRequestsProposals) {
  Serve();
  const auto counters = [this] {
    const std::string metrics = HttpGet(server_->port(), "/metrics").body;
    return std::vector<double>{MetricValue(metrics, "lgpt_spec_decode_num_drafts_total"),
                               MetricValue(metrics, "lgpt_spec_decode_num_draft_tokens_total"),
                               MetricValue(metrics, "lgpt_spec_decode_num_accepted_tokens_total")};
  };
  const std::vector<double> before = counters();
  for (double value : before) EXPECT_GE(value, 0);  // present
  const std::string path = "/v1/completions";
  const json reply = Post(path, Body(path, absl::StrCat(R"(, "speculative_config": )", kNgram)));
  ASSERT_TRUE(Replied(reply)) << reply;
  ExpectSpeculated(reply["usage"]);
  const std::vector<double> after = counters();
  EXPECT_EQ(after[0] - before[0], Stat(reply["usage"], "verify_steps"));
  EXPECT_EQ(after[1] - before[1], Stat(reply["usage"], "proposed_tokens"));
  EXPECT_EQ(after[2] - before[2], Stat(reply["usage"], "accepted_tokens"));
  // A plain request adds nothing.
  EXPECT_TRUE(Replied(Post(path, Body(path, ""))));
  EXPECT_EQ(counters(), after);
}

TEST_F(SpeculativeServingTest, ADraftModelsGreedyRepliesEqualPlainReplies) {
  // The default model drafts for itself: same tokenizer, and its proposals are mostly right.
  EngineOptions engine_options;
  engine_options.draft_checkpoint_dir = kDefaultModelDir;
  absl::StatusOr<std::shared_ptr<const Engine>> drafted =
      Engine::Load(kDefaultModelDir, engine_options);
  ASSERT_TRUE(drafted.ok()) << drafted.status();
  ServerOptions options;
  options.port = 0;
  options.access_log = false;
  options.speculative.method = "draft";
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(*drafted, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Every reply first, then the checks: the server thread is joined whatever they find.
  std::thread serving([&] { (*server)->Run(); });
  std::vector<std::string> paths, plain, by_default, ngram;
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    paths.push_back(path);
    plain.push_back(
        HttpPost(port, path, Body(path, R"(, "speculative_config": {"method": "none"})")).body);
    by_default.push_back(HttpPost(port, path, Body(path, "")).body);
    ngram.push_back(
        HttpPost(port, path, Body(path, absl::StrCat(R"(, "speculative_config": )", kNgram))).body);
  }
  (*server)->Shutdown();
  serving.join();
  for (size_t i = 0; i < paths.size(); ++i) {
    const json plain_json = json::parse(plain[i], nullptr, false);
    const json draft_json = json::parse(by_default[i], nullptr, false);
    const json ngram_json = json::parse(ngram[i], nullptr, false);
    ASSERT_TRUE(Replied(plain_json)) << plain[i];
    ASSERT_TRUE(Replied(draft_json)) << by_default[i];
    ASSERT_TRUE(Replied(ngram_json)) << ngram[i];
    EXPECT_EQ(Text(draft_json), Text(plain_json)) << paths[i];
    EXPECT_EQ(Text(ngram_json), Text(plain_json)) << paths[i];
    ExpectSpeculated(draft_json["usage"]);
    ExpectSpeculated(ngram_json["usage"]);
    EXPECT_GT(Stat(draft_json["usage"], "accepted_tokens"), 0) << draft_json;
  }
}

}  // namespace
}  // namespace lgpt
