// Fiber context switches for the emulation's scheduler (emu_sched.cpp). On x86-64 a switch saves
// the callee-saved registers on the old stack and loads them from the new one: no FP control words
// (see emu_sched.cpp), no signal mask (glibc's swapcontext makes a system call per switch, which
// made shuffle-heavy kernels ~10x slower). Elsewhere, ucontext.
#pragma once
#include <cstddef>
#include <cstdint>

namespace emu {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void emu_switch_x86_64(void** save_sp, void* load_sp);
inline void switch_context(Context& from, Context& to) { emu_switch_x86_64(&from.sp, to.sp); }

// `to` will start entry() on the stack [stack, stack + size) at its first switch; entry never returns.
inline void make_context(Context& to, char* stack, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15});
  void** sp = top - 2;  // the return address at a 16-byte boundary: entry starts as if called
  sp[0] = reinterpret_cast<void*>(entry);
  sp -= 6;  // rbp rbx r12 r13 r14 r15, popped in reverse
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  to.sp = sp;
}
#else
}  // namespace emu
#include <ucontext.h>
namespace emu {
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void make_context(Context& to, char* stack, size_t size, void (*entry)()) {
  getcontext(&to.uc);
  to.uc.uc_stack.ss_sp = stack;
  to.uc.uc_stack.ss_size = size;
  to.uc.uc_link = nullptr;
  makecontext(&to.uc, entry, 0);
}
#endif

}  // namespace emu
