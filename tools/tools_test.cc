// Runs the tool binaries as a user would: outputs match LitGPT's golden data, and every
// kind of bad input ends with one error line on stderr and exit status 1.
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/io/npy.h"
#include "core/io/safetensors.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

const char kGolden[] = "tests/testdata/golden/llama2";

struct ToolRun {
  int status = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

// A writable copy of the golden checkpoint (config and weights) at TempDir()/`name`.
std::string CopyOfGoldenCheckpoint(const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  for (const char* file : {"model_config.yaml", "lit_model.pth"}) {
    std::ofstream(dir + "/" + file, std::ios::binary) << ReadAll(absl::StrCat(kGolden, "/", file));
  }
  return dir;
}

ToolRun Execute(const std::string& tool, const std::string& args) {
  const std::string out = TempDir() + "/stdout.txt", err = TempDir() + "/stderr.txt";
  const std::string command = absl::StrCat("tools/", tool, " ", args, " >", out, " 2>", err);
  ToolRun run;
  const int raw = std::system(command.c_str());
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  return run;
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n');
  return lines.empty() ? "" : lines.back();
}

std::string IdsOf(const std::string& npy) {
  const at::Tensor t = ReadNpy(npy).value().contiguous();
  std::string text;
  for (int64_t i = 0; i < t.numel(); ++i)
    absl::StrAppend(&text, i ? "," : "", t[i].item<int64_t>());
  return text;
}

void ExpectCleanFailure(const ToolRun& run, const std::string& needle) {
  EXPECT_EQ(run.status, 1) << run.err;
  const std::string err(absl::StripTrailingAsciiWhitespace(run.err));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 0) << "more than one line:\n" << err;
  EXPECT_NE(absl::AsciiStrToLower(err).find("error"), std::string::npos) << err;
  EXPECT_NE(err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << err;
}

TEST(ScoreTest, WritesLitGptLogits) {
  const std::string out = TempDir() + "/logits.npy";
  const ToolRun run =
      Execute("score", absl::StrCat("--checkpoint_dir=", kGolden,
                                    " --token_ids=", IdsOf(absl::StrCat(kGolden, "/tokens.npy")),
                                    " --logits_out=", out));
  ASSERT_EQ(run.status, 0) << run.err;
  const at::Tensor got = ReadNpy(out).value();
  const at::Tensor want = ReadNpy(absl::StrCat(kGolden, "/logits.npy")).value();
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
}

// The logits never go into the checkpoint they come from: --logits_out=DIR/lit_model.pth
// replaced the model's weights with an .npy file (status 0).
TEST(ScoreTest, RefusesAnOutputInsideTheCheckpoint) {
  const std::string dir = CopyOfGoldenCheckpoint("score_input");
  const std::string weights = ReadAll(dir + "/lit_model.pth");
  ExpectCleanFailure(
      Execute("score", absl::StrCat("--checkpoint_dir=", dir, " --token_ids=1,2 --logits_out=", dir,
                                    "/lit_model.pth")),
      "lies inside the input");
  EXPECT_EQ(ReadAll(dir + "/lit_model.pth"), weights);
}

TEST(ScoreTest, TensorParallelLogitsMatchOneProcess) {
  const std::string args =
      absl::StrCat("--checkpoint_dir=", kGolden,
                   " --token_ids=", IdsOf(absl::StrCat(kGolden, "/tokens.npy")), " --logits_out=");
  const std::string one = TempDir() + "/logits_tp1.npy", two = TempDir() + "/logits_tp2.npy";
  const ToolRun a = Execute("score", args + one), b = Execute("score", args + two + " --tp=2");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const at::Tensor single = ReadNpy(one).value(), sharded = ReadNpy(two).value();
  ASSERT_EQ(single.sizes(), sharded.sizes());
  EXPECT_LT((single - sharded).abs().max().item<double>(), 1e-5);
  ExpectCleanFailure(Execute("score", args + two + " --tp=0"), "--tp must be >= 1, got 0");
  ExpectCleanFailure(Execute("score", args + two + " --tp=2 --tp_backend=mpi"),
                     "--tp_backend must be auto, gloo or nccl, got 'mpi'");
}

TEST(GenerateTest, GreedyIdsAreTheLastLineForAnyPrefillChunk) {
  std::string expected = IdsOf(absl::StrCat(kGolden, "/greedy.npy"));
  std::replace(expected.begin(), expected.end(), ',', ' ');
  for (int chunk : {0, 1, 3}) {
    const ToolRun run = Execute(
        "generate", absl::StrCat("--checkpoint_dir=", kGolden,
                                 " --prompt_ids=", IdsOf(absl::StrCat(kGolden, "/prompt.npy")),
                                 " --max_new_tokens=12 --temperature=0 --print_ids",
                                 " --prefill_chunk=", chunk));
    ASSERT_EQ(run.status, 0) << run.err;
    // The ids alone on stdout; the statistics on stderr.
    EXPECT_EQ(run.out, expected + "\n") << "chunk " << chunk;
    // llama2 golden: 2 layers, 4 query groups, head_size 16 (n_embd 64 / 4 heads),
    // float32, capacity = 8 prompt + 12 new tokens.
    EXPECT_NE(run.err.find(absl::StrCat("kv_cache_bytes=", 2 * 2 * 1 * 4 * 20 * 16 * 4, "\n")),
              std::string::npos)
        << run.err;
  }
}

// A checkpoint quantised once generates what quantising at every load generates, from a
// file a seventh of the float one; a second quantisation and a bad format are refused.
TEST(QuantizeTest, SavedQuantisedCheckpointGeneratesAsQuantisingAtLoad) {
  const std::string out = TempDir() + "/default_int4";
  const ToolRun quantize =
      Execute("quantize",
              absl::StrCat("--checkpoint_dir=tools/default_model --quantize=int4 --out_dir=", out));
  ASSERT_EQ(quantize.status, 0) << quantize.err;
  EXPECT_NE(quantize.out.find("ratio=0.1"), std::string::npos) << quantize.out;
  const std::string args = " --prompt='And God said' --max_new_tokens=24 --temperature=0";
  const ToolRun saved = Execute("generate", "--checkpoint_dir=" + out + args);
  const ToolRun at_load =
      Execute("generate", "--checkpoint_dir=tools/default_model --quantize=int4" + args);
  ASSERT_EQ(saved.status, 0) << saved.err;
  ASSERT_EQ(at_load.status, 0) << at_load.err;
  EXPECT_EQ(saved.out, at_load.out);
  ExpectCleanFailure(Execute("generate", "--checkpoint_dir=" + out + " --quantize=int8" + args),
                     "q4_0");
  ExpectCleanFailure(
      Execute("quantize", absl::StrCat("--checkpoint_dir=", out,
                                       " --quantize=int8 --out_dir=", TempDir(), "/twice")),
      "already quantised");
  ExpectCleanFailure(
      Execute("quantize", absl::StrCat("--checkpoint_dir=tools/default_model ",
                                       "--quantize=int3 --out_dir=", TempDir(), "/int3")),
      "int3");
  // A config that claims 2^20 layers over the saved quantised weights is refused from their
  // tensor names before any module is built.
  std::string yaml = ReadAll(out + "/model_config.yaml");
  ASSERT_NE(yaml.find("n_layer: 4\n"), std::string::npos);
  yaml.replace(yaml.find("n_layer: 4\n"), 10, "n_layer: 1048576");
  std::ofstream(out + "/model_config.yaml") << yaml;
  ExpectCleanFailure(Execute("generate", "--checkpoint_dir=" + out + args), "holds 4 layers");
}

TEST(PerplexityTest, AgreementComparesTheQuantisedModelWithTheFloatOne) {
  // A short text: the default model's first held-out lines are not in this package, so a
  // verse of its training domain stands in.
  const std::string text = TempDir() + "/agreement.txt";
  std::ofstream(text) << "And God said, Let there be light: and there was light.\n"
                         "And God saw the light, that it was good.\n";
  const ToolRun int8 = Execute("perplexity",
                               "--lines_bos_eos --quantize=int8 --agreement "
                               "--text_file=" +
                                   text);
  ASSERT_EQ(int8.status, 0) << int8.err;
  const size_t at = int8.out.find("top1_agreement=");
  ASSERT_NE(at, std::string::npos) << int8.out;
  const double agreement = std::atof(int8.out.c_str() + at + 15);
  EXPECT_GT(agreement, 0.8) << int8.out;  // int8 rarely changes the most likely token
  EXPECT_LE(agreement, 1.0) << int8.out;
  // Without quantisation there is nothing to compare: no agreement is printed.
  const ToolRun plain = Execute("perplexity", "--agreement --text_file=" + text);
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out.find("top1_agreement"), std::string::npos) << plain.out;
}

