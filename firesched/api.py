"""The two ways to run a schedule: ``interpret`` (CPU, numpy, hazard-checked) and ``compile``
(CUDA C++ → NVRTC → a launchable kernel).

Both take arrays in the order of the lowered program: ``A, B``, then the extra tensors the
epilogue reads (bias, residual) in the order the ops name them; ``compile(...)`` also takes the
output ``C`` last.  A compiled kernel also takes them by name (``k(A, B, bias=b)``), and allocates
the outputs it is not given when its inputs are torch tensors or CuPy arrays.  Arrays are logical
(A is M×K whatever its majorness); a column-major operand is passed as a transposed view
(``At.T``), which is what its strides say.

``arch`` / ``target`` None means the default target everywhere
(``firesched.hardware.target.default_target``: the GPU present, else sm_90a).
"""

from __future__ import annotations

import ctypes
import sys
import time
import warnings

import attrs
import numpy as np

from . import ir, runtime
from . import lower as _lower  # noqa: F401  (binds Schedule.check / Schedule.lower)
from . import simulate as _interp
from .cuda import nvrtc
from .cuda import printer as cuda
from .errors import CompileError, LaunchError, PerformanceWarning, ScheduleError
from .hardware.target import target as get_target
from .hardware.target import target_names
from .lower import driver as _driver
from .lower.driver import check_programmatic
from .schedule import Schedule


def _logical(buf: ir.GlobalBuffer, prog: ir.Program, sched: Schedule):
    """(logical shape, logical strides in elements, the storage axes as a permutation of the
    logical ones, or None when they agree) of a global buffer as the user passes it: in the order
    of its tensor's dims (a column-major operand's storage order differs)."""
    for t in sched.spec.operands:
        if t.name == buf.name and not t.tensor.workspace:
            tens = t.tensor
            storage = tens.storage_dims
            st = dict(zip(storage, buf.strides))
            perm = tuple(tens.dims.index(d) for d in storage) if storage != tens.dims else None
            return tuple(tens.extent(d) for d in tens.dims), tuple(st[d] for d in tens.dims), perm
    return buf.shape, buf.strides, None


def _packing(buf: ir.GlobalBuffer, sched: Schedule):
    """The ``Packing`` of the kernel tensor stored in ``buf`` (int4 weights), or None."""
    for t in sched.spec.operands:
        if t.name == buf.name:
            return t.tensor.packing
    return None


def _require_schedule(schedule, what: str) -> None:
    """A ScheduleError, with the fix, when ``schedule`` is not a ``Schedule`` (a spec not yet
    scheduled, most often)."""
    if isinstance(schedule, Schedule):
        return
    kind = type(schedule).__name__
    if hasattr(schedule, "schedule") and hasattr(schedule, "operands"):
        raise ScheduleError(
            f"{what} takes a schedule, and this {kind} spec has not been scheduled", field="schedule",
            value=str(schedule), allowed="a Schedule: spec.schedule(*strategies) or a firesched.recipes recipe",
            fix=f"firesched.{what}(spec.schedule(tile(...) >> to_blocks(), ...), ...); a kernel-level Pointwise, "
                f"Move or Reduce also lowers with its default schedule: spec.schedule()")
    raise ScheduleError(f"{what} takes a schedule, not a {kind}", field="schedule", value=schedule,
                        allowed="a Schedule: spec.schedule(*strategies) or a firesched.recipes recipe",
                        fix="build one with a recipe, e.g. firesched.recipes.gemm(M, N, K)")


