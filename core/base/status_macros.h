// Macros that propagate absl::Status through functions returning Status or StatusOr.
#ifndef LGPT_CORE_BASE_STATUS_MACROS_H_
#define LGPT_CORE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LGPT_CONCAT_INNER_(a, b) a##b
#define LGPT_CONCAT_(a, b) LGPT_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status lgpt_status_ = (expr);        \
    if (!lgpt_status_.ok()) return lgpt_status_;       \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F());` binds the value of a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(LGPT_CONCAT_(lgpt_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // LGPT_CORE_BASE_STATUS_MACROS_H_