// --kv_pool_dtype scores through a paged cache over a pool of such entries: float32 entries give
// the uncached windows' perplexity (to the printed digits), bfloat16 and int8 ones are named and
// close.
TEST(PerplexityTest, KVPoolDtypeScoresThroughAPagedCache) {
  const std::string text = TempDir() + "/kv_pool.txt";
  std::ofstream(text) << "And God said, Let there be light: and there was light.\n"
                         "And God saw the light, that it was good.\n";
  auto perplexity = [](const std::string& out) {
    const size_t at = out.find("perplexity=");
    return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + 11);
  };
  const ToolRun plain = Execute("perplexity", "--lines_bos_eos --text_file=" + text);
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const std::string dtype : {"float32", "bfloat16", "int8"}) {
    const ToolRun paged =
        Execute("perplexity",
                "--lines_bos_eos --chunk=3 --kv_pool_dtype=" + dtype + " --text_file=" + text);
    ASSERT_EQ(paged.status, 0) << paged.err;
    const char* named = dtype == "float32"    ? "kv_pool_dtype=Float "
                        : dtype == "bfloat16" ? "kv_pool_dtype=BFloat16"
                                              : "kv_pool_dtype=int8";
    EXPECT_NE(paged.out.find(named), std::string::npos) << paged.out;
    EXPECT_NEAR(perplexity(paged.out), perplexity(plain.out),
                dtype == "float32" ? 0.002 : 0.05 * perplexity(plain.out))
        << paged.out << plain.out;
  }
  ExpectCleanFailure(Execute("perplexity", "--kv_pool_dtype=int2 --text_file=" + text),
                     "--kv_pool_dtype");
}

// A text of fewer than two tokens, or a directory, has nothing to score: one line and status
// 1 (it printed tokens=0 and a NaN perplexity with status 0).
TEST(PerplexityTest, NothingToScoreIsAnError) {
  const std::string empty = TempDir() + "/empty.txt";
  std::ofstream(empty) << "";
  ExpectCleanFailure(Execute("perplexity", "--text_file=" + empty),
                     "empty.txt has too few tokens to score (1; at least 2 are needed)");
  ExpectCleanFailure(Execute("perplexity", "--text_file=" + TempDir()), "cannot read --text_file");
}

