// Host emulation of the CUDA constructs the gradcells kernels use, so that the very kernel
// source the GPU runs (gradcells/cells/<cell>/<cell>.cu and gradcells/gpu/reduce.cu, composed
// by gradcells.gpu._sources) compiles
// with the system C++ compiler and runs on the CPU:
//   - __global__, __device__, __host__, __forceinline__ as plain (inline) C++;
//   - threadIdx, blockIdx, blockDim, gridDim as globals that the launcher sets;
//   - the C math functions (tanhf, fmaf, fabsf and their double forms) from <math.h>;
//   - float16 <-> float32 conversion (round to nearest even, as the PTX cvt.rn.f16.f32 the
//     device uses), as the gc_host_* functions common.cuh calls;
//   - gc_host::launch, which runs every thread of every block, one after the other, with
//     the argument array that cuLaunchKernel takes (one pointer per kernel argument).
// Sequential threads are a valid schedule only for kernels without shared memory,
// __syncthreads or inter-thread communication, which is the case for every gradcells
// kernel (common.cuh says so); reverse != 0 runs blocks and threads in reverse order, and
// a kernel whose threads did interfere would give a different result.

#ifndef GRADCELLS_HOST_SHIM_H
#define GRADCELLS_HOST_SHIM_H

#include <math.h>
#include <string.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#define GRADCELLS_HOST_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

static uint3 threadIdx;
static uint3 blockIdx;
static dim3 blockDim;
static dim3 gridDim;

// IEEE binary16 <-> binary32 in portable integer arithmetic (no _Float16 needed), rounding
// to nearest even as PTX cvt.rn.f16.f32 does; tests/test_cuda_emulation.py checks both
// directions against NumPy on every half value and on every tie.
static inline float gc_host_bits_to_float(unsigned int bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float gc_host_half_bits_to_float(unsigned short h) {
    const unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
    const unsigned int exponent = (h >> 10) & 0x1fu;
    const unsigned int mantissa = h & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
        const float magnitude = (float)mantissa * 5.9604644775390625e-08f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) return gc_host_bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    return gc_host_bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline unsigned short gc_host_float_to_half_bits(float f) {
    unsigned int x;
    memcpy(&x, &f, sizeof x);
    const unsigned int sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // NaN
    if (x >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: infinity
    if (x < 0x38800000u) {  // below 2^-14: a half subnormal, |f|·2^24 rounded to even
        float scaled;
        memcpy(&scaled, &x, sizeof scaled);
        scaled *= 16777216.0f;  // exact: a power of two, far from overflow
        unsigned int whole = (unsigned int)scaled;
        const float rest = scaled - (float)whole;
        if (rest > 0.5f || (rest == 0.5f && (whole & 1u))) whole += 1;
        return (unsigned short)(sign | whole);  // whole == 1024 is the smallest normal
    }
    unsigned int h = ((((x >> 23) - 112u) << 10) | ((x >> 13) & 0x3ffu));
    const unsigned int rest = x & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // may carry: still right
    return (unsigned short)(sign | h);
}

// For the conversion test: n values each way.
extern "C" void gc_host_halves_to_floats(const unsigned short* in, float* out, long long n) {
    for (long long k = 0; k < n; ++k) out[k] = gc_host_half_bits_to_float(in[k]);
}
extern "C" void gc_host_floats_to_halves(const float* in, unsigned short* out, long long n) {
    for (long long k = 0; k < n; ++k) out[k] = gc_host_float_to_half_bits(in[k]);
}

namespace gc_host {

template <class... P, std::size_t... I>
inline void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<typename std::remove_reference<P>::type*>(args[I])...);
}

inline uint3 unflatten(unsigned long long index, const unsigned int* extent) {
    uint3 v;
    v.x = (unsigned int)(index % extent[0]);
    v.y = (unsigned int)((index / extent[0]) % extent[1]);
    v.z = (unsigned int)(index / ((unsigned long long)extent[0] * extent[1]));
    return v;
}

// grid and block: three extents each (x, y, z), as CuPy's launch takes them.
template <class... P>
inline void launch(void (*kernel)(P...), const unsigned int* grid, const unsigned int* block,
                   int reverse, void** args) {
    gridDim.x = grid[0]; gridDim.y = grid[1]; gridDim.z = grid[2];
    blockDim.x = block[0]; blockDim.y = block[1]; blockDim.z = block[2];
    const unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    const unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    for (unsigned long long b = 0; b < blocks; ++b) {
        blockIdx = unflatten(reverse ? blocks - 1 - b : b, grid);
        for (unsigned long long t = 0; t < threads; ++t) {
            threadIdx = unflatten(reverse ? threads - 1 - t : t, block);
            call(kernel, args, std::index_sequence_for<P...>{});
        }
    }
}

}  // namespace gc_host

#endif  // GRADCELLS_HOST_SHIM_H
