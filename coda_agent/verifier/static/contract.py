"""The contract's tables: what a candidate may import, name, call and read, in one place.

The rules (the family modules beside this one) and the prompt's contract text read these; changing one changes
both what is refused and what the model is told.
"""

from __future__ import annotations

import ast

from ... import primitives
from ...primitives import _values

PRIMITIVES = "coda_agent.primitives"
ALLOWED_MODULES = ("math", "torch", PRIMITIVES)

#: torch functions host glue may call (elementwise math, reductions, creation, shape and indexing; no GEMMs).
TORCH_FUNCTIONS = frozenset({
    "abs", "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "neg", "negative",
    "rsub", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "pow", "square", "reciprocal",
    "sigmoid", "tanh", "sin", "cos", "erf", "sign", "floor", "ceil", "round", "trunc", "clamp", "clip",
    "minimum", "maximum", "where", "lerp", "addcmul", "addcdiv", "sum", "mean", "amax", "amin", "max", "min",
    "argmax", "argmin", "logsumexp", "cumsum", "isfinite", "isnan", "isinf", "nan_to_num", "zeros", "ones",
    "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "arange", "tensor", "cat",
    "concat", "stack", "gather", "index_select", "take_along_dim", "reshape", "flatten", "squeeze",
    "unsqueeze", "transpose", "permute", "chunk", "split", "narrow", "broadcast_to", "repeat_interleave",
    "flip", "roll", "tril", "triu", "softmax", "log_softmax", "eq", "ne", "lt", "le", "gt", "ge",
})
#: torch attributes that are values, not functions (dtypes).
TORCH_VALUES = frozenset({
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool", "float",
    "half", "double", "long", "int", "Tensor",
})
#: The torch dtypes (``TORCH_VALUES`` less the ``Tensor`` type).
TORCH_DTYPES = TORCH_VALUES - {"Tensor"}
#: Methods host glue may call on tensors, dicts and lists. Not ``stride``: a size-1 dimension's stride differs
#: between meta and real tensors after many ops (``empty_like(x.t()[:, :1])``), which told the bench shapes'
#: meta runs apart from the calls that compute (a red-team pass).
METHODS = frozenset({
    "t", "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "expand",
    "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "chunk", "split", "narrow", "unbind",
    "repeat", "repeat_interleave", "size", "dim", "numel", "float", "half", "bfloat16", "double",
    "int", "long", "bool",
    "to", "type_as", "clone", "detach", "new_zeros", "new_ones", "new_full", "new_empty", "masked_fill",
    "fill_", "zero_", "copy_", "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "neg_",
    "abs", "exp", "exp_", "log", "log1p", "sqrt", "rsqrt", "rsqrt_", "pow", "square", "reciprocal", "sigmoid",
    "tanh", "sin", "cos", "clamp", "clamp_", "clamp_min", "clamp_max", "sum", "mean", "amax", "amin", "max",
    "min", "argmax", "logsumexp", "cumsum", "gather", "index_select", "isfinite", "isnan", "nan_to_num",
    "where", "lerp", "roll", "flip", "is_contiguous", "eq", "ne", "lt", "le", "gt", "ge",
    "get", "items", "keys", "values", "append", "extend", "update", "pop", "copy", "index", "count",
    # the method form of every torch function above that torch.Tensor has as a method
    "addcdiv", "addcmul", "argmin", "broadcast_to", "ceil", "clip", "divide", "erf", "exp2", "expm1", "floor",
    "isinf", "log2", "log_softmax", "maximum", "minimum", "multiply", "negative", "round", "sign", "softmax",
    "subtract", "take_along_dim", "tril", "triu", "true_divide", "trunc",
    # and the in-place forms of the element-wise ones (an input written in place is refused when it runs)
    "abs_", "addcdiv_", "addcmul_", "ceil_", "clip_", "erf_", "exp2_", "expm1_", "floor_", "lerp_", "log1p_",
    "log2_", "log_", "nan_to_num_", "pow_", "reciprocal_", "round_", "sigmoid_", "sign_", "sqrt_", "square_",
    "tanh_", "trunc_",
})
#: Attributes that may be read without calling them (``device`` only as a new tensor's ``device=``).
DATA_ATTRS = frozenset({"shape", "dtype", "device", "T", "mT", "ndim"})
#: Builtins a candidate may name.
BUILTINS = frozenset({
    "len", "range", "min", "max", "abs", "sum", "round", "divmod", "pow", "int", "float", "bool", "tuple",
    "list", "dict", "set", "frozenset", "zip", "enumerate", "map", "filter", "sorted", "reversed", "any",
    "all", "isinstance", "slice", "print", "iter", "next", "True", "False", "None", "ValueError",
    "RuntimeError", "TypeError", "AssertionError", "NotImplementedError",
})
#: What an epilogue fn's body may call: the primitives' value functions (``math`` too, on Python numbers).
EPILOGUE_FUNCTIONS = frozenset(_values.__all__) & frozenset(primitives.__all__)
#: Builtins an epilogue fn's body may call (on Python numbers).
EPILOGUE_BUILTINS = frozenset({"float", "int"})
#: The torch functions and tensor methods that make a tensor, whose ``device=`` may be ``x.device``.
PLACING = frozenset({"to", "new_zeros", "new_ones", "new_full", "new_empty", "zeros", "ones", "full", "empty",
                     "zeros_like", "ones_like", "full_like", "empty_like", "arange", "tensor"})