TEST(GenerateTest, SeededSamplingIsReproducible) {
  const std::string args = absl::StrCat("--checkpoint_dir=", kGolden,
                                        " --prompt_ids=1,2,3 --max_new_tokens=10 "
                                        "--temperature=1.0 --top_k=20 --seed=7");
  const ToolRun a = Execute("generate", args), b = Execute("generate", args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(LastLine(a.out), LastLine(b.out));
}

TEST(GenerateTest, TensorParallelRanksMatchOneProcess) {
  // --tp=2 starts two local ranks over Gloo; rank 0 alone prints.
  std::string expected = IdsOf(absl::StrCat(kGolden, "/greedy.npy"));
  std::replace(expected.begin(), expected.end(), ',', ' ');
  const ToolRun greedy = Execute(
      "generate", absl::StrCat("--checkpoint_dir=", kGolden,
                               " --prompt_ids=", IdsOf(absl::StrCat(kGolden, "/prompt.npy")),
                               " --max_new_tokens=12 --temperature=0 --print_ids --tp=2"));
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_EQ(greedy.out, expected + "\n");
  // Each rank's cache holds 2 of the 4 query groups: half of one process's bytes.
  for (const char* rank : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_NE(greedy.err.find(absl::StrCat(rank, "kv_cache_bytes=", 2 * 2 * 1 * 2 * 20 * 16 * 4)),
              std::string::npos)
        << greedy.err;
  }
  const std::string sampled = absl::StrCat("--checkpoint_dir=", kGolden,
                                           " --prompt_ids=1,2,3 --max_new_tokens=10 "
                                           "--temperature=1.0 --top_k=20 --seed=7");
  const ToolRun one = Execute("generate", sampled), two = Execute("generate", sampled + " --tp=2");
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_EQ(LastLine(one.out), LastLine(two.out));
  // 4 heads do not split 3 ways: every rank fails naming the field, and so does the run.
  const ToolRun three = Execute("generate", sampled + " --tp=3");
  EXPECT_NE(three.status, 0);
  EXPECT_NE(three.err.find("n_head (4) is not divisible by the tensor-parallel size 3"),
            std::string::npos)
      << three.err;
  EXPECT_NE(three.err.find("[launcher] rank "), std::string::npos) << three.err;
}

TEST(GenerateTest, DefaultModelStreamsTextThatContinuesThePrompt) {
  const ToolRun run = Execute("generate", "--prompt='And God said' --max_new_tokens=30 --seed=1");
  ASSERT_EQ(run.status, 0) << run.err;
  // stdout is the text alone: the prompt continued with words, one final newline. The
  // statistics are on stderr, so `generate > out.txt` is clean.
  ASSERT_EQ(run.out.rfind("And God said ", 0), 0u) << run.out;
  const std::string text = run.out;
  EXPECT_GT(text.size(), std::string("And God said ").size() + 20) << run.out;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(run.out.find("="), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("\n\n"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("model=lgpt-kjv-3m"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("decode_tokens_per_s="), std::string::npos) << run.err;
  // Same seed, same text.
  EXPECT_EQ(Execute("generate", "--prompt='And God said' --max_new_tokens=30 --seed=1")
                .out.substr(0, text.size()),
            text);
}

int64_t StatOf(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::atoll(out.c_str() + at + key.size() + 1);
}

// --speculative: the same greedy text, the acceptance rate on stderr (a draft of the model
// itself accepts everything), and refusals by their flags.
TEST(GenerateTest, SpeculativeDecodingPrintsItsAcceptanceAndKeepsTheText) {
  const std::string args =
      "--prompt='And God said, Let there be light: and there was light. And God said' "
      "--max_new_tokens=30 --temperature=0 --stop_at_eos=false";
  const ToolRun plain = Execute("generate", args);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const ToolRun ngram = Execute("generate", args + " --speculative=ngram --speculative_k=3");
  ASSERT_EQ(ngram.status, 0) << ngram.err;
  EXPECT_EQ(ngram.out, plain.out);
  EXPECT_NE(ngram.err.find("speculative=ngram k=3 proposed="), std::string::npos) << ngram.err;
  EXPECT_EQ(plain.err.find("speculative="), std::string::npos) << plain.err;
  const ToolRun draft =
      Execute("generate", args + " --speculative=draft:tools/default_model --speculative_k=6");
  ASSERT_EQ(draft.status, 0) << draft.err;
  EXPECT_EQ(draft.out, plain.out);
  EXPECT_NE(draft.err.find("acceptance_rate=1.000"), std::string::npos) << draft.err;
  ExpectCleanFailure(Execute("generate", args + " --speculative=draft:" + std::string(kGolden)),
                     "--speculative");
  ExpectCleanFailure(Execute("generate", args + " --speculative=ngram --speculative_k=0"),
                     "--speculative_k must be in [1, 64]");
  ExpectCleanFailure(
      Execute("generate", args + " --speculative=ngram --kv_cache=h2o --kv_budget=16"),
      "cannot come back");
}

TEST(GenerateTest, BudgetedCacheBytesStayFlatWhileDenseGrows) {
  const std::string args =
      "--prompt='And God said' --temperature=0 --stop_at_eos=false --max_new_tokens=";
  auto bytes = [&](const std::string& more) {
    const ToolRun run = Execute("generate", args + more);
    EXPECT_EQ(run.status, 0) << run.err;
    return StatOf(run.err, "kv_cache_bytes");
  };
  const int64_t dense_short = bytes("40"), dense_long = bytes("240");
  const int64_t sink_short = bytes("40 --kv_cache=sink --kv_budget=32");
  const int64_t sink_long = bytes("240 --kv_cache=sink --kv_budget=32");
  const int64_t sink8_long = bytes("240 --kv_cache=sink --kv_budget=32 --kv_bits=8");
  EXPECT_GT(dense_long, dense_short);
  EXPECT_EQ(sink_long, sink_short);  // the budget was reached within the first 40 tokens
  EXPECT_LT(sink_long, dense_long / 2);
  EXPECT_LT(sink8_long, sink_long);
  const ToolRun sink = Execute("generate", args + "8 --kv_cache=sink --kv_budget=32");
  EXPECT_NE(sink.err.find("kv_cache=\"sink budget=32"), std::string::npos) << sink.err;
  ExpectCleanFailure(Execute("generate", args + "8 --kv_cache=lru"), "lru");
  // The library names KVCacheSpec fields; the tool names its flags.
  ExpectCleanFailure(Execute("generate", args + "8 --kv_cache=sink --kv_budget=0"),
                     "--kv_budget must be >= 1");
  ExpectCleanFailure(Execute("generate", args + "8 --kv_bits=3"), "--kv_bits must be 16, 8 or 4");
}

TEST(GenerateTest, PromptStyleFramesTextPrompts) {
  // The default model's style is the identity: the prompt is echoed. A named style frames it
  // (then only the reply is printed); an unknown one is an error naming it. With --print_ids
  // the text streams to stderr and stdout holds only the ids.
  const ToolRun framed =
      Execute("generate",
              "--prompt='Quote Genesis 1:3.' --prompt_style=alpaca --max_new_tokens=8 "
              "--temperature=0 --print_ids");
  ASSERT_EQ(framed.status, 0) << framed.err;
  EXPECT_EQ(framed.err.find("Quote Genesis"), std::string::npos) << framed.err;
  EXPECT_EQ(framed.out.find("Quote Genesis"), std::string::npos) << framed.out;
  const ToolRun raw =
      Execute("generate",
              "--prompt='Quote Genesis 1:3.' --prompt_style=none --max_new_tokens=8 "
              "--temperature=0 --print_ids");
  ASSERT_EQ(raw.status, 0) << raw.err;
  EXPECT_EQ(raw.err.rfind("Quote Genesis 1:3.", 0), 0u) << raw.err;
  EXPECT_EQ(raw.out.find("Quote Genesis"), std::string::npos) << raw.out;
  EXPECT_EQ(std::count(raw.out.begin(), raw.out.end(), '\n'), 1) << raw.out;
  EXPECT_NE(LastLine(framed.out), LastLine(raw.out));
  ExpectCleanFailure(Execute("generate", "--prompt=x --prompt_style=nope"), "nope");
  ExpectCleanFailure(Execute("generate", "--prompt=x --stop=,"),
                     "--stop has an empty sequence (item 1 of 2)");
}

TEST(ChatTest, KeepsTheCacheAcrossTurnsAndSaysWhenTheContextIsFull) {
  const std::string input = TempDir() + "/chat_input.txt";
  std::ofstream(input) << "And God said\nAnd Moses said\n/reset\nAnd Jesus said\n";
  const ToolRun run =
      Execute("chat", "--temperature=0 --max_new_tokens=12 --prompt_style=default < " + input);
  ASSERT_EQ(run.status, 0) << run.err;
  // Turn 2 prefills only its own tokens although the context already held turn 1.
  const size_t turn2 = run.err.find("[turn 2: prefilled ");
  ASSERT_NE(turn2, std::string::npos) << run.err;
  const int64_t prefilled = std::atoll(run.err.c_str() + turn2 + 19);
  const size_t had = run.err.find("(context had ", turn2);
  ASSERT_NE(had, std::string::npos) << run.err;
  const int64_t context = std::atoll(run.err.c_str() + had + 13);
  EXPECT_GT(context, 12);
  EXPECT_GT(prefilled, 0);
  EXPECT_LT(prefilled, context);
  EXPECT_NE(run.err.find("(conversation reset)"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("[turn 1: prefilled", run.err.find("(conversation reset)")),
            std::string::npos)
      << run.err;

  // Long replies fill the 256-token context: the tool says so and goes on.
  {
    std::ofstream lines(input);
    for (int i = 0; i < 30; ++i) lines << "And the LORD said\n";
  }
  const ToolRun full =
      Execute("chat", "--temperature=0 --max_new_tokens=100 --prompt_style=default < " + input);
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("context full"), std::string::npos) << full.err;
}

TEST(ChatTest, TensorParallelRanksHoldTheSameConversation) {
  // Rank 0 reads the lines and shares them; both ranks run every turn, rank 0 prints.
  const std::string input = TempDir() + "/chat_tp_input.txt";
  std::ofstream(input) << "And God said\n/reset\nAnd Moses said\nAnd Jesus said\n";
  const std::string args = "--temperature=0 --max_new_tokens=10 --prompt_style=default < " + input;
  const ToolRun one = Execute("chat", args), two = Execute("chat", "--tp=2 " + args);
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_FALSE(one.out.empty());
  EXPECT_EQ(one.out, two.out);
  EXPECT_NE(two.err.find("[rank 1] "), std::string::npos) << two.err;
}

TEST(ChatTest, HelpListsCommandsAndUnknownCommandsAreNotSentToTheModel) {
  const std::string input = TempDir() + "/chat_commands.txt";
  std::ofstream(input) << "/help\n/bogus thing\nAnd God said\n";
  const ToolRun run =
      Execute("chat", "--temperature=0 --max_new_tokens=4 --prompt_style=default < " + input);
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.err.find("/reset"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("/help"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("unknown command '/bogus'"), std::string::npos) << run.err;
  // Only the real message became a turn.
  EXPECT_NE(run.err.find("[turn 1: "), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("[turn 2: "), std::string::npos) << run.err;
}

TEST(EvalCacheTest, WritesTablesPlotAndAttentionReport) {
  const std::string out_dir = TempDir() + "/eval_cache";
  const std::string text = TempDir() + "/eval_text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 12; ++i) {
      out << "And God said, Let there be light: and there was light. And God saw the light, "
             "that it was good: and God divided the light from the darkness.\n";
    }
  }
  const ToolRun run = Execute(
      "eval_cache", absl::StrCat("--checkpoint_dir=tools/default_model --text_file=", text,
                                 " --lines_bos_eos --max_tokens=200 --segment=96 --budgets=16,32 "
                                 "--policies=dense,window,sink --bits=16,8 --threads=1 --out_dir=",
                                 out_dir));
  ASSERT_EQ(run.status, 0) << run.err;
  const std::string csv = ReadAll(out_dir + "/results.csv");
  // Complete: the partial file was renamed.
  EXPECT_FALSE(std::ifstream(out_dir + "/results.csv.partial").good());
  // Header, the baseline, dense int8, and window/sink x 2 budgets x 2 bit widths.
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 2 + 8) << csv;
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> fields = absl::StrSplit(lines[i], ',');
    ASSERT_EQ(fields.size(), 10u) << lines[i];
    // Full precision is the model's float32: labelled 32 bits, never 16.
    EXPECT_TRUE(fields[2] == "32" || fields[2] == "8") << lines[i];
    double ppl = 0;
    ASSERT_TRUE(absl::SimpleAtod(fields[6], &ppl)) << lines[i];
    EXPECT_GT(ppl, 1.0) << lines[i];
    EXPECT_LT(ppl, 4096.0) << lines[i];
  }
  const std::string md = ReadAll(out_dir + "/results.md");
  EXPECT_NE(md.find("| window | 16 | 32 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| window | 16 | 8 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| 16 | 16 |"), std::string::npos) << md;
  // Each finished row is reported on stderr as it completes; stdout is the table.
  EXPECT_NE(run.err.find("[10/10] sink budget=32 8-bit"), std::string::npos) << run.err;
  EXPECT_EQ(run.out.rfind("# KV cache policies", 0), 0u) << run.out;
  EXPECT_NE(md.find("Attention on the first 4 tokens"), std::string::npos) << md;
  // One report row per layer of the default model (4 layers).
  EXPECT_NE(md.find("\n| 3 | "), std::string::npos) << md;
  EXPECT_EQ(md.find("\n| 4 | "), std::string::npos) << md;
  const std::string png = ReadAll(out_dir + "/ppl_vs_kv_bytes.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_LT(png.size(), 100000u);  // compressed (the raw pixels are 2.7 MB)
  ExpectCleanFailure(Execute("eval_cache",
                             "--checkpoint_dir=tools/default_model "
                             "--random_tokens=50 --policies=lru --out_dir=" +
                                 out_dir),
                     "lru");
  ExpectCleanFailure(Execute("eval_cache",
                             "--checkpoint_dir=tools/default_model "
                             "--random_tokens=50 --budgets=0 --out_dir=" +
                                 out_dir),
                     "budget");
}

TEST(EvalCacheTest, PoliciesWithABudgetPastTheSegmentEqualDense) {
  const std::string out_dir = TempDir() + "/eval_cache_full";
  const ToolRun run =
      Execute("eval_cache",
              "--checkpoint_dir=tools/default_model --random_tokens=120 --segment=60 "
              "--budgets=64 --policies=window,sink,h2o,tova --bits=16 "
              "--attention_report=false --threads=1 --out_dir=" +
                  out_dir);
  ASSERT_EQ(run.status, 0) << run.err;
  std::vector<std::string> lines =
      absl::StrSplit(ReadAll(out_dir + "/results.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + 1 + 4);
  auto perplexity = [](const std::string& line) {
    double ppl = 0;
    EXPECT_TRUE(absl::SimpleAtod(std::vector<std::string>(absl::StrSplit(line, ','))[6], &ppl));
    return ppl;
  };
  const double dense = perplexity(lines[1]);
  EXPECT_GT(dense, 1.0);
  for (size_t i = 2; i < lines.size(); ++i) {
    EXPECT_NEAR(perplexity(lines[i]), dense, dense * 1e-6) << lines[i];
  }
  EXPECT_EQ(ReadAll(out_dir + "/results.md").find("Attention on the first"), std::string::npos);
}

TEST(EvalCacheTest, NoFlagsScoresTheDefaultModelOnItsHeldOutText) {
  // No checkpoint and no token source: the default model on its held-out verses (limited
  // here to keep the test short), segments of its block size.
  const std::string out_dir = TempDir() + "/eval_cache_default";
  const ToolRun run = Execute("eval_cache",
                              "--max_tokens=300 --policies=window --budgets=32 --bits=16 "
                              "--attention_report=false --threads=1 --out_dir=" +
                                  out_dir);
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.err.find("held-out text"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("in segments of 256"), std::string::npos) << run.err;
  std::vector<std::string> lines =
      absl::StrSplit(ReadAll(out_dir + "/results.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].rfind("dense,,32,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("window,32,32,", 0), 0u) << lines[2];
  // 300 tokens in segments of 256 and 44: 255 + 43 scored.
  EXPECT_EQ(lines[2].substr(lines[2].rfind(',') + 1), "298") << lines[2];
}

// The results never go into the checkpoint they measure (results.csv, .md and the plot were
// written beside its weights), and negative sizes are errors, known before any scoring.
TEST(EvalCacheTest, RefusesAnOutputInsideTheCheckpointAndNegativeSizes) {
  const std::string dir = CopyOfGoldenCheckpoint("eval_cache_input");
  const std::string args = absl::StrCat("--checkpoint_dir=", dir,
                                        " --random_tokens=40 --policies=dense --bits=16 "
                                        "--budgets=8 --out_dir=");
  ExpectCleanFailure(Execute("eval_cache", args + dir), "a tool never writes into its input");
  ExpectCleanFailure(Execute("eval_cache", args + dir + "/results"),
                     "a tool never writes into its input");
  EXPECT_FALSE(std::ifstream(dir + "/results.csv").good());
  // Negative sizes were taken silently as their defaults.
  const std::string out = " --out_dir=" + TempDir() + "/eval_cache_negative";
  for (const char* flag : {"segment", "max_tokens", "random_tokens"}) {
    ExpectCleanFailure(Execute("eval_cache", absl::StrCat(args, out, " --", flag, "=-1")),
                       absl::StrCat("--", flag, " must be >= 0, got -1"));
  }
  ExpectCleanFailure(Execute("eval_cache", args + out + " --attention_report_from=-5"),
                     "--attention_report_from must be >= 0 (or -1: half a segment), got -5");
  // The attention report's option was named, not the flag.
  ExpectCleanFailure(Execute("eval_cache", args + out + " --kv_sink=-1"),
                     "--kv_sink must be >= 1 with --attention_report, got -1");
}

TEST(EvalCacheTest, AKilledRunLeavesItsFinishedRowsAndNoResultsCsv) {
  const std::string out_dir = TempDir() + "/eval_cache_killed";
  const std::string partial = out_dir + "/results.csv.partial";
  // Many rows; killed as soon as two have been written.
  const std::string script = absl::StrCat(
      "tools/eval_cache --random_tokens=1000 --segment=256 --policies=window,sink,h2o "
      "--budgets=16,32,64,128 --bits=16,8,4 --attention_report=false --threads=1 --out_dir=",
      out_dir, " >/dev/null 2>&1 & pid=$!; for i in $(seq 1200); do ", "[ -f ", partial,
      " ] && [ $(wc -l < ", partial, ") -ge 3 ] && break; sleep 0.05; done; ",
      "kill $pid; wait $pid; exit 0");
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  EXPECT_FALSE(std::ifstream(out_dir + "/results.csv").good());
  std::vector<std::string> lines = absl::StrSplit(ReadAll(partial), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("policy,budget,bits,", 0), 0u);
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(std::count(lines[i].begin(), lines[i].end(), ','), 9) << lines[i];
  }
}

TEST(ToolHelpTest, HelpListsTheSharedFlags) {
  for (const std::string tool : {"generate", "chat"}) {
    const ToolRun run = Execute(tool, "--help");
    for (const char* flag : {"--temperature", "--top_k", "--kv_cache", "--kv_budget", "--precision",
                             "--device", "--threads", "--checkpoint_dir"}) {
      EXPECT_NE(run.out.find(flag), std::string::npos) << tool << " --help lacks " << flag;
    }
  }
  const ToolRun eval = Execute("eval_cache", "--help");
  EXPECT_NE(eval.out.find("--threads"), std::string::npos) << eval.out;
  EXPECT_NE(eval.out.find("--budgets"), std::string::npos) << eval.out;
  const ToolRun score = Execute("score", "--help");
  EXPECT_NE(score.out.find("--threads"), std::string::npos) << score.out;
}

TEST(ToolErrorsTest, BadInputIsOneLineAndStatusOne) {
  const std::string ok_dir = absl::StrCat("--checkpoint_dir=", kGolden);
  ExpectCleanFailure(Execute("generate", "--checkpoint_dir=/nonexistent --prompt_ids=1"),
                     "/nonexistent");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1,x"), "prompt_ids");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --max_new_tokens=-2"),
                     "max_new_tokens");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --max_new_tokens=abc"),
                     "max_new_tokens");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --top_p=2"), "top_p");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --no_such_flag=1"),
                     "no_such_flag");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --max_new_tokens=5000"),
                     "context");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=99999"), "99999");
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt_ids=1 --precision=8-bit"),
                     "precision");
  ExpectCleanFailure(Execute("score", ok_dir + " --token_ids=1,2"), "logits_out");
  ExpectCleanFailure(Execute("generate", "--prompt=x --prompt_ids=1"), "exactly one");
  // The golden checkpoints have no tokenizer: a text prompt cannot be encoded.
  ExpectCleanFailure(Execute("generate", ok_dir + " --prompt=hello"), "tokenizer");
}

