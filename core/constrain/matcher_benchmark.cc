// The cost of FillNextTokenMask per generated token, on a typical JSON schema, replaying a
// realistic JSON answer tokenized greedily (longest match) with GPT-2's byte-level vocabulary:
// its first 32000 tokens (a Llama-sized vocabulary) and all 50257. Each iteration is one request:
// a new matcher, then a mask and AcceptToken per token; items are tokens, so the time per item is
// the mask plus accept cost per token, memo tables built from scratch (cold) in the request.
// Warm: the same answer again on a fork of a matcher that has seen it (every state cached).
//
//   bazel run -c opt //core/constrain:matcher_benchmark
//   TRACE_MASKS=1 bazel run -c opt //core/constrain:matcher_benchmark --
//       --benchmark_filter=Cold/32000 --benchmark_min_time=0     (each mask's time)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "core/constrain/json_schema.h"
#include "core/constrain/matcher.h"
#include "core/constrain/test_util.h"
#include "nlohmann/json.hpp"

namespace lgpt {
namespace {

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "pattern": "[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}"},
    "active": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                               "zip": {"type": "string", "pattern": "\\d{5}"}},
                "required": ["city"]},
    "score": {"type": "number"}
  },
  "required": ["name", "age", "active"]
})";

constexpr const char* kAnswer =
    "{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada.lovelace@example.org\",\n"
    "  \"active\": true,\n  \"tags\": [\"mathematics\", \"poetry of science\", \"engines\"],\n"
    "  \"address\": {\"street\": \"12 St James's Square\", \"city\": \"London\", \"zip\": "
    "\"10001\"},\n  \"score\": 98.25\n}";

struct Setup {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenVocabulary> vocabulary;
  std::vector<int64_t> answer;  // kAnswer's tokens, then EOS
};

Setup MakeSetup(int64_t size) {
  Setup s;
  s.grammar = CompileJsonSchema(nlohmann::ordered_json::parse(kSchema), "schema").value();
  std::shared_ptr<const TokenVocabulary> gpt2 = Gpt2Vocabulary();
  std::vector<std::string> bytes;
  for (int64_t id = 0; id < size - 1; ++id) bytes.push_back(gpt2->token_bytes(id));
  bytes.push_back("");  // EOS
  std::vector<std::string> copy = bytes;
  s.vocabulary = TokenVocabulary::Create(std::move(copy), {size - 1}).value();
  // Greedy longest match.
  const std::string text = kAnswer;
  for (size_t pos = 0; pos < text.size();) {
    int64_t best = -1;
    size_t best_length = 0;
    for (int64_t id = 0; id < size; ++id) {
      const std::string& b = bytes[id];
      if (b.size() > best_length && text.compare(pos, b.size(), b) == 0) {
        best = id;
        best_length = b.size();
      }
    }
    s.answer.push_back(best);
    pos += best_length;
  }
  s.answer.push_back(size - 1);
  return s;
}

const Setup& GetSetup(int64_t size) {
  static auto* const setups = new std::map<int64_t, Setup>;
  auto it = setups->find(size);
  if (it == setups->end()) it = setups->emplace(size, MakeSetup(size)).first;
  return it->second;
}

// This thread's CPU time in microseconds (the machine may be shared: wall time counts others).
double CpuMicros() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

// Returns the slowest mask's CPU time in microseconds.
double Replay(const Setup& s, GrammarMatcher matcher, std::vector<uint32_t>* bitmask) {
  double slowest = 0;
  for (int64_t id : s.answer) {
    const double start = CpuMicros();
    matcher.FillNextTokenMask(absl::MakeSpan(*bitmask));
    const double micros = CpuMicros() - start;
    if (std::getenv("TRACE_MASKS") != nullptr) {
      std::fprintf(stderr, "%.0f us before \"%s\"\n", micros,
                   s.vocabulary->token_bytes(id).c_str());
    }
    slowest = std::max(slowest, micros);
    if (!((*bitmask)[id >> 5] >> (id & 31) & 1) || !matcher.AcceptToken(id).ok()) {
      std::fprintf(stderr, "token %ld refused\n", static_cast<long>(id));
      std::abort();
    }
  }
  return slowest;
}

void BM_MaskPerTokenCold(benchmark::State& state) {
  const Setup& s = GetSetup(state.range(0));
  std::vector<uint32_t> bitmask((s.vocabulary->size() + 31) / 32);
  double slowest = 0;
  for (auto _ : state) {
    slowest = std::max(slowest, Replay(s, GrammarMatcher(s.grammar, s.vocabulary), &bitmask));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(s.answer.size()));
  state.counters["slowest_mask_us"] = slowest;
  state.counters["trie_nodes"] = s.vocabulary->num_nodes();
  state.counters["tokens"] = static_cast<double>(s.answer.size());
}

void BM_MaskPerTokenWarm(benchmark::State& state) {
  const Setup& s = GetSetup(state.range(0));
  std::vector<uint32_t> bitmask((s.vocabulary->size() + 31) / 32);
  GrammarMatcher seen(s.grammar, s.vocabulary);
  Replay(s, seen.Fork(), &bitmask);
  for (auto _ : state) Replay(s, seen.Fork(), &bitmask);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(s.answer.size()));
}

// Compiling the schema (to GBNF, then to the byte-level grammar).
void BM_CompileJsonSchema(benchmark::State& state) {
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(kSchema);
  for (auto _ : state) benchmark::DoNotOptimize(CompileJsonSchema(schema, "schema").value());
}

BENCHMARK(BM_CompileJsonSchema)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskPerTokenCold)->Arg(32000)->Arg(50257)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskPerTokenWarm)->Arg(32000)->Arg(50257)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lgpt

BENCHMARK_MAIN();
