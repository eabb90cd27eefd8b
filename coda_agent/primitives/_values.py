"""Value math for epilogue fns, valid in both backends.

Inside an epilogue fn a value is either a torch tensor (the CPU emulator evaluates the fn once over
whole FP32 tiles) or a CuTe DSL ``Float32`` scalar (QuACK traces the fn once per accumulator element).
Each function dispatches on the type of its argument, so one fn body serves both and the candidate never
chooses a backend. On the QuACK side the functions are QuACK's own (``quack.activation``,
``quack.epilogue.pexp``), the ones its library mods use.

The docstrings state each function's GPU precision: the PTX instruction it lowers to (read off the sm_90a PTX
of an epilogue that calls every function, built with ``CUTE_DSL_KEEP=ptx``: ``ex2.approx.ftz``,
``lg2.approx.ftz``, ``sqrt.rn``, ``rsqrt.approx``, ``sin/cos.approx``, ``tanh.approx``, ``rcp.approx.ftz``,
``div.rn``) and that instruction's documented maximum error (PTX ISA; CUDA C++ Programming Guide, intrinsic
functions). :data:`PRECISION` is what every function shares, the API reference's introduction to them.
"""

from __future__ import annotations

from typing import Any

import torch

Value = Any  # a torch.Tensor (emulator) or a CuTe DSL Float32 (QuACK trace)

#: What all value math shares on the GPU (the API reference's introduction to the value functions).
PRECISION = """Values are FP32: `acc`, `c` and every operand arrive in FP32 whatever their dtype, a reduce
sink takes its value in FP32, and D and the extra outputs are rounded once (to nearest even) to their dtype as
they are stored (only inside the tensor: at a partial last tile, only reduce sinks see the padding). Value
functions take numbers too (`maximum(acc, 0.0)`). On the GPU `+ - *` are FP32 (a multiply-add may fuse into an
FMA); `/` is IEEE division (`div.rn.f32`, ~10 instructions: multiply by a reciprocal constant instead). The
functions below run on the special-function unit (a quarter of the FMA rate) in `.approx` forms (subnormals
flushed), errors stated; the emulator's FP32 is more exact, so leave a margin where an output sums many
approximated terms; the emulator fuses only where QuACK's dswiglu and sin/cos do (its GEMM: torch's FP32
matmul). Numbers (constants, scalar
operands) enter the kernel rounded once to FP32. An expression the fn repeats, written the same way, is
computed once (`tanh(x * (K0 + K1 * (x * x)))`, `gelu_tanh`'s K0, K1, beside `gelu_tanh(x)` adds no
tanh). On the H200 (2026-12), element-mode kernels without C ran at 0.98-1.04x cuBLAS; reading C or packed
pairs cost more (0.83-0.96x)."""


class Pair:
    """Two lanes of a paired value (``acc_pair`` / ``packed`` modes) with lane-wise ``+ - *``.

    Scalars and unpaired values broadcast to both lanes, so ``acc * rstd`` works before ``unpack``.
    There is no division and no math function on a Pair: ``unpack`` it first.
    """

    __slots__ = ("a", "b")

    def __init__(self, a: Value, b: Value) -> None:
        self.a, self.b = a, b

    @staticmethod
    def _lanes(v: Value) -> tuple[Value, Value]:
        return (v.a, v.b) if isinstance(v, Pair) else (v, v)

    def __add__(self, other: Value) -> Pair:
        oa, ob = Pair._lanes(other)
        return Pair(self.a + oa, self.b + ob)

    __radd__ = __add__

    def __mul__(self, other: Value) -> Pair:
        oa, ob = Pair._lanes(other)
        return Pair(self.a * oa, self.b * ob)

    __rmul__ = __mul__

    def __sub__(self, other: Value) -> Pair:
        oa, ob = Pair._lanes(other)
        return Pair(self.a - oa, self.b - ob)

    def __rsub__(self, other: Value) -> Pair:
        oa, ob = Pair._lanes(other)
        return Pair(oa - self.a, ob - self.b)

    def __neg__(self) -> Pair:
        return Pair(-self.a, -self.b)

    def __repr__(self) -> str:
        return f"Pair({self.a!r}, {self.b!r})"