TEST(ToolErrorsTest, BenchServeNamesTheFlagNotTheOptionsField) {
  const std::string base = "--concurrency=1 --prompt_tokens=8 --new_tokens=2 ";
  for (const std::string flag : {"--kv_block_size=0",
                                 "--step_prefill_tokens=0",
                                 "--prefill_chunk=-1",
                                 "--max_running=0",
                                 "--pool_mb=-1",
                                 "--pool_mb=99999999999999",
                                 "--pool_mb=100000000",
                                 "--kv_pool_dtype=int2",
                                 "--kv_memory_fraction=1.5",
                                 "--kv_memory_fraction=-0.1",
                                 "--kv_memory_fraction=0.5 --pool_mb=8",
                                 "--shared_prefix_tokens=-1",
                                 "--shared_prefix_tokens=9",
                                 "--concurrency=0",
                                 "--concurrency=1,,2",
                                 "--concurrency=",
                                 "--concurrency=99999999999",
                                 "--rounds=0",
                                 "--speculative=eagle",
                                 "--speculative_k=0",
                                 "--ngram_min=0"}) {
    const ToolRun run = Execute("bench_serve", base + flag);
    ExpectCleanFailure(run, flag.substr(0, flag.find('=')));
    EXPECT_EQ(run.err.find("Options."), std::string::npos) << run.err;
  }
}

