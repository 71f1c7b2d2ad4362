"""Vectorizable activations for the Numba kernels: ``tanh``, ``sigmoid`` and ``typed``.

Inside jitted code each call is replaced by an implementation chosen by the argument's type
and inlined; every implementation is branch-free arithmetic (selects, no libm calls), so a
loop over contiguous arrays that calls it compiles to SIMD code (AVX2/AVX-512) under
``error_model="numpy"``. A loop calling libm's scalar ``tanh`` costs ~20 ns an element and
does not vectorize. Called from Python they compute the same values (each compiles once).

Both precisions use Cephes' tanh, made branch-free (both branches are computed and one is
selected), with a fused multiply-add where the processor has one (``llvm.fmuladd``):

    |z| < 0.625:  tanh z = z + z·s·P(s),  s = z²            (float64: z + z·s·P(s)/Q(s))
    otherwise:    tanh z = 1 - 2/(e^{2|z|} + 1)
                  e^y = 2^k·e^r,  y = k·ln2 + r (Cody-Waite),  |r| <= ln2/2,
                  e^r by Cephes' polynomial (float32) or Padé form (float64),
                  2^k assembled directly in the exponent bits (``_from_bits``)

|z| is clamped first (9.02 in float32, 22 in float64), where tanh already rounds to ±1, so
nothing overflows; the sign is restored with copysign, so the result is exactly odd, and NaN
gives NaN. Accuracy, measured by ``tests/test_cpu_activations.py``:

- float32: at most 1.33 units in the last place of the exact tanh over every float32 input
  (worst at z = 0.62831, just past the branch switch; the test's bound is
  ``TANH32_MAX_ULP`` = 1.5). Checked exhaustively on [2^-14, 9.02] against the C library's
  float64 tanh; below 2^-14 the result is the input itself, which is the correctly rounded
  tanh there; from 9.02 on it is exactly ±1, as is the correctly rounded tanh. This costs
  about as much as a rational minimax z·P(z²)/Q(z²) evaluated in float32 (one division
  each), which measured 6.3 ulp; evaluating that one in float64 gives 0.52 ulp at 2.4x the
  time;
- float64: relative error at most ``TANH64_MAX_REL`` = 1e-15; measured 2.2e-16 against
  mpmath (at the 200 sampled points furthest from NumPy's tanh), and within 4.5e-16 of
  NumPy's tanh everywhere sampled. About 2.5 ns an element, NumPy's tanh 23 ns here.

``sigmoid(z) = 0.5·tanh(0.5·z) + 0.5`` in the argument's own precision: no overflow for any
finite z (the house formula, as the reference uses).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ._compile import helper

TANH32_MAX_ULP = 1.5
TANH64_MAX_REL = 1e-15

_F32 = np.float32


# --- bit-level intrinsics --------------------------------------------------------------------

@intrinsic
def fmuladd(typingctx, a, b, c):
    """a·b + c, fused into one rounding where the processor has FMA (``llvm.fmuladd``)."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        llty = args[0].type
        fn = builder.module.declare_intrinsic(
            "llvm.fmuladd", [llty], ir.FunctionType(llty, [llty, llty, llty]))
        return builder.call(fn, args)

    return a(a, b, c), codegen


_UINT_OF = {types.float32: types.uint32, types.float64: types.uint64}
_FLOAT_OF = {types.uint32: types.float32, types.uint64: types.float64}


@intrinsic
def _bits(typingctx, value):
    """The IEEE-754 bits of a float32/float64 as uint32/uint64 (a register bitcast)."""
    if value not in _UINT_OF:
        return None
    uint = _UINT_OF[value]

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(uint.bitwidth))

    return uint(value), codegen


@intrinsic
def _from_bits(typingctx, bits):
    """The float32/float64 whose IEEE-754 bits are the uint32/uint64 ``bits``."""
    if bits not in _FLOAT_OF:
        return None
    flt = _FLOAT_OF[bits]

    def codegen(context, builder, signature, args):
        llty = ir.FloatType() if flt == types.float32 else ir.DoubleType()
        return builder.bitcast(args[0], llty)

    return flt(bits), codegen


# --- float32: Cephes tanhf / expf ------------------------------------------------------------
_CLAMP32 = _F32(9.02)                    # float32 tanh rounds to 1 from 9.010914 on
_SMALL32 = _F32(0.625)
_S32_0, _S32_1, _S32_2, _S32_3, _S32_4 = (_F32(c) for c in (
    -3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2,
    -5.70498872745e-3))
_E32_0, _E32_1, _E32_2, _E32_3, _E32_4, _E32_5 = (_F32(c) for c in (
    5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3,
    1.9875691500e-4))
_LOG2E32 = _F32(1.44269504088896341)
_SHIFT32 = _F32(12582912.0)             # 1.5·2^23: adding it rounds to an integer
_LN2_HI32, _LN2_LO32 = _F32(0.693359375), _F32(-2.12194440e-4)
_ONE32, _TWO32, _HALF32 = _F32(1.0), _F32(2.0), _F32(0.5)
_BIAS32, _MANT32 = np.uint32(127), np.uint32(23)


