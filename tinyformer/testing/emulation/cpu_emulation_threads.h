// The CUDA thread model of the CPU emulation (cpu_emulation.h): blocks, threads as fibers, barriers,
// warp shuffles and warp-collective exchanges, and the launch.
//
// One launch runs its blocks one after another; each block runs its threads as fibers on the
// calling OS thread, each on its own stack (switched by six pushes and pops on x86-64, by
// ucontext elsewhere), switched only at barriers: a CUDA thread runs until it waits at a barrier
// or returns, then the next one runs, in thread order. No OS thread is started and no lock is
// taken, so a launch costs a few switches per barrier and thread, and runs the same way every
// time. Hence
//   - threadIdx is per thread; blockIdx, blockDim and gridDim are per launch/block;
//   - __shared__ is `static`: one copy, used by the one block that runs at a time;
//   - __syncthreads() is a barrier over the block's threads, a warp shuffle a barrier over the
//     warp's threads around a slot exchange;
//   - a thread that returns drops out of both barriers, as an exited CUDA thread does; it must
//     not leave cp.async copies in flight (cpu_emulation_warp.h): the emulation aborts if it does;
//   - dynamic shared memory (extern __shared__) is a per-launch buffer of the launch's size,
//     filled with 0xFF bytes (NaN in every float type) so that unwritten reads show.
// A kernel that calls __syncthreads() or a shuffle divergently leaves threads that can never
// be released: the emulation aborts and says so. Reads of memory a thread does not own show up
// under AddressSanitizer (the fiber switches are announced to it): both are bugs on a GPU too.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define TF_EMU_ASAN 1
#endif

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};

namespace tf_emu {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "cpu_emulation: %s\n", what);
    std::abort();
}

// cp.async: copies wait in the issuing thread's open group, then in committed groups, and
// are performed by the wait that lets their group complete.
struct PendingCopy {
    void* dst;
    const void* src;
    int bytes, src_bytes;
};

// A barrier over `expected` live threads; `arrived` of them wait at it now.
struct Barrier {
    unsigned expected = 0, arrived = 0;
};

constexpr int RUNNABLE = -1, FINISHED = -2, BLOCK_BARRIER = 0;  // a warp w's barrier is 1 + w

