"""What a candidate's call launched: the GPU kernel trace, and on the CPU the launch estimate from the op log.

Both are recorded in the runner and judged here, in the checker, by the same rules: every task GEMM runs
through ``primitives.gemm`` (a QuACK kernel on the GPU, a logged gemm call on the CPU), no cuBLAS/torch
matmul, nothing on a side stream, no GEMM-sized work on the host, and no more launches than the budget.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..tasks.model import Task
from .verdict import Outcome

KernelKind = Literal["quack", "matmul", "marker", "other"]

#: The fused GEMM + epilogue kernels ``primitives.gemm`` launches, named by the CuTe DSL after their class's
#: module: QuACK's (``kernel_cutlass_kernel_quack...``) and the harness's load-ahead kernel
#: (``kernel_cutlass_kernel_coda_agentprimitives_ahead...``, ``primitives/_ahead.py``). Candidates cannot
#: build CuTe DSL kernels of their own: the static check refuses the imports.
QUACK_KERNEL = re.compile(r"^kernel_cutlass_kernel_(quack|coda_agentprimitives_ahead)")
#: cuBLAS/cuBLASLt, CUTLASS-in-cuBLAS and Inductor matmul kernels: a GEMM that bypassed primitives.gemm.
MATMUL_KERNEL = re.compile(
    r"nvjet|gemm|gemv|xmma|cublas|cutlass|wgmma|tensorop|[sh]1688|[sh]16816|splitKreduce|dot_kernel|"
    r"triton_tem",
    re.IGNORECASE,
)
#: The runner's marker (``torch.cuda._sleep``), launched before each call: the trace splits there.
MARKER_KERNEL = re.compile(r"spin_kernel")

#: Kernels QuACK's host side launches after the GEMM to finalise a reduce, by sink (measured on the H200:
#: a partial-buffer sum or amax is one kernel; torch.logsumexp over the partials is nine; a select sink's
#: NaN-filled buffer is one fill).
FINALISE_LAUNCHES = {"ColVecReduce": 1, "RowVecReduce": 1, "OnlineLSEReduce": 9, "ColVecSelect": 1}
#: Host ops that launch more than one kernel on a GPU, by the op log's name (without the overload), and how
#: many (torch.logsumexp on the H200: an amax, a mask of infinite maxima in three, a subtraction, an exp, a
#: sum, a log and an add; the rest by bench/probes/host_op_launches.py on an H100, torch 2.11,
#: bench/results/h100-2026-12-07-a-host-ops.log, which found every other common op one kernel, a contiguous
#: clone none). Every other host op that computes or fills is one.
HOST_OP_LAUNCHES = {"aten::logsumexp": 9, "aten::topk": 2, "aten::sort": 3, "aten::constant_pad_nd": 2}
#: What makes a host op whose aten name a kernel's author would not recognise (said beside it in the budget's
#: refusal).
HOST_OP_CAUSES = {"aten::_local_scalar_dense": "a 1-element tensor read to the host: a 1-element operand or "
                                               "float(t)"}
#: Host ops that launch no kernel (allocation without a fill).
NO_KERNEL_OPS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                 "aten::lift_fresh"}
#: Host ops the GPU would run as a matmul kernel (cuBLAS, cuDNN): the CPU's counterpart of a ``matmul``
#: kernel.
MATMUL_OPS = frozenset(f"aten::{op}" for op in (
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv", "dot", "vdot", "matmul", "linear",
    "_addmm_activation", "_scaled_mm", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "mkldnn_convolution",
    "_mm_plus_mm", "_int_mm", "tensordot", "einsum",
))


def classify_kernel(name: str) -> KernelKind:
    """``quack`` for the fused kernels of :data:`QUACK_KERNEL`, ``matmul`` for cuBLAS-style GEMMs, the
    runner's marker, else ``other``."""
    if QUACK_KERNEL.match(name):
        return "quack"
    if MARKER_KERNEL.search(name):
        return "marker"
    if MATMUL_KERNEL.search(name):
        return "matmul"
    return "other"


@dataclass(frozen=True)
class KernelEvent:
    """One kernel the profiler saw: its name, stream and launch order (CUPTI correlation id)."""

    name: str
    stream: int
    order: int

    @property
    def kind(self) -> KernelKind:
        return classify_kernel(self.name)


def kernels_from_chrome_trace(trace: Mapping[str, Any]) -> list[KernelEvent]:
    """Kernel events of a ``torch.profiler`` Chrome trace, in launch order."""
    events = []
    for e in trace.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("cat") != "kernel":
            continue
        args = e.get("args", {}) if isinstance(e.get("args"), dict) else {}
        order = args.get("correlation", e.get("ts", 0)) or 0
        stream = args.get("stream", e.get("tid", -1))
        events.append(KernelEvent(name=str(e.get("name", "")),
                                  stream=int(stream if stream is not None else -1), order=int(order)))
    return sorted(events, key=lambda k: k.order)


