#include "tools/tool_util.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <glog/logging.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <new>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_field.h"
#include "core/base/status_macros.h"

ABSL_FLAG(int32_t, threads, 0,
          "intra-op threads; 0: all hardware threads (or OMP_NUM_THREADS when set)");

namespace lgpt {
namespace {

std::string& ProgramName() {
  static std::string* name = new std::string("lgpt");
  return *name;
}

// The last line of defence: an exception no tool code caught (an allocation LibTorch could not
// make, say) becomes one error line and exit status 1 instead of an abort with a core dump.
[[noreturn]] void ReportUncaughtException() {
  std::string what = "unknown exception";
  if (std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::bad_alloc&) {
      what = "out of memory (an allocation failed; are the sizes in the flags or files sane?)";
    } catch (const c10::Error& e) {
      what = e.what_without_backtrace();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s\n", ProgramName().c_str(), what.c_str());
  std::_Exit(1);
}

// Threads beyond the hardware's only add switching (and thousands of them take seconds to
// start), so --threads is capped at the hardware threads.
int ThreadsFromFlag() {
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0) {
    Die(absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", threads)));
  }
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (threads == 0) {
    if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;  // LibTorch reads it.
    return hardware;
  }
  if (threads > hardware) {
    std::fprintf(stderr, "%s: note: --threads=%d capped to the %d hardware threads\n",
                 ProgramName().c_str(), threads, hardware);
    return hardware;
  }
  return threads;
}

}  // namespace

void InitTool(int argc, char** argv, absl::string_view usage) {
  std::string name = argv[0];
  const size_t slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  ProgramName() = name;
  absl::SetProgramUsageMessage(usage);
  // --help lists every flag the tool links in (its own, the shared sampling, KV cache,
  // precision, device and thread flags), not only those of the file named like the tool.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StartsWith(file, "tools/") || absl::StrContains(file, "/tools/");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    Die(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "' (flags look like --name=value)")));
  }
  std::set_terminate(ReportUncaughtException);
  // Set once, before any parallel work: Debian's LibTorch otherwise runs one thread.
  const int threads = ThreadsFromFlag();
  if (threads > 0) at::set_num_threads(threads);
  FLAGS_minloglevel = 2;  // LibTorch's warnings would clutter tool output.
  FLAGS_logtostderr = true;
}

std::optional<std::string> FlagOfField(absl::string_view path) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"KVCacheSpec.policy", "--kv_cache"},
      {"KVCacheSpec.budget", "--kv_budget"},
      {"KVCacheSpec.bits", "--kv_bits"},
      {"KVCacheSpec.sink_tokens", "--kv_sink"},
      {"KVCacheSpec.residual", "--kv_residual"},
      {"KVCacheSpec.group_size", "--kv_group"},
      {"KVCacheSpec.grace_period", "--kv_grace"},
      {"KVCacheSpec.normalize_scores", "--kv_normalize_scores"},
      {"KVCacheSpec.budget_rule", "--kv_budget_rule"},
      {"KVCacheSpec.positions", "--kv_positions"},
      {"SpeculativeSpec.method", "--speculative"},
      {"SpeculativeSpec.num_speculative_tokens", "--speculative_k"},
      {"SpeculativeSpec.prompt_lookup_min", "--ngram_min"},
      {"SpeculativeSpec.prompt_lookup_max", "--ngram_max"},
      {"EngineOptions.draft_checkpoint_dir", "--speculative"},
      {"EngineOptions.verify_checksums", "--verify_checksums"},
      {"LoadOptions.verify_checksums", "--verify_checksums"},
      {"ConvertOptions.verify_checksums", "--verify_checksums"},
      {"EngineOptions.quantize", "--quantize"},
      {"EngineOptions.loras", "--lora"},
      {"EngineOptions.adapters", "--lora"},
      {"EngineOptions.dtype", "--precision"},
      {"EngineOptions.device", "--device"},
      {"SchedulerOptions.kv_pool_bytes", "--pool_mb"},
      {"EngineOptions.kv_pool_memory_fraction", "--kv_memory_fraction"},
      {"EngineOptions.kv_pool_dtype", "--kv_pool_dtype"},
      {"SchedulerOptions.max_running", "--max_running"},
      {"SchedulerOptions.max_waiting", "--max_waiting"},
      {"SchedulerOptions.prefill_chunk", "--prefill_chunk"},
      {"SchedulerOptions.step_prefill_tokens", "--step_prefill_tokens"},
      {"SchedulerOptions.kv_block_size", "--kv_block_size"},
      {"SchedulerOptions.prefix_caching", "--prefix_caching"},
      {"SchedulerOptions.speculative_max_rows", "--speculative_max_rows"},
      {"OpenAIServerOptions.max_body_bytes", "--max_body_bytes"},
      {"OpenAIServerOptions.http_threads", "--http_threads"},
      {"OpenAIServerOptions.prompt_style", "--prompt_style"},
      {"OpenAIServerOptions.shutdown_s", "--shutdown_s"},
      {"OpenAIServerOptions.speculative.method", "--speculative"},
      {"OpenAIServerOptions.speculative.num_speculative_tokens", "--speculative_k"},
      {"OpenAIServerOptions.speculative.prompt_lookup_min", "--ngram_min"},
      {"OpenAIServerOptions.speculative.prompt_lookup_max", "--ngram_max"},
      {"ServeOnSocket.path", "--unix_socket"},
      {"ServeOnPort.host", "--host"},
      {"ServeOnPort.port", "--port"},
  };
  for (const auto& [field, flag] : kFlags) {
    if (path == field) return std::string(flag);
  }
  return std::nullopt;
}

