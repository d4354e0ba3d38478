#include "usrc/common/guard.h"

#include <signal.h>
#include <ucontext.h>

#include <cstring>
#include <mutex>
#include <utility>

#ifdef USRC_GUARD_ASM
// usrc_guarded_copy(dst, src, n): a leaf (no stack use, so the fault return
// is a plain ret), true in al. Up to 64 bytes in overlapping moves, up to
// 256 in 32-byte steps, beyond that rep movsb (fast strings).
asm(R"(
  .text
  .p2align 4
  .globl usrc_guarded_copy
  .hidden usrc_guarded_copy
  .type usrc_guarded_copy, @function
usrc_guarded_copy:
usrc_gcopy_begin:
  cmp $64, %rdx
  ja 5f
  cmp $16, %rdx
  jb 2f
  movdqu (%rsi), %xmm0
  movdqu -16(%rsi,%rdx), %xmm1
  cmp $32, %rdx
  jbe 1f
  movdqu 16(%rsi), %xmm2
  movdqu -32(%rsi,%rdx), %xmm3
  movdqu %xmm2, 16(%rdi)
  movdqu %xmm3, -32(%rdi,%rdx)
1:
  movdqu %xmm0, (%rdi)
  movdqu %xmm1, -16(%rdi,%rdx)
  mov $1, %eax
  ret
2:
  cmp $8, %rdx
  jb 3f
  mov (%rsi), %rax
  mov -8(%rsi,%rdx), %rcx
  mov %rax, (%rdi)
  mov %rcx, -8(%rdi,%rdx)
  mov $1, %eax
  ret
3:
  cmp $4, %rdx
  jb 4f
  mov (%rsi), %eax
  mov -4(%rsi,%rdx), %ecx
  mov %eax, (%rdi)
  mov %ecx, -4(%rdi,%rdx)
  mov $1, %eax
  ret
4:
  test %rdx, %rdx
  jz 8f
  movzbl (%rsi), %eax
  mov %al, (%rdi)
  inc %rsi
  inc %rdi
  dec %rdx
  jmp 4b
5:
  cmp $2048, %rdx
  ja 7f
  cmpb $0, usrc_gcopy_avx2(%rip)
  jne 9f
  movdqu -64(%rsi,%rdx), %xmm4
  movdqu -48(%rsi,%rdx), %xmm5
  movdqu -32(%rsi,%rdx), %xmm6
  movdqu -16(%rsi,%rdx), %xmm7
  lea -64(%rdi,%rdx), %r8
6:
  movdqu (%rsi), %xmm0
  movdqu 16(%rsi), %xmm1
  movdqu 32(%rsi), %xmm2
  movdqu 48(%rsi), %xmm3
  movdqu %xmm0, (%rdi)
  movdqu %xmm1, 16(%rdi)
  movdqu %xmm2, 32(%rdi)
  movdqu %xmm3, 48(%rdi)
  add $64, %rsi
  add $64, %rdi
  sub $64, %rdx
  cmp $64, %rdx
  ja 6b
  movdqu %xmm4, (%r8)
  movdqu %xmm5, 16(%r8)
  movdqu %xmm6, 32(%r8)
  movdqu %xmm7, 48(%r8)
  mov $1, %eax
  ret
7:
  mov %rdx, %rcx
  rep movsb
8:
  mov $1, %eax
  ret
9:
  vmovdqu -64(%rsi,%rdx), %ymm4
  vmovdqu -32(%rsi,%rdx), %ymm5
  lea -64(%rdi,%rdx), %r8
10:
  vmovdqu (%rsi), %ymm0
  vmovdqu 32(%rsi), %ymm1
  vmovdqu %ymm0, (%rdi)
  vmovdqu %ymm1, 32(%rdi)
  add $64, %rsi
  add $64, %rdi
  sub $64, %rdx
  cmp $64, %rdx
  ja 10b
  vmovdqu %ymm4, (%r8)
  vmovdqu %ymm5, 32(%r8)
  vzeroupper
  mov $1, %eax
  ret
usrc_gcopy_fault:
  cmpb $0, usrc_gcopy_avx2(%rip)
  je 11f
  vzeroupper
11:
  xor %eax, %eax
  ret
usrc_gcopy_end:
  .size usrc_guarded_copy, .-usrc_guarded_copy
  .globl usrc_gcopy_begin
  .globl usrc_gcopy_fault
  .globl usrc_gcopy_end
  .hidden usrc_gcopy_begin
  .hidden usrc_gcopy_fault
  .hidden usrc_gcopy_end
)");
extern "C" {
// Read by the copy: set once, before any copy can run (static init).
__attribute__((visibility("hidden"))) unsigned char usrc_gcopy_avx2 =
    (__builtin_cpu_init(), __builtin_cpu_supports("avx2") != 0);
extern const char usrc_gcopy_begin[] __attribute__((visibility("hidden")));
extern const char usrc_gcopy_end[] __attribute__((visibility("hidden")));
extern const char usrc_gcopy_fault[] __attribute__((visibility("hidden")));
}
#endif