// Checked before any prompt is built: a huge --prompt_tokens ran out of memory making the
// prompts, and the warm-up's error named its max_new_tokens (8), not the flags.
TEST(ToolErrorsTest, BenchServeRefusesRequestsBeyondTheContextByTheirFlags) {
  for (const std::string flags :
       {"--prompt_tokens=300 --new_tokens=2", "--prompt_tokens=250 --new_tokens=10"}) {
    const ToolRun run = Execute("bench_serve", "--concurrency=1 " + flags);
    ExpectCleanFailure(run, "--prompt_tokens");
    EXPECT_NE(run.err.find("--new_tokens"), std::string::npos) << run.err;
    EXPECT_EQ(run.out, "") << flags;
  }
}

// Rounds in turns: a row per concurrency and round, then the medians and each round's ratio.
TEST(ToolsTest, BenchServeRoundsPrintMedians) {
  const ToolRun run =
      Execute("bench_serve", absl::StrCat("--checkpoint_dir=", kGolden,
                                          " --concurrency=1,16 --prompt_tokens=4"
                                          " --new_tokens=2 --rounds=3 --warmup=false"));
  ASSERT_EQ(run.status, 0) << run.err;
  const std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1 + 6 + 1 + 2 + 2) << run.out;  // header, rounds, medians, ratios
  for (int i = 1; i <= 6; ++i) {
    EXPECT_EQ(lines[i].substr(0, 2), i % 2 == 1 ? "1 " : "16") << lines[i];
  }
  EXPECT_EQ(lines[7], "median of 3 rounds:");
  EXPECT_EQ(lines[8].substr(0, 2), "1 ");
  EXPECT_EQ(lines[9].substr(0, 2), "16");
  EXPECT_EQ(lines[10].rfind("throughput_ratio_16_vs_1_rounds=", 0), 0u) << lines[10];
  EXPECT_EQ(std::count(lines[10].begin(), lines[10].end(), ','), 2) << lines[10];
  EXPECT_EQ(lines[11].rfind("throughput_ratio_16_vs_1=", 0), 0u) << lines[11];
}

