"""Load compiled kernels and launch them on arrays from torch, CuPy or any CUDA array protocol.

Only ``cuda.bindings.driver`` is used: the driver API shares the device's *primary* context with
torch and CuPy (both use the runtime API, which uses that context), so pointers from either are
valid in our launches and our kernels run on their streams.  torch and CuPy are never imported
here unless the caller hands us one of their objects, so a CPU-only user pays nothing for them.

Arguments are described by ``DeviceArray`` values and checked against the kernel's ``ArgSpec``
list *before* any launch, because a kernel handed a transposed or misaligned matrix does not
fail: it silently computes garbage or faults asynchronously, far from the mistake.

The launch path is kept short (a cached parameter layout, one ``struct.pack_into``, one driver
call) because small kernels are often launched thousands of times from Python.

``encode_tensor_map`` (any rank; ``encode_tensor_map_2d`` for matrices) builds the 128-byte TMA
descriptor (``CUtensorMap``) that sm_90a kernels take as a ``__grid_constant__`` parameter.

``load_module`` loads a module's CUBIN where it runs (its own compute capability, or a later minor
version of the same major); on a GPU of a newer major version (an sm_80 module on an H100) it
loads the module's PTX instead, which the driver compiles for that GPU.  sm_90a code runs on
compute capability 9.0 alone, CUBIN or PTX.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import struct
import threading
from typing import Any

import attrs

from firesched.errors import LaunchError

#: The element types an array can have, by firesched name, with their sizes in bytes.
ITEMSIZE: dict[str, int] = {
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i32": 4, "i64": 8,
    "f8e4m3": 1, "f8e5m2": 1,
}
DTYPES: tuple[str, ...] = tuple(ITEMSIZE)

#: Without opting in, a block may use at most 48 KiB of shared memory.
DEFAULT_SHARED_LIMIT = 48 * 1024


_DRIVER = None


def _driver():
    """cuda.bindings.driver, imported on first use and then kept (a function-level import on
    every launch would cost more than the rest of the launch's Python work)."""
    global _DRIVER
    if _DRIVER is None:
        from cuda.bindings import driver

        _DRIVER = driver
    return _DRIVER


# ---------------------------------------------------------------------------------------------
# Is there a GPU?

_gpu_lock = threading.Lock()
_gpu_reason: list[str | None] = []  # empty until probed; then [reason or None]


def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device can be used, else a sentence saying why not.  Probed once."""
    if _gpu_reason:
        return _gpu_reason[0]
    with _gpu_lock:
        if not _gpu_reason:
            _gpu_reason.append(_probe_gpu())
    return _gpu_reason[0]


def gpu_available() -> bool:
    """Whether kernels can be loaded and launched in this process."""
    return gpu_unavailable_reason() is None


def _probe_gpu() -> str | None:
    try:
        driver = _driver()
    except Exception as e:
        return f"cuda-bindings cannot be imported ({e})"
    try:
        (err,) = driver.cuInit(0)
    except Exception as e:
        return f"no CUDA driver was found ({e})"
    if err != driver.CUresult.CUDA_SUCCESS:
        if err == driver.CUresult.CUDA_ERROR_NO_DEVICE:
            return "the CUDA driver found no CUDA device"
        return f"cuInit failed with {_error_text(err)}"
    try:
        err, count = driver.cuDeviceGetCount()
    except Exception as e:
        return f"cuDeviceGetCount failed ({e})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuDeviceGetCount failed with {_error_text(err)}"
    if count == 0:
        return "the CUDA driver found no CUDA device"
    return None


def _require_gpu() -> None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise LaunchError(
            f"cannot load or launch kernels: no usable CUDA device/driver was found ({reason}). "
            f"Compiling still works without a GPU: firesched.compile emits CUDA and compiles it "
            f"with NVRTC; only loading and launching need a GPU.")


def _error_text(err) -> str:
    """'CUDA_ERROR_X: what the driver says it means' for a CUresult."""
    name = getattr(err, "name", None) or str(err)
    try:
        driver = _driver()
        e2, text = driver.cuGetErrorString(err)
        if e2 == driver.CUresult.CUDA_SUCCESS and text:
            text = text.decode() if isinstance(text, bytes) else str(text)
            return f"{name}: {text}"
    except Exception:
        pass
    return name


def _call(what: str, fn, *args):
    """Call a driver function and return its results without the CUresult; any failure becomes
    a LaunchError that names the call."""
    try:
        res = fn(*args)
    except Exception as e:
        raise LaunchError(f"{what} failed: {e}") from e
    err = res[0]
    if err:  # CUDA_SUCCESS is 0
        raise LaunchError(f"{what} failed with {_error_text(err)}")
    if len(res) == 1:
        return None
    if len(res) == 2:
        return res[1]
    return res[1:]


# ---------------------------------------------------------------------------------------------
# Devices and contexts


@attrs.frozen
class DeviceInfo:
    """What we need to know about a device, queried once."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    max_shared_per_block_optin: int
    max_threads_per_block: int
    sm_count: int = 0


class _Device:
    __slots__ = ("index", "handle", "context", "context_int", "info", "_get_current")

    def __init__(self, index: int):
        driver = _driver()
        self.index = index
        self.handle = _call(f"cuDeviceGet({index})", driver.cuDeviceGet, index)
        self.context = _call(f"cuDevicePrimaryCtxRetain(device {index})",
                             driver.cuDevicePrimaryCtxRetain, self.handle)
        self.context_int = int(self.context)
        self._get_current = driver.cuCtxGetCurrent
        attr = driver.CUdevice_attribute

        def get(a):
            return int(_call(f"cuDeviceGetAttribute({a.name}, device {index})",
                             driver.cuDeviceGetAttribute, a, self.handle))

        raw_name = _call(f"cuDeviceGetName(device {index})", driver.cuDeviceGetName, 256, self.handle)
        name = raw_name.split(b"\x00", 1)[0].decode(errors="replace") if isinstance(raw_name, bytes) \
            else str(raw_name)
        self.info = DeviceInfo(
            index=index,
            name=name,
            compute_capability=(get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
            max_shared_per_block_optin=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            max_threads_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )

    def make_current(self) -> None:
        """Make this device's primary context current in the calling thread, if it is not.

        Asked on every launch rather than remembered, because torch or CuPy may have switched
        the thread to another device's context since (``torch.cuda.set_device``)."""
        err, current = self._get_current()
        if err or current is None or int(current) != self.context_int:
            _call(f"cuCtxSetCurrent(primary context of device {self.index})",
                  _driver().cuCtxSetCurrent, self.context)


_devices: dict[int, _Device] = {}
_devices_lock = threading.Lock()


def _device(index: int) -> _Device:
    dev = _devices.get(index)
    if dev is not None:
        return dev
    _require_gpu()
    with _devices_lock:
        dev = _devices.get(index)
        if dev is None:
            count = _call("cuDeviceGetCount", _driver().cuDeviceGetCount)
            if not 0 <= index < count:
                raise LaunchError(f"there is no CUDA device {index}; this machine has {count} "
                                  f"(0..{count - 1})")
            dev = _Device(index)
            _devices[index] = dev
    return dev


def device_info(index: int = 0) -> DeviceInfo:
    """Name, compute capability and limits of CUDA device ``index``."""
    return _device(index).info


_driver_version: list[int] = []


def driver_version() -> int:
    """The CUDA driver's version as ``cuDriverGetVersion`` gives it (13000 for 13.0); asked once."""
    if not _driver_version:
        _require_gpu()
        _driver_version.append(int(_call("cuDriverGetVersion", _driver().cuDriverGetVersion)))
    return _driver_version[0]


def current_device() -> int:
    """The device of the calling thread's current CUDA context (torch's current device when
    torch made it current), 0 when no context is current."""
    _require_gpu()
    err, ctx = _driver().cuCtxGetCurrent()
    if err or ctx is None or int(ctx) == 0:
        return 0
    return int(_call("cuCtxGetDevice", _driver().cuCtxGetDevice))


# ---------------------------------------------------------------------------------------------
# Arrays


@attrs.frozen
class DeviceArray:
    """An array as a kernel sees it: a pointer, a shape, strides in elements and a dtype.

    ``device`` is None for memory that is not on a CUDA device (a numpy array, a CPU tensor), so
    that ``check_args`` can say so instead of launching on a host pointer.  ``stream`` is the
    framework's current stream for the array's device (None when the framework has none); a
    kernel launched there is ordered after the framework's pending work on the array.
    ``keepalive`` holds what must outlive the pointer (a DLPack capsule).
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int | None
    kind: str
    stream: int | None = None
    readonly: bool = False
    keepalive: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (C order) strides, in elements, of an array of ``shape``."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


_TORCH_DTYPES = {
    "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32",
    "torch.float64": "f64", "torch.int8": "i8", "torch.uint8": "u8", "torch.int32": "i32",
    "torch.int64": "i64", "torch.float8_e4m3fn": "f8e4m3", "torch.float8_e5m2": "f8e5m2",
}
_TORCH_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}

_NUMPY_DTYPES = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8",
    "uint8": "u8", "int32": "i32", "int64": "i64", "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
}

# Array-interface typestrs; bf16 and fp8 have none of their own (numpy calls them 'V'oid).
_TYPESTRS = {
    "f2": "f16", "f4": "f32", "f8": "f64", "i1": "i8", "u1": "u8", "i4": "i32", "i8": "i64",
}

_DLPACK_DTYPES = {
    # (type code, bits): firesched dtype
    (2, 16): "f16", (2, 32): "f32", (2, 64): "f64", (4, 16): "bf16",
    (0, 8): "i8", (0, 32): "i32", (0, 64): "i64", (1, 8): "u8",
    (10, 8): "f8e4m3", (12, 8): "f8e5m2",
}
_KDLCPU = 1
_KDLCUDA = 2

_ACCEPTED = ("a torch tensor, a CuPy array, an object with __cuda_array_interface__ or with "
             "__dlpack__/__dlpack_device__ (CUDA memory), or a numpy array (rejected later as "
             "host memory)")


def as_device_array(obj: Any, name: str) -> DeviceArray:
    """Describe ``obj`` (the kernel argument called ``name``) as a ``DeviceArray``.

    Accepts torch tensors, CuPy arrays, anything with ``__cuda_array_interface__`` (v2/v3) and
    DLPack producers.  Host memory (numpy, CPU tensors) comes back with ``device=None`` so that
    ``check_args`` reports it by name.  Raises ``ValueError`` for anything else.
    """
    if isinstance(obj, DeviceArray):
        return obj
    mod = type(obj).__module__.partition(".")[0]
    if mod == "torch" or (hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda")
                          and hasattr(obj, "stride") and hasattr(obj, "dtype")):
        return _from_torch(obj, name)
    if mod == "cupy" and hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name, kind="cupy")
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name, kind="cai")
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__") and \
            not hasattr(obj, "__array_interface__"):
        return _from_dlpack(obj, name)
    if hasattr(obj, "__array_interface__"):
        return _from_numpy(obj, name)
    raise ValueError(f"argument {name} is a {type(obj).__module__}.{type(obj).__qualname__}; "
                     f"expected {_ACCEPTED}")


def _unknown_dtype(name: str, what: str, how: str) -> ValueError:
    return ValueError(f"argument {name} has dtype {what}, which firesched kernels do not take "
                      f"({how}); allowed: {', '.join(DTYPES)}")


def _from_torch(t, name: str) -> DeviceArray:
    dtype = _TORCH_DTYPES.get(str(t.dtype))
    if dtype is None:
        raise _unknown_dtype(name, str(t.dtype), "torch tensor")
    dev = t.device
    shape = tuple(int(s) for s in t.shape)
    strides = tuple(int(s) for s in t.stride())
    if getattr(t, "is_cuda", False):
        import torch

        index = dev.index if dev.index is not None else torch.cuda.current_device()
        stream = int(torch.cuda.current_stream(index).cuda_stream)
        return DeviceArray(ptr=int(t.data_ptr()), shape=shape, strides=strides, dtype=dtype,
                           device=int(index), kind="torch", stream=stream)
    if getattr(dev, "type", "cpu") != "cpu":
        raise ValueError(f"argument {name} is a torch tensor on device {dev}; firesched kernels "
                         f"need CUDA tensors, e.g. {name}.cuda()")
    return DeviceArray(ptr=int(t.data_ptr()), shape=shape, strides=strides, dtype=dtype,
                       device=None, kind="torch", stream=None)


def _byte_strides_to_elements(name: str, byte_strides, itemsize: int) -> tuple[int, ...]:
    out = []
    for s in byte_strides:
        if s % itemsize:
            raise ValueError(f"argument {name} has a byte stride of {s}, not a multiple of its "
                             f"{itemsize}-byte elements; pass a copy with regular strides")
        out.append(s // itemsize)
    return tuple(out)


def _typestr_dtype(name: str, typestr: str, protocol: str) -> str:
    order, code = typestr[:1], typestr[1:]
    dtype = _TYPESTRS.get(code)
    if dtype is None or order not in "<|=":
        raise _unknown_dtype(
            name, repr(typestr), f"{protocol} typestr; bf16 and fp8 have no typestr of their own, "
            f"so pass such arrays as torch tensors or through DLPack")
    return dtype


def _from_cai(obj, name: str, *, kind: str) -> DeviceArray:
    cai = obj.__cuda_array_interface__
    version = cai.get("version", 0)
    if version < 2:
        raise ValueError(f"argument {name} has __cuda_array_interface__ version {version}; "
                         f"versions 2 and 3 are supported")
    if cai.get("mask") is not None:
        raise ValueError(f"argument {name} is a masked array; pass its data without a mask")
    dtype = _typestr_dtype(name, cai["typestr"], "__cuda_array_interface__")
    shape = tuple(int(s) for s in cai["shape"])
    raw = cai.get("strides")
    strides = contiguous_strides(shape) if raw is None else \
        _byte_strides_to_elements(name, raw, ITEMSIZE[dtype])
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    stream = cai.get("stream")
    if kind == "cupy":
        import cupy

        device = int(obj.device.id)
        stream = int(cupy.cuda.get_current_stream().ptr)
    else:
        device = _pointer_device(ptr, name)
    return DeviceArray(ptr=ptr, shape=shape, strides=strides, dtype=dtype, device=device,
                       kind=kind, stream=None if stream is None else int(stream),
                       readonly=bool(readonly))


def _pointer_device(ptr: int, name: str) -> int:
    """The device a CUDA pointer belongs to, asked of the driver (the array interface does not
    say).  An empty array's null pointer belongs to the current device."""
    _require_gpu()
    driver = _driver()
    if ptr == 0:
        try:
            err, dev = driver.cuCtxGetDevice()
            return int(dev) if err == driver.CUresult.CUDA_SUCCESS else 0
        except Exception:
            return 0
    try:
        err, ordinal = driver.cuPointerGetAttribute(
            driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    except Exception as e:
        raise ValueError(f"argument {name}: cannot ask the driver which device holds pointer "
                         f"{ptr:#x} ({e})") from e
    if err != driver.CUresult.CUDA_SUCCESS:
        raise ValueError(f"argument {name}: the pointer {ptr:#x} is not CUDA device memory the "
                         f"driver knows ({_error_text(err)})")
    return int(ordinal)


def _from_numpy(a, name: str) -> DeviceArray:
    ai = a.__array_interface__
    np_name = getattr(getattr(a, "dtype", None), "name", None)
    dtype = _NUMPY_DTYPES.get(np_name) if np_name else None
    if dtype is None:
        dtype = _typestr_dtype(name, ai["typestr"], "__array_interface__")
    shape = tuple(int(s) for s in ai["shape"])
    raw = ai.get("strides")
    strides = contiguous_strides(shape) if raw is None else \
        _byte_strides_to_elements(name, raw, ITEMSIZE[dtype])
    ptr, readonly = ai["data"]
    return DeviceArray(ptr=int(ptr or 0), shape=shape, strides=strides, dtype=dtype, device=None,
                       kind="numpy", stream=None, readonly=bool(readonly))


# DLPack's C structures (dlpack.h); we read them, we never free them ourselves.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_DLPACK_READ_ONLY = 1

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, name: str) -> DeviceArray:
    """Read a DLPack capsule without consuming it.

    The capsule stays named "dltensor" (or "dltensor_versioned"), so its own destructor calls
    the producer's deleter once the capsule is garbage: we must not call the deleter, and we
    keep the capsule alive in ``keepalive`` for as long as the DeviceArray holds the pointer.
    """
    dev_type, dev_id = (int(x) for x in obj.__dlpack_device__())
    if dev_type not in (_KDLCPU, _KDLCUDA):
        raise ValueError(f"argument {name} is DLPack memory of device type {dev_type}; firesched "
                         f"kernels take CUDA device memory (kDLCUDA = 2)")
    try:
        capsule = obj.__dlpack__(max_version=(1, 1))
    except TypeError:
        capsule = obj.__dlpack__()
    readonly = False
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        if managed.version.major != 1:
            raise ValueError(f"argument {name} is a DLPack {managed.version.major}.x tensor; "
                             f"firesched reads DLPack 1.x")
        tensor = managed.dl_tensor
        readonly = bool(managed.flags & _DLPACK_READ_ONLY)
    elif _capsule_is_valid(capsule, b"dltensor"):
        tensor = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor")).dl_tensor
    else:
        raise ValueError(f"argument {name}: __dlpack__() did not return an unused DLPack capsule")
    dt = tensor.dtype
    dtype = _DLPACK_DTYPES.get((dt.code, dt.bits)) if dt.lanes == 1 else None
    if dtype is None:
        raise _unknown_dtype(name, f"(code {dt.code}, {dt.bits} bits, {dt.lanes} lanes)", "DLPack")
    ndim = tensor.ndim
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if ndim and bool(tensor.strides):
        strides = tuple(int(tensor.strides[i]) for i in range(ndim))
    else:
        strides = contiguous_strides(shape)
    ptr = (tensor.data or 0) + tensor.byte_offset
    device = int(tensor.device.device_id) if tensor.device.device_type == _KDLCUDA else None
    return DeviceArray(ptr=ptr, shape=shape, strides=strides, dtype=dtype, device=device,
                       kind="dlpack", stream=None, readonly=readonly, keepalive=capsule)


# ---------------------------------------------------------------------------------------------
# Checking arguments


@attrs.frozen
class ArgSpec:
    """What a kernel expects of one array argument."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str = attrs.field()
    strides: tuple[int, ...] = attrs.field(converter=tuple)
    align_bytes: int = 16
    writable: bool = False

    @dtype.validator
    def _check_dtype(self, _attribute, value):
        if value not in ITEMSIZE:
            raise ValueError(f"ArgSpec {self.name}: unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")

    @strides.validator
    def _check_strides(self, _attribute, value):
        if len(value) != len(self.shape):
            raise ValueError(f"ArgSpec {self.name}: {len(value)} strides for a {len(self.shape)}-d "
                             f"shape {self.shape}")


def _hint_to_gpu(a: DeviceArray, name: str) -> str:
    if a.kind == "torch":
        return f"{name}.cuda()"
    if a.kind == "numpy":
        return f"torch.from_numpy({name}).cuda() or cupy.asarray({name})"
    return "a copy in CUDA device memory"


def _hint_copy(a: DeviceArray, name: str) -> str:
    if a.kind == "torch":
        return f"{name}.clone()"
    if a.kind in ("cupy", "numpy"):
        return f"{name}.copy()"
    return f"a copy of {name}"


def _hint_dtype(a: DeviceArray, name: str, want: str) -> str:
    if a.kind == "torch":
        return f"{name}.to({_TORCH_NAMES[want]})"
    if a.kind in ("cupy", "numpy") and want in _NUMPY_DTYPES.values():
        np_name = next(k for k, v in _NUMPY_DTYPES.items() if v == want)
        return f"{name}.astype('{np_name}')"
    return f"a {want} copy of {name}"


def _strides_match(shape, found, expected) -> bool:
    """Strides of dimensions of extent 1 are never used, and an empty array reads nothing, so
    frameworks may report anything there; compare only the strides that address memory."""
    if any(n == 0 for n in shape):
        return True
    return all(n == 1 or f == e for n, f, e in zip(shape, found, expected))


def _describe_strides(name: str, shape, found, expected) -> str:
    row = contiguous_strides(shape)
    col = tuple(reversed(contiguous_strides(tuple(reversed(shape)))))
    if _strides_match(shape, expected, row):
        what = f"{name} is not row-major contiguous"
        fix = f"pass {name}.contiguous()"
    elif len(shape) >= 2 and _strides_match(shape, expected, col):
        what = f"{name} is not column-major contiguous"
        fix = f"pass {name}.t().contiguous().t() (torch) or numpy.asfortranarray({name})"
    else:
        what = f"{name} does not have the strides the kernel was built for"
        fix = f"pass a copy of {name} with those strides"
    return (f"{what}: strides {tuple(found)}, expected {tuple(expected)} (in elements); {fix}, "
            f"or build the schedule with a layout=... that matches {name}'s strides")


def check_args(specs: list[ArgSpec], arrays: list[DeviceArray], kernel: str) -> int:
    """Check ``arrays`` against the kernel's ``specs``; return the device they all live on.

    Every problem found is reported in one ``ValueError``, each naming the argument, what it is
    and what the kernel expects, with a way to fix it.  Nothing is launched when this raises.
    """
    if len(arrays) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise ValueError(f"kernel {kernel} takes {len(specs)} array argument(s) ({names}) but "
                         f"{len(arrays)} were given")
    problems: list[str] = []
    devices: dict[int, list[str]] = {}
    for spec, a in zip(specs, arrays):
        n = spec.name
        if a.device is None:
            problems.append(f"{n} is on the CPU; move it to the GPU, e.g. {_hint_to_gpu(a, n)}")
        else:
            devices.setdefault(a.device, []).append(n)
        if a.dtype != spec.dtype:
            problems.append(f"{n} has dtype {a.dtype}, expected {spec.dtype}; convert it, e.g. "
                            f"{_hint_dtype(a, n, spec.dtype)}")
        if tuple(a.shape) != tuple(spec.shape):
            problems.append(f"{n} has shape {tuple(a.shape)}, expected {tuple(spec.shape)}")
        elif not _strides_match(a.shape, a.strides, spec.strides):
            problems.append(_describe_strides(n, a.shape, a.strides, spec.strides))
        if spec.align_bytes > 1 and a.ptr % spec.align_bytes:
            problems.append(
                f"{n}'s data pointer {a.ptr:#x} is not aligned to {spec.align_bytes} bytes (it is "
                f"off by {a.ptr % spec.align_bytes}); the kernel reads it with "
                f"{spec.align_bytes}-byte loads. Views that start inside an allocation (e.g. "
                f"{n}[1:]) do this; pass a fresh copy, e.g. {_hint_copy(a, n)}")
        if spec.writable and a.readonly:
            problems.append(f"{n} is read-only, but kernel {kernel} writes it; pass a writable array")
    if len(devices) > 1:
        where = ", ".join(f"{', '.join(ns)} on cuda:{d}" for d, ns in sorted(devices.items()))
        first = min(devices)
        problems.append(f"the arguments are on different devices ({where}); move them to one "
                        f"device, e.g. .to('cuda:{first}')")
    if problems:
        head = f"kernel {kernel}: " + ("" if len(problems) == 1 else f"{len(problems)} argument problems:\n  - ")
        raise ValueError(head + "\n  - ".join(problems))
    return next(iter(devices)) if devices else 0


# ---------------------------------------------------------------------------------------------
# Kernel parameters


_SCALAR_CODES = {
    # ctypes' own type letters mapped to struct's standard-size codes (long is 8 bytes on the
    # 64-bit platforms CUDA supports, so "l"/"L" become "q"/"Q").
    "b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "l": "q", "L": "Q",
    "q": "q", "Q": "Q", "f": "f", "d": "d", "?": "?", "P": "Q",
}


class _ParamLayout:
    """How one kernel signature's parameters sit in a buffer, and a per-thread buffer for it.

    ``cuLaunchKernel`` takes an array of pointers, one per parameter, each pointing at that
    parameter's bytes; it copies them before returning, so one buffer per thread is reused for
    every launch.  Packing is a single ``struct.pack_into``.
    """

    __slots__ = ("types", "fmt", "size", "offsets", "sizes", "blob_sizes", "pointer_slots",
                 "_local")

    def __init__(self, types: tuple):
        self.types = types
        pieces = ["="]
        offsets: list[int] = []
        sizes: list[int] = []
        blob_sizes: dict[int, int] = {}
        pointer_slots: list[int] = []
        pos = 0
        for i, t in enumerate(types):
            if isinstance(t, int):  # a raw blob of t bytes (ctype None with a bytes value)
                size, align, code = t, (64 if t >= 64 else 8), f"{t}s"
                blob_sizes[i] = t
            elif isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Union, ctypes.Array)):
                size, align = ctypes.sizeof(t), ctypes.alignment(t)
                code = f"{size}s"
                blob_sizes[i] = size
            elif isinstance(t, type) and issubclass(t, ctypes._SimpleCData) and \
                    getattr(t, "_type_", None) in _SCALAR_CODES:
                size, align = ctypes.sizeof(t), ctypes.alignment(t)
                code = _SCALAR_CODES[t._type_]
                if struct.calcsize("=" + code) != size:
                    raise TypeError(f"parameter {i}: unsupported ctype {t.__name__}")
                if t._type_ == "P":
                    pointer_slots.append(i)
            else:
                raise TypeError(
                    f"parameter {i}: unsupported type {t!r}; use a ctypes scalar type (c_void_p "
                    f"for pointers, c_int, c_float, ...), a ctypes Structure/array type, or None "
                    f"with a bytes value for a raw __grid_constant__ blob")
            pad = (-pos) % align
            if pad:
                pieces.append(f"{pad}x")
                pos += pad
            offsets.append(pos)
            sizes.append(size)
            pieces.append(code)
            pos += size
        self.fmt = struct.Struct("".join(pieces))
        self.size = max(pos, 1)
        self.offsets = tuple(offsets)
        self.sizes = tuple(sizes)
        self.blob_sizes = blob_sizes
        self.pointer_slots = tuple(pointer_slots)
        self._local = threading.local()

    def _buffers(self):
        loc = self._local
        buf = getattr(loc, "buf", None)
        if buf is None:
            # 64-byte alignment for the whole block keeps every blob's alignment real.
            raw = ctypes.create_string_buffer(self.size + 64)
            base = ctypes.addressof(raw)
            shift = (-base) % 64
            buf = (ctypes.c_char * self.size).from_buffer(raw, shift)
            n = len(self.offsets)
            ptrs = (ctypes.c_void_p * max(n, 1))(*[base + shift + off for off in self.offsets])
            loc.raw, loc.buf, loc.ptrs = raw, buf, ptrs
            loc.addr = ctypes.addressof(ptrs) if n else 0
        return loc

    def pack(self, values: list) -> int:
        """Write ``values`` into this thread's buffer; return the address of the pointer array."""
        loc = self._buffers()
        # Pointers must be plain ints here: struct would happily take any object's __index__
        # (a one-element integer tensor's value), so everything else goes through _coerce.
        slow = bool(self.blob_sizes)
        if not slow:
            for i in self.pointer_slots:
                if type(values[i]) is not int:
                    slow = True
                    break
        if slow:
            values = self._coerce(values)
        try:
            self.fmt.pack_into(loc.buf, 0, *values)
        except (struct.error, TypeError):
            self.fmt.pack_into(loc.buf, 0, *self._coerce(values))
        return loc.addr

    def _coerce(self, values: list) -> list:
        out = list(values)
        for i, v in enumerate(out):
            t = self.types[i]
            if i in self.blob_sizes:
                want = self.blob_sizes[i]
                b = bytes(v) if not isinstance(v, bytes) else v
                if len(b) != want:
                    raise ValueError(f"kernel parameter {i} is a {want}-byte blob but {len(b)} "
                                     f"bytes were given")
                out[i] = b
                continue
            if isinstance(v, DeviceArray):
                v = v.ptr
            elif isinstance(v, ctypes._SimpleCData):
                v = v.value
            elif i in self.pointer_slots:
                if hasattr(v, "data_ptr"):
                    v = v.data_ptr()
                elif hasattr(v, "getPtr"):
                    v = v.getPtr()
                elif v is not None and not isinstance(v, int):
                    raise ValueError(f"kernel parameter {i} is a pointer; pass an int address, a "
                                     f"DeviceArray or a tensor, not {type(v).__name__}")
            if v is None and i in self.pointer_slots:
                v = 0
            try:
                struct.pack("=" + _SCALAR_CODES[t._type_], v)
            except (struct.error, TypeError) as e:
                raise ValueError(f"kernel parameter {i}: cannot pass {v!r} as {t.__name__} ({e})") \
                    from None
            out[i] = v
        return out


def _layout_key(args) -> tuple[tuple, list]:
    values = [a[0] for a in args]
    types = tuple([a[1] for a in args])
    if None in types:
        types = tuple(len(bytes(v)) if t is None else t for v, t in zip(values, types))
    return types, values


def _stream_handle(stream) -> int:
    if stream is None:
        return 0
    if type(stream) is int:
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ValueError(f"stream must be an int handle, a torch/CuPy stream or a CUstream; got "
                         f"{stream!r}") from None


# ---------------------------------------------------------------------------------------------
# Modules and kernels


class Kernel:
    """One ``__global__`` function of a loaded module, ready to launch on its device."""

    __slots__ = ("name", "module", "device", "handle", "static_smem_bytes", "max_threads",
                 "_dev", "_dyn_allowed", "_optin", "_layouts", "_param_sizes", "_launch", "_pdl_configs",
                 "__weakref__")

    def __init__(self, module: LoadedModule, name: str, handle, params: int | None = None):
        driver = _driver()
        fattr = driver.CUfunction_attribute
        self.name = name
        self.module = module
        self._dev = module._dev
        self.device = module.device
        self.handle = handle

        def get(a):
            return int(_call(f"cuFuncGetAttribute({a.name}, {name})", driver.cuFuncGetAttribute,
                             a, handle))

        self.static_smem_bytes = get(fattr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        self.max_threads = get(fattr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self._dyn_allowed = get(fattr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        self._optin = self._dev.info.max_shared_per_block_optin
        self._layouts: dict[tuple, _ParamLayout] = {}
        try:
            self._param_sizes = _param_sizes(handle, params)
        except LaunchError as e:
            raise LaunchError(f"kernel {name}: {e}") from None
        self._launch = driver.cuLaunchKernel
        # programmatic launches' configurations, by (grid, block, shared bytes, stream): built once
        self._pdl_configs: dict[tuple, object] = {}

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, device={self.device})"

    def reserve_shared(self, nbytes: int) -> None:
        """Allow launches with ``nbytes`` of dynamic shared memory.  Above 48 KiB (less the static
        shared memory) a kernel must opt in; the device's opt-in limit caps it."""
        if nbytes <= self._dyn_allowed:
            return
        total = nbytes + self.static_smem_bytes
        if total > self._optin:
            info = self._dev.info
            raise LaunchError(
                f"kernel {self.name} asks for {nbytes} bytes of dynamic shared memory plus "
                f"{self.static_smem_bytes} static = {total} bytes per block, more than the "
                f"{self._optin} bytes device {self.device} ({info.name}) allows "
                f"(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); use smaller tiles or "
                f"fewer pipeline stages")
        driver = _driver()
        self._dev.make_current()
        _call(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}, {self.name})",
              driver.cuFuncSetAttribute, self.handle,
              driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self._dyn_allowed = nbytes

    def max_active_clusters(self, grid, block, shared_bytes: int = 0) -> int:
        """How many thread-block clusters of this kernel (its compile-time ``__cluster_dims__``)
        can be resident on the device at once (``cuOccupancyMaxActiveClusters``): the largest
        grid a persistent cluster kernel can fill in one wave is this many clusters."""
        driver = _driver()
        if shared_bytes > self._dyn_allowed:
            self.reserve_shared(shared_bytes)
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(g) for g in grid)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(b) for b in block)
        cfg.sharedMemBytes = int(shared_bytes)
        cfg.numAttrs = 0
        self._dev.make_current()
        return int(_call(f"cuOccupancyMaxActiveClusters({self.name})", driver.cuOccupancyMaxActiveClusters,
                         self.handle, cfg))

    def _layout(self, types: tuple) -> _ParamLayout:
        layout = self._layouts.get(types)
        if layout is None:
            layout = _ParamLayout(types)
            sizes = self._param_sizes
            if sizes is not None:
                if len(sizes) != len(layout.sizes):
                    raise LaunchError(f"kernel {self.name} takes {len(sizes)} parameters but "
                                      f"{len(layout.sizes)} were given")
                for i, (want, got) in enumerate(zip(sizes, layout.sizes)):
                    if want != got:
                        raise LaunchError(f"kernel {self.name}: parameter {i} is {want} bytes but "
                                          f"the value given for it is {got} bytes ({types[i]!r})")
            self._layouts[types] = layout
        return layout

    def launch(self, grid, block, args, *, shared_bytes: int = 0, stream=0, programmatic: bool = False) -> None:
        """Launch on ``grid`` x ``block`` with ``args``, a list of (value, ctype) pairs.

        Pointers are ``(int or DeviceArray, ctypes.c_void_p)``, scalars e.g. ``(n, ctypes.c_int)``,
        and a ``__grid_constant__`` struct such as a 128-byte TMA descriptor is ``(its bytes,
        None)`` or ``(a ctypes Structure, its type)``.  ``stream`` is a raw handle (0 = the
        legacy default stream) or a torch/CuPy stream object.  ``programmatic`` launches it with
        programmatic stream serialization (``cuLaunchKernelEx``): it may start before the previous
        launch on the stream has completed, and must ``griddepcontrol.wait`` for it
        (``ir.Kernel.programmatic``).
        """
        types, values = _layout_key(args)
        params = self._layout(types).pack(values)
        if shared_bytes > self._dyn_allowed:
            self.reserve_shared(shared_bytes)
        gx, gy, gz = grid
        bx, by, bz = block
        check_block_size(self.name, block, self.max_threads)
        if type(stream) is not int:
            stream = _stream_handle(stream)
        self._dev.make_current()
        try:
            if programmatic:
                key = (tuple(grid), tuple(block), shared_bytes, stream)
                cfg = self._pdl_configs.get(key)
                if cfg is None:
                    cfg = self._pdl_configs.setdefault(key, _programmatic_config(grid, block, shared_bytes, stream))
                (err,) = _driver().cuLaunchKernelEx(cfg, self.handle, params, 0)
            else:
                (err,) = self._launch(self.handle, gx, gy, gz, bx, by, bz, shared_bytes, stream,
                                      params, 0)
        except Exception as e:
            raise LaunchError(f"cuLaunchKernel({self.name}) failed: {e}") from e
        if err:
            raise LaunchError(
                f"cuLaunchKernel({self.name}, grid={tuple(grid)}, block={tuple(block)}, "
                f"shared_bytes={shared_bytes}, stream={stream:#x}) failed with {_error_text(err)}")


def _programmatic_config(grid, block, shared_bytes: int, stream: int):
    """The ``cuLaunchKernelEx`` configuration of a launch with the programmatic-stream-
    serialization attribute (a dependent launch: see ``lower.transforms.launches``)."""
    driver = _driver()
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = shared_bytes
    cfg.hStream = driver.CUstream(stream)
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


def check_block_size(kernel: str, block, max_threads: int) -> None:
    """Refuse a block of more threads than the kernel may run (``LaunchError``): the driver would
    fail the launch with a less helpful message."""
    bx, by, bz = block
    if bx * by * bz > max_threads:
        raise LaunchError(f"kernel {kernel}: a block of {bx}x{by}x{bz} = {bx * by * bz} "
                          f"threads is more than its limit of {max_threads}")


def _param_sizes(handle, count: int | None = None) -> tuple[int, ...] | None:
    """The byte size of each kernel parameter from the CUBIN's metadata, so that a wrong number
    or size of arguments is an error instead of a kernel reading garbage.  None when the driver
    or the bindings cannot tell (cuFuncGetParamInfo is CUDA 12.4+).

    With ``count`` (the caller knows the signature: it generated the source) only parameters
    ``0 .. count-1`` are asked for, and one the CUBIN lacks is an error.  Without it the
    parameters are asked for until the driver says there is no such index; that answer is a CUDA
    API error which compute-sanitizer reports (one per kernel), hence the hint."""
    driver = _driver()
    fn = getattr(driver, "cuFuncGetParamInfo", None)
    if fn is None:
        return None
    sizes = []
    try:
        for i in range(4096 if count is None else count):
            res = fn(handle, i)
            if count is not None and res[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                raise LaunchError(f"the kernel takes {i} parameters, not the {count} its "
                                  f"signature declared")
            if res[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                break
            if res[0]:
                return None
            sizes.append(int(res[2]))
    except LaunchError:
        raise
    except Exception:
        return None
    return tuple(sizes)


class LoadedModule:
    """A CUBIN loaded on one device (in its primary context)."""

    __slots__ = ("device", "handle", "cubin_sha256", "arch", "from_ptx", "_dev", "_kernels", "_lock")

    def __init__(self, handle, dev: _Device, cubin_sha256: str, arch: str | None, from_ptx: bool = False):
        self.handle = handle
        self._dev = dev
        self.device = dev.index
        self.cubin_sha256 = cubin_sha256
        self.arch = arch
        self.from_ptx = from_ptx      # loaded from the module's PTX (the driver compiled it), not its CUBIN
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        via = ", from PTX" if self.from_ptx else ""
        return f"LoadedModule(sha256={self.cubin_sha256[:12]}..., device={self.device}{via})"

    def kernel(self, name: str, params: int | None = None) -> Kernel:
        """The ``extern "C" __global__`` function ``name`` of this module.

        ``params``, where the caller knows it, is the number of parameters the kernel was
        declared with: launches are then checked against the sizes of exactly those (a CUBIN
        with fewer is an error here), without asking the driver for a parameter past the last,
        an API error that compute-sanitizer would report."""
        k = self._kernels.get(name)
        if k is not None:
            if params is not None and k._param_sizes is not None and len(k._param_sizes) < params:
                raise LaunchError(f"kernel {name}: the kernel takes {len(k._param_sizes)} "
                                  f"parameters, not the {params} its signature declared")
            return k
        with self._lock:
            k = self._kernels.get(name)
            if k is None:
                driver = _driver()
                self._dev.make_current()
                try:
                    res = driver.cuModuleGetFunction(self.handle, name.encode())
                except Exception as e:
                    raise LaunchError(f"cuModuleGetFunction({name!r}) failed: {e}") from e
                if res[0] == driver.CUresult.CUDA_ERROR_NOT_FOUND:
                    raise LaunchError(f"the module has no kernel named {name!r}; kernels must be "
                                      f'declared extern "C" __global__ so that their names are '
                                      f"not mangled")
                if res[0]:
                    raise LaunchError(f"cuModuleGetFunction({name!r}) failed with {_error_text(res[0])}")
                k = Kernel(self, name, res[1], params)
                self._kernels[name] = k
        return k


_modules: dict[tuple[str, int], LoadedModule] = {}
_modules_lock = threading.Lock()


def _suggest_arch(have: tuple[int, int], smem_optin: int | None = None) -> str:
    """The target to compile for on a GPU of compute capability ``have``."""
    from firesched.hardware.target import target_for_capability

    try:
        return target_for_capability(*have, smem_optin).name
    except ValueError:
        return f"sm_{have[0]}{have[1]}"


def load_plan(arch: str | None, have: tuple[int, int], has_ptx: bool, smem_optin: int | None = None) -> str:
    """How a module compiled for ``arch`` loads on a GPU of compute capability ``have``:
    ``"cubin"`` where its CUBIN runs (the same capability, or a later minor version of the same
    major), ``"ptx"`` on a GPU of a later major version when the module has PTX (the driver
    compiles it for the GPU).  Raises ``LaunchError`` where neither runs: an older GPU, an
    architecture-specific arch (sm_90a) on another capability, a newer major without PTX; its fix
    names the target for that GPU (``smem_optin``: its shared memory per block, where known)."""
    if arch is None:
        return "cubin"
    digits = arch[3:].rstrip("a")
    try:
        number = int(digits)
    except ValueError:
        return "cubin"
    want = (number // 10, number % 10)
    if have == want:
        return "cubin"
    suggest = _suggest_arch(have, smem_optin)
    where = f"compute capability {have[0]}.{have[1]}"
    if arch.endswith("a"):
        raise LaunchError(
            f"the module was compiled for {arch}, whose CUBIN and PTX run on compute capability "
            f"{want[0]}.{want[1]} only (architecture-specific instructions such as wgmma and setmaxnreg): "
            f"the driver cannot JIT {arch} PTX for {where}; compile it with arch={suggest!r}")
    if have[0] == want[0] and have[1] > want[1]:
        return "cubin"
    if have > want and has_ptx:
        return "ptx"
    if have > want:
        raise LaunchError(f"the module was compiled for {arch}, whose CUBIN does not run on {where}, and it "
                          f"carries no PTX for the driver to compile; compile it with arch={suggest!r} (or pass "
                          f"the CompiledModule, which holds its PTX, rather than CUBIN bytes)")
    raise LaunchError(f"the module was compiled for {arch}, which cannot run on the older {where}; compile it "
                      f"with arch={suggest!r}")


def _check_arch_runs(arch: str, info: DeviceInfo, has_ptx: bool = False) -> str:
    """``load_plan`` for a device, with the device named in its errors."""
    try:
        return load_plan(arch, info.compute_capability, has_ptx, info.max_shared_per_block_optin)
    except LaunchError as e:
        raise LaunchError(f"device {info.index} ({info.name}): {e}") from None


def load_module(module, device: int = 0) -> LoadedModule:
    """Load a compiled module (a ``CompiledModule``, or CUBIN bytes) on CUDA device ``device``.

    The CUBIN is loaded where it runs; on a GPU of a newer major version the module's PTX
    (``CompiledModule.ptx``) is loaded instead and compiled by the driver (``load_plan``), and
    also when the driver refuses the CUBIN of an earlier minor version.  ``LoadedModule.from_ptx``
    says which.  Modules are cached per (CUBIN sha256, device), so loading the same kernel again
    is free.
    """
    _require_gpu()
    cubin = getattr(module, "cubin", module)
    arch = getattr(module, "arch", None)
    ptx = getattr(module, "ptx", None) or None
    if not isinstance(cubin, (bytes, bytearray, memoryview)):
        raise TypeError(f"load_module takes a CompiledModule or CUBIN bytes, not {type(module).__name__}")
    cubin = bytes(cubin)
    sha = hashlib.sha256(cubin).hexdigest()
    key = (sha, device)
    loaded = _modules.get(key)
    if loaded is not None:
        return loaded
    dev = _device(device)
    plan = _check_arch_runs(arch, dev.info, ptx is not None) if arch is not None else "cubin"
    with _modules_lock:
        loaded = _modules.get(key)
        if loaded is None:
            dev.make_current()
            driver = _driver()
            what = f"cuModuleLoadData(device {device}, {len(cubin)}-byte CUBIN for {arch or 'an unknown arch'})"
            if plan == "cubin":
                try:
                    handle = _call(what, driver.cuModuleLoadData, cubin)
                except LaunchError:
                    if ptx is None or arch is None or arch.endswith("a") or \
                            dev.info.compute_capability == _capability(arch):
                        raise
                    plan = "ptx"       # the driver refused a CUBIN of an earlier minor version
            if plan == "ptx":
                have = dev.info.compute_capability
                handle = _call(f"cuModuleLoadData(device {device}, the {arch} PTX, which the driver compiles "
                               f"for compute capability {have[0]}.{have[1]})",
                               driver.cuModuleLoadData, ptx.encode() + b"\x00")
            loaded = LoadedModule(handle, dev, sha, arch, from_ptx=plan == "ptx")
            _modules[key] = loaded
    return loaded


def _capability(arch: str) -> tuple[int, int] | None:
    try:
        number = int(arch[3:].rstrip("a"))
    except ValueError:
        return None
    return number // 10, number % 10


@contextlib.contextmanager
def capture_relaxed():
    """Within this block, the calling thread may allocate and load modules while a stream of
    another thread or framework is capturing a CUDA graph (``CU_STREAM_CAPTURE_MODE_RELAXED``);
    such work is not part of the graph.  Without a GPU it does nothing."""
    if not gpu_available():
        yield
        return
    driver = _driver()
    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    err, previous = driver.cuThreadExchangeStreamCaptureMode(relaxed)
    if err:
        raise LaunchError(f"cuThreadExchangeStreamCaptureMode failed with {_error_text(err)}")
    try:
        yield
    finally:
        driver.cuThreadExchangeStreamCaptureMode(previous)


def launch(function, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
           args: list, stream=0) -> None:
    """Launch ``function`` (a ``Kernel``, or a raw ``CUfunction`` whose context is current).

    ``args`` is a list of (value, ctype) pairs; see ``Kernel.launch``.
    """
    if isinstance(function, Kernel):
        function.launch(grid, block, args, shared_bytes=shared_bytes, stream=stream)
        return
    _require_gpu()
    types, values = _layout_key(args)
    layout = _raw_layouts.get(types)
    if layout is None:
        layout = _raw_layouts.setdefault(types, _ParamLayout(types))
    params = layout.pack(values)
    driver = _driver()
    gx, gy, gz = grid
    bx, by, bz = block
    stream = _stream_handle(stream)
    _call(f"cuLaunchKernel(grid={tuple(grid)}, block={tuple(block)}, shared_bytes={shared_bytes})",
          driver.cuLaunchKernel, function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, 0)


_raw_layouts: dict[tuple, _ParamLayout] = {}


# ---------------------------------------------------------------------------------------------
# TMA descriptors


def tensor_map_encode_args(ptr, dtype, shape, strides_bytes, box, swizzle: int = 0) -> tuple:
    """The positional arguments of ``cuTensorMapEncodeTiled`` (after the output map) for a tiled
    TMA view of rank r = ``len(shape)`` (1 to 5), validated; computing them needs ``cuda.bindings``
    but no GPU or driver.

    Parameters as ``encode_tensor_map``.  The tuple is ``(data type, rank r, global address,
    global dims, global strides, box dims, element strides, interleave, swizzle, L2 promotion,
    out-of-bounds fill)`` with the dims innermost first, as the driver takes them: the columns
    (contiguous), then the rows, then the outer dimensions (a batch); r - 1 global strides in
    bytes, of the dimensions above the innermost (the innermost stride being the element size
    implicitly); element strides 1 (every element of the box); no interleave; L2 promotion by
    128 bytes; out-of-bounds elements read as zeros (fill NONE).  Invalid parameters raise
    ``ValueError``."""
    shape = tuple(shape)
    what = "encode_tensor_map_2d" if len(shape) == 2 else "encode_tensor_map"
    return _tensor_map_args(_tensor_map_fields(ptr, dtype, shape, strides_bytes, box, swizzle, what))


def _tensor_map_fields(ptr, dtype, shape, strides_bytes, box, swizzle: int, what: str = "encode_tensor_map",
                       rank: int | None = None) -> tuple:
    """Validate a tiled TMA view (``ValueError`` naming every problem, prefixed by ``what``; of
    rank ``rank`` when given) and return its values: (data type code, address, global dims
    innermost first, the r - 1 byte strides of the dims above the innermost, innermost first,
    box dims innermost first, swizzle code)."""
    from firesched import dtypes as _dt
    from firesched.hardware.tma import TMA_DATA_TYPES, TMA_SWIZZLES, tma_box_problems

    try:
        d = _dt.dtype(dtype)
    except ValueError:
        d = None
    if d is None or d.name not in TMA_DATA_TYPES:
        raise ValueError(f"{what}: dtype {dtype!r} has no TMA data type; allowed: "
                         f"{', '.join(TMA_DATA_TYPES)}")
    if isinstance(ptr, DeviceArray):
        ptr = ptr.ptr
    elif hasattr(ptr, "data_ptr"):
        ptr = ptr.data_ptr()
    if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0:
        raise ValueError(f"{what}: ptr must be a non-null device address, not {ptr!r}")
    if ptr % 16:
        raise ValueError(f"{what}: the global address {ptr:#x} is not 16-byte aligned")
    shape, strides_bytes, box = tuple(shape), tuple(strides_bytes), tuple(box)
    problems = tma_box_problems(d.bits // 8, shape, strides_bytes, box, swizzle, rank=rank)
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
    # the driver takes every array innermost first; numpy's order is outermost first
    dims = tuple(int(x) for x in reversed(shape))
    strides = tuple(int(x) for x in reversed(strides_bytes[:-1]))
    box_dims = tuple(int(x) for x in reversed(box))
    return TMA_DATA_TYPES[d.name], ptr, dims, strides, box_dims, TMA_SWIZZLES[swizzle]


def _tensor_map_args(fields: tuple) -> tuple:
    """The driver's argument objects for ``_tensor_map_fields``' validated values."""
    dtype_code, ptr, dims, strides, box_dims, swizzle_code = fields
    driver = _driver()
    return (
        driver.CUtensorMapDataType(dtype_code), len(dims), ptr,
        # the bindings take their own integer types for these arrays (plain ints are refused)
        [driver.cuuint64_t(x) for x in dims], [driver.cuuint64_t(x) for x in strides],
        [driver.cuuint32_t(x) for x in box_dims], [driver.cuuint32_t(1) for _ in dims],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle(swizzle_code),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


def encode_tensor_map_2d(ptr, dtype, shape, strides_bytes, box, swizzle: int = 0, *,
                         device: int = 0) -> bytes:
    """The 128-byte ``CUtensorMap`` of a 2-D tiled TMA view, for a ``const __grid_constant__
    CUtensorMap`` kernel parameter (pass it to ``Kernel.launch`` as ``(blob, None)``).

    ``ptr`` is the device address of element (0, 0) (an int, a ``DeviceArray`` or a tensor with
    ``data_ptr()``); ``dtype`` a firesched dtype or its name; ``shape``, ``strides_bytes`` and
    ``box`` are in row-major order ``(rows, cols)`` — numpy's ``.shape``/``.strides`` of the
    matrix and the box a TMA instruction moves; ``swizzle`` is the shared-memory swizzle span in
    bytes (0, 32, 64, 128).  Out-of-bounds box elements read as zeros.  Invalid parameters raise
    ``ValueError`` (checked here, before the driver is called); encoding needs the CUDA driver.
    The driver's arguments are ``tensor_map_encode_args``; ``encode_tensor_map`` takes any rank.
    """
    # validated here first so that a mistake is reported as this function's, with the 2-D rules
    shape, strides_bytes, box = tuple(shape), tuple(strides_bytes), tuple(box)
    _tensor_map_fields(ptr, dtype, shape, strides_bytes, box, swizzle, "encode_tensor_map_2d", 2)
    return encode_tensor_map(ptr, dtype, shape, strides_bytes, box, swizzle, device=device)


def encode_tensor_map(ptr, dtype, shape, strides_bytes, box, swizzle: int = 0, *, device: int = 0) -> bytes:
    """The 128-byte ``CUtensorMap`` of a tiled TMA view of rank 1 to 5, for a ``const
    __grid_constant__ CUtensorMap`` kernel parameter (pass it to ``Kernel.launch`` as
    ``(blob, None)``).

    ``ptr`` is the device address of element (0, ..., 0) (an int, a ``DeviceArray`` or a tensor
    with ``data_ptr()``); ``dtype`` a firesched dtype or its name; ``shape``, ``strides_bytes``
    and ``box`` have one entry per dimension, in row-major order, outermost first — numpy's
    ``.shape``/``.strides`` of the array and the box a TMA instruction moves: ``(batch, rows,
    cols)`` with a box of ``(1, rows, cols)`` for one matrix of a batch, whose rows and columns
    past the matrix then read as zeros (loads) or are not written (stores) instead of reaching
    the next matrix.  The innermost stride must be the element size; ``swizzle`` is the
    shared-memory swizzle span in bytes (0, 32, 64, 128).  Invalid parameters raise
    ``ValueError`` (checked here, before the driver is called); encoding needs the CUDA driver.
    The driver's arguments are ``tensor_map_encode_args``.
    """
    fields = _tensor_map_fields(ptr, dtype, shape, strides_bytes, box, swizzle)
    _require_gpu()
    _device(device).make_current()
    driver = _driver()
    tmap = _call("cuTensorMapEncodeTiled", driver.cuTensorMapEncodeTiled, *_tensor_map_args(fields))
    blob = struct.pack("<16Q", *(int(x) for x in tmap.opaque))
    if len(blob) != 128:  # pragma: no cover - a driver binding change
        raise LaunchError(f"cuTensorMapEncodeTiled returned {len(blob)} bytes, not 128")
    return blob