def interpret(schedule: Schedule, *arrays, target=None) -> np.ndarray:
    """Run ``schedule`` on the CPU interpreter and return C (numpy); a fused spec with several
    results (``Fused.results``) returns a tuple of them, in that order.

    ``arrays`` are ``A, B`` and the epilogue's extra tensors, as numpy arrays of any float dtype
    (values are rounded to the schedule's dtypes); int4 codes (a W4A16 weight) in their logical
    order, which the interpreter packs as the kernel reads them (on the GPU a kernel takes
    ``recipes.pack_weights``'s bytes instead).  Races, reads of in-flight async copies and
    out-of-bounds accesses raise ``HazardError``.  ``target`` None is the default target.
    """
    _require_schedule(schedule, "interpret")
    prog = schedule.lower(target)
    if len(arrays) != len(prog.inputs):
        names = ", ".join(b.name for b in prog.inputs)
        raise ValueError(f"interpret: expected {len(prog.inputs)} arrays ({names}), got {len(arrays)}")
    feed = {}
    for buf, arr in zip(prog.inputs, arrays):
        arr = np.asarray(arr)
        shape, _, perm = _logical(buf, prog, schedule)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"interpret: {buf.name} has shape {arr.shape}, the schedule expects {shape}")
        feed[buf.name] = np.ascontiguousarray(np.transpose(arr, perm)) if perm else arr
        pk = _packing(buf, schedule)
        if pk is not None:
            # the kernel reads the codes in the packing's order along the major (last stored) dim
            feed[buf.name] = pk.pack(feed[buf.name], axis=-1)
    got = _interp.run_program(prog, feed)
    results = []
    for buf in prog.outputs:
        _, _, perm = _logical(buf, prog, schedule)
        # the result comes back in storage order; hand it over in the tensor's dims order
        results.append(np.transpose(got[buf.name], np.argsort(perm)) if perm else got[buf.name])
    return results[0] if len(results) == 1 else tuple(results)


@attrs.frozen
class _Launch:
    kernel: object
    grid: tuple
    block: tuple
    smem: int
    args: tuple          # indices into the call's pointer list
    programmatic: bool = False   # a dependent launch (``ir.Kernel.programmatic``)


def _stream_key(stream) -> int:
    """A launch stream as the int handle workspaces are kept by (0: the default stream)."""
    return runtime._stream_handle(stream)