@dataclass
class LaunchTrace:
    """The kernels one call launched, after the runner's marker and its L2 flush; ``main_stream`` is the
    marker's."""

    main_stream: int
    kernels: list[KernelEvent] = field(default_factory=list)

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def of_kind(self, kind: KernelKind) -> list[KernelEvent]:
        return [k for k in self.kernels if k.kind == kind]

    @property
    def side_stream(self) -> list[KernelEvent]:
        return [k for k in self.kernels if k.stream != self.main_stream]

    def signature(self) -> Counter[str]:
        """The multiset of kernel names: timed calls must launch what the checked calls launched."""
        return Counter(k.name for k in self.kernels)

    def problem(self, task: Task, shape: str) -> tuple[Outcome, str] | None:
        """The first rule the trace breaks, with what to change; None when it breaks none."""
        matmul = self.of_kind("matmul")
        if matmul:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, forward() launched a cuBLAS/torch matmul kernel "
                f"({_short(matmul[0].name)}): every GEMM must run through primitives.gemm, fused with its "
                "epilogue"
            )
        side = self.side_stream
        if side:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, forward() launched {len(side)} kernel(s) on a side stream "
                f"({_short(side[0].name)}): all work must run on the caller's stream"
            )
        if task.gemms and len(self.of_kind("quack")) < len(task.gemms):
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, {len(self.of_kind('quack'))} GEMM kernel(s) ran through primitives.gemm "
                f"for the task's {len(task.gemms)} GEMM(s) (kernels: "
                f"{', '.join(_short(k.name) for k in self.kernels[:4]) or 'none'}); every call must compute "
                "each GEMM the task lists with a primitives.gemm call of its own, not another way and not "
                "from a cache"
            )
        if self.launches > task.launch_budget:
            names = ", ".join(_short(k.name, 50) for k in self.kernels)
            return Outcome.OVER_LAUNCH_BUDGET, (
                f"at shape {shape}, forward() launched {self.launches} kernels, over the task's budget of "
                f"{task.launch_budget} ({names}); move host-side glue into the epilogue or merge steps"
            )
        return None

    def describe(self) -> dict[str, object]:
        return {
            "launches": self.launches,
            "quack_kernels": len(self.of_kind("quack")),
            "kernels": [_short(k.name, 90) for k in self.kernels],
        }


def calls_from_trace(trace: Mapping[str, Any], calls: int) -> list[LaunchTrace]:
    """Split a batch's trace at the runner's markers: per call, the kernels after the marker and the flush."""
    events = kernels_from_chrome_trace(trace)
    starts = [i for i, k in enumerate(events) if k.kind == "marker"]
    if len(starts) == calls + 1 and starts[:2] == [0, 1]:
        starts = starts[1:]  # the batch's lead-in sleep (measure.timing.lead_in) runs the same kernel
    if len(starts) != calls:
        raise ValueError(f"the kernel trace holds {len(starts)} call markers for {calls} calls (is CUPTI "
                         "available?)")
    out = []
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(events)
        marker, body = events[i], events[i + 1 : end]
        # body[0] is the runner's L2 flush
        out.append(LaunchTrace(main_stream=marker.stream, kernels=body[1:]))
    return out


