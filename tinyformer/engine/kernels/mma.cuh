// Tensor-core matrix products and their data movement for the kernels, one helper per PTX
// instruction: inline PTX on the GPU, the CPU emulation's warp-collective instructions on the CPU
// (which follows the same fragment layouts; tests/engine/kernels/test_mma.py checks both against a
// plain matrix product).
//
// Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.f32 (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), lane l, group g = l/4, t = l%4, two 16-bit elements per
// 32-bit register, the lower-indexed one in the low half:
//   A (16×16, row-major):  a[r] = A[g + 8·(r%2)][2t + 8·(r/2) + {0,1}]
//   B (16×8, column-major): b[r] = B[2t + 8r + {0,1}][g]
//   C, D (16×8, float):    c[i] = C[g + 8·(i/2)][2t + i%2]
// So the accumulators of two neighbouring 16×8 tiles, converted to 16-bit pairs, are the
// A fragment of the next product (FlashAttention-2's P and dS never leave registers).
#pragma once
#include "common.cuh"

namespace tf {

// Two floats as a register of two 16-bit T, rounded to nearest even; `lo` in the low half.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    return unsigned(__half_as_ushort(__float2half_rn(lo))) | (unsigned(__half_as_ushort(__float2half_rn(hi))) << 16);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// d += a·b, m16n8k16, 16-bit T inputs, float accumulators.
template <typename T> __device__ __forceinline__ void mma_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2]);

#ifdef TF_CPU_EMULATION
template <> __device__ __forceinline__ void mma_m16n8k16<__half>(float d[4], const unsigned a[4], const unsigned b[2]) {
    tf_emu::mma_m16n8k16<__half>(d, a, b, d);
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const unsigned a[4], const unsigned b[2]) {
    tf_emu::mma_m16n8k16<__nv_bfloat16>(d, a, b, d);
}
#else
template <> __device__ __forceinline__ void mma_m16n8k16<__half>(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// ldmatrix.sync.aligned.m8n8.{x4,x2,x1}[.trans].shared.b16: lanes 8m..8m+7 pass the addresses
// of rows 0..7 of matrix m (16 bytes each, 16-byte aligned); register m of lane l receives row
// l/4, elements 2(l%4), 2(l%4)+1 of matrix m (with TRANS: column l/4, rows 2(l%4), 2(l%4)+1).
template <bool TRANS = false>
__device__ __forceinline__ void ldmatrix_x4(unsigned regs[4], const void* row_address) {
#ifdef TF_CPU_EMULATION
    tf_emu::ldmatrix<4, TRANS>(regs, row_address);
#else
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(shared_address(row_address)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(shared_address(row_address)));
#endif
}
template <bool TRANS = false>
__device__ __forceinline__ void ldmatrix_x2(unsigned regs[2], const void* row_address) {
#ifdef TF_CPU_EMULATION
    tf_emu::ldmatrix<2, TRANS>(regs, row_address);
#else
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(regs[0]), "=r"(regs[1]) : "r"(shared_address(row_address)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                     : "=r"(regs[0]), "=r"(regs[1]) : "r"(shared_address(row_address)));
#endif
}
template <bool TRANS = false>
__device__ __forceinline__ void ldmatrix_x1(unsigned regs[1], const void* row_address) {
#ifdef TF_CPU_EMULATION
    tf_emu::ldmatrix<1, TRANS>(regs, row_address);
#else
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
                     : "=r"(regs[0]) : "r"(shared_address(row_address)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(regs[0]) : "r"(shared_address(row_address)));
#endif
}

// The unit of cp.async: 16 bytes.
struct alignas(16) CopyChunk {
    unsigned words[4];
};
constexpr int kCopyBytes = sizeof(CopyChunk);

// cp.async.cg.shared.global of one CopyChunk (both addresses 16-byte aligned); `valid` false
// writes zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_chunk(void* shared, const void* global, bool valid) {
#ifdef TF_CPU_EMULATION
    tf_emu::cp_async(shared, global, kCopyBytes, valid ? kCopyBytes : 0);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(shared)), "l"(global),
                 "r"(valid ? 16 : 0));
#endif
}

// cp.async.commit_group: the copies issued since the last commit form a group.
__device__ __forceinline__ void cp_async_commit() {
#ifdef TF_CPU_EMULATION
    tf_emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;");
#endif
}

// cp.async.wait_group PENDING: wait until at most the PENDING newest groups are in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#ifdef TF_CPU_EMULATION
    tf_emu::cp_async_wait(PENDING);
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING));
#endif
}

// cp.async.wait_all: commit the copies issued since the last commit and wait for every group.
// Each kernel that issues cp.async calls it before it exits (as CUTLASS's do), so that no copy is
// in flight when its block's shared memory goes to the next block (the emulation checks).
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef TF_CPU_EMULATION
    tf_emu::cp_async_wait_all();
#else
    asm volatile("cp.async.wait_all;");
#endif
}

}  // namespace tf
