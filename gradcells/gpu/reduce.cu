// Column sums of a C-contiguous [rows, cols] array: the bias and peephole gradients
// (Σ over the batch, and over time for sequences). No shared memory and no atomics, so
// the result is deterministic: one thread owns one column of one part of the rows.
//
//   out[p, j] = Σ in[r, j] over r in [p·rows_per_part, min(rows, (p+1)·rows_per_part))
//
// accumulated in the arithmetic type of TIn (float for gc_half and float, double for
// double). Threads x walk the columns, blocks y walk the parts (both grid-stride). With
// parts = 1 this is the whole column sum; with parts > 1 a second launch with
// rows = parts sums the partial rows (gradcells/gpu/_ops.py: _column_sum).

#include "common.cuh"

template <class TIn, class TOut>
__global__ void column_sum(
    const TIn* in, long long rows, long long cols, long long rows_per_part,
    long long parts, TOut* out)
{
    typedef typename gc_compute<TIn>::type A;
    for (long long p = blockIdx.y; p < parts; p += gridDim.y) {
        const long long first = p * rows_per_part;
        const long long last = first + rows_per_part < rows ? first + rows_per_part : rows;
        for (long long j = gc_first_x<long long>(); j < cols; j += gc_stride_x<long long>()) {
            A acc = (A)0;
            for (long long r = first; r < last; ++r) acc = acc + gc_load(in[r * cols + j]);
            out[p * cols + j] = gc_store<TOut>::from(acc);
        }
    }
}
