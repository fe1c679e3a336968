// hk/error.h — the exception types every layer throws.
//
// Errors carry one sentence a user can act on: what failed, which file / repo / layer, and what to
// do. Across the kernel C ABI errors are status codes instead (see hk_abi/hk_kernel.h); this header
// is for C++ only. It deliberately has no error codes or categories beyond the few subclasses that
// callers actually need to tell apart.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace hk {

// Base of every hk error. `what()` is the full, user-facing sentence.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Bad input from the user: a malformed file, an unknown option, a shape that does not fit.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file or repository that should exist does not.
class NotFound : public Error {
 public:
  using Error::Error;
};

// The operation is valid but not available here (no CUDA runtime, dtype not implemented, ...).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// A CUDA / cuBLAS / system call failed.
class RuntimeFailure : public Error {
 public:
  using Error::Error;
};

// A downloaded or cached file whose digest does not match, or a lockfile violation.
class IntegrityError : public Error {
 public:
  using Error::Error;
};

// Text from a file or the network, made safe to put in a message or on a terminal: control bytes
// (< 0x20 and 0x7f) become "\xNN"; everything else is kept.
std::string escape_control_bytes(std::string_view text);

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace hk

// Precondition check that throws hk::InvalidArgument with the given message (a std::string
// expression). Use for user-visible argument checks; internal invariants may use assert.
#define HK_CHECK(cond, message)                                                    \
  do {                                                                             \
    if (!(cond)) ::hk::detail::throw_check_failure(__FILE__, __LINE__, (message)); \
  } while (0)
