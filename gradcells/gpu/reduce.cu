// Column sums of a C-contiguous [rows, cols] array: the bias and peephole gradients
// (sums over the batch, and over time for sequences). No shared memory and no atomics, so
// the result is deterministic: one thread owns one column of one part of the rows.
//
//   out[p, j] = sum of in[r, j] over r in [p*rows_per_part, min(rows, (p+1)*rows_per_part))
//
// accumulated in the arithmetic type of TIn (float for gc_half and float, double for
// double) by compensated (Kahan) summation: a plain running sum over the T*B rows of a
// sequence drifts by about sqrt(rows) units in the last place of the column's sum of |x|
// (hundreds of eps at 100k rows in float32); the compensated one stays within a few eps,
// however the rows are split. Only additions: contracting multiply-adds (NVRTC's default)
// cannot touch it, and no fast-math reassociation is enabled. Once the sum is not finite
// the compensation is dropped, so infinities propagate as in a plain sum.
//
// Threads x walk the columns, blocks y walk the parts (both grid-stride). With parts = 1
// this is the whole column sum; with parts > 1 a second launch with rows = parts sums the
// partial rows (gradcells/gpu/_launch.py: column_sum).

#include "common.cuh"

template <class TIn, class TOut>
GC_KERNEL void column_sum(
    const TIn* in, long long rows, long long cols, long long rows_per_part,
    long long parts, TOut* out)
{
    typedef typename gc_compute<TIn>::type A;
    for (long long p = blockIdx.y; p < parts; p += gridDim.y) {
        const long long first = p * rows_per_part;
        const long long last = first + rows_per_part < rows ? first + rows_per_part : rows;
        for (long long j = gc_first_x<long long>(); j < cols; j += gc_stride_x<long long>()) {
            A sum = (A)0, lost = (A)0;  // lost: what the rounding of sum dropped, negated
            for (long long r = first; r < last; ++r) {
                const A y = gc_load(in[r * cols + j]) - lost;
                const A t = sum + y;
                lost = isfinite(t) ? (t - sum) - y : (A)0;
                sum = t;
            }
            out[p * cols + j] = gc_store<TOut>::from(sum);
        }
    }
}