@helper
def tanh32(z):
    """float32 tanh (module docstring): within 1.5 ulp over all float32."""
    a = abs(z)
    a = _CLAMP32 if a > _CLAMP32 else a          # NaN fails the test and stays NaN
    s = a * a
    poly = fmuladd(fmuladd(fmuladd(fmuladd(_S32_4, s, _S32_3), s, _S32_2), s, _S32_1), s,
                   _S32_0)
    small = fmuladd(a * s, poly, a)
    y = a + a
    shifted = fmuladd(y, _LOG2E32, _SHIFT32)    # low mantissa bits hold k = round(y/ln2)
    k = shifted - _SHIFT32
    r = fmuladd(-k, _LN2_LO32, fmuladd(-k, _LN2_HI32, y))
    er = fmuladd(r * r, fmuladd(fmuladd(fmuladd(fmuladd(fmuladd(
        _E32_5, r, _E32_4), r, _E32_3), r, _E32_2), r, _E32_1), r, _E32_0), r) + _ONE32
    e = er * _from_bits(np.uint32((_bits(shifted) + _BIAS32) << _MANT32))   # ·2^k
    large = _ONE32 - _TWO32 / (e + _ONE32)
    return math.copysign(small if a < _SMALL32 else large, z)


# --- float64: Cephes tanh / exp --------------------------------------------------------------
_CLAMP64 = 22.0                           # tanh(22) == 1.0 in float64
_SMALL64 = 0.625
# tanh z = z + z·s·P(s)/Q(s), s = z² (Q monic)
_TP0, _TP1, _TP2 = -9.64399179425052238628e-1, -9.92877231001918586564e1, \
    -1.61468768441708447952e3
_TQ0, _TQ1, _TQ2 = 1.12811678491632931402e2, 2.23548839060100448583e3, \
    4.84406305325125486048e3
# e^r = (q + r·p)/(q - r·p), p = P(r²), q = Q(r²)
_EP0, _EP1, _EP2 = 1.26177193074810590878e-4, 3.02994407707441961300e-2, \
    9.99999999999999999910e-1
_EQ0, _EQ1, _EQ2, _EQ3 = 3.00198505138664455042e-6, 2.52448340349684104192e-3, \
    2.27265548208155028766e-1, 2.00000000000000000009e0
_LN2_HI64, _LN2_LO64 = 6.93145751953125e-1, 1.42860682030941723212e-6
_LOG2E64 = 1.4426950408889634
_SHIFT64 = 6755399441055744.0             # 1.5·2^52
_BIAS64, _MANT64 = np.uint64(1023), np.uint64(52)


@helper
def tanh64(z):
    """float64 tanh (module docstring): relative error within 1e-15."""
    a = abs(z)
    a = _CLAMP64 if a > _CLAMP64 else a
    s = a * a
    tp = fmuladd(fmuladd(_TP0, s, _TP1), s, _TP2)
    tq = fmuladd(fmuladd(s + _TQ0, s, _TQ1), s, _TQ2)
    small_num = a * fmuladd(s, tp, tq)            # tanh = small_num / tq
    y = a + a
    shifted = fmuladd(y, _LOG2E64, _SHIFT64)
    k = shifted - _SHIFT64
    r = fmuladd(-k, _LN2_LO64, fmuladd(-k, _LN2_HI64, y))
    rr = r * r
    rp = r * fmuladd(fmuladd(_EP0, rr, _EP1), rr, _EP2)
    q = fmuladd(fmuladd(fmuladd(_EQ0, rr, _EQ1), rr, _EQ2), rr, _EQ3)
    scale = _from_bits((_bits(shifted) + _BIAS64) << _MANT64)          # 2^k
    large_num = 2.0 * (q - rp)                     # tanh = 1 - large_num / large_den
    large_den = fmuladd(scale, q + rp, q - rp)
    small = a < _SMALL64
    ratio = (small_num if small else large_num) / (tq if small else large_den)
    return math.copysign(ratio if small else 1.0 - ratio, z)


# --- the generic names the kernels call ------------------------------------------------------

def tanh(z):
    """tanh(z) for a float32 or float64 scalar; inside Numba kernels it is vectorizable."""
    return tanh32(z) if isinstance(z, np.float32) else tanh64(z)


def sigmoid(z):
    """σ(z) = 0.5·tanh(0.5·z) + 0.5 in the precision of ``z``; never overflows."""
    if isinstance(z, np.float32):
        return _HALF32 * tanh32(_HALF32 * z) + _HALF32
    return 0.5 * tanh64(0.5 * z) + 0.5


def typed(value, like):
    """``value`` converted to the dtype of the array ``like`` (a compile-time constant)."""
    return like.dtype.type(value)


@overload(tanh)
def _tanh_impl(z):
    if z == types.float32:
        return lambda z: tanh32(z)
    if z == types.float64:
        return lambda z: tanh64(z)
    return None


@overload(sigmoid)
def _sigmoid_impl(z):
    if z == types.float32:
        return lambda z: _HALF32 * tanh32(_HALF32 * z) + _HALF32
    if z == types.float64:
        return lambda z: 0.5 * tanh64(0.5 * z) + 0.5
    return None


@overload(typed)
def _typed_impl(value, like):
    if isinstance(like, types.Array) and like.dtype == types.float32:
        return lambda value, like: np.float32(value)
    if isinstance(like, types.Array) and like.dtype == types.float64:
        return lambda value, like: np.float64(value)
    return None
