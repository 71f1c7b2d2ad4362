// Shared by every gradcells kernel: storage and compute types, activations, index loops.
//
// This text is compiled three ways, always after gradcells.gpu._sources.compose() has
// inlined it into the including .cu file:
//   - by NVRTC through CuPy (the GPU backend);
//   - by nvcc --ptx in tests/test_cuda_compile.py;
//   - by the host C++ compiler through tests/cuda_host/gradcells_host_shim.h, which
//     defines GRADCELLS_HOST_EMULATION, for the emulation tests.
// The only host/device difference is the float16 <-> float32 conversion below: inline PTX
// on the device, integer arithmetic in the host shim; both round to nearest even.
//
// Kernels use no shared memory, no __syncthreads and no atomics: every output element is
// written by exactly one thread, so any order of threads gives the same result.

#ifndef GRADCELLS_COMMON_CUH
#define GRADCELLS_COMMON_CUH

// A kernel, written once as a template over its storage type(s): a device function that
// every thread runs. Its launchable entry points are generated per instantiation by
// gradcells.gpu._kernels (extern "C" __global__ functions named lstm_forward__float and so
// on), so that NVRTC needs no name expressions: CuPy before 14.2 does not read its disk
// cache for a module compiled with them.
#define GC_KERNEL __device__ __forceinline__

// An IEEE binary16 value as stored in a float16 array; arithmetic happens in float.
struct gc_half {
    unsigned short bits;
};

#ifdef GRADCELLS_HOST_EMULATION
__device__ __forceinline__ float gc_half_to_float(gc_half h) {
    return gc_host_half_bits_to_float(h.bits);
}
__device__ __forceinline__ gc_half gc_float_to_half(float f) {
    gc_half h;
    h.bits = gc_host_float_to_half_bits(f);
    return h;
}
#else
__device__ __forceinline__ float gc_half_to_float(gc_half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ gc_half gc_float_to_half(float f) {
    gc_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
#endif

// The arithmetic type of a storage type: float16 computes in float32.
template <class T> struct gc_compute { typedef T type; };
template <> struct gc_compute<gc_half> { typedef float type; };

// Storage -> compute.
__device__ __forceinline__ float gc_load(float v) { return v; }
__device__ __forceinline__ double gc_load(double v) { return v; }
__device__ __forceinline__ float gc_load(gc_half v) { return gc_half_to_float(v); }

// Compute -> storage (round to nearest even).
template <class T> struct gc_store;
template <> struct gc_store<float> {
    static __device__ __forceinline__ float from(float a) { return a; }
};
template <> struct gc_store<double> {
    static __device__ __forceinline__ double from(double a) { return a; }
};
template <> struct gc_store<gc_half> {
    static __device__ __forceinline__ gc_half from(float a) { return gc_float_to_half(a); }
};

// The value ``a`` takes once stored as T and loaded again (identity for float and double).
template <class T>
__device__ __forceinline__ typename gc_compute<T>::type gc_rounded(typename gc_compute<T>::type a) {
    return gc_load(gc_store<T>::from(a));
}

// Activations. sigmoid(z) = 0.5*tanh(0.5*z) + 0.5 never overflows, for any finite z.
__device__ __forceinline__ float gc_tanh(float z) { return tanhf(z); }
__device__ __forceinline__ double gc_tanh(double z) { return tanh(z); }
__device__ __forceinline__ float gc_sigmoid(float z) { return 0.5f * tanhf(0.5f * z) + 0.5f; }
__device__ __forceinline__ double gc_sigmoid(double z) { return 0.5 * tanh(0.5 * z) + 0.5; }
// Correctly rounded square roots (no fast math): the layer norms' deviations.
__device__ __forceinline__ float gc_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double gc_sqrt(double a) { return sqrt(a); }
__device__ __forceinline__ float gc_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double gc_abs(double a) { return fabs(a); }

// a*b + c with a single rounding: the same value on every compiler and every contraction
// setting, so a backward kernel recomputing it gets the forward's value bit for bit.
__device__ __forceinline__ float gc_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double gc_fma(double a, double b, double c) { return fma(a, b, c); }

// Clamp to [-limit, limit]; NaN passes through unchanged (as numpy.clip does).
template <class A>
__device__ __forceinline__ A gc_clip(A a, A limit) {
    return a > limit ? limit : (a < -limit ? -limit : a);
}

// Zoneout's mix of a state (docs/spec.md, section 11.3): z*old + (1-z)*new.
template <class A>
__device__ __forceinline__ A gc_zoned(A z, A old_value, A new_value) {
    return z * old_value + ((A)1 - z) * new_value;
}

// First index and stride of a grid-stride loop over the x dimension.
template <class Index>
__device__ __forceinline__ Index gc_first_x() {
    return (Index)blockIdx.x * (Index)blockDim.x + (Index)threadIdx.x;
}
template <class Index>
__device__ __forceinline__ Index gc_stride_x() {
    return (Index)blockDim.x * (Index)gridDim.x;
}

// Elementwise kernels over n = B*H elements run their body with 32-bit unsigned index
// arithmetic (64-bit division is several times slower on the GPU) when every offset they
// form, at most 4*n, fits: n <= GC_UINT32_SAFE_COUNT.
#define GC_UINT32_SAFE_COUNT 1073741823LL

#endif  // GRADCELLS_COMMON_CUH
