// Shared plumbing of the command-line tools: flag parsing, one-line errors with exit
// status 1, paths relative to where `bazel run` was invoked, and small parsers.
#ifndef LGPT_TOOLS_TOOL_UTIL_H_
#define LGPT_TOOLS_TOOL_UTIL_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/base/output_dir.h"

// --threads: intra-op threads of every tool (LibTorch's and the GEMV pool's); 0: all
// hardware threads unless OMP_NUM_THREADS says otherwise; more than the hardware threads are
// capped with a note.
ABSL_DECLARE_FLAG(int32_t, threads);

namespace lgpt {

// Parses flags (unknown flags and bad values end the program with one line and status 1),
// sets the intra-op threads (--threads) and quiets LibTorch's logging. Positional arguments
// are an error.
void InitTool(int argc, char** argv, absl::string_view usage);

// The flag that sets a library field ("KVCacheSpec.budget" -> "--kv_budget",
// "SchedulerOptions.kv_pool_bytes" -> "--pool_mb"); nullopt where no flag sets it.
std::optional<std::string> FlagOfField(absl::string_view path);

// The library names fields in its errors ("KVCacheSpec.budget must be >= 1") and carries them
// (core/base/status_field.h); tools speak of the flags that set them ("--kv_budget must be
// >= 1", values as --flag=value). Only the carried fields are renamed; fields no flag sets stay
// as they are.
std::string InFlagTerms(const absl::Status& status);

// Prints "<tool>: error: <message>" (in flag terms) on stderr and exits with status 1.
[[noreturn]] void Die(const absl::Status& status);

// Exits via Die() when `status` is not OK.
void DieIfError(const absl::Status& status);

template <typename T>
T ValueOrDie(absl::StatusOr<T> value) {
  if (!value.ok()) Die(value.status());
  return *std::move(value);
}

// Relative paths are taken from the directory `bazel run` was started in.
std::string ResolvePath(const std::string& path);

// `relative` (a path in the workspace, e.g. "tools/default_model") in the tool's runfiles,
// whether the tool runs under `bazel run`, a test, or directly as bazel-bin/tools/NAME from
// any directory; `relative` itself when not found.
std::string RunfilesPath(const std::string& relative);

// The embedded default model (//tools/default_model) in the tool's runfiles, whether the
// tool runs under `bazel run`, a test, or directly as bazel-bin/tools/NAME from anywhere.
std::string DefaultModelDir();

// "1,2,3" -> {1, 2, 3}; `flag` names the flag in errors.
absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, absl::string_view flag);

// --pool_mb in bytes (0: no pool); InvalidArgument when negative or past int64 in bytes.
absl::StatusOr<int64_t> PoolBytesFromFlag(int64_t pool_mb);

// LitGPT's precision names: 32-true, bf16-true, 16-true (and 64-true); errors name `flag`.
absl::StatusOr<c10::ScalarType> ParsePrecision(absl::string_view precision,
                                               absl::string_view flag = "precision");

// The tokenizer files a checkpoint directory may hold; tools writing a checkpoint copy those
// present with it.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.model", "tokenizer.json",
                                                  "tokenizer_config.json", "generation_config.json",
                                                  "special_tokens_map.json"};

// Copies the files named in `names` that exist in `from_dir` into `out`; returns how many.
absl::StatusOr<int> CopyPresentFiles(const std::string& from_dir,
                                     absl::Span<const char* const> names, OutputDir& out);

// Prints loading stages on stderr when it is a terminal; scripted runs keep stderr for the
// one error line.
void PrintProgress(const std::string& stage);

// Peak resident memory of this process, in bytes.
int64_t PeakRssBytes();
// Resident memory of this process now that is not a mapped file (RssAnon): what it owns,
// leaving out the pages of memory-mapped checkpoints, which the page cache shares. 0 where
// unsupported.
int64_t AnonRssBytes();
// Starts a new peak for PeakRssBytes (Linux /proc/self/clear_refs); a no-op where unsupported.
void ResetPeakRss();

}  // namespace lgpt

#endif  // LGPT_TOOLS_TOOL_UTIL_H_
