// The embedding's weight gradient without atomics. Reference: functional.Embedding.
//   dW[v] = Σ_{i : ids[i] = v} dy[i]   (summed in position order: the same bits at every run)
// One block per vocabulary row v: it scans the ids a chunk of blockDim positions at a time, writes
// the chunk's positions holding v, in order, to shared memory (a block-wide prefix count of the
// matches), and its threads, one per column, add those rows of dy to float accumulators. Every
// element of dW has one writer and a fixed order of terms, so the result does not depend on
// scheduling (CuPy's scatter add, atomics, does), as a CUDA graph's replay must equal the eager step.
// Columns beyond TF_EMBEDDING_COLUMNS · blockDim (registry.EMBEDDING_COLUMNS_PER_THREAD) take
// another pass over the ids.
#include "common.cuh"

// grid (vocab), block of at most TF_ROW_BLOCK threads.
template <typename T>
__global__ void embedding_backward(const int* __restrict__ ids, const T* __restrict__ grad_out,
                                   T* __restrict__ grad_weight, int positions, int cols) {
    __shared__ int matches[TF_ROW_BLOCK];
    __shared__ int counts[TF_ROW_BLOCK];
    const int row = blockIdx.x;
    const int t = threadIdx.x;
    for (int base = 0; base < cols; base += TF_EMBEDDING_COLUMNS * blockDim.x) {
        float acc[TF_EMBEDDING_COLUMNS];
        for (int c = 0; c < TF_EMBEDDING_COLUMNS; ++c) acc[c] = 0.0f;
        for (int start = 0; start < positions; start += blockDim.x) {
            const int i = start + t;
            const int match = i < positions && ids[i] == row;
            counts[t] = match;
            __syncthreads();
            for (int step = 1; step < blockDim.x; step *= 2) {  // inclusive prefix count (Hillis–Steele)
                const int earlier = t >= step ? counts[t - step] : 0;
                __syncthreads();
                counts[t] += earlier;
                __syncthreads();
            }
            if (match) matches[counts[t] - 1] = i;
            const int found = counts[blockDim.x - 1];
            __syncthreads();  // the chunk's matches are written
            for (int m = 0; m < found; ++m) {
                const long long first = (long long)matches[m] * cols;
                for (int c = 0; c < TF_EMBEDDING_COLUMNS; ++c) {
                    const int j = base + c * blockDim.x + t;
                    if (j < cols) acc[c] += tf::to_float(grad_out[first + j]);
                }
            }
            __syncthreads();  // counts and matches are rewritten by the next chunk
        }
        for (int c = 0; c < TF_EMBEDDING_COLUMNS; ++c) {
            const int j = base + c * blockDim.x + t;
            if (j < cols) grad_weight[(long long)row * cols + j] = tf::from_float<T>(acc[c]);
        }
    }
}
