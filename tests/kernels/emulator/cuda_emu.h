// Host emulation of the CUDA C surface our kernels use, for g++ (C++17).
//
// Each CUDA thread of a block is a fiber (own stack, cooperative switches). A fiber runs
// until it reaches a barrier (__syncthreads, a warp *_sync intrinsic) or returns; the
// scheduler then resumes the next ready fiber, and releases a barrier only when every
// thread it names has arrived. So barriers hold exactly, and the mistakes CUDA leaves
// undefined are reported instead of silently "working":
//   - __syncthreads reached after some threads of the block returned (divergent barrier),
//   - a warp intrinsic whose mask names an exited or non-existent lane (partial warps),
//   - lanes of a warp disagreeing on the mask, a deadlock,
//   - more threads than __launch_bounds__ or the device allows, too much shared memory.
// Shared memory is poisoned with 0xFF bytes (NaN as float) before every block, so a read
// that a missing __syncthreads lets run early sees NaN, not a plausible stale value.
// Blocks run one after another on the calling OS thread (in grid order, or a shuffled order
// for the race check); atomics are therefore plain.
//
// Limits: one sync group per warp at a time (masks must agree across the warp);
// __shared__ arrays must be declared in non-template functions (g++ ignores the section
// attribute of template statics, which would escape poisoning).
#pragma once

#ifndef EMU_SCAN  // the kernel-name scan keeps these words in the preprocessed text
#define __global__
#define __launch_bounds__(...)
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __shared__ static __attribute__((section("emu_shared")))
#define INFERDESK_EMULATOR 1

#ifndef EMU_SCAN
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <numeric>
#include <type_traits>
#include <utility>

// ---- vector types -----------------------------------------------------------------
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(4) char4 { signed char x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }
static const int warpSize = 32;

// ---- math -------------------------------------------------------------------------
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __fadd_rn(float a, float b) { return a + b; }  // -std=c++17: no contraction
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline void sincosf_(float a, float* s, float* c) { *s = sinf(a); *c = cosf(a); }
#define sincosf sincosf_
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
template <class T> static inline T __ldg(const T* p) { return *p; }

// ---- half / bfloat16 ----------------------------------------------------------------
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
typedef __half half;

static inline float emu_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t emu_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.x & 0x8000) << 16;
    const uint32_t e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    if (e == 0) {  // zero or subnormal: m * 2^-24
        const float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (e == 31) return emu_bits_to_float(sign | 0x7f800000u | (m << 13));
    return emu_bits_to_float(sign | ((e + 112) << 23) | (m << 13));
}

