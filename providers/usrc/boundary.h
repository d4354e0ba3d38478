// The edge between libibverbs (C) and the provider (C++): no exception
// crosses it. An op that throws (std::bad_alloc under an address-space
// limit, std::system_error from a thread that cannot be started) fails as
// a verb does: NULL with errno, or the errno as its int result.
#pragma once

#include <cerrno>
#include <new>
#include <system_error>
#include <type_traits>

namespace usrc {

// The errno for the exception being handled (call inside a catch).
inline int exception_errno() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc &) {
    return ENOMEM;
  } catch (const std::system_error &e) {
    // (std::thread: resource_unavailable_try_again, EAGAIN.)
    return e.code().category() == std::generic_category() || e.code().category() == std::system_category()
               ? (e.code().value() > 0 ? e.code().value() : ENOMEM)
               : ENOMEM;
  } catch (...) {
    return ENOMEM;
  }
}

// Runs f(); false, with *err the errno, if it threw.
template <class F>
bool no_throw(F &&f, int *err) noexcept {
  try {
    f();
    return true;
  } catch (...) {
    *err = exception_errno();
    return false;
  }
}

// ops.x = at_boundary<x>: x, with what it throws turned into its failure.
// Pointer results: NULL and errno; int results: the errno (the verbs'
// convention) or, for Neg (poll_cq), minus it; void: nothing.
template <auto F, bool Neg = false>
struct Boundary;
template <class R, class... A, R (*F)(A...), bool Neg>
struct Boundary<F, Neg> {
  static R call(A... a) noexcept {
    if constexpr (std::is_void_v<R>) {
      int e = 0;
      no_throw([&] { F(a...); }, &e);
    } else {
      R r{};
      int e = 0;
      if (no_throw([&] { r = F(a...); }, &e)) return r;
      errno = e;
      if constexpr (std::is_pointer_v<R>) return nullptr;
      else return static_cast<R>(Neg ? -e : e);
    }
  }
};
template <auto F, bool Neg = false>
inline constexpr auto at_boundary = &Boundary<F, Neg>::call;

}  // namespace usrc
