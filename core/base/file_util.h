// Small filesystem queries shared by the checkpoint, tokenizer and conversion readers.
#ifndef LGPT_CORE_BASE_FILE_UTIL_H_
#define LGPT_CORE_BASE_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace lgpt {

// Whether `path` names a regular file (symbolic links followed).
bool IsFile(const std::string& path);
// Whether `path` names a directory (symbolic links followed).
bool IsDirectory(const std::string& path);
// The whole content of the regular file `path`: NotFound when there is none,
// PermissionDenied when it cannot be opened.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_FILE_UTIL_H_