def _emulated(x: Value) -> bool:
    return isinstance(x, (torch.Tensor, Pair, int, float))


def _scalar_only(name: str, x: Value) -> None:
    if isinstance(x, Pair) or type(x).__name__ == "Pair":
        raise TypeError(f"{name}() takes one lane, not a Pair: split it first with `a, b = unpack(v)`")


def _t(x: Value) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float32)


#: FP32's smallest normal number: the GPU's ``.ftz`` instructions read and write anything smaller as 0.
FLT_MIN = torch.finfo(torch.float32).tiny


def _flushed(t: torch.Tensor) -> torch.Tensor:
    """``t`` with 0 where it is subnormal, as an ``.ftz`` instruction has it: the emulator's torch keeps
    subnormals, so a term scaled up from exp(-88) was 1 on the CPU and 0 on the GPU."""
    return t.masked_fill(t.abs() < FLT_MIN, 0.0)


def _fma(a: Value, b: Value, c: Value) -> torch.Tensor:
    """a * b + c rounded once to FP32, as the FFMA ptxas fuses it into (the product exact in FP64)."""
    return (_t(a).double() * _t(b).double() + _t(c).double()).float()


_LOG2_E = 1.4426950408889634


def _sigmoid(t: torch.Tensor) -> torch.Tensor:
    """QuACK's sigmoid, step by step: ``rcp.approx.ftz(ex2.approx.ftz(x * -log2(e)) + 1)``, so an
    overflowing exp gives 0 and a subnormal one 1, as on the GPU."""
    return _flushed(torch.reciprocal(_flushed(torch.exp2(t * -_LOG2_E)) + 1.0))


def pack(a: Value, b: Value) -> Value:
    """Join two lanes into a paired value: return ``{"D": pack(x, y)}`` to write both lanes of a pair."""
    if _emulated(a):
        return Pair(a, b)
    from quack.epilogue import pack as quack_pack

    return quack_pack(a, b)


def unpack(v: Value) -> tuple[Value, Value]:
    """Split a paired value into its lanes: ``gate, up = unpack(acc)`` (acc_pair) or ``x, y = unpack(c)``
    (packed)."""
    if isinstance(v, Pair):
        return v.a, v.b
    if isinstance(v, torch.Tensor):
        raise TypeError(
            "unpack() got an unpaired value: declare mode='acc_pair' (adjacent accumulator columns) "
            "or mode='packed' (interleaved 16-bit C/D) in @epilogue"
        )
    from quack.epilogue import unpack as quack_unpack

    return quack_unpack(v)


def exp(x: Value) -> Value:
    """e**x.

    GPU: ``ex2.approx.ftz.f32`` of ``x * log2(e)`` (CUDA's ``__expf``): at most ``2 + 1.2 |x|`` ulp (an ulp is
    6e-8 relative); results below 1.2e-38 flush to 0. One special-function op.
    """
    _scalar_only("exp", x)
    if _emulated(x):
        return _flushed(torch.exp(_t(x)))
    from quack.epilogue import pexp

    return pexp(x)


def log(x: Value) -> Value:
    """Natural logarithm.

    GPU: ``lg2.approx.ftz.f32`` times ln 2 (CUDA's ``__logf``): absolute error at most 2^-21.4 (4e-7) for x in
    [0.5, 2], at most 3 ulp elsewhere; a subnormal x reads as 0 (-inf). One special-function op.
    """
    _scalar_only("log", x)
    if _emulated(x):
        return torch.log(_flushed(_t(x)))
    import cutlass.cute as cute

    return cute.math.log(x, fastmath=True)


def sqrt(x: Value) -> Value:
    """Square root.

    GPU: ``sqrt.rn.f32``, IEEE correctly rounded (exact to FP32); several instructions.
    """
    _scalar_only("sqrt", x)
    if _emulated(x):
        return torch.sqrt(_t(x))
    import cutlass.cute as cute

    return cute.math.sqrt(x)


