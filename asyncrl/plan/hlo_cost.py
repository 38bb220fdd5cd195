"""What a compiled program costs, its loops run as many times as they run.

XLA's cost analysis (`compiled.cost_analysis()`) counts a while loop's body once, whatever
its trip count (libtpu 0.0.42.1 and XLA:CPU in JAX 0.10.2): a model that scans its layers
reads as one layer, a train step's micro-batch loop as one micro-batch, its chunked
unembedding as one chunk. `Program` walks the optimized HLO text (`compiled.as_text()`)
with XLA's rules for each instruction (below), twice: every loop run once, as XLA counts
it, and every loop run its trip count. `asyncrl.plan.tpu_compile.analysis` adds the
difference, what the further iterations cost, to XLA's own figures. On loop-free programs
this count agrees with XLA's FLOPs within 2% (XLA:CPU, and the TPU compiler at real shapes)
and XLA:CPU's bytes within 3% (tests/test_plan.py holds the CPU figures to it). The TPU
compiler's byte rules are its own: it credits a layer's weights sliced from the stacked
array in a nested fusion sometimes with the slice, sometimes with the whole stack, and these
rules count the slice; on loop-free programs its figure is 0.5-1.6x this count.

Per instruction, as HloCostAnalysis counts them:
  flops           a dot or convolution 2 per multiply-add (a convolution's window
                  positions on padding excluded), an elementwise op 1 per element (exp,
                  log, tanh, rsqrt... count as transcendentals instead), a reduce 1 per
                  input element; a fusion the sum of what it fuses;
  bytes accessed  a top-level op's operands and result; a fusion's parameter that it only
                  slices (through bitcasts and nested fusions) counts the slices, a buffer
                  it updates in place the update; a custom call nothing (a Pallas kernel
                  declares no cost: its own is counted from its block plan,
                  asyncrl/plan/kernel_cost.py);
  vmem bytes      results a top-level op writes into TPU VMEM (memory space S(1)): XLA's
                  bytes count such a buffer when written and again when read, though
                  neither touches HBM, so bytes - 2 * vmem estimates HBM traffic (exact for
                  a buffer written once and read once in full).
A loop's trip count is XLA:CPU's `known_trip_count`, or, where the TPU compiler leaves none,
read from its condition (induction variable < constant, from the constant it starts at, by
the constant its body adds: 2 where the compiler unrolled a loop by two).
"""

from __future__ import annotations

import dataclasses
import math
import re

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%(\S+)\s*=\s*(.*)")
_HEADER = re.compile(r"(ENTRY\s+)?%(\S+)\s*\(")
_NAME = re.compile(r"%([\w.\-]+)")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                   "rsqrt", "sqrt", "cbrt", "power", "sine", "cosine", "tan", "logistic",
                   "atan2", "erf"}
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
                "compare", "select", "and", "or", "xor", "not", "negate", "abs", "sign",
                "convert", "clamp", "floor", "ceil", "round-nearest-afz", "round-nearest-even",
                "shift-left", "shift-right-logical", "shift-right-arithmetic", "is-finite",
                "popcnt", "count-leading-zeros", "real", "imag", "stochastic-convert",
                *_TRANSCENDENTAL}
# No buffer of their own: an alias of one counted where it was written.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "iota"}
# Ops that update their operand 0 in place inside a fusion, and which operand is the update
# they write. XLA:CPU counts a fused scatter's whole operand and result; the TPU compiler
# counts its update (so do these rules: `Program(tpu=...)`).
_IN_PLACE = {"dynamic-update-slice": 1}
_IN_PLACE_TPU = {**_IN_PLACE, "scatter": -1}
# Async ops: which element of the result tuple is the buffer they fill (the others alias
# the operand or are a context word); their *-done halves return that same buffer.
_ASYNC_DESTINATION = {"copy-start": 0, "slice-start": 1}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str  # the result's shape, as printed
    opcode: str
    args: str  # the operand list as printed (a parameter's number, a constant's literal)
    attributes: str  # everything after the operand list

    @property
    def operands(self) -> list[str]:
        return _NAME.findall(self.args)

    def called(self) -> dict[str, str]:
        """The computations it calls, by role: calls, to_apply, body, condition."""
        return dict(_CALLED.findall(self.attributes))


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    vmem_bytes: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(a + b for a, b in zip(dataclasses.astuple(self),
                                             dataclasses.astuple(other))))

    def __mul__(self, times: float) -> "Cost":
        return Cost(*(a * times for a in dataclasses.astuple(self)))

    def __sub__(self, other: "Cost") -> "Cost":
        return self + other * -1