// A fresh checkpoint of a shape: loads and generates, the same seed gives the same weights,
// another seed other weights; a bad request is one error line.
TEST(InitCheckpointTest, WritesALoadableSeededCheckpoint) {
  const std::string shape =
      "--model_config=tools/default_model/model_config.yaml --tokenizer_dir=tools/default_model";
  const std::string a = TempDir() + "/init_a", b = TempDir() + "/init_b", c = TempDir() + "/init_c";
  for (const auto& [dir, seed] : {std::pair<std::string, int>{a, 1}, {b, 1}, {c, 2}}) {
    const ToolRun run =
        Execute("init_checkpoint", absl::StrCat(shape, " --out_dir=", dir, " --seed=", seed));
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_NE(run.out.find("parameters"), std::string::npos) << run.out;
  }
  const std::string weights = ReadAll(a + "/lit_model.pth");
  EXPECT_GT(weights.size(), 1000u);
  EXPECT_EQ(weights, ReadAll(b + "/lit_model.pth"));
  EXPECT_NE(weights, ReadAll(c + "/lit_model.pth"));
  EXPECT_EQ(ReadAll(a + "/tokenizer.model"), ReadAll("tools/default_model/tokenizer.model"));
  const ToolRun generate = Execute("generate", absl::StrCat("--checkpoint_dir=", a,
                                                            " --prompt=\"And God said\""
                                                            " --max_new_tokens=4 --temperature=0"));
  EXPECT_EQ(generate.status, 0) << generate.err;
  const ToolRun bench =
      Execute("bench_serve",
              absl::StrCat("--checkpoint_dir=", c,
                           " --concurrency=2 --prompt_tokens=4 --new_tokens=2 --warmup=false"));
  EXPECT_EQ(bench.status, 0) << bench.err;

  ExpectCleanFailure(Execute("init_checkpoint", absl::StrCat(shape,
                                                             " --model_name=pythia-14m"
                                                             " --out_dir=",
                                                             a)),
                     "--model_config");
  ExpectCleanFailure(
      Execute("init_checkpoint", absl::StrCat(shape, " --out_dir=tools/default_model")), "input");
  ExpectCleanFailure(Execute("init_checkpoint", "--model_name=no-such-model --out_dir=" + a),
                     "no-such-model");
  // A shape whose weights cannot fit (2000 layers of 2048 x 8192: ~400 GB) is refused before
  // it is initialised.
  std::string yaml = ReadAll("tools/default_model/model_config.yaml");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"n_embd: 192", "n_embd: 2048"},
           {"n_head: 6", "n_head: 64"},
           {"n_layer: 4", "n_layer: 2000"},
           {"intermediate_size: 512", "intermediate_size: 8192"}}) {
    ASSERT_NE(yaml.find(from), std::string::npos) << from;
    yaml.replace(yaml.find(from), from.size(), to);
  }
  const std::string huge = TempDir() + "/huge_config.yaml";
  std::ofstream(huge) << yaml;
  ExpectCleanFailure(Execute("init_checkpoint", "--model_config=" + huge + " --out_dir=" + a),
                     "memory are available");
  ExpectCleanFailure(Execute("init_checkpoint", "--model_name=pythia-14m --tokenizer_dir=" +
                                                    TempDir() + " --out_dir=" + a),
                     "holds no tokenizer");
}