def rsqrt(x: Value) -> Value:
    """1 / sqrt(x).

    GPU: ``rsqrt.approx.f32``: at most 2 ulp (relative error about 2^-22). One special-function op.
    """
    _scalar_only("rsqrt", x)
    if _emulated(x):
        return torch.rsqrt(_t(x))
    import cutlass.cute as cute

    return cute.math.rsqrt(x)


_TWO_PI = 6.283185307179586
_INV_TWO_PI = 0.15915494309189535
_ROUND_BIAS = 12582912.0  # 1.5 * 2**23: (t + bias) - bias rounds |t| < 2**22 to the nearest integer


def _reduced_radians(x: Value) -> Value:
    """x mod 2pi, in [-pi, pi], reduced in turns (as QuACK's RoPE epilogues do).

    The hardware sin/cos approximations (MUFU) are accurate only near zero and libdevice's precise sinf is
    slow in an epilogue; reducing in turns is one multiply, a round done with full-rate adds (the
    magic-bias trick, not FRND on the quarter-rate pipe) and a subtract.
    """
    import cutlass.cute as cute

    t = x * _INV_TWO_PI
    q = cute.math.fma(t, 1.0, _ROUND_BIAS) - _ROUND_BIAS
    return (t - q) * _TWO_PI


def _turns_reduced(t: torch.Tensor) -> torch.Tensor:
    """:func:`_reduced_radians` on the emulator, rounding as the sm_90a build does (ptxas fuses x / 2pi into
    both FFMAs): sin(2**100) is sin(0) there, where torch's exact reduction gives -0.87."""
    q = _fma(t, _INV_TWO_PI, _ROUND_BIAS) - _ROUND_BIAS
    return _fma(t, _INV_TWO_PI, -q) * _TWO_PI


def sin(x: Value) -> Value:
    """Sine (radians).

    GPU: ``sin.approx.f32`` after reducing x to [-pi, pi] in turns: absolute error at most 2^-21.4 (4e-7,
    CUDA's ``__sinf``) plus the FP32 rounding of x / 2pi (|x| * 6e-8 rad).
    """
    _scalar_only("sin", x)
    if _emulated(x):
        return torch.sin(_turns_reduced(_t(x)))
    import cutlass.cute as cute

    return cute.math.sin(_reduced_radians(x), fastmath=True)


def cos(x: Value) -> Value:
    """Cosine (radians); on the GPU computed like :func:`sin` (``cos.approx.f32``, the same error)."""
    _scalar_only("cos", x)
    if _emulated(x):
        return torch.cos(_turns_reduced(_t(x)))
    import cutlass.cute as cute

    return cute.math.cos(_reduced_radians(x), fastmath=True)


def erf(x: Value) -> Value:
    """Error function (exact GELU: ``0.5 * x * (1 + erf(x * 0.7071067811865476))``).

    GPU: ``cute.math.erf`` (QuACK's exact GELU's), an ``ex2.approx`` and an ``rcp.approx`` in a
    polynomial: absolute error at most 5e-7 (H100, against FP64).
    """
    _scalar_only("erf", x)
    if _emulated(x):
        return torch.erf(_t(x))
    import cutlass.cute as cute

    return cute.math.erf(x, fastmath=True)


def maximum(x: Value, y: Value) -> Value:
    """Element-wise max of two values (the only data-dependent select an fn needs for clamping). Exact.

    NaN: the GPU's ``max.f32`` returns the non-NaN operand, and so does the emulator (torch.fmax).
    """
    _scalar_only("maximum", x)
    if _emulated(x):
        return torch.fmax(_t(x), _t(y))
    import cutlass.cute as cute

    return cute.math.max(x, y)


def minimum(x: Value, y: Value) -> Value:
    """Element-wise min of two values. Exact (NaN: as :func:`maximum`)."""
    _scalar_only("minimum", x)
    if _emulated(x):
        return torch.fmin(_t(x), _t(y))
    import cutlass.cute as cute

    return cute.math.min(x, y)


