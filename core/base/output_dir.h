// A tool's output directory written as one transaction: a reader (or a later run) sees the
// directory as it was before or as it is after, never a mix, whatever kills the writer.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, OutputDir::Begin(dir, {input_dir}));
//   RETURN_IF_ERROR(out->WriteFile("model_config.yaml", yaml));
//   RETURN_IF_ERROR(WriteTorchStateDict(out->Path("lit_model.pth"), tensors));
//   RETURN_IF_ERROR(out->Commit());
//
// Files are written into a hidden staging directory beside `dir`
// (`.NAME.lgpt-PID.partial`). Commit fsyncs them, carries over (as hard links) the files of an
// existing `dir` that were not rewritten (except those named in `drop`), and then swaps the
// staging directory and `dir` in one rename (renameat2 RENAME_EXCHANGE; a plain rename when
// `dir` does not exist yet). Costs: one fsync per file, one hard link per carried file.
// Staging directories left by killed runs are removed by the next Begin for the same `dir`.
// Without Commit (an error, an exception) the destructor removes the staging directory.
#ifndef LGPT_CORE_BASE_OUTPUT_DIR_H_
#define LGPT_CORE_BASE_OUTPUT_DIR_H_

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

struct OutputDirOptions {
  // Files of an existing directory that are not carried over when not rewritten (a stale
  // model.safetensors would shadow a new lit_model.pth, say).
  std::vector<std::string> drop;
};

class OutputDir {
 public:
  // Checks before any work is done: `dir` is none of `inputs` (nor inside one, nor holds one),
  // is not a file, and its parent is writable. FailedPrecondition / PermissionDenied otherwise.
  static absl::StatusOr<std::unique_ptr<OutputDir>> Begin(const std::string& dir,
                                                          const std::vector<std::string>& inputs,
                                                          const OutputDirOptions& options = {});
  // Begin's checks alone, creating nothing: for tools that check their output before long
  // work and Begin when they have something to write.
  static absl::Status Check(const std::string& dir, const std::vector<std::string>& inputs);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  // Where to write the file `name` (a plain file name) before Commit.
  std::string Path(absl::string_view name) const;
  // Writes `contents` as the file `name`.
  absl::Status WriteFile(absl::string_view name, absl::string_view contents);
  // Copies the file at `from` as `name`.
  absl::Status CopyFile(const std::string& from, absl::string_view name);

  // Makes the staged files the directory's contents; see the file comment.
  absl::Status Commit();

  const std::string& dir() const { return dir_; }

 private:
  OutputDir(std::string dir, std::string staging, OutputDirOptions options)
      : dir_(std::move(dir)), staging_(std::move(staging)), options_(std::move(options)) {}

  std::string dir_;
  std::string staging_;
  OutputDirOptions options_;
  bool committed_ = false;
};

// Checks before any work that the output file `path` lies inside none of the input
// directories `inputs` (score's logits replaced the model's own model.safetensors) and is
// no device, pipe or directory. FailedPrecondition otherwise.
absl::Status CheckOutputFile(const std::string& path, const std::vector<std::string>& inputs);

// Writes `contents` to `path` through `path.partial`, fsynced and renamed into place, so
// `path` is never seen truncated. An existing `path` that is not a regular file (a device,
// say) is FailedPrecondition, as it is for FinishPartialFile: the rename would replace it.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// The end of a write through `partial` (a file opened with fopen, to become `path`): when
// `written` (everything before succeeded) flushes and fsyncs it; closes it; renames it to
// `path`. On any failure, or when not `written`, `partial` is removed and the error (errno at
// the first failure) names `path`. So `path` is never seen truncated.
absl::Status FinishPartialFile(std::FILE* file, const std::string& partial, const std::string& path,
                               bool written);

// fsync of a written file or a directory (so a rename into it is durable).
absl::Status SyncPath(const std::string& path);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_OUTPUT_DIR_H_