def _short(name: str, limit: int = 70) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def gemm_shortfall(want: list[tuple[int, int, int]],
                   seen: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The task's GEMMs (``want``, (M, N, K) each) that the gemm calls ``seen`` leave undone; empty when they
    do them all: as many calls as the task lists, with at least their FLOPs (so a call of the transposed
    product, (N, M, K), or a GEMM split into parts along any dimension counts). What it returns names the
    listed GEMMs no call matches in either orientation. One rule for the emulator's op log and the sm_90a
    build."""
    if len(seen) >= len(want) and sum(math.prod(g) for g in seen) >= sum(math.prod(g) for g in want):
        return []
    left = Counter((min(m, n), max(m, n), k) for m, n, k in seen)
    missing = []
    for m, n, k in want:
        key = (min(m, n), max(m, n), k)
        if left[key]:
            left[key] -= 1
        else:
            missing.append((m, n, k))
    return missing


def gemm_shortfall_reason(shape: str, missing: list[tuple[int, int, int]],
                          seen: list[tuple[int, int, int]]) -> str:
    """Why :func:`gemm_shortfall` refused a call: the listed GEMMs it left undone, and the rule."""
    which = ", ".join(map(str, missing))
    return (f"at shape {shape}, the task's GEMM{'s' if len(missing) > 1 else ''} (M, N, K) {which} ran as no "
            f"primitives.gemm call (gemm calls seen: {seen or 'none'}): each GEMM the task lists must be a "
            "gemm() call of its own (or its transpose, (N, M, K), or parts of it split along any dimension), "
            "not folded into another "
            "call's epilogue or computed another way")


# --- the CPU's view: an op log ----------------------------------------------------------------------


def op_launches(op: Mapping[str, Any]) -> int:
    """The kernels one record of the runner's op log launches on a GPU: a gemm call, its reduces'
    finalisation and the backend's copies of strided operands; a host op, by :data:`HOST_OP_LAUNCHES`."""
    if "gemm" in op:
        return (1 + sum(FINALISE_LAUNCHES.get(str(s), 0) for s in op.get("sinks", []))
                + int(op.get("operand_copies", 0)))
    name = str(op.get("op")).split(".", 1)[0]  # overloads: aten::empty.memory_format
    return 0 if name in NO_KERNEL_OPS else HOST_OP_LAUNCHES.get(name, 1)


@dataclass
class LaunchEstimate:
    """What one call would launch on the GPU, from the runner's op log of the emulator run."""

    gemms: list[tuple[int, int, int]]
    gemm_launches: int
    host_ops: list[str]
    largest_host_tensor: int
    host_launches: int = 0
    #: The host op that made the largest tensor.
    largest_host_op: str = ""

    @property
    def launches(self) -> int:
        return self.gemm_launches + self.host_launches

    @classmethod
    def from_ops(cls, ops: list[dict[str, Any]]) -> LaunchEstimate:
        gemms, gemm_launches, host, largest, host_launches, largest_op = [], 0, [], 0, 0, ""
        for op in ops:
            launches = op_launches(op)
            if "gemm" in op:
                m, n, k = (int(v) for v in op["gemm"])
                gemms.append((m, n, k))
                gemm_launches += launches
            elif launches:
                host.append(str(op.get("op")))
                host_launches += launches
                if int(op.get("numel", 0)) > largest:
                    largest, largest_op = int(op.get("numel", 0)), str(op.get("op"))
        return cls(gemms, gemm_launches, host, largest, host_launches, largest_op)

    def signature(self) -> Counter[str]:
        return Counter([*self.host_ops, *(f"gemm{g}" for g in self.gemms)])

    @staticmethod
    def kinds(ops: list[dict[str, Any]]) -> Counter[str]:
        """The kinds of work a call does, free of shapes and configs: each gemm call's epilogue (its name,
        mode, sinks, outputs, stored D and B's major) and each host op that launches a kernel. A forward()
        must do the same at every shape: the CPU checks values at the small shapes only, so work it drops at
        the bench shapes alone would pass it unseen."""
        work = []
        for op in ops:
            if "gemm" in op:
                work.append(f"gemm {op.get('epilogue')} (mode {op.get('mode')}, sinks {op.get('sinks')}, "
                            f"{op.get('outputs')} outputs, store_d {op.get('store_d')}, b_major "
                            f"{op.get('b_major')})")
            elif str(op.get("op")).split(".", 1)[0] not in NO_KERNEL_OPS:
                work.append(str(op.get("op")))
        return Counter(work)

    def problem(self, task: Task, dims: dict[str, int], shape: str, budget: bool = True) -> tuple[Outcome,
                                                                                                  str] | None:
        """The GEMM and host-work rules (and, where no kernel trace exists, the launch budget)."""
        matmul = [op for op in self.host_ops if op.split(".", 1)[0] in MATMUL_OPS]
        if matmul:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, host code ran {matmul[0]} outside primitives.gemm (the GPU would launch "
                "a cuBLAS/cuDNN kernel for it): every GEMM must run through primitives.gemm, fused with its "
                "epilogue"
            )
        missing = gemm_shortfall(task.gemm_shapes(dims), self.gemms)
        if missing:
            return Outcome.CHEAT_DETECTED, gemm_shortfall_reason(shape, missing, self.gemms)
        biggest = max(task_numel(task, dims), default=0)
        if self.largest_host_tensor > biggest:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, host code outside primitives.gemm ({self.largest_host_op}) touched a "
                f"tensor of {self.largest_host_tensor} elements, more than any input or output has "
                f"({biggest}): a host tensor may have no more elements than the largest input or output, or "
                "it reads as GEMM work done outside gemm(); make such a tensor's values in an epilogue (a "
                "host step over several outputs at once may run on each alone)"
            )
        if budget and self.launches > task.launch_budget:
            return Outcome.OVER_LAUNCH_BUDGET, (
                f"at shape {shape}, forward() would launch about {self.launches} kernels on the GPU, over "
                f"the task's budget of {task.launch_budget} (GEMM kernels, their reduce finalisation and "
                f"operand copies: {self.gemm_launches}; host ops: {self._host_text()}); "
                + ("move host-side glue into the epilogue or merge steps" if self.host_launches else
                   "use fewer gemm calls or reduce sinks (each sink's finalisation is a launch)")
            )
        return None

    def _host_text(self) -> str:
        """The host ops, each that launches several kernels with its count, and each whose aten name says
        little with what makes it."""
        def text(op: str) -> str:
            name = op.split(".", 1)[0]
            if name in HOST_OP_LAUNCHES:
                return f"{op} ({HOST_OP_LAUNCHES[name]} kernels)"
            return f"{op} ({HOST_OP_CAUSES[name]})" if name in HOST_OP_CAUSES else op

        return ", ".join(map(text, self.host_ops)) or "none"

    def describe(self) -> dict[str, object]:
        return {"launches_estimate": self.launches, "gemm_calls": [list(g) for g in self.gemms],
                "host_ops": self.host_ops}


def task_numel(task: Task, dims: dict[str, int]) -> list[int]:
    """Element counts of every declared input and output at one shape."""
    return [math.prod(s.concrete_shape(dims)) for s in (*task.inputs, *task.outputs)]
