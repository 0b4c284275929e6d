// A lighter fiber switch for oneTBB's resumable tasks (x86-64 Linux with glibc).
//
// A device that waits for its peers suspends its oneTBB task (tbb::task::suspend), and a
// peer resumes it: each is a switch of fibers, which oneTBB 2021 makes with glibc's
// swapcontext(). That function also saves and restores the signal mask: one rt_sigprocmask
// system call per switch, the larger part of a switch's ~1.2 us on this VM. perf of the heat
// stencil (8 devices on 2 threads, two ppermutes per step) put 22% of all cycles in the
// kernel's pvm_irq_enable and 18% in __swapcontext, both on that system call. oneTBB's fibers
// never need a mask of their own (they are worker stacks, not signal contexts), so pmap
// points oneTBB's own calls of swapcontext (its GOT entry, nothing else in the process) at
// the same switch without the system call: glibc 2.36's x86-64 swapcontext, the signal mask
// left alone, on the same ucontext_t layout (checked below).
//
// Not done: with PMAP_FAST_SWITCH=0; on another architecture or libc; when the process
// runs with a shadow stack (glibc's switch would then switch it too); when oneTBB is not a
// shared library calling swapcontext through its GOT. Sanitizer builds run devices on
// threads and never switch fibers: the Pool then does not install it (pool.hpp).
#include "pmap/detail/fiber_switch.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define PMAP_FAST_SWITCH_AVAILABLE 1
#include <cstddef>
#include <cstdint>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#else
#define PMAP_FAST_SWITCH_AVAILABLE 0
#endif

#if PMAP_FAST_SWITCH_AVAILABLE

// The offsets the assembly below uses, as glibc's ucontext_i.sym defines them.
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R8]) == 0x28);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R9]) == 0x30);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R12]) == 0x48);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R13]) == 0x50);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R14]) == 0x58);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_R15]) == 0x60);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RDI]) == 0x68);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RSI]) == 0x70);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RBP]) == 0x78);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RBX]) == 0x80);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RDX]) == 0x88);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RCX]) == 0x98);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RSP]) == 0xa0);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs[REG_RIP]) == 0xa8);
static_assert(offsetof(ucontext_t, uc_mcontext.fpregs) == 0xe0);
static_assert(offsetof(ucontext_t, __fpregs_mem) == 0x1a8);
static_assert(offsetof(ucontext_t, __fpregs_mem.mxcsr) == 0x1c0);

extern "C" int pmap_swapcontext(ucontext_t* from, const ucontext_t* to);

// int pmap_swapcontext(ucontext_t* from [rdi], const ucontext_t* to [rsi]): saves into
// `from` what getcontext() saves (callee-saved and argument registers, the return address and
// stack pointer, the floating-point control state) and loads `to` as setcontext() does, so that
// a context made by getcontext()/makecontext() starts or resumes as under glibc. Of the x87
// environment it keeps the control word (first in both the fnstenv image glibc stores and this
// one) and not the status and tag words, which are empty at a call by the ABI: fnstenv and
// fldenv cost more than the rest of the switch (Boost.Context keeps the same two: x87 control
// word and MXCSR). It starts with endbr64, as an indirect-branch target must under CET's IBT
// (a no-op elsewhere): oneTBB calls it through its GOT.
asm(R"(
  .text
  .globl pmap_swapcontext
  .hidden pmap_swapcontext
  .type pmap_swapcontext, @function
  .p2align 4
pmap_swapcontext:
  .cfi_startproc
  endbr64
  movq %rbx, 0x80(%rdi)
  movq %rbp, 0x78(%rdi)
  movq %r12, 0x48(%rdi)
  movq %r13, 0x50(%rdi)
  movq %r14, 0x58(%rdi)
  movq %r15, 0x60(%rdi)
  movq %rdi, 0x68(%rdi)
  movq %rsi, 0x70(%rdi)
  movq %rdx, 0x88(%rdi)
  movq %rcx, 0x98(%rdi)
  movq %r8, 0x28(%rdi)
  movq %r9, 0x30(%rdi)
  movq (%rsp), %rcx
  movq %rcx, 0xa8(%rdi)
  leaq 8(%rsp), %rcx
  movq %rcx, 0xa0(%rdi)
  leaq 0x1a8(%rdi), %rcx
  movq %rcx, 0xe0(%rdi)
  fnstcw (%rcx)
  stmxcsr 0x1c0(%rdi)
  movq %rsi, %rdx
  movq 0xe0(%rdx), %rcx
  fldcw (%rcx)
  ldmxcsr 0x1c0(%rdx)
  movq 0xa0(%rdx), %rsp
  movq 0x80(%rdx), %rbx
  movq 0x78(%rdx), %rbp
  movq 0x48(%rdx), %r12
  movq 0x50(%rdx), %r13
  movq 0x58(%rdx), %r14
  movq 0x60(%rdx), %r15
  movq 0xa8(%rdx), %rcx
  pushq %rcx
  movq 0x68(%rdx), %rdi
  movq 0x70(%rdx), %rsi
  movq 0x98(%rdx), %rcx
  movq 0x28(%rdx), %r8
  movq 0x30(%rdx), %r9
  movq 0x88(%rdx), %rdx
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size pmap_swapcontext, .-pmap_swapcontext
)");

