// One-warp probes of the instructions in kernels/mma.cuh, so that the tests can hold each against
// the PTX ISA's fragment layouts (tests/engine/kernels/test_mma.py, tests/engine/kernels/test_emulation.py): in CI
// through the CPU emulation, on a GPU against the hardware. Test machinery, not a shipped kernel:
// the tests build it themselves (tests/mma_probes.py), with kernels/ on the include path. Each
// probe is launched with blocks of one warp.
#include "mma.cuh"

namespace tf_mma_probe {
constexpr int kMatrix = tf::kCopyBytes / sizeof(unsigned short);  // an 8×8 matrix of 16-bit elements
}  // namespace tf_mma_probe

// out[(variant · 32 + lane) · 4 + r]: register r of `lane` after ldmatrix variant (x1, x2, x4,
// x1.trans, x2.trans, x4.trans) with lane l passing the address of row rows[l] of m, 64 rows of 8
// elements copied to shared memory (any rows, in any order: the rows of a matrix need not be
// contiguous). Registers a variant does not write stay 0.
template <typename T>
__global__ void ldmatrix_probe(const T* __restrict__ m, const int* __restrict__ rows, unsigned* __restrict__ out) {
    using namespace tf_mma_probe;
    __shared__ tf::CopyChunk pool[2 * tf::kWarp];
    const int lane = threadIdx.x;
    pool[lane] = reinterpret_cast<const tf::CopyChunk*>(m)[lane];
    pool[tf::kWarp + lane] = reinterpret_cast<const tf::CopyChunk*>(m)[tf::kWarp + lane];
    __syncthreads();
    const tf::CopyChunk* row = &pool[rows[lane]];
    unsigned regs[6][4] = {};  // x1, x2, x4, then the same with .trans
    tf::ldmatrix_x1(regs[0], row);
    tf::ldmatrix_x2(regs[1], row);
    tf::ldmatrix_x4(regs[2], row);
    tf::ldmatrix_x1<true>(regs[3], row);
    tf::ldmatrix_x2<true>(regs[4], row);
    tf::ldmatrix_x4<true>(regs[5], row);
    for (int variant = 0; variant < 6; ++variant)
        for (int r = 0; r < 4; ++r) out[(variant * tf::kWarp + lane) * 4 + r] = regs[variant][r];
}

// One mma.m16n8k16 per block on registers the caller packed: lane l of block x takes its A
// registers from a[(x · 32 + l) · 4 + r], B from b[(x · 32 + l) · 2 + r], C from c[(x · 32 + l) · 4 + i]
// and writes D to d at C's places. The probe knows no layout: the test packs and unpacks.
template <typename T>
__global__ void mma_fragment_probe(const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                                   const float* __restrict__ c, float* __restrict__ d) {
    const long long at = (long long)blockIdx.x * tf::kWarp + threadIdx.x;
    unsigned af[4], bf[2];
    float acc[4];
    for (int r = 0; r < 4; ++r) {
        af[r] = a[at * 4 + r];
        acc[r] = c[at * 4 + r];
    }
    for (int r = 0; r < 2; ++r) bf[r] = b[at * 2 + r];
    tf::mma_m16n8k16<T>(acc, af, bf);
    for (int i = 0; i < 4; ++i) d[at * 4 + i] = acc[i];
}

// d = a·b + c for a 16×16 a, 16×8 b, 16×8 c (row-major), one m16n8k16. via_ldmatrix = 0: every
// lane packs its fragments from global memory by the documented layouts; 1: A by ldmatrix.x4 and
// B by ldmatrix.x2.trans from shared memory.
template <typename T>
__global__ void mma_probe(const T* __restrict__ a, const T* __restrict__ b, const float* __restrict__ c,
                          float* __restrict__ d, int via_ldmatrix) {
    using namespace tf_mma_probe;
    __shared__ tf::CopyChunk a_rows[2 * 2 * kMatrix], b_rows[2 * kMatrix];  // a: 16 rows of 2 chunks; b: 16 rows
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto bits = [](T x) { return unsigned(reinterpret_cast<const unsigned short&>(x)); };
    auto pair = [&](const T* p) { return bits(p[0]) | (bits(p[1]) << 16); };
    unsigned af[4], bf[2];
    if (via_ldmatrix) {
        a_rows[lane] = reinterpret_cast<const tf::CopyChunk*>(a)[lane];
        if (lane < 2 * kMatrix) b_rows[lane] = reinterpret_cast<const tf::CopyChunk*>(b)[lane];
        __syncthreads();
        // A's matrices in register order: (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
        const int row = lane % kMatrix + kMatrix * ((lane / kMatrix) % 2), half = lane / (2 * kMatrix);
        tf::ldmatrix_x4(af, &a_rows[2 * row + half]);
        tf::ldmatrix_x2<true>(bf, &b_rows[lane % (2 * kMatrix)]);  // B's k rows 0-7, then 8-15
    } else {
        const int width = 2 * kMatrix;
        for (int r = 0; r < 4; ++r) af[r] = pair(a + (g + kMatrix * (r % 2)) * width + 2 * t + kMatrix * (r / 2));
        for (int r = 0; r < 2; ++r) {
            const T lo = b[(2 * t + kMatrix * r) * kMatrix + g], hi = b[(2 * t + kMatrix * r + 1) * kMatrix + g];
            bf[r] = bits(lo) | (bits(hi) << 16);
        }
    }
    float acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = c[(g + kMatrix * (i / 2)) * kMatrix + 2 * t + i % 2];
    tf::mma_m16n8k16<T>(acc, af, bf);
    for (int i = 0; i < 4; ++i) d[(g + kMatrix * (i / 2)) * kMatrix + 2 * t + i % 2] = acc[i];
}

