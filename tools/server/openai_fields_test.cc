// The OpenAI API's depth over HTTP on the embedded default model: n choices (indexed, seeded as
// separate requests, streamed per index), logprobs in both endpoints' shapes and streamed,
// lists of prompts, truncate_prompt_tokens, vLLM's /tokenize and /detokenize, and CORS
// (allowed origins, preflight, off by default).
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

}  // namespace
}  // namespace lgpt