namespace usrc::guard {

thread_local Scope *current [[gnu::tls_model("initial-exec")]] = nullptr;
std::atomic<uint64_t> recovered{0};

namespace {

struct sigaction prev_segv, prev_bus;

void on_fault(int sig, siginfo_t *si, void *uc) {
  // Only a fault the kernel raised (si_code > 0; kill() and tgkill() give
  // SI_USER, SI_TKILL) inside a guarded copy is ours.
  const bool fault = si && si->si_code > 0;
#ifdef USRC_GUARD_ASM
  auto &pc = static_cast<ucontext_t *>(uc)->uc_mcontext.gregs[REG_RIP];
  if (fault && uintptr_t(pc) >= uintptr_t(usrc_gcopy_begin) && uintptr_t(pc) < uintptr_t(usrc_gcopy_end)) {
    recovered.fetch_add(1, std::memory_order_relaxed);
    pc = greg_t(uintptr_t(usrc_gcopy_fault));
    return;
  }
#endif
  Scope *s = current;
  if (s && fault) {   // (a guarded run())
    current = s->prev;
    recovered.fetch_add(1, std::memory_order_relaxed);
    siglongjmp(s->jb, 1);   // (SA_NODEFER: the signal is not left blocked)
  }
  const struct sigaction &p = sig == SIGSEGV ? prev_segv : prev_bus;
  if (p.sa_flags & SA_SIGINFO) {
    p.sa_sigaction(sig, si, uc);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    p.sa_handler(sig);
  } else {
    // The default action: restored, then the faulting access runs again
    // (a fault) or the signal is raised again (one sent by another).
    signal(sig, SIG_DFL);
    if (!si || si->si_code <= 0) raise(sig);
  }
}

}  // namespace

void install() {
  // Again if someone replaced it since (and restored what was there
  // before us, as a test framework does around each test): ours goes in
  // front of whatever is there now.
  static std::mutex mu;
  std::lock_guard g(mu);
  for (auto [sig, prev] : {std::pair{SIGSEGV, &prev_segv}, std::pair{SIGBUS, &prev_bus}}) {
    struct sigaction now {};
    if (sigaction(sig, nullptr, &now) != 0) continue;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault) continue;
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    *prev = now;   // (before ours is in: a fault meanwhile finds it)
    sigaction(sig, &sa, nullptr);
  }
}

#ifndef USRC_GUARD_ASM
bool copy(void *dst, const void *src, size_t n) {
  if (!n) return true;   // (a zero-length SEND has no buffer: memcpy wants one)
  return run([&] { std::memcpy(dst, src, n); });
}
#endif

bool readable(const void *p, size_t n) {
  if (!n) return true;
  const auto *b = static_cast<const volatile uint8_t *>(p);
  return run([&] {
    const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(b);
    for (uintptr_t a = start; a < start + n; a = (a & ~(page - 1)) + page)
      (void)*reinterpret_cast<const volatile uint8_t *>(a);
    (void)b[n - 1];
  });
}

}  // namespace usrc::guard