class CompiledProgram:
    """A compiled schedule: ``source`` (CUDA C++), per-kernel ``modules`` (cubin, PTX, resources),
    callable on GPU arrays as ``k(A, B, *extras, C)``, by name (``k(A=a, B=b, bias=v, C=c)``, or
    positional then named), with the outputs left out allocated (torch or CuPy inputs only).
    Returns the output, or a tuple of them.  A program with a workspace (split-K partial sums)
    keeps one per stream it is launched on, so launches on several streams at once are safe."""

    def __init__(self, schedule: Schedule, program: ir.Program, source: str, modules, arch: str,
                 compile_seconds: float):
        self.schedule = schedule
        self.program = program
        self.source = source
        self.modules = modules
        self.arch = arch
        self.compile_seconds = compile_seconds
        self._loaded = None
        self._workspace = {}
        self._arg_specs = self._make_arg_specs()
        self._torch_specs = None
        self._tmaps: dict = {}

    @property
    def resources(self) -> dict:
        out = {}
        for m in self.modules:
            out.update(m.resources)
        return out

    @property
    def spills(self) -> int:
        """Bytes of spill traffic per thread, over every kernel."""
        return sum(r.spill_store_bytes + r.spill_load_bytes for r in self.resources.values())

    @property
    def ptx(self) -> str:
        """The PTX NVRTC generated (``.target <arch>``): one module's as it is; the modules of a
        program of several launches one after the other, each under a ``// kernel <name>`` line."""
        if len(self.modules) == 1:
            return self.modules[0].ptx
        return "\n".join(f"// kernel {k.name}\n{m.ptx}" for k, m in zip(self.program.kernels, self.modules))

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The names of the arrays the kernel takes, in positional order: inputs, then outputs."""
        return tuple(s.name for s in self._arg_specs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The names of the arrays the kernel writes (the last ``len(output_names)`` arguments)."""
        return tuple(b.name for b in self.program.outputs)

    def bind(self, args: tuple, kwargs: dict) -> tuple[list, tuple[str, ...]]:
        """The arrays of a call ``k(*args, **kwargs)`` in positional order, None where an output
        was left out, and the names of those outputs.  Raises ``ValueError`` naming the argument
        for too many arrays, a name given twice, an unknown name, or a missing input; nothing here
        needs a GPU."""
        names = self.arg_names
        kernel = self.program.kernels[0].name
        if len(args) > len(names):
            raise ValueError(f"{kernel}: expected at most {len(names)} arrays ({', '.join(names)}), got "
                             f"{len(args)}; fix: pass {', '.join(names)} in that order or by name")
        bound = list(args) + [None] * (len(names) - len(args))
        for name, value in kwargs.items():
            if name not in names:
                raise ValueError(f"{kernel}: unknown argument {name}=...; allowed names: {', '.join(names)} "
                                 f"(inputs, then outputs); fix: pass the array under one of them")
            i = names.index(name)
            if i < len(args):
                raise ValueError(f"{kernel}: argument {name} given twice (positional #{i + 1} and {name}=...); "
                                 f"fix: pass it once")
            bound[i] = value
        n_out = len(self.program.outputs)
        missing_in = [names[i] for i in range(len(names) - n_out) if bound[i] is None]
        if missing_in:
            raise ValueError(f"{kernel}: missing input(s) {', '.join(missing_in)}; the kernel takes "
                             f"{', '.join(names)}; fix: pass {missing_in[0]}=<array> (outputs may be left out "
                             f"with torch or CuPy inputs: they are allocated)")
        missing_out = tuple(names[i] for i in range(len(names) - n_out, len(names)) if bound[i] is None)
        return bound, missing_out

    def _allocate(self, bound: list, missing: tuple[str, ...]) -> None:
        """Allocate the outputs ``missing`` with the array library (torch or CuPy) and the device of
        the inputs, with the strides the kernel writes; a ``LaunchError`` for any other inputs."""
        n_in = len(self.program.inputs)
        inputs = bound[:n_in]
        kinds = {type(a).__module__.partition(".")[0] for a in inputs}
        specs = {s.name: s for s in self._arg_specs}
        kernel = self.program.kernels[0].name
        if kinds == {"torch"}:
            import torch

            devs = {a.device for a in inputs}
            dev = next(iter(devs))
            if len(devs) != 1 or dev.type != "cuda":
                raise LaunchError(f"{kernel}: cannot allocate {', '.join(missing)}: the inputs are on "
                                  f"{', '.join(sorted(map(str, devs)))}, not on one CUDA device; fix: move them to "
                                  f"one GPU, or pass {missing[0]}=<array>")
            tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
                   "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64}
            for name in missing:
                s = specs[name]
                bound[self.arg_names.index(name)] = torch.empty_strided(s.shape, s.strides, dtype=tdt[s.dtype],
                                                                        device=dev)
            return
        if kinds == {"cupy"}:
            import cupy

            devs = {int(a.device.id) for a in inputs}
            if len(devs) != 1:
                raise LaunchError(f"{kernel}: cannot allocate {', '.join(missing)}: the inputs are on devices "
                                  f"{sorted(devs)}; fix: move them to one GPU, or pass {missing[0]}=<array>")
            cdt = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "u8": "uint8",
                   "i32": "int32", "i64": "int64"}
            with cupy.cuda.Device(devs.pop()):
                for name in missing:
                    s = specs[name]
                    if s.dtype not in cdt:
                        raise LaunchError(f"{kernel}: CuPy has no {s.dtype} arrays to allocate {name} with; "
                                          f"fix: pass {name}=<array> (e.g. a torch tensor through DLPack)")
                    item = np.dtype(cdt[s.dtype]).itemsize
                    size = 1 + sum((n - 1) * st for n, st in zip(s.shape, s.strides)) if all(s.shape) else 0
                    mem = cupy.cuda.alloc(max(size, 1) * item)
                    bound[self.arg_names.index(name)] = cupy.ndarray(
                        s.shape, dtype=cdt[s.dtype], memptr=mem, strides=tuple(st * item for st in s.strides))
            return
        raise LaunchError(f"{kernel}: output(s) {', '.join(missing)} not given, and firesched allocates outputs "
                          f"only when every input is a torch tensor or every input a CuPy array (these are "
                          f"{', '.join(sorted(kinds))}); fix: pass {missing[0]}=<array>")

    def prepare(self, device: int = 0, stream=None) -> "CompiledProgram":
        """Load the kernels on CUDA device ``device`` and allocate their workspaces for launches
        on ``stream`` (None: the default stream) now, rather than at the first call: do it before
        capturing a CUDA graph, whose capture forbids allocating (this is also allowed during a
        capture: allocations then go around it).  Returns self."""
        with runtime.capture_relaxed():
            for ln in self._load(device):
                for i in ln.args:
                    if isinstance(i, tuple) and i[0] in ("ws", "tmap_ws"):
                        buf = i[1]
                        self._ws(buf.name, device, buf.size * buf.dtype.bits // 8, stream, buf.zeroed)
        return self

    @property
    def workspace_bytes(self) -> int:
        """Bytes of workspace (split-K partial sums, padded copies) one launch needs; each stream
        that launches this program gets its own (``prepare(device, stream)`` allocates it ahead)."""
        return sum(max(b.size * b.dtype.bits // 8, 16) for b in self.program.workspaces)

    def _make_arg_specs(self):
        specs = []
        outs = self.program.outputs
        for buf in list(self.program.inputs) + list(outs):
            shape, strides, _ = _logical(buf, self.program, self.schedule)
            dt = buf.dtype.name
            if buf.dtype.is_subbyte:
                # 4-bit codes are passed as their storage bytes, two a byte along the stored last
                # dim (quant.pack_int4's form): (N, K / 2) uint8 for a K-contiguous (K, N) weight
                if buf.shape[-1] % 2:
                    raise ValueError(f"{buf.name}: {buf.shape[-1]} 4-bit codes along its contiguous dim do not "
                                     f"fill whole bytes; pad it to an even length")
                shape = buf.shape[:-1] + (buf.shape[-1] // 2,)
                strides = tuple(st // 2 for st in buf.strides[:-1]) + (1,)
                dt = "u8"
            specs.append(runtime.ArgSpec(buf.name, shape, dt, strides, 16, writable=buf in outs))
        return specs

    def _load(self, device: int):
        if self._loaded is None or self._loaded[0] != device:
            launches = []
            names = [b.name for b in self.program.inputs] + [b.name for b in self.program.outputs]
            for kern, mod in zip(self.program.kernels, self.modules):
                lm = runtime.load_module(mod, device)
                k = lm.kernel(kern.name, params=len(kern.params))
                if kern.shared_bytes > 48 * 1024:
                    k.reserve_shared(kern.shared_bytes)
                idx = []
                for p in kern.params:
                    if isinstance(p, ir.TensorMapParam) and p.buffer.name in names:
                        idx.append(("tmap", names.index(p.buffer.name), p))
                    elif isinstance(p, ir.TensorMapParam):       # a workspace (e.g. padded rows)
                        idx.append(("tmap_ws", self._workspace_buffer(p.buffer.name), p))
                    else:
                        idx.append(names.index(p.name) if p.name in names else
                                   ("ws", self._workspace_buffer(p.name)))
                launches.append(_Launch(k, kern.grid, (kern.threads, 1, 1), kern.shared_bytes, tuple(idx),
                                        kern.programmatic))
            self._loaded = (device, launches)
        return self._loaded[1]

    def _workspace_buffer(self, name: str) -> ir.GlobalBuffer:
        """The workspace buffer (the storage a launch needs) of that name."""
        return next(b for b in self.program.workspaces if b.name == name)

    def _ws(self, name: str, device: int, nbytes: int, stream=None, zeroed: bool = False) -> int:
        """The workspace ``name`` of launches on ``stream`` of ``device``: one per stream, so that
        launches on two streams at once never share partial sums (a stream runs its launches in
        order, so one stream's launches may share it)."""
        key = (name, device, _stream_key(stream))
        if key not in self._workspace:
            from cuda.bindings import driver

            with runtime.capture_relaxed():
                err, ptr = driver.cuMemAlloc(max(nbytes, 16))
            if err == driver.CUresult.CUDA_SUCCESS and zeroed:
                # zero-filled, as the interpreter's (stream-K's flags start cleared; each launch leaves
                # them cleared again), on the launch's stream: ordered before it, and part of a graph
                # that stream may be capturing
                (err,) = driver.cuMemsetD8Async(ptr, 0, max(nbytes, 16), _stream_key(stream))
            if err != driver.CUresult.CUDA_SUCCESS:
                raise runtime.LaunchError(f"cuMemAlloc / cuMemsetD8({nbytes}) for a workspace failed: {err}")
            self._workspace[key] = int(ptr)
        return self._workspace[key]

    def _torch_fast(self, arrays, stream):
        """Launch directly when every array is a CUDA torch tensor that matches its spec exactly
        (same checks as ``runtime.check_args``, without building descriptions); None otherwise, and
        the general path then reports what is wrong."""
        torch = sys.modules.get("torch")
        if torch is None or self._torch_specs is False:
            return None
        if self._torch_specs is None:
            tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "u8": torch.uint8}
            try:
                self._torch_specs = [(tdt[s.dtype], torch.Size(s.shape), tuple(s.strides)) for s in self._arg_specs]
            except KeyError:
                self._torch_specs = False
                return None
        Tensor = torch.Tensor
        dev = None
        ptrs = []
        for a, (dt, shape, strides) in zip(arrays, self._torch_specs):
            if type(a) is not Tensor or a.dtype is not dt or a.shape != shape or a.stride() != strides:
                return None
            p = a.data_ptr()
            d = a.get_device()          # -1 for a CPU tensor
            if d < 0 or p % 16 or (dev is not None and d != dev):
                return None
            dev = d
            ptrs.append(p)
        if stream is None:
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what torch.cuda.current_stream reads
            stream = raw(dev) if raw is not None else torch.cuda.current_stream(dev).cuda_stream
        self._launch_all(dev, ptrs, stream)
        return self._results(arrays)

    def _tmap(self, p: ir.TensorMapParam, ptr: int, device: int) -> bytes:
        """The TMA descriptor of ``p`` for the array at ``ptr`` (encoded once per address)."""
        key = (p.name, ptr, device)
        blob = self._tmaps.get(key)
        if blob is None:
            # any rank: (rows, cols) matrices, (batch, rows, cols) batches of them; int4 codes as bytes
            dt, shape, strides, box = p.hardware_view()
            blob = runtime.encode_tensor_map(ptr, dt, shape, strides, box, p.swizzle, device=device)
            if len(self._tmaps) > 64:
                self._tmaps.clear()
            self._tmaps[key] = blob
        return blob

    def _launch_all(self, device: int, ptrs: list, stream) -> None:
        for ln in self._load(device):
            args = []
            for i in ln.args:
                if isinstance(i, tuple) and i[0] == "tmap":
                    args.append((self._tmap(i[2], ptrs[i[1]], device), None))
                elif isinstance(i, tuple) and i[0] == "tmap_ws":
                    buf = i[1]
                    ptr = self._ws(buf.name, device, buf.size * buf.dtype.bits // 8, stream, buf.zeroed)
                    args.append((self._tmap(i[2], ptr, device), None))
                elif isinstance(i, tuple):
                    buf = i[1]
                    args.append((self._ws(buf.name, device, buf.size * buf.dtype.bits // 8, stream, buf.zeroed),
                                 ctypes.c_void_p))
                else:
                    args.append((ptrs[i], ctypes.c_void_p))
            ln.kernel.launch(ln.grid, ln.block, args, shared_bytes=ln.smem, stream=stream, programmatic=ln.programmatic)

    def __call__(self, *arrays, stream=None, **named):
        """Launch on ``arrays`` (positional, then ``named`` by tensor name; outputs left out are
        allocated for torch / CuPy inputs) on ``stream`` (default: the inputs' framework's current
        stream); returns the output(s)."""
        if not named and len(arrays) == len(self._arg_specs):
            done = self._torch_fast(arrays, stream)
            if done is not None:
                return done
        if named or len(arrays) != len(self._arg_specs):
            bound, missing = self.bind(arrays, named)
            if missing:
                self._allocate(bound, missing)
            arrays = tuple(bound)
            done = self._torch_fast(arrays, stream)
            if done is not None:
                return done
        if not runtime.gpu_available():
            raise runtime.LaunchError(
                f"no usable CUDA GPU: {runtime.gpu_unavailable_reason()}. The kernel compiled fine "
                f"(source and cubin are on this object); running it needs a GPU.")
        specs = self._arg_specs
        descs = [runtime.as_device_array(a, s.name) for a, s in zip(arrays, specs)]
        device = runtime.check_args(specs, descs, self.program.kernels[0].name)
        if stream is None:
            stream = next((d.stream for d in descs if d.stream is not None), 0)
        self._launch_all(device, [d.ptr for d in descs], stream)
        return self._results(arrays)

    def _results(self, arrays):
        n = len(self.program.outputs)
        return arrays[-1] if n == 1 else tuple(arrays[-n:])


_MEMO: dict = {}
_MEMO_MAX = 64


def compile(schedule: Schedule, arch: str | None = None, *, use_cache: bool = True,
            programmatic: bool | None = None) -> CompiledProgram:
    """Lower, print and NVRTC-compile ``schedule`` for ``arch`` (works without a GPU).

    ``arch`` None is the default target (``hardware.target.default_target``: the GPU present,
    else sm_90a).  sm_70 is the interpreter's alone: NVRTC 13 cannot build it (``CompileError``).

    ``programmatic``: the program's first kernel is launched with programmatic stream
    serialization and waits (``griddepcontrol.wait``) before its first global access, and its
    last kernel lets the next launch start early, so calls one after another on a stream overlap
    each launch with the tail of the one before (``lower.transforms.launches``; measured on an
    H100: 0.3-0.7 us a call).  None (the default): the first kernel so on sm_90a, except for a
    grid sized to the SMs (a persistent or stream-K schedule), which gains nothing from it, and the
    last lets the next launch start only in a program of one kernel (a split product's reduction
    that did so measured up to 12 % slower); True: both on every program; False: the first kernel
    launched the ordinary way.  True on a target without ``griddepcontrol`` is a ``ScheduleError``.

    Compiled programs are remembered per (schedule, arch) in this process, and cubins on disk
    (``firesched.cuda.nvrtc.cache_dir()``), so asking again costs a dictionary lookup;
    ``use_cache=False`` lowers and compiles afresh (the lowering's memo skipped too).

    A kernel that spills registers to local memory compiles, with a ``PerformanceWarning`` that
    names it, its spill bytes and what to change.
    """
    _require_schedule(schedule, "compile")
    try:
        tgt = get_target(arch)
    except ValueError as e:
        raise ScheduleError(str(e), field="arch", value=arch, allowed=target_names(compiled=True),
                            fix="compile(schedule, arch='sm_80') or another target listed, or arch=None for the "
                                "GPU present") from None
    arch = tgt.arch
    if not tgt.compiles:
        raise CompileError(nvrtc.unbuildable_message(arch))
    check_programmatic(programmatic)            # before the memo's lookup: the value is part of its key
    key = (schedule, arch, nvrtc.cache_dir(), programmatic)
    out = _MEMO.get(key) if use_cache else None
    if out is None:
        t0 = time.perf_counter()
        # use_cache=False lowers afresh too: a caller that changed a lowering tunable between
        # two compiles of one schedule (bench/layernorm_variants.py) gets what it asked for
        prog = schedule.lower(arch, programmatic=programmatic) if use_cache else \
            _driver.lower(schedule, arch, programmatic=programmatic, fresh=True)
        modules = []
        sources = []
        for kern in prog.kernels:
            src = cuda.emit_kernel(kern)
            sources.append(src)
            modules.append(nvrtc.compile_cuda(src, arch=arch, use_cache=use_cache,
                                              filename=f"{kern.name}.cu"))
        out = CompiledProgram(schedule, prog, "\n".join(sources), modules, arch, time.perf_counter() - t0)
        if use_cache:
            if len(_MEMO) >= _MEMO_MAX:
                _MEMO.pop(next(iter(_MEMO)))
            _MEMO[key] = out
    for name, r in out.resources.items():
        if r.spill_store_bytes or r.spill_load_bytes:
            warnings.warn(PerformanceWarning(
                f"kernel {name} spills registers ({arch}): {r.spill_store_bytes} bytes of spill stores and "
                f"{r.spill_load_bytes} bytes of spill loads per thread, at {r.registers} registers; spilled "
                f"values go through local memory at every use. Use smaller tiles (smaller warp tiles: more "
                f"warps per block, or a smaller block tile), fewer pipeline stages, or fewer epilogue / "
                f"prologue ops (CompiledProgram.resources has the figures)"), stacklevel=2)
    return out