def split_shape(text: str) -> tuple[str, str]:
    """An instruction's right-hand side -> (its shape, the rest from the opcode on)."""
    if not text.startswith("("):
        shape, _, rest = text.partition(" ")
        return shape, rest
    depth = 0
    for end, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if depth == 0:
            return text[:end + 1], text[end + 1:].lstrip()
    return text, ""


def tuple_elements(shape: str) -> list[str]:
    """The element shapes of a tuple shape "(a, b, ...)"."""
    inner, depth, start, parts = shape[1:-1], 0, 0, []
    for index, char in enumerate(inner):
        depth += char in "({"
        depth -= char in ")}"
        if char == "," and depth == 0:
            parts.append(inner[start:index])
            start = index + 1
    return parts + [inner[start:]]


def _arrays(shape: str) -> list[tuple[str, list[int], str]]:
    return [(dtype, [int(d) for d in dims.split(",") if d], layout)
            for dtype, dims, layout in _ARRAY.findall(shape)]


def shape_bytes(shape: str, vmem_only: bool = False) -> float:
    """Bytes of every array in a shape (a tuple's elements summed); vmem_only: only those
    laid out in VMEM (S(1))."""
    return float(sum(math.prod(dims) * _DTYPE_BYTES.get(dtype, 0)
                     for dtype, dims, layout in _arrays(shape)
                     if not vmem_only or "S(1)" in layout))


def _elements(shape: str) -> int:
    return sum(math.prod(dims) for _, dims, _ in _arrays(shape))


def _dims(shape: str) -> list[int]:
    arrays = _arrays(shape)
    return arrays[0][1] if arrays else []


