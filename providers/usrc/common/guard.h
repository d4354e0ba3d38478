// Copies that survive memory the application unmapped (or a file mapping
// truncated under it) while the engine reads or writes it: registered
// memory is not pinned, so a fault is bad luck, not a bug of ours, and it
// must end as an access error, never as a signal.
//
// How: a thread-local recovery point set around the copy, and a SIGSEGV/
// SIGBUS handler (installed once, by install()) that jumps back to it for a
// fault the kernel raised inside a guarded copy of the faulting thread, and
// otherwise hands the signal on to the handler that was there before it
// (the default action, the application's, a sanitizer's). On x86-64 the
// copy itself is a leaf routine in its own code range: the handler resumes
// a fault inside it at its failure return, so a guarded copy costs what a
// plain one does (no sigsetjmp per copy: 15 ns, more than a 64 B copy).
// Elsewhere, and under the sanitizers (which must see the copies), it is a
// memcpy behind a sigsetjmp that saves no signal mask. No system call
// either way.
#pragma once

#include <atomic>
#include <csetjmp>
#include <cstddef>
#include <cstdint>

namespace usrc::guard {

// Installs the handler, unless it is in place already (each context open
// and engine creation asks). Until then guarded copies still copy,
// unguarded; an application that replaces the SIGSEGV handler afterwards
// without chaining loses the guard until the next open.
void install();

struct Scope {
  sigjmp_buf jb;
  Scope *prev;
};
// The innermost guarded region of this thread (initial-exec: the provider
// is loaded with dlopen, and one pointer fits the static TLS surplus).
extern thread_local Scope *current [[gnu::tls_model("initial-exec")]];
// Faults recovered, by all threads: a caller that copied under the guard
// in a callee it cannot ask (the NIC) compares readings.
extern std::atomic<uint64_t> recovered;
inline uint64_t faults() { return recovered.load(std::memory_order_relaxed); }
// A copy elsewhere (the kernel's: EFAULT) found memory unmapped.
inline void note_fault() { recovered.fetch_add(1, std::memory_order_relaxed); }

// Runs f() under the guard: true if it returned, false if it faulted (then
// it stopped at the faulting access; what it wrote before stays written).
// f must hold no lock or resource a jump out of it would leak.
template <class F>
[[gnu::noinline]] bool run(F &&f) {
  Scope s;
  s.prev = current;
  if (sigsetjmp(s.jb, 0)) {
    current = s.prev;
    return false;
  }
  current = &s;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  f();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  current = s.prev;
  return true;
}

// memcpy under the guard: false if it faulted (part may be copied).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define USRC_GUARD_ASM 1
extern "C" bool usrc_guarded_copy(void *dst, const void *src, size_t n)
    __attribute__((visibility("hidden")));
inline bool copy(void *dst, const void *src, size_t n) { return usrc_guarded_copy(dst, src, n); }
#else
bool copy(void *dst, const void *src, size_t n);
#endif
// Whether every page of [p, p + n) can be read now (one byte of each read
// under the guard).
bool readable(const void *p, size_t n);

}  // namespace usrc::guard