// cp.async groups: lane l copies chunk l of `src` in group 0 and chunk 32 + l in group 1 (the
// chunks of lanes >= `valid` zero-filled) into shared memory that first holds kStale in every
// word; after wait_group 1 it reads group 0's chunk back into out[l], after wait_group 0 group
// 1's into out[32 + l] (a neighbour's chunks, after a barrier). `read_early` != 0 reads group 1's
// chunks too after wait_group 1, before their group is waited for (wait_group 0 follows the
// read): the CPU emulation performs a copy only in the wait that completes its group, so there
// the read sees kStale; on a GPU it is a race whose result is undefined.
namespace tf_mma_probe {
constexpr unsigned kStale = 0xA5A5A5A5u;  // 0xA5A5 in every 16-bit element
}  // namespace tf_mma_probe

template <typename T>
__global__ void cp_async_probe(const T* __restrict__ src, T* __restrict__ out, int valid, int read_early) {
    using namespace tf_mma_probe;
    __shared__ tf::CopyChunk staged[2 * tf::kWarp];
    const int lane = threadIdx.x, other = (lane + 1) % tf::kWarp;  // read a neighbour's copy
    const tf::CopyChunk* from = reinterpret_cast<const tf::CopyChunk*>(src);
    tf::CopyChunk* to = reinterpret_cast<tf::CopyChunk*>(out);
    for (int w = 0; w < 4; ++w) staged[lane].words[w] = staged[tf::kWarp + lane].words[w] = kStale;
    __syncthreads();
    tf::cp_async_chunk(&staged[lane], &from[lane], lane < valid);
    tf::cp_async_commit();
    tf::cp_async_chunk(&staged[tf::kWarp + lane], &from[tf::kWarp + lane], lane < valid);
    tf::cp_async_commit();
    tf::cp_async_wait<1>();
    __syncthreads();
    to[other] = staged[other];
    if (read_early) to[tf::kWarp + other] = staged[tf::kWarp + other];
    __syncthreads();  // every read above is done before a wait below lands a group-1 copy
    tf::cp_async_wait<0>();
    __syncthreads();
    if (!read_early) to[tf::kWarp + other] = staged[tf::kWarp + other];
}

// cp.async.wait_all: lane l copies chunk l of `src` into shared memory that first holds kStale,
// without committing it. mode 0: wait_all (which commits it), a barrier, then out[l] = the copy of
// lane l + 1. mode 1: return with the copy uncommitted; mode 2: committed but not waited for. The
// CPU emulation aborts when a thread returns with copies in flight (modes 1 and 2); on a GPU they
// would be a bug, so the GPU tests run mode 0 alone.
template <typename T>
__global__ void cp_async_drain_probe(const T* __restrict__ src, T* __restrict__ out, int mode) {
    using namespace tf_mma_probe;
    __shared__ tf::CopyChunk staged[tf::kWarp];
    const int lane = threadIdx.x, other = (lane + 1) % tf::kWarp;
    for (int w = 0; w < 4; ++w) staged[lane].words[w] = kStale;
    __syncthreads();
    tf::cp_async_chunk(&staged[lane], &reinterpret_cast<const tf::CopyChunk*>(src)[lane], true);
    if (mode == 2) tf::cp_async_commit();
    if (mode != 0) return;
    tf::cp_async_wait_all();
    __syncthreads();
    reinterpret_cast<tf::CopyChunk*>(out)[other] = staged[other];
}

// y = T(x) rounded to nearest even, back = float(y): the conversions the kernels use.
template <typename T>
__global__ void convert_probe(const float* __restrict__ x, T* __restrict__ y, float* __restrict__ back, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        y[i] = tf::from_float<T>(x[i]);
        back[i] = tf::to_float(y[i]);
    }
}
