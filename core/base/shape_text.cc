#include "core/base/shape_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lgpt {

std::string ShapeText(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace lgpt