static inline __half __float2half_rn(float f) {  // round to nearest even, like cvt.rn
    uint32_t x = emu_float_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return {(uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00))};
    if (ax >= 0x477ff000u) return {(uint16_t)(sign | 0x7c00)};  // >= 65520 rounds to inf
    if (ax < 0x38800000u) {  // below the smallest normal half: count units of 2^-24
        const float a = emu_bits_to_float(ax);
        return {(uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f))};
    }
    ax += 0xfffu + ((ax >> 13) & 1u);
    ax -= 112u << 23;
    return {(uint16_t)(sign | (ax >> 13))};
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __half __ushort_as_half(unsigned short u) { return {u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline float __bfloat162float(__nv_bfloat16 b) { return emu_bits_to_float((uint32_t)b.x << 16); }
static inline __nv_bfloat16 __float2bfloat16(float f) {
    const uint32_t x = emu_float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((x >> 16) | 0x40)};
    return {(uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// ---- the scheduler --------------------------------------------------------------------
namespace emu {

enum State : uint8_t { READY, WAIT_BAR, WAIT_WARP, DONE };

struct Fiber {
    void* sp;
    uint3 tid;
    int lane, warp;
    State state;
    // Memory-transaction model: barriers this thread has passed (warp or block), and how
    // often it executed each traced load/store site since the last one. Threads of a warp
    // between the same two barriers that reach a site for the n-th time are one warp-level
    // instruction (they run the same code: a lane that skips a site is an inactive lane).
    uint32_t epoch, site_epoch;
    int nsite;
    uint32_t site[16], count[16];
};

// One lane's part of a traced global access; see emu_access.
struct Access {
    uint64_t addr;
    uint32_t size, store, block, warp, site, epoch, inst, pad;
};
struct Trace {
    Access* ev = nullptr;
    size_t n = 0, cap = 0;
    int on = 0;
};
static Trace trace;

struct Warp {
    uint32_t live;     // lanes that exist and have not returned
    uint32_t arrived;  // lanes waiting at the current warp barrier
    uint32_t want;     // the mask of the current warp barrier
    int parity;        // double-buffered exchange slots: one barrier per shuffle
    uint64_t slot[2][32];
};

struct Cfg {  // filled by the Python launcher
    unsigned int grid[3], block[3];
    unsigned long long dyn_smem;
    int reverse;      // schedule threads last-to-first (race detection runs both orders)
    int max_threads;  // __launch_bounds__ of the kernel, 0 if none
    unsigned long long block_seed;  // 0: blocks in x, y, z order; else a shuffled order
};

static const size_t kStack = 128 * 1024;
static const size_t kSmemLimit = 48 * 1024;  // without the opt-in attribute

struct Ctx {
    Fiber* fibers = nullptr;
    int nthreads = 0, live = 0, exited = 0, bar_arrived = 0, capacity = 0;
    Warp warps[32];
    void* sched_sp = nullptr;
    Fiber* cur = nullptr;
    bool failed = false;
    bool reverse = false;
    char err[600];
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    char* stacks = nullptr;
    size_t page = 4096;
    alignas(16) char dyn_smem[kSmemLimit];
    uint3 block_idx;
    dim3 block_dim, grid_dim;
};
static Ctx g;

}  // namespace emu

extern char __start_emu_shared[] __attribute__((weak));
extern char __stop_emu_shared[] __attribute__((weak));

#define threadIdx (emu::g.cur->tid)
#define blockIdx (emu::g.block_idx)
#define blockDim (emu::g.block_dim)
#define gridDim (emu::g.grid_dim)

// Context switch: x86-64 SysV saves the callee-saved registers on the old stack.
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.p2align 4
.local emu_ctx_switch
.type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_ctx_switch, .-emu_ctx_switch
)");
#else
#define EMU_UCONTEXT 1
#include <ucontext.h>
#endif

namespace emu {

#ifdef EMU_UCONTEXT
static ucontext_t* g_uctx = nullptr;
static ucontext_t g_sched_uctx;
#endif

static void to_scheduler() {
#ifdef EMU_UCONTEXT
    swapcontext(&g_uctx[g.cur - g.fibers], &g_sched_uctx);
#else
    emu_ctx_switch(&g.cur->sp, g.sched_sp);
#endif
}

// Give the CPU to the next ready thread in schedule order (cyclically after the current
// one), directly rather than through the scheduler; to the scheduler when none is ready.
static void switch_away() {
    Fiber* from = g.cur;
    const int n = g.nthreads, i0 = (int)(from - g.fibers), step = g.reverse ? n - 1 : 1;
    for (int k = 1, i = (i0 + step) % n; k <= n; ++k, i = (i + step) % n) {
        Fiber* f = &g.fibers[i];
        if (f->state != READY) continue;
        if (f == from) return;  // only the current thread can run: carry on
        g.cur = f;
#ifdef EMU_UCONTEXT
        swapcontext(&g_uctx[i0], &g_uctx[i]);
#else
        emu_ctx_switch(&from->sp, f->sp);
#endif
        return;
    }
    to_scheduler();
}

[[noreturn]] static void fail(const char* fmt, ...) {
    if (!g.failed) {
        g.failed = true;
        int n = snprintf(g.err, sizeof g.err, "block (%u,%u,%u) thread (%u,%u,%u): ", g.block_idx.x,
                         g.block_idx.y, g.block_idx.z, g.cur ? g.cur->tid.x : 0,
                         g.cur ? g.cur->tid.y : 0, g.cur ? g.cur->tid.z : 0);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g.err + n, sizeof g.err - n, fmt, ap);
        va_end(ap);
    }
    for (;;) to_scheduler();  // the scheduler abandons this block
}

static void thread_exit() {
    Fiber* f = g.cur;
    f->state = DONE;
    g.live--;
    g.exited++;
    Warp& w = g.warps[f->warp];
    w.live &= ~(1u << f->lane);
    if (w.arrived && (w.want & (1u << f->lane)))
        fail("returned while lanes 0x%08x of its warp wait for it in a *_sync intrinsic", w.arrived);
    if (g.bar_arrived) fail("returned while %d thread(s) wait at __syncthreads", g.bar_arrived);
    switch_away();  // never resumed: a DONE fiber is not READY
}

static void fiber_main() {
    g.body(g.body_arg);
    thread_exit();
    __builtin_unreachable();
}

static void syncthreads() {
    g.cur->epoch++;
    if (g.exited) fail("__syncthreads after %d thread(s) of the block returned (divergent barrier)", g.exited);
    g.cur->state = WAIT_BAR;
    if (++g.bar_arrived == g.live) {
        for (int i = 0; i < g.nthreads; ++i)
            if (g.fibers[i].state == WAIT_BAR) g.fibers[i].state = READY;
        g.bar_arrived = 0;
    }
    switch_away();
}

// Arrive at a warp barrier with `value`; returns the slot parity to read peers from.
static int warp_arrive(uint32_t mask, uint64_t value) {
    Fiber* f = g.cur;
    f->epoch++;
    Warp& w = g.warps[f->warp];
    const uint32_t bit = 1u << f->lane;
    if (!(mask & bit)) fail("warp intrinsic with mask 0x%08x that excludes the calling lane", mask);
    if (mask & ~w.live)
        fail("warp intrinsic mask 0x%08x names lanes 0x%08x that do not exist or have returned "
             "(block size not a multiple of 32, or an early return?)", mask, mask & ~w.live);
    if (w.arrived == 0) w.want = mask;
    else if (w.want != mask) fail("lanes of a warp disagree on the sync mask (0x%08x vs 0x%08x)", mask, w.want);
    const int p = w.parity;
    w.slot[p][f->lane] = value;
    w.arrived |= bit;
    if (w.arrived == w.want) {  // last to arrive: release the others and carry on
        const int base = f->warp * 32;
        for (int l = 0; l < 32; ++l)
            if ((w.want >> l) & 1u) g.fibers[base + l].state = READY;
        w.arrived = 0;
        w.parity ^= 1;
        switch_away();  // yield anyway so the schedule order stays what the launch asked
    } else {
        f->state = WAIT_WARP;
        switch_away();
    }
    return p;
}

template <class T> static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> static inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

template <class T> static T shfl_from(uint32_t mask, T v, int src) {
    const int p = warp_arrive(mask, to_bits(v));
    if (!((mask >> src) & 1u)) fail("shuffle reads lane %d outside the mask 0x%08x", src, mask);
    return from_bits<T>(g.warps[g.cur->warp].slot[p][src]);
}

static void run_block(bool reverse) {
    const int n = g.nthreads;
    g.live = n;
    g.exited = 0;
    g.bar_arrived = 0;
    for (int w = 0; w < (n + 31) / 32; ++w) {
        const int lanes = n - w * 32 < 32 ? n - w * 32 : 32;
        g.warps[w].live = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
        g.warps[w].arrived = 0;
        g.warps[w].parity = 0;
    }
    const size_t slot = kStack + g.page;
    for (int i = 0; i < n; ++i) {
        Fiber& f = g.fibers[i];
        f.state = READY;
        f.epoch = f.site_epoch = 0;
        f.nsite = 0;
#ifdef EMU_UCONTEXT
        getcontext(&g_uctx[i]);
        g_uctx[i].uc_stack.ss_sp = g.stacks + i * slot + g.page;
        g_uctx[i].uc_stack.ss_size = kStack;
        g_uctx[i].uc_link = nullptr;
        makecontext(&g_uctx[i], (void (*)())fiber_main, 0);
#else
        // Initial frame popped by emu_ctx_switch: six zero registers, then fiber_main as the
        // return address; rsp % 16 == 8 on entry, as after a call.
        uintptr_t top = (uintptr_t)(g.stacks + (i + 1) * slot) & ~(uintptr_t)15;
        void** sp = (void**)top;
        *--sp = nullptr;
        *--sp = (void*)&fiber_main;
        for (int r = 0; r < 6; ++r) *--sp = nullptr;
        f.sp = sp;
#endif
    }
    while (g.live > 0) {
        bool ran = false;
        for (int k = 0; k < n; ++k) {
            Fiber* f = &g.fibers[reverse ? n - 1 - k : k];
            if (f->state != READY) continue;
            ran = true;
            g.cur = f;
#ifdef EMU_UCONTEXT
            swapcontext(&g_sched_uctx, &g_uctx[f - g.fibers]);
#else
            emu_ctx_switch(&g.sched_sp, f->sp);
#endif
            if (g.failed) return;
        }
        if (!ran && g.live > 0) {
            int bar = 0, warp = 0;
            for (int i = 0; i < n; ++i) {
                bar += g.fibers[i].state == WAIT_BAR;
                warp += g.fibers[i].state == WAIT_WARP;
            }
            g.failed = true;
            snprintf(g.err, sizeof g.err, "block (%u,%u,%u): deadlock: %d thread(s) wait at __syncthreads, %d in warp intrinsics",
                     g.block_idx.x, g.block_idx.y, g.block_idx.z, bar, warp);
            return;
        }
    }
}

static bool ensure_capacity(int n) {
    if (n <= g.capacity) return true;
    g.page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t slot = kStack + g.page;
    if (g.stacks) munmap(g.stacks, slot * g.capacity);
    delete[] g.fibers;
    void* mem = mmap(nullptr, slot * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    g.stacks = (char*)mem;
    for (int i = 0; i < n; ++i) mprotect(g.stacks + i * slot, g.page, PROT_NONE);  // guard page
    g.fibers = new Fiber[n];
#ifdef EMU_UCONTEXT
    delete[] g_uctx;
    g_uctx = new ucontext_t[n];
#endif
    g.capacity = n;
    return true;
}

static int config_error(const char* fmt, ...) {
    g.failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.err, sizeof g.err, fmt, ap);
    va_end(ap);
    return 1;
}

// A fault inside a kernel thread (a read or write past a buffer, which the Python side
// backs with a PROT_NONE page) ends the launch with an error, like CUDA's "illegal memory
// access", instead of killing the process. The handler leaves by switching to the scheduler.
static void on_segv(int sig, siginfo_t* si, void*) {
    if (g.cur == nullptr) {  // not in kernel code: fall back to the default action
        signal(sig, SIG_DFL);
        return;
    }
    fail("illegal memory access at %p (past the end of a buffer?)", si->si_addr);
}

struct SignalGuard {  // installed for the duration of one launch, then restored
    struct sigaction old_segv, old_bus;
    stack_t old_stack;
    static char* alt() { static char s[64 * 1024]; return s; }
    SignalGuard() {
        stack_t st{};
        st.ss_sp = alt();
        st.ss_size = 64 * 1024;
        sigaltstack(&st, &old_stack);
        struct sigaction sa {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
    }
    ~SignalGuard() {
        sigaction(SIGSEGV, &old_segv, nullptr);
        sigaction(SIGBUS, &old_bus, nullptr);
        sigaltstack(&old_stack, nullptr);
    }
};

// Run every block of the grid; returns 0, or 1 with the reason in g.err.
static int launch_grid(const Cfg* c) {
    SignalGuard guard;
    g.failed = false;
    g.err[0] = 0;
    g.cur = nullptr;
    const unsigned bx = c->block[0], by = c->block[1], bz = c->block[2];
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    const size_t static_smem = (size_t)(__stop_emu_shared - __start_emu_shared);
    if (threads == 0 || c->grid[0] == 0 || c->grid[1] == 0 || c->grid[2] == 0)
        return config_error("invalid configuration: empty grid or block");
    if (bx > 1024 || by > 1024 || bz > 64 || threads > 1024)
        return config_error("invalid configuration: block (%u,%u,%u) exceeds 1024 threads or per-axis limits", bx, by, bz);
    if (c->max_threads > 0 && threads > (unsigned long long)c->max_threads)
        return config_error("too many resources requested: block of %llu threads > __launch_bounds__(%d)", threads, c->max_threads);
    if (c->grid[1] > 65535 || c->grid[2] > 65535 || c->grid[0] > 2147483647u)
        return config_error("invalid configuration: grid (%u,%u,%u)", c->grid[0], c->grid[1], c->grid[2]);
    if (c->dyn_smem + static_smem > kSmemLimit)
        return config_error("shared memory %llu + %zu bytes exceeds 48 KB", c->dyn_smem, static_smem);
    if (!ensure_capacity((int)threads)) return config_error("cannot allocate fiber stacks");
    g.nthreads = (int)threads;
    g.block_dim = {bx, by, bz};
    g.grid_dim = {c->grid[0], c->grid[1], c->grid[2]};
    for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = g.fibers[i];
        f.tid = {i % bx, (i / bx) % by, i / (bx * by)};
        f.lane = i % 32;
        f.warp = i / 32;
    }
    // Blocks of a grid may run in any order on a GPU. With a seed, block n of the launch is
    // (a * n + b) mod N for an `a` coprime to N: a permutation that puts neighbouring blocks
    // far apart, so a block that reads what another block writes gets a different answer
    // than in x, y, z order (the race check compares the two).
    const unsigned long long gx = c->grid[0], gy = c->grid[1], nblocks = gx * gy * c->grid[2];
    unsigned long long a = 1, b = 0;
    if (c->block_seed && nblocks > 1) {
        a = (c->block_seed * 0x9E3779B97F4A7C15ull >> 17) % nblocks | 1;
        while (std::gcd(a, nblocks) != 1) a += 2;
        b = (c->block_seed * 0xD1B54A32D192ED03ull >> 7) % nblocks;
    }
    for (unsigned long long n = 0; n < nblocks; ++n) {
        const unsigned long long i = (unsigned long long)(((unsigned __int128)a * n + b) % nblocks);
        g.block_idx = {(unsigned)(i % gx), (unsigned)(i / gx % gy), (unsigned)(i / (gx * gy))};
        if (static_smem) memset(__start_emu_shared, 0xff, static_smem);
        memset(g.dyn_smem, 0xff, c->dyn_smem);
        g.reverse = c->reverse != 0;
        run_block(g.reverse);
        g.cur = nullptr;
        if (g.failed) return 1;
    }
    return 0;
}

// ---- calling a kernel of any signature with CUDA's void** argument convention ---------
template <class... A, size_t... I>
static void invoke(void (*k)(A...), void** a, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(a[I])...);
}
template <class... A> struct Call {
    void (*k)(A...);
    void** args;
    static void run(void* self) {
        Call* c = (Call*)self;
        invoke(c->k, c->args, std::index_sequence_for<A...>{});
    }
};
template <class... A> static int launch(void (*k)(A...), const Cfg* c, void** args) {
    Call<A...> call{k, args};
    g.body = &Call<A...>::run;
    g.body_arg = &call;
    return launch_grid(c);
}

// One letter per parameter, so Python can check what it passes (CuPy would not).
template <class T> constexpr char code() {
    return std::is_pointer<T>::value                                   ? 'p'
           : std::is_same<T, float>::value                            ? 'f'
           : std::is_same<T, double>::value                           ? 'd'
           : std::is_integral<T>::value && sizeof(T) == 4             ? (std::is_signed<T>::value ? 'i' : 'I')
           : std::is_integral<T>::value && sizeof(T) == 8             ? (std::is_signed<T>::value ? 'l' : 'L')
                                                                      : '?';
}
template <class... A> static const char* signature(void (*)(A...)) {
    static const char s[] = {code<A>()..., '\0'};
    return s;
}

}  // namespace emu

// A GPU faults on a misaligned vector or half-word load; x86 would not, so kernels state
// their alignment assumptions with CHECK_ALIGNED (common.cuh) and the emulator checks them.
static inline void emu_check_aligned(const void* p, size_t n) {
    if ((uintptr_t)p % n) emu::fail("misaligned %zu-byte access at %p", n, p);
}

// A typed global load or store of n bytes (ld_global/st_global in common.cuh): always
// checked for alignment to n, and logged for the memory-transaction model when it is on
// (kernels/emulator/traffic.py groups the log into warp instructions and 32-byte sectors).
// Accesses to shared memory are checked but not logged.
static inline void emu_access(const void* p, size_t n, bool store, unsigned site) {
    if ((uintptr_t)p % n) emu::fail("misaligned %zu-byte %s at %p", n, store ? "store" : "load", p);
    emu::Trace& t = emu::trace;
    if (!t.on) return;
    const char* c = (const char*)p;
    if ((c >= __start_emu_shared && c < __stop_emu_shared) ||
        (c >= emu::g.dyn_smem && c < emu::g.dyn_smem + sizeof emu::g.dyn_smem))
        return;
    emu::Fiber* f = emu::g.cur;
    if (f->site_epoch != f->epoch) {
        f->nsite = 0;
        f->site_epoch = f->epoch;
    }
    int k = 0;
    while (k < f->nsite && f->site[k] != site) ++k;
    if (k == f->nsite) {
        if (k == 16) emu::fail("more than 16 traced access sites between two barriers");
        f->site[k] = site;
        f->count[k] = 0;
        f->nsite++;
    }
    if (t.n == t.cap) {
        t.cap = t.cap ? 2 * t.cap : 4096;
        t.ev = (emu::Access*)realloc(t.ev, t.cap * sizeof(emu::Access));
        if (!t.ev) emu::fail("out of memory for the access trace");
    }
    const uint3 b = emu::g.block_idx;
    const dim3 gd = emu::g.grid_dim;
    t.ev[t.n++] = {(uint64_t)(uintptr_t)p, (uint32_t)n, store ? 1u : 0u,
                   b.x + gd.x * (b.y + gd.y * b.z), (uint32_t)f->warp, site, f->epoch,
                   f->count[k]++, 0};
}

// ---- integer dot products (sm_61+) ------------------------------------------------------
// __dp4a(a, b, c): c plus the sum of the four byte-wise products of a and b, bytes signed
// for int/char4 arguments and unsigned for unsigned/uchar4 ones (wrapping like the 32-bit
// hardware result).
static inline int __dp4a(int a, int b, int c) {
    uint32_t s = (uint32_t)c;
    for (int i = 0; i < 4; ++i) s += (uint32_t)((int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i)));
    return (int)s;
}
static inline unsigned int __dp4a(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int s = c;
    for (int i = 0; i < 4; ++i) s += ((a >> (8 * i)) & 0xFFu) * ((b >> (8 * i)) & 0xFFu);
    return s;
}
static inline int __dp4a(char4 a, char4 b, int c) {
    return (int)((uint32_t)c + (uint32_t)(a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w));
}
static inline unsigned int __dp4a(uchar4 a, uchar4 b, unsigned int c) {
    return c + (unsigned)a.x * b.x + (unsigned)a.y * b.y + (unsigned)a.z * b.z + (unsigned)a.w * b.w;
}

// ---- CUDA intrinsics --------------------------------------------------------------------
static inline void __syncthreads() { emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_arrive(mask, 0); }
static inline void __threadfence() {}
static inline void __threadfence_block() {}

template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = emu::g.cur->lane;
    return emu::shfl_from(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = emu::g.cur->lane;
    int src = lane ^ lane_mask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu::shfl_from(mask, v, src);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = emu::g.cur->lane;
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return emu::shfl_from(mask, v, src);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = emu::g.cur->lane;
    const int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return emu::shfl_from(mask, v, src);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    const int p = emu::warp_arrive(mask, pred != 0);
    unsigned r = 0;
    for (int l = 0; l < 32; ++l)
        if (((mask >> l) & 1u) && emu::g.warps[emu::g.cur->warp].slot[p][l]) r |= 1u << l;
    return r;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
static inline unsigned __activemask() { return emu::g.warps[emu::g.cur->warp].live; }

// Fibers switch only at barriers, so read-modify-write needs no locking.
template <class T> static inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicMax(T* p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> static inline T atomicMin(T* p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> static inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

// Dynamic shared memory (`extern __shared__` has no host equivalent): see common.cuh.
#define EMU_DYN_SMEM (emu::g.dyn_smem)

#endif  // EMU_SCAN