namespace {

// A mention in flag terms: the flag, with the value as --flag=value.
std::optional<std::string> FlagTerm(const FieldMention& mention) {
  // The older spelling of --quantize=int8, and a value the flag spells its own way.
  if (mention.path == "EngineOptions.quantize_int8") return "--quantize=int8";
  if (mention.path == "EngineOptions.dtype" && mention.value == "float32") {
    return "--precision=32-true";
  }
  std::optional<std::string> flag = FlagOfField(mention.path);
  if (!flag || !mention.value) return flag;
  return absl::StrCat(*flag, "=", *mention.value);
}

}  // namespace

std::string InFlagTerms(const absl::Status& status) { return MessageInTerms(status, FlagTerm); }

void Die(const absl::Status& status) {
  std::cout.flush();
  std::fprintf(stderr, "%s: error: %s\n", ProgramName().c_str(), InFlagTerms(status).c_str());
  std::exit(1);
}

void DieIfError(const absl::Status& status) {
  if (!status.ok()) Die(status);
}

std::string RunfilesPath(const std::string& relative) {
  std::vector<std::string> candidates;
  // Run directly (./lgpt runs bazel-bin/tools/NAME from the user's directory): the
  // binary's own runfiles tree.
  char exe[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (length > 0) {
    candidates.push_back(absl::StrCat(absl::string_view(exe, length), ".runfiles/lgpt/", relative));
  }
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/lgpt/", relative));
  }
  // `bazel run` and tests start in the runfiles root.
  candidates.push_back(relative);
  for (const std::string& path : candidates) {
    struct stat info;
    if (::stat(path.c_str(), &info) == 0) return path;
  }
  return relative;
}

std::string DefaultModelDir() { return RunfilesPath("tools/default_model"); }

std::string ResolvePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* base = std::getenv("BUILD_WORKING_DIRECTORY");
  if (base == nullptr || *base == '\0') return path;
  return absl::StrCat(base, "/", path);
}

absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, absl::string_view flag) {
  std::vector<int64_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  }
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", piece, "' is not a non-negative integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<int64_t> PoolBytesFromFlag(int64_t pool_mb) {
  constexpr int64_t kMaxMb = std::numeric_limits<int64_t>::max() >> 20;
  if (pool_mb < 0 || pool_mb > kMaxMb) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pool_mb must be in [0, ", kMaxMb, "], got ", pool_mb));
  }
  return pool_mb << 20;
}

absl::StatusOr<c10::ScalarType> ParsePrecision(absl::string_view precision,
                                               absl::string_view flag) {
  if (precision == "32-true") return c10::kFloat;
  if (precision == "bf16-true") return c10::kBFloat16;
  if (precision == "16-true") return c10::kHalf;
  if (precision == "64-true") return c10::kDouble;
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": unknown value '", precision,
                                                 "' (expected 32-true, bf16-true or 16-true)"));
}

void PrintProgress(const std::string& stage) {
  static const bool terminal = ::isatty(STDERR_FILENO) == 1;
  if (terminal) std::fprintf(stderr, "%s\n", stage.c_str());
}

namespace {

// A "Name:   N kB" line of /proc/self/status, in bytes; nullopt where absent.
std::optional<int64_t> ProcStatusBytes(absl::string_view name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    int64_t kb = 0;
    if (absl::StartsWith(line, name) && line.size() > name.size() && line[name.size()] == ':' &&
        absl::SimpleAtoi(
            absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(name.size() + 1), "kB")),
            &kb)) {
      return kb * 1024;
    }
  }
  return std::nullopt;
}

}  // namespace

int64_t PeakRssBytes() {
  // VmHWM follows ResetPeakRss; getrusage's maximum never goes down.
  if (std::optional<int64_t> peak = ProcStatusBytes("VmHWM")) return *peak;
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

int64_t AnonRssBytes() { return ProcStatusBytes("RssAnon").value_or(0); }

void ResetPeakRss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
}

absl::StatusOr<int> CopyPresentFiles(const std::string& from_dir,
                                     absl::Span<const char* const> names, OutputDir& out) {
  int copied = 0;
  for (const char* name : names) {
    const std::filesystem::path from = std::filesystem::path(from_dir) / name;
    std::error_code error;
    if (!std::filesystem::is_regular_file(from, error)) continue;
    RETURN_IF_ERROR(out.CopyFile(from.string(), name));
    ++copied;
  }
  return copied;
}

}  // namespace lgpt
