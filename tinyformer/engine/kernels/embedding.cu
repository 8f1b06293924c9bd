// The Transformer's input in one pass, and the embedding's weight gradient without atomics.
// Reference: functional.EmbeddingInput (and functional.Embedding for the gradient alone).
//   forward:  out_e = dropout(W[ids[i]]_j · scale + table[i mod length]_j), e = i · cols + j, each
//             step rounded to T as the separate ops store it (the product, the sum, the dropped
//             value); scale 1 skips the product, a null table the sum. The mask is dropout.cu's for
//             (seed, offset) over out's elements (one Philox block per 4 of them); p = 0 keeps all.
//   backward: dW[v] (+)= Σ_{i : ids[i] = v} dy[i] ∘ keep[i] · factor, summed in position order (the
//             same bits at every run), factor = dropout's scale times the embedding's.
// Backward: one block per vocabulary row v: it scans the ids a chunk of blockDim positions at a time,
// writes the chunk's positions holding v, in order, to shared memory (a block-wide prefix count of
// the matches), and its threads, one per column, add those rows of dy to float accumulators. Every
// element of dW has one writer and a fixed order of terms, so the result does not depend on
// scheduling (CuPy's scatter add, atomics, does), as a CUDA graph's replay must equal the eager step.
// Columns beyond TF_EMBEDDING_COLUMNS · blockDim (registry.EMBEDDING_COLUMNS_PER_THREAD) take
// another pass over the ids.
#include "common.cuh"
#include "philox.cuh"

// Grid-stride over groups of 4 consecutive elements (dropout.cu's layout: one Philox block each).
template <typename T>
__global__ void embedding_forward(const long long* __restrict__ ids, const T* __restrict__ weight,
                                  const T* __restrict__ table, T* __restrict__ out, bool* __restrict__ keep,
                                  long long n, int cols, int length, float scale, float p, float drop_scale,
                                  unsigned long long seed, const unsigned long long* __restrict__ seed_ptr,
                                  unsigned long long offset) {
    seed = tf::resolve_seed(seed, seed_ptr);
    const long long groups = (n + 3) / 4;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        unsigned words[4] = {0u, 0u, 0u, 0u};
        if (p > 0.0f) {  // p = 0 draws no random numbers
            const tf::Philox4 r = tf::philox_block(seed, offset, g);
            words[0] = r.x, words[1] = r.y, words[2] = r.z, words[3] = r.w;
        }
        const long long first = 4 * g;
        const int count = n - first < 4 ? (int)(n - first) : 4;
        for (int k = 0; k < count; ++k) {
            const long long e = first + k, i = e / cols;
            const int j = (int)(e - i * cols);
            float v = tf::to_float(weight[ids[i] * cols + j]);
            if (scale != 1.0f) v = tf::to_float(tf::from_float<T>(v * scale));
            if (table != nullptr) v = tf::to_float(tf::from_float<T>(v + tf::to_float(table[(i % length) * cols + j])));
            const bool kept = p <= 0.0f || tf::uniform_from_word(words[k]) >= p;
            out[e] = tf::from_float<T>(p <= 0.0f ? v : v * (kept ? drop_scale : 0.0f));
            if (keep != nullptr) keep[e] = kept;
        }
    }
}

// grid (vocab), block of at most TF_ROW_BLOCK threads; keep null: every term kept; accumulate: add
// to what grad_weight holds (a parameter's .grad) instead of writing it.
template <typename T>
__global__ void embedding_backward(const long long* __restrict__ ids, const T* __restrict__ grad_out,
                                   const bool* __restrict__ keep, T* __restrict__ grad_weight, int positions,
                                   int cols, float factor, int accumulate) {
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
                    if (j < cols) {
                        const float dy = tf::to_float(grad_out[first + j]);
                        acc[c] += keep == nullptr ? dy * factor : (keep[first + j] ? dy * factor : 0.0f);
                    }
                }
            }
            __syncthreads();  // counts and matches are rewritten by the next chunk
        }
        for (int c = 0; c < TF_EMBEDDING_COLUMNS; ++c) {
            const int j = base + c * blockDim.x + t;
            const long long e = (long long)row * cols + j;
            if (j < cols) grad_weight[e] = tf::from_float<T>(accumulate ? tf::to_float(grad_weight[e]) + acc[c] : acc[c]);
        }
    }
}