#: The torch functions that make a tensor from nothing: they must say where (``device=x.device``).
FACTORIES = frozenset({"zeros", "ones", "full", "empty", "arange", "tensor"})
#: What an annotation may be built from: names, dotted names, subscripts, tuples and constants (and ``|``).
TYPE_NODES = (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Constant, ast.Load, ast.BitOr)
#: Binary operators an epilogue fn's values support alike on the emulator and the GPU (``%``, ``//``, ``**``
#: differ).
EPILOGUE_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
#: Control flow on values that the emulator's tensors and the GPU's symbolic values do not share.
EPILOGUE_BANNED: dict[type, str] = {
    ast.Compare: "comparisons", ast.BoolOp: "and/or", ast.IfExp: "conditional expressions",
    ast.If: "if statements", ast.While: "while loops", ast.For: "for loops", ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions", ast.DictComp: "comprehensions", ast.GeneratorExp: "generator expressions",
    ast.Starred: "starred expressions",
}
OP_SYMBOLS = {ast.Mod: "%", ast.FloorDiv: "//", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&",
              ast.BitOr: "|",
               ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
#: Builtins that may name a type in an annotation (``-> dict[str, torch.Tensor]``), though not be called.
ANNOTATION_BUILTINS = frozenset({"str", "object", "type"})
#: The one future import: it changes no semantics a check relies on.
FUTURE_IMPORTS = frozenset({"annotations"})
#: The primitives a top-level constant may call: frozen declarations (a value function such as ``pack`` or
#: ``exp`` would make a mutable object, a place to keep state across calls).
DECLARATIONS = frozenset({"Config", "ColVecLoad", "ColVecReduce", "ColVecSelect", "OnlineLSEReduce",
                          "RowVecLoad", "RowVecReduce"})
#: Top-level values a constant declaration may be built from (besides literals and primitives' names).
CONST_NODES = (ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Set, ast.UnaryOp, ast.BinOp, ast.Name,
               ast.Load,
                ast.keyword, ast.operator, ast.unaryop, ast.Attribute, ast.Call, ast.Subscript, ast.Slice)

#: Constructs refused wherever they stand, by what the message calls them.
BANNED_CONSTRUCTS: dict[type, str] = {
    ast.ClassDef: "class definitions", ast.Global: "global statements (state across calls)",
    ast.Nonlocal: "nonlocal statements (state across calls)", ast.Try: "try/except blocks (fallback paths)",
    ast.TryStar: "try/except blocks (fallback paths)", ast.AsyncFunctionDef: "async functions",
    ast.Await: "await expressions", ast.Yield: "generators", ast.YieldFrom: "generators",
    ast.With: "with blocks", ast.AsyncWith: "with blocks", ast.AsyncFor: "async loops",
    ast.Match: "match statements", ast.NamedExpr: "assignment expressions (:=)",
}