def parse(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
    """The computations of an HLO module's text, by name, and the entry's name."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and line.rstrip().endswith("{"):
                current = computations.setdefault(header.group(2), [])
                entry = header.group(2) if header.group(1) else entry
            continue
        if line.rstrip() == "}":  # not "}}, metadata=…": a Pallas call's attributes span lines
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        shape, rest = split_shape(match.group(2))
        opcode, _, tail = rest.partition("(")
        args, attributes = _operand_list(tail)
        current.append(Instruction(match.group(1), shape, opcode.strip(), args, attributes))
    return computations, entry


def _operand_list(tail: str) -> tuple[str, str]:
    """'a, b), attrs' -> ('a, b', 'attrs'): the operands up to the matching parenthesis."""
    depth = 1
    for index, char in enumerate(tail):
        depth += char in "({"
        depth -= char in ")}"
        if depth == 0:
            return tail[:index], tail[index + 1:]
    return tail, ""


class Program:
    """One compiled program's HLO text, costed per computation."""

    def __init__(self, hlo_text: str, in_place: bool | None = None):
        """in_place: count a fused scatter's update, not its whole operand (the TPU
        compiler's rule, and what the hardware moves); None: as the program's compiler
        counts (a TPU program's layouts carry tiles, ":T(8,128)"; XLA:CPU's never do)."""
        self.computations, self.entry = parse(hlo_text)
        if in_place is None:
            in_place = ":T(" in hlo_text
        self._in_place = _IN_PLACE_TPU if in_place else _IN_PLACE
        self._by_name = {name: {i.name: i for i in body}
                         for name, body in self.computations.items()}
        self._memo: dict[tuple[str, bool], Cost] = {}
        self._user_index: dict[str, dict[str, list[tuple[Instruction, int]]]] = {}

    def cost(self, loops: bool = True) -> Cost:
        """The entry computation's cost; loops: each loop run its trip count (else once, as
        XLA's cost analysis counts it)."""
        return self._computation(self.entry, loops)

    def loops(self) -> list[tuple[str, int]]:
        """Every while loop (its instruction's name) and its trip count."""
        return [(i.name, self.trip_count(where, i))
                for where, body in self.computations.items() for i in body
                if i.opcode == "while"]

    def _computation(self, name: str, loops: bool) -> Cost:
        key = (name, loops)
        if key not in self._memo:
            self._memo[key] = sum((self._instruction(name, i, loops)
                                   for i in self.computations.get(name, ())), Cost())
        return self._memo[key]

    def _instruction(self, where: str, i: Instruction, loops: bool) -> Cost:
        called = i.called()
        if i.opcode == "while":
            trips = self.trip_count(where, i) if loops else 1
            return (self._computation(called["body"], loops) * trips
                    + self._computation(called["condition"], loops) * (trips + 1))
        if i.opcode == "conditional":
            branches = _BRANCHES.search(i.attributes)
            names = (_NAME.findall(branches.group(1)) if branches else
                     re.findall(r"(?:true|false)_computation=%([\w.\-]+)", i.attributes))
            return max((self._computation(b, loops) for b in names),
                       key=lambda c: (c.flops, c.bytes_accessed), default=Cost())
        if i.opcode in ("call", "async-start") and "calls" in called:
            return self._computation(called["calls"], loops)
        arithmetic = self._flops(where, i)
        if i.opcode == "fusion":
            moved = self._fusion_bytes(where, i)
        else:
            moved = self._bytes(where, i)
        return Cost(arithmetic.flops, arithmetic.transcendentals, moved, _vmem(i))

    def _shape(self, where: str, name: str) -> str:
        found = self._by_name.get(where, {}).get(name)
        return found.shape if found else ""

    def _flops(self, where: str, i: Instruction) -> Cost:
        """Arithmetic of one instruction (a fusion's: all it fuses)."""
        if i.opcode == "fusion":
            inner = i.called()["calls"]
            return sum((self._flops(inner, j) for j in self.computations.get(inner, ())),
                       Cost())
        if i.opcode == "dot":
            lhs = _dims(self._shape(where, i.operands[0]))
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", i.attributes)
            inner = (math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
                     if contracting and lhs else 1)
            return Cost(flops=2.0 * _elements(i.shape) * inner)
        if i.opcode == "convolution":
            return Cost(flops=2.0 * self._convolution_macs(where, i))
        if i.opcode == "reduce":
            # Its operands are the inputs, then as many initial values.
            inputs = i.operands[:max(len(i.operands) // 2, 1)]
            return Cost(flops=float(sum(_elements(self._shape(where, o)) for o in inputs)))
        if i.opcode == "reduce-window":
            size = re.search(r"size=([\dx]+)", i.attributes)
            window = math.prod(int(s) for s in size.group(1).split("x")) if size else 1
            return Cost(flops=float(_elements(i.shape) * window))
        if i.opcode in _TRANSCENDENTAL:
            return Cost(transcendentals=float(_elements(i.shape)))
        if i.opcode in _ELEMENTWISE:
            return Cost(flops=float(_elements(i.shape)))
        return Cost()

    def _convolution_macs(self, where: str, i: Instruction) -> float:
        """Multiply-adds of a convolution: per output element, the kernel's input features
        times the window positions that land on the (dilated) input, not on its padding."""
        labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", i.attributes)
        lhs = _dims(self._shape(where, i.operands[0]))
        rhs = _dims(self._shape(where, i.operands[1]))
        out = _dims(i.shape)
        if labels is None or not (lhs and rhs and out):
            return 0.0
        lhs_l, rhs_l, out_l = labels.groups()
        spatial = sorted(c for c in out_l if c.isdigit())
        window = _window(i.attributes, len(spatial))
        macs = math.prod(out[out_l.index(c)] for c in out_l if not c.isdigit())
        macs *= rhs[rhs_l.index("i")]
        for axis, c in enumerate(spatial):
            macs *= _valid_window_pairs(lhs[lhs_l.index(c)], rhs[rhs_l.index(c)],
                                        out[out_l.index(c)], **window[axis])
        return float(macs)

    def _bytes(self, where: str, i: Instruction) -> float:
        """Bytes a top-level (unfused) instruction reads and writes."""
        if i.opcode in _FREE or i.opcode.endswith("-done") or i.opcode == "custom-call":
            return 0.0
        out = shape_bytes(i.shape)
        operands = [shape_bytes(self._shape(where, o)) for o in i.operands]
        if i.opcode.endswith("-start") and i.opcode in _ASYNC_DESTINATION:
            if not i.shape.startswith("("):
                return out + sum(operands)
            out = shape_bytes(tuple_elements(i.shape)[_ASYNC_DESTINATION[i.opcode]])
        if i.opcode in ("slice", "dynamic-slice", "slice-start"):
            return 2 * out
        if i.opcode == "dynamic-update-slice":
            return 2 * operands[1]
        if i.opcode == "gather":
            return 2 * out + operands[1]
        if i.opcode == "scatter":  # in place: indices and updates read, updates written
            return sum(operands[1:]) + operands[-1]
        return out + sum(operands)

    def _fusion_bytes(self, where: str, i: Instruction) -> float:
        """A fusion's operands and result; a parameter it only slices counts its slices, a
        buffer it updates in place (dynamic-update-slice) the update written."""
        body = self.computations.get(i.called().get("calls", ""), [])
        if not body:
            return shape_bytes(i.shape) + sum(shape_bytes(self._shape(where, o))
                                              for o in i.operands)
        callee = i.called().get("calls", "")
        total = sum(self._read_bytes(callee, n, shape_bytes(self._shape(where, o)))
                    for n, o in enumerate(i.operands))
        named = {inner.name: inner for inner in body}
        root = body[-1]
        for r in ([named.get(o) for o in root.operands] if root.opcode == "tuple" else [root]):
            if r is not None and r.opcode in self._in_place:  # writes its update alone
                update = named.get(r.operands[self._in_place[r.opcode]])
                total += shape_bytes(update.shape) if update else 0.0
            elif r is not None:
                total += shape_bytes(r.shape)
        return total

    def _users(self, computation: str) -> dict[str, list[tuple[Instruction, int]]]:
        if computation not in self._user_index:
            users: dict[str, list[tuple[Instruction, int]]] = {}
            for inner in self.computations.get(computation, ()):
                for position, operand in enumerate(inner.operands):
                    users.setdefault(operand, []).append((inner, position))
            self._user_index[computation] = users
        return self._user_index[computation]

    def _read_bytes(self, computation: str, number: int, full: float) -> float:
        """What a fusion (calling `computation`) reads of its operand `number`: the slices
        it takes when every use of that parameter (through bitcasts and nested fusions)
        slices or gathers it, nothing when every use updates it in place, else all of it."""
        param = next((i.name for i in self.computations.get(computation, ())
                      if i.opcode == "parameter" and int(i.args) == number), None)
        if param is None:
            return full
        frontier, taken = [param], 0.0
        while frontier:
            for user, position in self._users(computation).get(frontier.pop(), []):
                if user.opcode == "bitcast":
                    frontier.append(user.name)
                elif user.opcode == "fusion":
                    taken += self._read_bytes(user.called()["calls"], position, full)
                elif user.opcode in ("slice", "dynamic-slice", "gather") and position == 0:
                    taken += shape_bytes(user.shape)
                elif user.opcode in self._in_place and position == 0:
                    continue
                else:
                    return full
        return min(taken, full)

    def trip_count(self, where: str, loop: Instruction) -> int:
        """How many times a while loop runs its body: XLA:CPU's known_trip_count, else its
        condition read as `induction variable < limit` from the value it starts at."""
        known = _TRIP.search(loop.attributes)
        if known:
            return int(known.group(1))
        condition = loop.called()["condition"]
        scope = dict(self._by_name[condition])
        compare = self.computations[condition][-1]
        if compare.opcode == "fusion":  # the compare fused with its constant
            inner = compare.called()["calls"]
            scope.update(self._by_name[inner])
            compare = self.computations[inner][-1]
        direction = re.search(r"direction=(\w+)", compare.attributes)
        limits = [_constant(scope.get(o)) for o in compare.operands]
        if (compare.opcode != "compare" or direction is None or direction.group(1) != "LT"
                or len(limits) != 2 or limits[1] is None):
            raise ValueError(f"while loop {loop.name}: cannot read its trip count from its "
                             f"condition {condition}")
        induction = scope.get(compare.operands[0])
        index = (re.search(r"\bindex=(\d+)", induction.attributes)
                 if induction is not None and induction.opcode == "get-tuple-element" else None)
        step = self._loop_step(loop, int(index.group(1))) if index else 1
        return max(-(-(limits[1] - self._loop_start(where, loop)) // step), 0)

    def _loop_step(self, loop: Instruction, index: int) -> int:
        """What each trip adds to the induction variable (element `index` of the loop's
        tuple): the constant the body's root adds to it, else 1. The TPU compiler unrolls a
        windowed einsum's loop (an FSDP all-gather fused with its matmul) by two and steps
        it by 2."""
        body = loop.called()["body"]
        root = self.computations[body][-1]
        if root.opcode != "tuple" or index >= len(root.operands):
            return 1
        scope = self._by_name[body]
        update = scope.get(root.operands[index])
        if update is None or update.opcode != "add":
            return 1
        steps = [_constant(scope.get(o)) for o in update.operands]
        return next((s for s in steps if s is not None and s > 0), 1)

    def _loop_start(self, where: str, loop: Instruction) -> int:
        """The induction variable's first value: element 0 of the loop's initial tuple when
        it is a constant (JAX's loops count from 0; a loop the compiler peeled starts on)."""
        scope = self._by_name[where]
        init = scope.get(loop.operands[0]) if loop.operands else None
        if init is None or init.opcode != "tuple" or not init.operands:
            return 0
        first = scope.get(init.operands[0])
        while first is not None and first.opcode in ("copy", "bitcast") and first.operands:
            first = scope.get(first.operands[0])
        value = _constant(first)
        return 0 if value is None else value


def _constant(instruction: Instruction | None) -> int | None:
    """An integer scalar constant's value; None for anything else."""
    if instruction is None or instruction.opcode != "constant":
        return None
    value = instruction.args.strip()
    return int(value) if re.fullmatch(r"-?\d+", value) else None


def _vmem(i: Instruction) -> float:
    """Bytes a top-level op writes into VMEM."""
    if i.opcode in _FREE or i.opcode.endswith("-done"):
        return 0.0
    shape = i.shape
    if i.opcode.endswith("-start"):
        if i.opcode not in _ASYNC_DESTINATION or not shape.startswith("("):
            return 0.0
        shape = tuple_elements(shape)[_ASYNC_DESTINATION[i.opcode]]
    return shape_bytes(shape, vmem_only=True)


def _window(attributes: str, rank: int) -> list[dict]:
    """A convolution's window per spatial dimension (its size is the kernel's): stride,
    padding and dilations."""
    fields = {"stride": [1] * rank, "pad": [(0, 0)] * rank, "lhs_dilate": [1] * rank,
              "rhs_dilate": [1] * rank}
    window = re.search(r"window=\{([^}]*)\}", attributes)
    for item in (window.group(1).split() if window else []):
        key, _, value = item.partition("=")
        if key == "pad":
            fields["pad"] = [tuple(int(v) for v in p.split("_")) for p in value.split("x")]
        elif key in fields:
            fields[key] = [int(v) for v in value.split("x")]
    return [{key: fields[key][axis] for key in fields} for axis in range(rank)]


def _valid_window_pairs(size: int, kernel: int, out: int, stride: int, pad: tuple,
                        lhs_dilate: int, rhs_dilate: int) -> int:
    """(output position, kernel position) pairs of one spatial dimension that land on an
    element of the (dilated) input, not on padding or a dilation hole."""
    extent = (size - 1) * lhs_dilate + 1
    count = 0
    for k in range(kernel):
        offset = k * rhs_dilate - pad[0]  # input position of output 0
        first = max(0, -(offset // stride) if offset < 0 else 0)
        while first < out and first * stride + offset < 0:
            first += 1
        last = min(out - 1, (extent - 1 - offset) // stride)
        if last < first:
            continue
        if lhs_dilate == 1:
            count += last - first + 1
        else:
            count += sum((o * stride + offset) % lhs_dilate == 0 for o in range(first, last + 1))
    return count