TEST(ToolErrorsTest, BrokenCheckpointsAreOneLineAndStatusOne) {
  const std::string dir = TempDir() + "/broken";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  const std::string args = absl::StrCat("--checkpoint_dir=", dir, " --prompt_ids=1,2");
  // No config at all.
  ExpectCleanFailure(Execute("generate", args), "model_config.yaml");
  // Malformed yaml.
  std::ofstream(dir + "/model_config.yaml") << "n_layer: [1, 2\nname: x\n";
  ExpectCleanFailure(Execute("generate", args), "model_config.yaml");
  // Unknown key.
  std::ofstream(dir + "/model_config.yaml")
      << ReadAll(absl::StrCat(kGolden, "/model_config.yaml")) << "bogus_key: 3\n";
  ExpectCleanFailure(Execute("generate", args), "bogus_key");
  // Good config, truncated weights.
  std::ofstream(dir + "/model_config.yaml") << ReadAll(absl::StrCat(kGolden, "/model_config.yaml"));
  const std::string weights = ReadAll(absl::StrCat(kGolden, "/model.safetensors"));
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << weights.substr(0, weights.size() / 2);
  ExpectCleanFailure(Execute("generate", args), "model.safetensors");
  // Weights of another model: shape mismatch names the tensor.
  ASSERT_EQ(std::system(("cp tests/testdata/golden/pythia/model.safetensors " + dir).c_str()), 0);
  ExpectCleanFailure(Execute("generate", args), "model.safetensors");
  // Corrupt lit_model.pth only.
  ASSERT_EQ(std::system(("rm " + dir + "/model.safetensors").c_str()), 0);
  std::ofstream(dir + "/lit_model.pth", std::ios::binary) << "PK\x03\x04 not really a zip";
  ExpectCleanFailure(Execute("generate", args), "lit_model.pth");
}

