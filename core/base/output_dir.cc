#include "core/base/output_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;

// Whether `inner` is `outer` or lies inside it (both absolute and normalised).
bool IsWithin(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

fs::path Normalised(const std::string& path) {
  std::error_code error;
  fs::path p = fs::weakly_canonical(fs::absolute(path, error), error);
  return error ? fs::absolute(path).lexically_normal() : p;
}

// Whether a file of `dir` is a file of `input` (symbolic links followed): a directory of links
// to the input (a Bazel runfiles tree, say) is the input too.
bool SharesFiles(const fs::path& dir, const fs::path& input) {
  std::error_code error;
  std::vector<std::pair<dev_t, ino_t>> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(input, error)) {
    struct stat st;
    if (::stat(entry.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      files.emplace_back(st.st_dev, st.st_ino);
    }
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    struct stat st;
    if (::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (std::find(files.begin(), files.end(), std::make_pair(st.st_dev, st.st_ino)) !=
        files.end()) {
      return true;
    }
  }
  return false;
}

std::string StagingPrefix(const fs::path& dir) {
  return absl::StrCat(".", dir.filename().string(), ".lgpt-");
}

// Removes what killed runs left beside `dir`: staging directories of processes that no longer
// run, and an old copy moved aside by the rename fallback (put back if `dir` is missing).
void CleanUpStale(const fs::path& dir) {
  std::error_code error;
  const std::string prefix = StagingPrefix(dir);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir.parent_path(), error)) {
    std::string name = entry.path().filename().string();
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, prefix)) continue;
    const bool old = absl::ConsumeSuffix(&rest, ".old");
    if (!old && !absl::ConsumeSuffix(&rest, ".partial")) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(rest, &pid) || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running (or not ours)
    if (old && !fs::exists(dir, error)) {
      fs::rename(entry.path(), dir, error);
    } else {
      fs::remove_all(entry.path(), error);
    }
  }
}

// Writes `contents` to `path`; with `sync`, fsyncs it before closing.
absl::Status WriteAll(const std::string& path, absl::string_view contents, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create"));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error ? error : EIO, absl::StrCat(path, ": write failed"));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = !sync || ::fsync(fd) == 0;
  const int error = errno;
  if (::close(fd) != 0 || !synced) {
    return absl::ErrnoToStatus(synced ? errno : error, absl::StrCat(path, ": write failed"));
  }
  return absl::OkStatus();
}

// Makes `to` a copy of the tree at `from`: files as hard links (copies where linking fails).
absl::Status Mirror(const fs::path& from, const fs::path& to) {
  std::error_code error;
  const fs::file_status status = fs::symlink_status(from, error);
  if (fs::is_symlink(status)) {
    fs::copy_symlink(from, to, error);
  } else if (fs::is_directory(status)) {
    fs::create_directory(to, error);
    if (error)
      return absl::ErrnoToStatus(error.value(), absl::StrCat(to.string(), ": cannot create"));
    for (const fs::directory_entry& entry : fs::directory_iterator(from, error)) {
      absl::Status status = Mirror(entry.path(), to / entry.path().filename());
      if (!status.ok()) return status;
    }
  } else if (::link(from.c_str(), to.c_str()) != 0) {
    fs::copy_file(from, to, error);
  }
  if (error)
    return absl::ErrnoToStatus(error.value(), absl::StrCat(from.string(), ": cannot carry over"));
  return absl::OkStatus();
}

absl::Status SyncTree(const fs::path& root) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root, error)) {
    if (entry.is_regular_file() || entry.is_directory()) {
      absl::Status status = SyncPath(entry.path().string());
      if (!status.ok()) return status;
    }
  }
  if (error)
    return absl::ErrnoToStatus(error.value(), absl::StrCat(root.string(), ": cannot list"));
  return SyncPath(root.string());
}

// The writers rename a complete file over `path`: over a device, pipe or socket (as root,
// --logits_out=/dev/stdout or /dev/full) that replaced the node with a regular file.
absl::Status CheckReplaceable(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      path,
      " is not a regular file: outputs are written whole and renamed into place, so the "
      "path must be a regular file or not exist"));
}

}  // namespace

absl::Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open to sync"));
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // some file systems cannot sync dirs
  const int error = errno;
  ::close(fd);
  if (!ok) return absl::ErrnoToStatus(error, absl::StrCat(path, ": fsync failed"));
  return absl::OkStatus();
}

absl::Status FinishPartialFile(std::FILE* file, const std::string& partial, const std::string& path,
                               bool written) {
  auto last_error = [] { return errno != 0 ? errno : EIO; };
  int error = written ? 0 : last_error();
  if (error == 0 && (std::fflush(file) != 0 || ::fsync(::fileno(file)) != 0)) error = last_error();
  if (std::fclose(file) != 0 && error == 0) error = last_error();
  absl::Status replaceable = CheckReplaceable(path);
  if (!replaceable.ok()) {
    std::remove(partial.c_str());
    return replaceable;
  }
  if (error == 0 && std::rename(partial.c_str(), path.c_str()) != 0) error = last_error();
  if (error == 0) return absl::OkStatus();
  std::remove(partial.c_str());
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": write failed"));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  RETURN_IF_ERROR(CheckReplaceable(path));
  const std::string partial = path + ".partial";
  absl::Status status = WriteAll(partial, contents, /*sync=*/true);
  if (status.ok() && std::rename(partial.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot rename ", partial, " to it"));
  }
  if (!status.ok()) {
    std::remove(partial.c_str());
    return status;
  }
  return SyncPath(fs::absolute(path).parent_path().string());
}