def tanh(x: Value) -> Value:
    """Hyperbolic tangent.

    GPU: ``tanh.approx.f32`` (one special-function op): relative error up to about 2^-11 (5e-4), the least
    precise here: below bf16's rounding (2^-9) but it shows in FP32 outputs and in sums over many columns.
    """
    _scalar_only("tanh", x)
    if _emulated(x):
        return torch.tanh(_t(x))
    from quack import activation

    return activation.tanh(x)


def sigmoid(x: Value) -> Value:
    """1 / (1 + exp(-x)).

    GPU: ``ex2.approx.ftz.f32`` then ``rcp.approx.ftz.f32`` (1 ulp): a few ulp relative; 0, not NaN, where
    exp(-x) overflows (the emulator too). Two special-function ops.
    """
    _scalar_only("sigmoid", x)
    if _emulated(x):
        return _sigmoid(_t(x))
    from quack import activation

    return activation.sigmoid(x)


def silu(x: Value) -> Value:
    """x * sigmoid(x) (a.k.a. swish).

    GPU: :func:`sigmoid` times x: a few ulp relative. Two special-function ops.
    """
    _scalar_only("silu", x)
    if _emulated(x):
        t = _t(x)
        return t * _sigmoid(t)  # as QuACK's: silu(-inf) is -inf * 0, NaN
    from quack import activation

    return activation.silu(x)


def relu(x: Value) -> Value:
    """max(x, 0), the same as ``maximum(x, 0.0)``.

    GPU: ``max.f32``, exact; relu(NaN) is 0 (the max returns its non-NaN operand) and relu(-0.0) is +0.0
    (the compiler folds it so), on the emulator too.
    """
    _scalar_only("relu", x)
    if _emulated(x):
        t = _t(x)
        return torch.where(t > 0, t, 0.0)
    from quack import activation

    return activation.relu(x)


def gelu_tanh(x: Value) -> Value:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    GPU: ``tanh(x * (K0 + K1 * (x * x)))``, K0 = sqrt(2/pi), K1 = 0.044715 K0 (``tanh.approx.f32``): absolute
    error up to about ``0.5 |x| * 2^-11``.
    """
    _scalar_only("gelu_tanh", x)
    if _emulated(x):
        return torch.nn.functional.gelu(_t(x), approximate="tanh")
    from quack import activation

    return activation.gelu_tanh_approx(x)


def swiglu(gate: Value, up: Value) -> Value:
    """SwiGLU: silu(gate) * up.

    GPU: :func:`silu`'s precision (a few ulp relative).
    """
    _scalar_only("swiglu", gate)
    _scalar_only("swiglu", up)
    if _emulated(gate):
        g = _t(gate)
        return g * _sigmoid(g) * up
    from quack import activation

    return activation.swiglu(gate, up)


def dswiglu(gate: Value, up: Value, dout: Value) -> tuple[Value, Value, Value]:
    """SwiGLU backward: returns ``(dgate, dup, out)``.

    With s = sigmoid(gate): dgate = dout * up * s * (1 + gate * (1 - s)), dup = dout * silu(gate),
    out = silu(gate) * up (the forward value, recomputed for free).

    GPU: through :func:`sigmoid` (``ex2.approx`` + ``rcp.approx``): a few ulp relative.
    """
    for v in (gate, up, dout):
        _scalar_only("dswiglu", v)
    if _emulated(gate):
        # QuACK's order and fused multiply-adds: (s - silu * s) * dout + silu * dout, which is 0 where the
        # textbook form is 1 at a gate of 1e30 (a red-team pass told the backends apart by it)
        g = _t(gate)
        s = _sigmoid(g)
        silu_g = g * s
        silu_dout = silu_g * dout
        dgate = _fma(_fma(-silu_g, s, s), dout, silu_dout) * up
        return dgate, silu_dout, silu_g * up
    from quack import activation

    return activation.dswiglu(gate, up, dout)


__all__ = [
    "Pair",
    "cos",
    "dswiglu",
    "erf",
    "exp",
    "gelu_tanh",
    "log",
    "maximum",
    "minimum",
    "pack",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "swiglu",
    "tanh",
    "unpack",
]