// A fiber's saved state, and the one switch between two of them: switch_context(from, to) saves
// the running fiber in `from` and resumes `to`. start_context(c, stack, size, entry) prepares
// `c` so that switching to it calls entry() on that stack; entry never returns.
#if defined(__x86_64__)
// The callee-saved registers on the fiber's own stack, the stack pointer in the Context.
struct Context {
    void* sp = nullptr;
};
extern "C" void tf_emu_switch_stacks(void** save_sp, void* load_sp);
asm(R"(
    .text
    .weak tf_emu_switch_stacks
    .type tf_emu_switch_stacks, @function
tf_emu_switch_stacks:
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
    .size tf_emu_switch_stacks, .-tf_emu_switch_stacks
)");
inline void switch_context(Context& from, Context& to) { tf_emu_switch_stacks(&from.sp, to.sp); }
inline void start_context(Context& c, char* stack, size_t size, void (*entry)()) {
    auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<void**>(top) - 8;  // six registers, entry as the return address, a pad
    std::memset(frame, 0, 8 * sizeof(void*));
    frame[6] = reinterpret_cast<void*>(entry);  // entry starts with the stack 8 bytes off 16, as after a call
    c.sp = frame;
}
#else
struct Context {
    ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void start_context(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// What a CUDA thread has of its own: its index, its registers' stand-ins that the emulation
// keeps, and its fiber.
struct Thread {
    uint3 index{};
    unsigned linear = 0;
    unsigned collective_parity = 0;
    std::vector<PendingCopy> open_copies;
    std::vector<std::vector<PendingCopy>> committed_copies;
    int waiting_on = RUNNABLE;  // RUNNABLE, FINISHED, or the barrier it waits at
    Context context;
    char* stack = nullptr;
};

struct Block {
    unsigned threads = 0;
    std::vector<Thread> state;
    Barrier block_barrier;
    std::vector<Barrier> warp_barriers;
    std::vector<uint64_t> slots;  // one per thread, for shuffles
    // One 32-byte payload per thread for warp-collective operations, in two sets used
    // alternately: a set is rewritten only after every lane passed the next operation's barrier.
    std::vector<std::array<uint64_t, 4>> exchange[2];
    std::vector<unsigned char> dynamic_shared;
    void (*body)(void*) = nullptr;  // runs the kernel for the current thread
    void* body_arg = nullptr;
    Context scheduler;
    const void* scheduler_stack = nullptr;  // for AddressSanitizer's fiber switches
    size_t scheduler_stack_size = 0;
};

inline uint3 block_index;
inline dim3 block_dim, grid_dim;
inline Block* current_block = nullptr;
inline Thread* current_thread = nullptr;

#if defined(TF_EMU_ASAN)
inline size_t stack_bytes = size_t(512) << 10;  // AddressSanitizer's redzones make frames larger
#else
inline size_t stack_bytes = size_t(128) << 10;
#endif

inline unsigned char* dynamic_shared() { return current_block->dynamic_shared.data(); }

// The running thread gives the CPU back to the block's scheduler (it waits or has finished).
inline void switch_to_scheduler(bool finished) {
    Block& b = *current_block;
#if defined(TF_EMU_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake_stack, b.scheduler_stack, b.scheduler_stack_size);
#endif
    switch_context(current_thread->context, b.scheduler);
    if (finished) fail("a finished thread was resumed");
#if defined(TF_EMU_ASAN)
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Lets every thread that waits at barrier `id` run again; the barrier starts its next phase.
inline void release(Barrier& barrier, int id) {
    Block& b = *current_block;
    barrier.arrived = 0;
    const unsigned first = id == BLOCK_BARRIER ? 0 : 32 * unsigned(id - 1);
    const unsigned last = id == BLOCK_BARRIER ? b.threads : std::min(b.threads, first + 32);
    for (unsigned t = first; t < last; ++t)
        if (b.state[t].waiting_on == id) b.state[t].waiting_on = RUNNABLE;
}

// std::barrier's arrive_and_wait: the last of the live threads to arrive releases the others.
inline void arrive_and_wait(Barrier& barrier, int id) {
    if (++barrier.arrived == barrier.expected) {
        release(barrier, id);
        return;
    }
    current_thread->waiting_on = id;
    switch_to_scheduler(false);
}

// std::barrier's arrive_and_drop: a returning thread no longer counts, in this phase or later.
inline void arrive_and_drop(Barrier& barrier, int id) {
    --barrier.expected;
    if (barrier.arrived > 0 && barrier.arrived == barrier.expected) release(barrier, id);
}

inline int warp_barrier_id(unsigned thread) { return 1 + int(thread >> 5); }

inline void warp_arrive_and_wait() {
    const unsigned me = current_thread->linear;
    arrive_and_wait(current_block->warp_barriers[me >> 5], warp_barrier_id(me));
}

// Deposits `mine`, waits for the warp, then calls body(payload_of) where payload_of(lane)
// is what that lane of the same warp deposited.
template <typename Payload, typename Body>
void warp_collective(const Payload& mine, Body body) {
    static_assert(sizeof(Payload) <= sizeof(std::array<uint64_t, 4>), "warp payload wider than 32 bytes");
    Block& b = *current_block;
    const unsigned me = current_thread->linear, base = me & ~31u;
    if (base + 32 > b.threads) fail("a warp-collective operation needs a full warp of 32 threads");
    auto& slots = b.exchange[current_thread->collective_parity];
    current_thread->collective_parity ^= 1u;
    std::memcpy(&slots[me], &mine, sizeof(Payload));
    warp_arrive_and_wait();
    body([&](unsigned lane) {
        Payload p;
        std::memcpy(&p, &slots[base + lane], sizeof(Payload));
        return p;
    });
}

template <typename T, typename SourceLane>
T shuffle(T value, SourceLane source_lane) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 8 bytes");
    Block& b = *current_block;
    const unsigned me = current_thread->linear, base = me & ~31u, lane = me & 31u;
    std::memcpy(&b.slots[me], &value, sizeof(T));
    warp_arrive_and_wait();
    T result = value;
    const int src = source_lane(lane);
    if (src >= 0 && base + src < b.threads) std::memcpy(&result, &b.slots[base + src], sizeof(T));
    warp_arrive_and_wait();
    return result;
}

// Whether `t` issued cp.async copies it has not waited for, in its open group or a committed one
// (an empty group is complete: PTX ISA, cp.async.wait_group).
inline bool copies_in_flight(const Thread& t) {
    if (!t.open_copies.empty()) return true;
    for (const std::vector<PendingCopy>& group : t.committed_copies)
        if (!group.empty()) return true;
    return false;
}

// A fiber's first function: runs the kernel as the current thread, then leaves both barriers.
// A thread must not return with copies in flight: on a GPU they may land in the shared memory of
// the next block on the multiprocessor.
inline void thread_entry() {
    Block& b = *current_block;
#if defined(TF_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_stack, &b.scheduler_stack_size);
#endif
    b.body(b.body_arg);
    if (copies_in_flight(*current_thread))
        fail("a thread returned with cp.async copies in flight: drain them (cp.async.wait_all) before the kernel "
             "exits");
    const unsigned me = current_thread->linear;
    arrive_and_drop(b.block_barrier, BLOCK_BARRIER);
    arrive_and_drop(b.warp_barriers[me >> 5], warp_barrier_id(me));
    current_thread->waiting_on = FINISHED;
    switch_to_scheduler(true);
}

// Stacks for the threads of a block, kept for later launches: `count` stacks of stack_bytes,
// each above a page that may not be touched (an overflow faults instead of corrupting).
inline char* thread_stacks(unsigned count) {
    static char* stacks = nullptr;
    static unsigned capacity = 0;
    if (count > capacity) {
        if (stacks) munmap(stacks, size_t(capacity) * stack_bytes);
        void* p = mmap(nullptr, size_t(count) * stack_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fail("cannot map the threads' stacks");
        stacks = static_cast<char*>(p);
        for (unsigned t = 0; t < count; ++t) mprotect(stacks + size_t(t) * stack_bytes, 4096, PROT_NONE);
        capacity = count;
    }
    return stacks;
}

// Runs the block's threads until all have returned; aborts if the live ones all wait at
// barriers that cannot complete (a barrier reached by only some of its threads).
inline void run_block(Block& b) {
    char* stacks = thread_stacks(b.threads);
    for (unsigned t = 0; t < b.threads; ++t) {
        Thread& th = b.state[t];
        th.stack = stacks + size_t(t) * stack_bytes;
        start_context(th.context, th.stack + 4096, stack_bytes - 4096, thread_entry);
    }
    for (unsigned finished = 0; finished < b.threads;) {
        bool ran = false;
        for (unsigned t = 0; t < b.threads; ++t) {
            Thread& th = b.state[t];
            if (th.waiting_on != RUNNABLE) continue;
            ran = true;
            current_thread = &th;
#if defined(TF_EMU_ASAN)
            void* fake_stack = nullptr;
            __sanitizer_start_switch_fiber(&fake_stack, th.stack + 4096, stack_bytes - 4096);
#endif
            switch_context(b.scheduler, th.context);
#if defined(TF_EMU_ASAN)
            __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
            if (th.waiting_on == FINISHED) ++finished;
        }
        if (!ran)
            fail("__syncthreads() or a warp-collective operation was reached by only some of the threads it "
                 "waits for (divergent barrier: a deadlock on a GPU)");
    }
    current_thread = nullptr;
}

template <typename... Args, std::size_t... I>
void invoke(void (*kernel)(Args...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<Args>*>(args[I])...);
}

// Runs kernel<<<grid, block>>>(args...) with args given as cuLaunchKernel takes them:
// args[i] points at the value of the i-th parameter.
template <typename... Args>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, unsigned shared_bytes, void** args) {
    const unsigned n = block.x * block.y * block.z;
    grid_dim = grid;
    block_dim = block;
    struct Call {
        void (*kernel)(Args...);
        void** args;
    } call{kernel, args};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                Block b;
                b.threads = n;
                b.state.resize(n);
                for (unsigned t = 0; t < n; ++t) {
                    b.state[t].linear = t;
                    b.state[t].index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                }
                b.block_barrier.expected = n;
                for (unsigned w = 0; w < (n + 31) / 32; ++w) b.warp_barriers.push_back({std::min(32u, n - 32 * w), 0});
                b.slots.assign(n, 0);
                b.exchange[0].assign(n, {});
                b.exchange[1].assign(n, {});
                b.dynamic_shared.assign(shared_bytes + 16, 0xFF);
                b.body = [](void* c) {
                    auto* call = static_cast<Call*>(c);
                    invoke(call->kernel, call->args, std::index_sequence_for<Args...>{});
                };
                b.body_arg = &call;
                block_index = {x, y, z};
                current_block = &b;
                run_block(b);
                current_block = nullptr;
            }
}

}  // namespace tf_emu