namespace pmap::detail {
namespace {

/// The GOT slot through which the loaded object `info` calls `symbol`, or nullptr.
void** got_slot(const dl_phdr_info& info, const char* symbol) {
  const ElfW(Dyn)* dynamic = nullptr;
  for (int p = 0; p < info.dlpi_phnum; ++p)
    if (info.dlpi_phdr[p].p_type == PT_DYNAMIC)
      dynamic = reinterpret_cast<const ElfW(Dyn)*>(info.dlpi_addr + info.dlpi_phdr[p].p_vaddr);
  if (!dynamic) return nullptr;
  const ElfW(Rela)* relocations = nullptr;
  std::size_t bytes = 0;
  const ElfW(Sym)* symbols = nullptr;
  const char* names = nullptr;
  for (const ElfW(Dyn)* d = dynamic; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_JMPREL:
        relocations = reinterpret_cast<const ElfW(Rela)*>(d->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        bytes = d->d_un.d_val;
        break;
      case DT_SYMTAB:
        symbols = reinterpret_cast<const ElfW(Sym)*>(d->d_un.d_ptr);
        break;
      case DT_STRTAB:
        names = reinterpret_cast<const char*>(d->d_un.d_ptr);
        break;
      default:
        break;
    }
  }
  if (!relocations || !symbols || !names) return nullptr;
  for (std::size_t k = 0; k < bytes / sizeof(ElfW(Rela)); ++k) {
    const ElfW(Rela)& r = relocations[k];
    if (ELF64_R_TYPE(r.r_info) != R_X86_64_JUMP_SLOT) continue;
    if (std::strcmp(names + symbols[ELF64_R_SYM(r.r_info)].st_name, symbol) == 0)
      return reinterpret_cast<void**>(info.dlpi_addr + r.r_offset);
  }
  return nullptr;
}

/// Whether `address` lies in the object's RELRO segment (read-only once relocated).
bool in_relro(const dl_phdr_info& info, const void* address) {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  for (int p = 0; p < info.dlpi_phnum; ++p) {
    const ElfW(Phdr)& h = info.dlpi_phdr[p];
    const std::uintptr_t begin = info.dlpi_addr + h.p_vaddr;
    if (h.p_type == PT_GNU_RELRO && a >= begin && a < begin + h.p_memsz) return true;
  }
  return false;
}

/// Points the GOT slot at `target`. Under RELRO its page is read-only: made writable for the
/// store and read-only again; otherwise it stays writable, as the dynamic linker needs it for
/// the lazy binding of the slot's neighbours.
bool redirect(const dl_phdr_info& info, void** slot, void* target) {
  const long page = sysconf(_SC_PAGESIZE);
  auto* start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(slot) &
                                        ~static_cast<std::uintptr_t>(page - 1));
  if (mprotect(start, static_cast<std::size_t>(page), PROT_READ | PROT_WRITE) != 0) return false;
  __atomic_store_n(slot, target, __ATOMIC_RELEASE);
  if (in_relro(info, slot)) mprotect(start, static_cast<std::size_t>(page), PROT_READ);
  return true;
}

int patch_tbb(dl_phdr_info* info, std::size_t, void* done) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libtbb.so")) return 0;
  void** slot = got_slot(*info, "swapcontext");
  if (slot && redirect(*info, slot, reinterpret_cast<void*>(&pmap_swapcontext)))
    *static_cast<bool*>(done) = true;
  return 1;
}

}  // namespace

bool shadow_stack_enabled() {
  constexpr long kArchShstkStatus = 0x5005;
  unsigned long features = 0;
  return syscall(SYS_arch_prctl, kArchShstkStatus, &features) == 0 && (features & 1) != 0;
}

bool install_fiber_switch() {
  static bool installed = [] {
    const char* setting = std::getenv("PMAP_FAST_SWITCH");
    if (setting && std::strcmp(setting, "0") == 0) return false;
    if (shadow_stack_enabled()) return false;
    bool done = false;
    dl_iterate_phdr(patch_tbb, &done);
    return done;
  }();
  return installed;
}

}  // namespace pmap::detail

#else

namespace pmap::detail {
bool shadow_stack_enabled() { return false; }
bool install_fiber_switch() { return false; }
}  // namespace pmap::detail

#endif