absl::Status CheckOutputFile(const std::string& path, const std::vector<std::string>& inputs) {
  if (path.empty()) return absl::InvalidArgumentError("the output file is empty");
  const fs::path target = Normalised(path);
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    if (IsWithin(target, Normalised(input))) {
      return absl::FailedPreconditionError(
          absl::StrCat("the output file ", path, " lies inside the input ", input,
                       ": a tool never writes into its input; choose another output file"));
    }
  }
  return CheckReplaceable(path);
}

absl::Status OutputDir::Check(const std::string& dir, const std::vector<std::string>& inputs) {
  if (dir.empty()) return absl::InvalidArgumentError("the output directory is empty");
  const fs::path target = Normalised(dir);
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    const fs::path source = Normalised(input);
    if (IsWithin(target, source) || IsWithin(source, target) || SharesFiles(target, source)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the output directory ", dir, " is, holds or lies inside the input ", input,
                       ": a tool never writes into its input; choose another output directory"));
    }
  }
  std::error_code error;
  if (fs::exists(target, error) && !fs::is_directory(target, error)) {
    return absl::FailedPreconditionError(absl::StrCat("the output directory ", dir, " is a file"));
  }
  // The nearest existing ancestor must be a writable directory (the rest is created).
  fs::path existing = target.parent_path();
  while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
  if (!fs::is_directory(existing, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        existing.string(), " is a file: the output directory ", dir, " cannot be made under it"));
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat(existing.string(), ": cannot write the output there"));
  }
  if (fs::exists(target) && ::access(target.c_str(), W_OK | X_OK) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(dir, ": cannot write the output there"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OutputDir>> OutputDir::Begin(const std::string& dir,
                                                            const std::vector<std::string>& inputs,
                                                            const OutputDirOptions& options) {
  RETURN_IF_ERROR(Check(dir, inputs));
  const fs::path target = Normalised(dir);
  const fs::path parent = target.parent_path();
  std::error_code error;
  fs::create_directories(parent, error);
  if (error || !fs::is_directory(parent)) {
    return absl::ErrnoToStatus(
        error ? error.value() : ENOTDIR,
        absl::StrCat(parent.string(), ": cannot create the output's parent"));
  }
  CleanUpStale(target);
  const fs::path staging = parent / absl::StrCat(StagingPrefix(target), ::getpid(), ".partial");
  fs::remove_all(staging, error);
  if (!fs::create_directory(staging, error)) {
    return absl::ErrnoToStatus(
        error ? error.value() : EEXIST,
        absl::StrCat(staging.string(), ": cannot create the staging directory"));
  }
  return std::unique_ptr<OutputDir>(new OutputDir(target.string(), staging.string(), options));
}

OutputDir::~OutputDir() {
  if (committed_) return;
  std::error_code error;
  fs::remove_all(staging_, error);
}

std::string OutputDir::Path(absl::string_view name) const {
  return absl::StrCat(staging_, "/", name);
}

// Staged files are fsynced once, by Commit.
absl::Status OutputDir::WriteFile(absl::string_view name, absl::string_view contents) {
  return WriteAll(Path(name), contents, /*sync=*/false);
}

absl::Status OutputDir::CopyFile(const std::string& from, absl::string_view name) {
  std::error_code error;
  fs::copy_file(from, Path(name), fs::copy_options::overwrite_existing, error);
  if (error) return absl::ErrnoToStatus(error.value(), absl::StrCat(from, ": cannot copy"));
  return absl::OkStatus();
}

absl::Status OutputDir::Commit() {
  if (committed_) return absl::FailedPreconditionError("the output was committed already");
  const fs::path target(dir_), staging(staging_);
  std::error_code error;
  if (fs::exists(target, error)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(target, error)) {
      const std::string name = entry.path().filename().string();
      if (fs::exists(staging / name) ||
          std::find(options_.drop.begin(), options_.drop.end(), name) != options_.drop.end()) {
        continue;
      }
      absl::Status status = Mirror(entry.path(), staging / name);
      if (!status.ok()) return status;
    }
    if (error) return absl::ErrnoToStatus(error.value(), absl::StrCat(dir_, ": cannot list"));
  }
  absl::Status synced = SyncTree(staging);
  if (!synced.ok()) return synced;
  if (!fs::exists(target)) {
    if (std::rename(staging_.c_str(), dir_.c_str()) != 0) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat(dir_, ": cannot rename the staging directory to it"));
    }
  } else if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) ==
             0) {
    fs::remove_all(staging, error);  // the previous contents
  } else {
    // File systems without RENAME_EXCHANGE: move the old directory aside first. A run killed
    // between the two renames leaves `.NAME.lgpt-PID.old`, which the next Begin puts back.
    const std::string old =
        (target.parent_path() / absl::StrCat(StagingPrefix(target), ::getpid(), ".old")).string();
    if (std::rename(dir_.c_str(), old.c_str()) != 0 ||
        std::rename(staging_.c_str(), dir_.c_str()) != 0) {
      const int rename_error = errno;
      if (!fs::exists(target)) std::rename(old.c_str(), dir_.c_str());
      return absl::ErrnoToStatus(rename_error,
                                 absl::StrCat(dir_, ": cannot replace the directory"));
    }
    fs::remove_all(old, error);
  }
  committed_ = true;
  return SyncPath(target.parent_path().string());
}

}  // namespace lgpt
