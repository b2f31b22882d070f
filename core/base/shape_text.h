// A tensor shape as error messages print it: "[4, 192, 64]".
#ifndef LGPT_CORE_BASE_SHAPE_TEXT_H_
#define LGPT_CORE_BASE_SHAPE_TEXT_H_

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace lgpt {

std::string ShapeText(c10::IntArrayRef shape);

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_SHAPE_TEXT_H_