// The case: 40 bytes flipped in a tensor record of lit_model.pth. score (LoadOptions)
// and generate (EngineOptions) exit 1 naming the tensor and the flag that skips the check;
// with --verify_checksums=false they load it.
TEST(ToolErrorsTest, CorruptLitModelPthNamesTheTensor) {
  const std::string dir = TempDir() + "/corrupt";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/model_config.yaml") << ReadAll(absl::StrCat(kGolden, "/model_config.yaml"));
  std::string bytes = ReadAll(absl::StrCat(kGolden, "/lit_model.pth"));
  const std::string name = "transformer.h.1.attn.proj.weight";
  const at::Tensor weight =
      ReadSafetensors(absl::StrCat(kGolden, "/model.safetensors")).value().at(name).contiguous();
  const size_t at = bytes.find(std::string(static_cast<const char*>(weight.data_ptr()),
                                           weight.numel() * weight.element_size()));
  ASSERT_NE(at, std::string::npos);
  for (size_t i = 0; i < 40; ++i) bytes[at + 4 + i] ^= 1;  // The values stay finite.
  std::ofstream(dir + "/lit_model.pth", std::ios::binary) << bytes;

  const std::string logits = TempDir() + "/corrupt_logits.npy";
  const std::string score =
      absl::StrCat("--checkpoint_dir=", dir, " --token_ids=1,2,3", " --logits_out=", logits);
  const std::string generate =
      absl::StrCat("--checkpoint_dir=", dir, " --prompt_ids=1,2 --max_new_tokens=2");
  const std::vector<std::pair<std::string, std::string>> runs = {{"score", score},
                                                                 {"generate", generate}};
  for (const auto& [tool, args] : runs) {
    SCOPED_TRACE(tool);
    const ToolRun refused = Execute(tool, args);
    ExpectCleanFailure(refused, absl::StrCat("(tensor ", name, ") fails its CRC-32 check"));
    EXPECT_NE(refused.err.find("set --verify_checksums=false to load it anyway"), std::string::npos)
        << refused.err;
    const ToolRun loaded = Execute(tool, args + " --verify_checksums=false");
    EXPECT_EQ(loaded.status, 0) << loaded.err;
  }
}

// --kv_positions=cache: window and sink caches generate and chat past the 256-token context in
// flat memory; absolute positions (the default) refuse, and other policies reject the flag.
TEST(CachePositionsToolsTest, GenerateAndChatGoPastTheContext) {
  const std::string args =
      "--prompt='And God said' --stop_at_eos=false --kv_cache=sink --kv_budget=64 "
      "--max_new_tokens=";
  int64_t flat = -1;
  for (const char* more :
       {"600 --kv_positions=cache", "600 --kv_positions=cache --kv_bits=8",
        "600 --kv_positions=cache --kv_bits=4", "600 --kv_positions=cache --kv_cache=window",
        "100 --kv_positions=cache"}) {
    const ToolRun run = Execute("generate", args + more);
    ASSERT_EQ(run.status, 0) << more << ": " << run.err;
    const std::string all = run.out + run.err;  // statistics: wherever the tool prints them
    const int64_t length = std::atoll(more);
    EXPECT_EQ(StatOf(all, "new_tokens"), length) << more;
    if (std::string(more) == "600 --kv_positions=cache") flat = StatOf(all, "kv_cache_bytes");
    if (length == 100) {
      EXPECT_EQ(StatOf(all, "kv_cache_bytes"), flat);
    }
  }
  ExpectCleanFailure(Execute("generate", args + "600"), "--kv_positions=cache");
  ExpectCleanFailure(Execute("generate", args + "600 --kv_positions=cache --kv_cache=h2o"),
                     "--kv_positions=cache needs --kv_cache window or sink");
  ExpectCleanFailure(Execute("generate", args + "60 --kv_positions=cache --kv_cache=dense"),
                     "--kv_positions=cache needs --kv_cache window or sink");
  ExpectCleanFailure(Execute("generate", args + "60 --kv_positions=sideways"),
                     "--kv_positions must be absolute or cache");

  // The conversation passes the context that the default positions fill.
  const std::string input = TempDir() + "/chat_stream_input.txt";
  {
    std::ofstream lines(input);
    for (int i = 0; i < 30; ++i) lines << "And the LORD said\n";
  }
  const std::string chat_args =
      "--temperature=0 --max_new_tokens=100 --prompt_style=default --kv_cache=sink "
      "--kv_budget=64 ";
  const ToolRun full = Execute("chat", chat_args + "< " + input);
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("context full"), std::string::npos) << full.err;
  const ToolRun streaming = Execute("chat", chat_args + "--kv_positions=cache < " + input);
  ASSERT_EQ(streaming.status, 0) << streaming.err;
  EXPECT_EQ(streaming.err.find("context full"), std::string::npos) << streaming.err;
  const size_t last = streaming.err.find("[turn 30: prefilled ");
  ASSERT_NE(last, std::string::npos) << streaming.err;
  const size_t had = streaming.err.find("(context had ", last);
  ASSERT_NE(had, std::string::npos);
  EXPECT_GT(std::atoll(streaming.err.c_str() + had + 13), 256) << streaming.err.substr(last);
}

}  // namespace
}  // namespace lgpt
