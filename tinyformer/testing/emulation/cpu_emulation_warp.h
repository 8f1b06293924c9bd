// Tensor cores and their data movement for the CPU emulation (cpu_emulation.h), used through
// kernels/mma.cuh: warp-collective operations here as on the GPU, following the fragment layouts of
// the PTX ISA exactly:
//   - mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: each lane deposits its A and B
//     registers, one warp barrier, each lane computes its own four accumulators from the
//     lanes that hold their rows and columns (products exact in float, summed with fmaf);
//   - ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16: lanes deposit row addresses,
//     one warp barrier, each lane reads its elements (16-byte aligned rows are required);
//   - cp.async.cg.shared.global (16 bytes, zero fill) is *deferred*: a copy is performed only
//     when a cp.async.wait_group (or wait_all) lets its group complete, so a kernel that reads a
//     tile before waiting for it reads stale data here and fails its test; a thread that returns
//     with copies in flight aborts the emulation (cpu_emulation_threads.h), so a kernel drains
//     them before it exits, as CUTLASS's do.
// A warp-collective call by a partial warp aborts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_emulation_half.h"
#include "cpu_emulation_threads.h"

namespace tf_emu {

template <typename Element>
inline float element_to_float(uint16_t bits) {
    if constexpr (std::is_same_v<Element, __half>) return half_table()[bits];
    else return bits_float(uint32_t(bits) << 16);
}

// The 16-bit element `index` (0: low half) of a 32-bit register.
inline uint16_t half_word(uint32_t reg, int index) { return uint16_t(index ? reg >> 16 : reg & 0xffffu); }

// d = a·b + c for one warp, m16n8k16, A row-major 16×16, B column-major 16×8, f32 accumulators.
// Lane l (group g = l/4, t = l%4) holds A[g + 8·(r%2)][2t + 8·(r/2) + e] in half e of register r,
// B[2t + 8r + e][g] in half e of its register r, and C/D[g + 8·(i/2)][2t + i%2] as element i.
template <typename Element>
void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    struct Operands {
        uint32_t a[4], b[2];
    } mine;
    std::memcpy(mine.a, a, sizeof mine.a);
    std::memcpy(mine.b, b, sizeof mine.b);
    const unsigned lane = current_thread->linear & 31u, g = lane >> 2, t = lane & 3u;
    float result[4];
    warp_collective(mine, [&](auto operands_of) {
        float rows[2][16], cols[2][16];  // A rows g, g+8; B columns 2t, 2t+1
        for (int k = 0; k < 16; ++k) {
            const unsigned a_lane = 4 * g + (k % 8) / 2;
            const Operands holder = operands_of(a_lane);
            rows[0][k] = element_to_float<Element>(half_word(holder.a[0 + 2 * (k / 8)], k % 2));
            rows[1][k] = element_to_float<Element>(half_word(holder.a[1 + 2 * (k / 8)], k % 2));
            for (int n = 0; n < 2; ++n) {
                const Operands column_holder = operands_of(4 * (2 * t + n) + (k % 8) / 2);
                cols[n][k] = element_to_float<Element>(half_word(column_holder.b[k / 8], k % 2));
            }
        }
        for (int i = 0; i < 4; ++i) {
            float acc = c[i];
            for (int k = 0; k < 16; ++k) acc = std::fma(rows[i / 2][k], cols[i % 2][k], acc);
            result[i] = acc;
        }
    });
    std::memcpy(d, result, sizeof result);
}

// ldmatrix: lanes 8m..8m+7 give the addresses of rows 0..7 of matrix m (16 bytes each). Lane l
// gets, of matrix m, in register m: row l/4, elements 2(l%4) and 2(l%4)+1; with .trans,
// elements [2(l%4)][l/4] and [2(l%4)+1][l/4] (the transposed matrix's row l/4).
template <int COUNT, bool TRANS>
void ldmatrix(uint32_t regs[COUNT], const void* row_address) {
    static_assert(COUNT == 1 || COUNT == 2 || COUNT == 4, "ldmatrix loads 1, 2 or 4 matrices");
    const unsigned lane = current_thread->linear & 31u;
    if (lane < 8 * COUNT && reinterpret_cast<uintptr_t>(row_address) % 16)
        fail("ldmatrix: a row address is not 16-byte aligned");
    uint32_t out[COUNT];
    warp_collective(row_address, [&](auto address_of) {
        for (int m = 0; m < COUNT; ++m) {
            uint16_t e[2];
            for (int i = 0; i < 2; ++i) {
                const int row = TRANS ? 2 * int(lane % 4) + i : int(lane / 4);
                const int col = TRANS ? int(lane / 4) : 2 * int(lane % 4) + i;
                std::memcpy(&e[i], static_cast<const uint16_t*>(address_of(8 * m + row)) + col, 2);
            }
            out[m] = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
        }
    });
    std::memcpy(regs, out, sizeof out);
}

inline void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
    if (reinterpret_cast<uintptr_t>(dst) % bytes || (src_bytes && reinterpret_cast<uintptr_t>(src) % bytes))
        fail("cp.async: an address is not aligned to the copy size");
    current_thread->open_copies.push_back({dst, src, bytes, src_bytes});
}
inline void cp_async_commit() {
    current_thread->committed_copies.push_back(std::move(current_thread->open_copies));
    current_thread->open_copies.clear();
}
inline void cp_async_wait(int pending) {
    auto& committed_copies = current_thread->committed_copies;
    while (committed_copies.size() > size_t(std::max(pending, 0))) {
        for (const PendingCopy& c : committed_copies.front()) {
            if (c.src_bytes) std::memcpy(c.dst, c.src, c.src_bytes);
            std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
        }
        committed_copies.erase(committed_copies.begin());
    }
}

// cp.async.wait_all: cp.async.commit_group, then cp.async.wait_group 0 (the PTX ISA's definition):
// the copies not yet committed complete too.
inline void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait(0);
}

}  // namespace tf_emu
