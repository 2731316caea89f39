"""Compile generated CUDA C++ to a CUBIN (and its PTX) with NVRTC, with an on-disk cache.

Why NVRTC: it ships as a wheel (``nvidia-cuda-nvrtc``), so firesched compiles kernels on a
machine with no CUDA toolkit and no GPU.  We load a CUBIN, not PTX, so that the driver does not
JIT-compile at load time (that would hide ptxas errors until launch and cost seconds per
kernel) and so that ptxas' resource report (registers, spills, shared memory) is known before
any launch.  The PTX NVRTC wrote on the way is kept beside the CUBIN (``CompiledModule.ptx``):
it is what a reader inspects, and what the runtime loads on a GPU newer than the CUBIN's
architecture (the driver compiles it for that GPU), except for ``sm_90a``, whose PTX runs on
compute capability 9.0 only.

The cache exists because ptxas is slow on large kernels (seconds for a pipelined GEMM) while a
cache hit is one hash and one file read.  Entries are written atomically and carry a checksum,
so a crash, a full disk or two processes racing never leave an entry that is trusted while
half-written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import time
import warnings
from pathlib import Path

import attrs

from firesched.errors import CompileError
from firesched.hardware.target import default_target

#: The architectures firesched generates code for.  ``sm_90a`` unlocks wgmma, setmaxnreg and the
#: other Hopper-only instructions; plain ``sm_90`` code also runs on later chips.
SUPPORTED_ARCHS: tuple[str, ...] = ("sm_70", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")

#: Options passed on every compile.  ``-lineinfo`` costs nothing at run time and lets profilers
#: and ptxas errors point back to source lines.  Fast math is deliberately not here: it changes
#: results (flush to zero, approximate division), so a schedule must ask for it.
DEFAULT_OPTIONS: tuple[str, ...] = ("--ptxas-options=-v", "-std=c++17", "-lineinfo")

#: NVRTC 12.9+ keeps CUBINs in the driver's compute cache when a driver is installed, and on a
#: hit skips ptxas, so its log then lacks the resource report we parse (and compile times lie).
#: We have our own cache, so we turn that one off.
_NO_DRIVER_CACHE = "--no-cache"

#: Bumped whenever the cache key or the entry layout changes, so old entries are never misread.
CACHE_FORMAT = "firesched-cubin-v2"      # v2: entries hold the PTX (metadata "ptx")

_MAGIC = b"FSCUBIN\x00"
_FORMAT_NUMBER = 1
# magic, format number, sha256 of the payload, metadata length, cubin length
_HEADER = struct.Struct("<8sI32sIQ")


def _nvrtc():
    # Imported lazily so that ``import firesched`` works (and says why compiling cannot) on a
    # machine where cuda-bindings is missing or broken.
    from cuda.bindings import nvrtc

    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC library that compiles our kernels."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check_nvrtc(err, "nvrtcVersion")
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def _nvrtc_archs() -> tuple[int, ...]:
    """The real architectures this NVRTC can target, e.g. (75, 80, 86, 89, 90, ...)."""
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check_nvrtc(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def _check_nvrtc(err, call: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{call} failed: {_nvrtc_error_name(err)}")


def _nvrtc_error_name(err) -> str:
    return getattr(err, "name", None) or str(err)


@attrs.frozen
class KernelResources:
    """What ptxas reports for one kernel: the numbers that decide occupancy and whether a
    schedule spilled registers to local memory (which usually means it is too ambitious)."""

    name: str
    registers: int
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_frame_bytes: int = 0
    static_smem_bytes: int = 0

    @property
    def spills(self) -> int:
        """Bytes of spill traffic per thread, stores plus loads; 0 for a healthy kernel."""
        return self.spill_store_bytes + self.spill_load_bytes


@attrs.frozen
class CompiledModule:
    """A compiled CUBIN with its PTX, what produced them and what ptxas said about it.

    ``ptx`` is the PTX NVRTC generated for ``arch`` (``.target <arch>``), from which ptxas built
    the CUBIN.  ``compile_seconds`` is the time this call took: the whole NVRTC compile on a miss,
    the cache look-up on a hit (``from_cache``).  ``log`` is NVRTC's log (ptxas' report included)
    without its warnings about unused functions and variables (``clean_log``).
    """

    cubin: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    arch: str
    source: str = attrs.field(repr=False)
    options: tuple[str, ...]
    log: str = attrs.field(repr=False)
    resources: dict[str, KernelResources] = attrs.field(eq=False, hash=False, repr=False)
    compile_seconds: float = attrs.field(eq=False, hash=False)
    from_cache: bool = attrs.field(eq=False, hash=False)
    ptx: str = attrs.field(default="", repr=False)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The entry functions ptxas compiled, in the order it reported them."""
        return tuple(self.resources)

    def resources_of(self, name: str) -> KernelResources:
        """ptxas' report for kernel ``name``."""
        try:
            return self.resources[name]
        except KeyError:
            known = ", ".join(self.resources) or "none"
            raise ValueError(
                f"no kernel named {name!r} in this module; its kernels are: {known}. Kernels must "
                f'be declared extern "C" __global__ so that their names are not mangled.'
            ) from None


# ---------------------------------------------------------------------------------------------
# ptxas -v report


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_FRAME = re.compile(
    r"(\d+) bytes stack frame,\s*(\d+) bytes spill stores,\s*(\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_resources(log: str) -> dict[str, KernelResources]:
    """Read the per-kernel figures out of a ``--ptxas-options=-v`` log.

    ptxas prints, per entry function, a "Compiling entry function" line, a "Function
    properties" block (stack frame and spills) and a "Used N registers" line; non-inlined device
    functions get a properties block of their own.  The blocks of different functions can come
    in any order, so each figure is keyed by the name its line belongs to rather than by
    position.  A missing ``smem`` figure means 0 bytes.
    """
    entries: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry: str | None = None
    props: str | None = None
    for line in log.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            entry = m.group(1)
            entries.setdefault(entry, {})
            continue
        m = _RE_PROPS.search(line)
        if m:
            props = m.group(1)
            continue
        m = _RE_FRAME.search(line)
        if m and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = _RE_USED.search(line)
        if m and entry is not None:
            sm = _RE_SMEM.search(line)
            entries[entry]["registers"] = int(m.group(1))
            entries[entry]["smem"] = int(sm.group(1)) if sm else 0
    out: dict[str, KernelResources] = {}
    for name, figures in entries.items():
        stack, stores, loads = frames.get(name, (0, 0, 0))
        out[name] = KernelResources(
            name=name,
            registers=figures.get("registers", 0),
            spill_store_bytes=stores,
            spill_load_bytes=loads,
            stack_frame_bytes=stack,
            static_smem_bytes=figures.get("smem", 0),
        )
    return out


# ---------------------------------------------------------------------------------------------
# Error messages


_RE_SRC_DIAG = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<kind>catastrophic error|error|warning)[^:]*: (?P<msg>.*)$")
_RE_PTXAS_DIAG = re.compile(r"^ptxas.*?, line (?P<line>\d+); (?P<kind>error|fatal)\s*: (?P<msg>.*)$")
_RE_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
_RE_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")

_RE_PTXAS_AT_LINE = re.compile(r"^ptxas.*?\b(?:error|fatal)\s*:.*?\bat line (?P<line>\d+)\b")
_RE_ERROR_LINE = re.compile(r"\b(error|errors|fatal)\b", re.IGNORECASE)

#: NVRTC's warnings about declarations nothing uses.  The generated prelude defines every helper a
#: kernel might call (conversions, 4-bit packing, register fences) as a static function, so each
#: kernel draws a dozen of them; they say nothing about the kernel.  NVRTC 13 words them
#:
#:     firesched_kernel.cu(21): warning #177-D: function "fs_bf16_to_f32" was declared but never referenced
#:     t.cu(7): warning #177-D: variable "x" was declared but never referenced
#:     t.cu(3): warning #550-D: variable "x" was set but never used
#:
#: each followed by the source line and a caret, and the first warning of a log by
#: ``Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"``.
_RE_UNUSED = re.compile(r"\): warning #\d+-D: (?:function|variable) \"[^\"]*\" was "
                        r"(?:declared but never referenced|set but never used)\s*$")
_RE_REMARK = re.compile(r"^Remark: The warnings can be suppressed")
_RE_ANY_WARNING = re.compile(r"\): warning\b")

_MAX_ERRORS_SHOWN = 5
_MAX_REST_SHOWN = 20
_CONTEXT_LINES = 2


@attrs.frozen
class LogParts:
    """An NVRTC log taken apart: its error diagnostics, the rest, and how many warnings about
    unused functions and variables were left out of both."""

    errors: tuple[str, ...]        # one entry per diagnostic, its continuation lines included
    rest: tuple[str, ...]
    unused_warnings: int

    @property
    def text(self) -> str:
        """The errors, then the rest: the log a reader wants."""
        return "\n".join(self.errors + self.rest)


def _log_entries(log: str) -> list[str]:
    """The diagnostics of a log, each with the indented lines that follow it (the quoted source
    line and the caret under it); blank lines dropped."""
    entries: list[list[str]] = []
    for ln in log.splitlines():
        if not ln.strip():
            continue
        if ln[:1].isspace() and entries:
            entries[-1].append(ln)
        else:
            entries.append([ln])
    return ["\n".join(e) for e in entries]


def split_log(log: str) -> LogParts:
    """The error diagnostics of ``log`` (lines that say error or fatal), the other lines, and the
    count of warnings about unused functions and variables dropped from both (``_RE_UNUSED``;
    NVRTC's remark on suppressing warnings goes with them when no other warning is left)."""
    errors, rest, unused = [], [], 0
    entries = _log_entries(log)
    for e in entries:
        head = e.split("\n", 1)[0]
        if _RE_UNUSED.search(head):
            unused += 1
        elif _RE_ERROR_LINE.search(head) and not _RE_ANY_WARNING.search(head):
            errors.append(e)
        else:
            rest.append(e)
    if unused and not any(_RE_ANY_WARNING.search(e.split("\n", 1)[0]) for e in errors + rest):
        rest = [e for e in rest if not _RE_REMARK.match(e)]
    return LogParts(tuple(errors), tuple(rest), unused)


def clean_log(log: str) -> str:
    """``log`` without NVRTC's warnings about unused functions and variables (see ``_RE_UNUSED``),
    errors first: what a successful compile keeps and shows."""
    return split_log(log).text


def _excerpt(lines: list[str], lineno: int, context: int = _CONTEXT_LINES, *,
             indent: str = "    ") -> str:
    """Lines ``lineno - context`` .. ``lineno + context`` (1-based), numbered, the middle marked."""
    if not 1 <= lineno <= len(lines):
        return f"{indent}(line {lineno} is outside the {len(lines)}-line source)"
    lo = max(1, lineno - context)
    hi = min(len(lines), lineno + context)
    width = len(str(hi))
    out = []
    for i in range(lo, hi + 1):
        mark = ">" if i == lineno else " "
        out.append(f"{indent}{mark} {i:>{width}} | {_clip(lines[i - 1])}")
    return "\n".join(out)


_MAX_LINE_SHOWN = 240


def _clip(line: str) -> str:
    """``line``, cut at ``_MAX_LINE_SHOWN`` characters (an asm statement of a wgmma binds 130
    registers on one line)."""
    if len(line) <= _MAX_LINE_SHOWN:
        return line
    return line[:_MAX_LINE_SHOWN] + f" ... ({len(line) - _MAX_LINE_SHOWN} more characters)"


def _ptx_to_source_line(ptx_lines: list[str], ptx_line: int, filename: str) -> int | None:
    """The CUDA source line a PTX line came from, through the ``.loc`` directives -lineinfo
    writes; None when the PTX has no location for our file before that line."""
    ours: set[str] = set()
    for text in ptx_lines:
        m = _RE_PTX_FILE.match(text)
        if m and (m.group(2) == filename or m.group(2).endswith("/" + filename)):
            ours.add(m.group(1))
    for text in reversed(ptx_lines[: max(0, ptx_line - 1)]):
        m = _RE_PTX_LOC.match(text)
        if m and m.group(1) in ours:
            return int(m.group(2))
    return None


def _ptx_context(ptx_lines: list[str], src_lines: list[str], pline: int, filename: str) -> str:
    """The PTX line ``pline`` and the generated source lines it came from, indented."""
    out = ""
    if 1 <= pline <= len(ptx_lines):
        out += f"\n    PTX: {_clip(ptx_lines[pline - 1].strip())}"
    sline = _ptx_to_source_line(ptx_lines, pline, filename) if ptx_lines else None
    if sline is not None:
        out += f"\n    generated from {filename} line {sline}:\n" + _excerpt(src_lines, sline)
    return out


def _indent(entries, limit: int) -> tuple[str, int]:
    """``entries`` indented by four spaces, at most ``limit`` lines; and how many were cut."""
    lines = [ln for e in entries for ln in e.splitlines()]
    shown = "\n".join("    " + ln for ln in lines[:limit])
    return shown, max(0, len(lines) - limit)


def format_compile_error(*, log: str, source: str, filename: str, arch: str, result: str,
                         ptx: str | None = None) -> str:
    """Turn an NVRTC log into a message that shows each of the first errors next to the lines
    of generated source it is about, so the reader need not count lines in a long kernel.

    Errors come first; NVRTC's warnings about unused functions and variables (the prelude's
    helpers a kernel does not call) are left out; the rest of the log follows.  The whole log stays
    on ``CompileError.log``."""
    src_lines = source.splitlines()
    ptx_lines = ptx.splitlines() if ptx else []
    parts = split_log(log)
    log_lines = [ln for e in parts.errors for ln in e.splitlines()]
    blocks: list[str] = []
    n_errors = 0
    last_ptx_line = None
    for ln in log_lines:
        m = _RE_SRC_DIAG.match(ln)
        if m and m.group("kind") != "warning":
            n_errors += 1
            last_ptx_line = None
            if len(blocks) < _MAX_ERRORS_SHOWN:
                block = ln.strip()
                if os.path.basename(m.group("file")) == os.path.basename(filename):
                    block += "\n" + _excerpt(src_lines, int(m.group("line")))
                blocks.append(block)
            continue
        m = _RE_PTXAS_DIAG.match(ln)
        if m and m.group("kind") == "error":
            pline = int(m.group("line"))
            msg = m.group("msg").strip()
            if pline == last_ptx_line:
                # ptxas often reports several errors for one PTX line: show that line once.
                blocks[-1] = blocks[-1].replace("\n", f"; {msg}\n", 1)
                continue
            n_errors += 1
            last_ptx_line = None
            if len(blocks) < _MAX_ERRORS_SHOWN:
                block = f"ptxas: PTX line {pline}: {msg}"
                block += _ptx_context(ptx_lines, src_lines, pline, filename)
                blocks.append(block + "\n")
                last_ptx_line = pline
    blocks = [b.rstrip("\n") for b in blocks]
    head = f"NVRTC could not compile {filename} for {arch} ({result})"
    left_out = (f" (with {parts.unused_warnings} warning(s) about unused functions and variables, "
                f"left out here)" if parts.unused_warnings else "")
    foot = f"\nThe full log is CompileError.log{left_out}; the source is CompileError.source."
    if not blocks:
        # Not a located diagnostic (a ptxas fatal error, a bad option, an internal error): the
        # error lines, each ptxas fatal error at a PTX line with that line and its source, then
        # the rest of the log.
        shown = []
        for e in parts.errors:
            m = _RE_PTXAS_AT_LINE.match(e)
            shown.append("    " + e.replace("\n", "\n    ")
                         + (_ptx_context(ptx_lines, src_lines, int(m.group("line")), filename) if m else ""))
        rest, cut = _indent(parts.rest, _MAX_REST_SHOWN)
        text = "\n".join(shown + ([rest] if rest else []))
        if cut:
            text += f"\n    ... and {cut} more line(s)"
        return f"{head}:\n{text or '    (the compiler log is empty)'}{foot}"
    more = n_errors - len(blocks)
    tail = f"\n... and {more} more error(s)" if more > 0 else ""
    rest, cut = _indent(parts.rest, _MAX_REST_SHOWN)
    if rest:
        tail += "\nThe rest of the log:\n" + rest + (f"\n    ... and {cut} more line(s)" if cut else "")
    return f"{head}; {n_errors} error(s):\n" + "\n\n".join(blocks) + tail + foot


# ---------------------------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$FIRESCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/firesched``,
    else ``~/.cache/firesched``.  Read at each call so that a test or a user can redirect it."""
    explicit = os.environ.get("FIRESCHED_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "firesched"


def _cubin_dir() -> Path:
    return cache_dir() / "cubin"


# Directories we could not write to; we warn once for each and stop trying.
_unwritable: set[str] = set()


def clear_cache() -> int:
    """Remove every cached kernel (and any temporary file a killed writer left behind).
    Returns how many files were removed."""
    d = _cubin_dir()
    removed = 0
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    for n in names:
        if n.endswith(".cubin") or n.startswith(".tmp-"):
            try:
                os.unlink(d / n)
                removed += 1
            except FileNotFoundError:
                pass
    _unwritable.discard(str(d))
    return removed


def cache_key(source: str, arch: str, options: tuple[str, ...], filename: str) -> str:
    """sha256 over everything that decides the CUBIN: the source, every option (the arch among
    them), the file name (it is written into the line table), the NVRTC version and the cache
    format.  Length-prefixed so that no two different inputs hash the same bytes."""
    h = hashlib.sha256()
    major, minor = nvrtc_version()
    parts = [CACHE_FORMAT, f"nvrtc {major}.{minor}", arch, filename, *options]
    h.update(struct.pack("<I", len(parts)))
    for p in parts:
        b = p.encode()
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    src = source.encode()
    h.update(struct.pack("<Q", len(src)))
    h.update(src)
    return h.hexdigest()


def _entry_path(key: str) -> Path:
    return _cubin_dir() / f"{key}.cubin"


def _encode_entry(key: str, cubin: bytes, meta: dict) -> bytes:
    meta_bytes = json.dumps(dict(meta, key=key), sort_keys=True).encode()
    payload = meta_bytes + cubin
    header = _HEADER.pack(_MAGIC, _FORMAT_NUMBER, hashlib.sha256(payload).digest(),
                          len(meta_bytes), len(cubin))
    return header + payload


def _decode_entry(data: bytes, key: str) -> tuple[bytes, dict] | None:
    """The (cubin, metadata) of a cache file, or None for anything not exactly what we wrote."""
    if len(data) < _HEADER.size:
        return None
    magic, number, digest, meta_len, cubin_len = _HEADER.unpack_from(data)
    if magic != _MAGIC or number != _FORMAT_NUMBER:
        return None
    if len(data) != _HEADER.size + meta_len + cubin_len:
        return None
    payload = memoryview(data)[_HEADER.size:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        meta = json.loads(bytes(payload[:meta_len]))
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None
    return bytes(payload[meta_len:]), meta


def _read_entry(key: str) -> tuple[bytes, dict] | None:
    try:
        with open(_entry_path(key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return _decode_entry(data, key)
    except (struct.error, ValueError):
        return None


def _write_entry(key: str, cubin: bytes, meta: dict) -> None:
    """Write an entry so that a reader sees either nothing or the whole file: a temporary file
    in the same directory, fsync'd, then renamed over the final name (atomic on POSIX)."""
    d = _cubin_dir()
    if str(d) in _unwritable:
        return
    data = _encode_entry(key, cubin, meta)
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _entry_path(key))
        tmp = None
    except OSError as e:
        _unwritable.add(str(d))
        warnings.warn(
            f"firesched cannot write its kernel cache in {d} ({e}); kernels will be compiled "
            f"each time. Set FIRESCHED_CACHE_DIR to a writable directory to cache them.",
            RuntimeWarning, stacklevel=3)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# Compile


def _check_arch(arch: str) -> None:
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; firesched compiles for: {', '.join(SUPPORTED_ARCHS)}")
    number = int(arch[3:].rstrip("a"))
    archs = _nvrtc_archs()
    if number not in archs:
        raise CompileError(unbuildable_message(arch))


def unbuildable_message(arch: str) -> str:
    """One line: the installed NVRTC cannot build ``arch`` (NVRTC 13 has no sm_70), what it
    builds, and that the CPU interpreter still runs such schedules."""
    try:
        major, minor = nvrtc_version()
        oldest = f"sm_{min(_nvrtc_archs())}"
    except Exception:             # no usable NVRTC: the message still says what to do
        (major, minor), oldest = ("13", "x"), "sm_75"
    return (f"NVRTC {major}.{minor} cannot build {arch} (its oldest architecture is {oldest}); "
            f"firesched.interpret(schedule, ...) runs {arch} schedules on the CPU, and compiling "
            f"needs arch='sm_80' or later")


def _check_options(options) -> tuple[str, ...]:
    if isinstance(options, (str, bytes)):
        raise TypeError(f"options must be a tuple of strings, e.g. ({options!r},), not one string")
    options = tuple(options)
    for o in options:
        if not isinstance(o, str):
            raise TypeError(f"options must be strings; got {o!r} of type {type(o).__name__}")
        if o.startswith(("--gpu-architecture", "-arch")):
            raise ValueError(f"pass the architecture as arch=..., not as the option {o!r}")
    return options


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = bytearray(size)
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return ""
    return bytes(buf).rstrip(b"\x00").decode(errors="replace").rstrip()


def _program_ptx(nvrtc, prog) -> str | None:
    """The PTX of the last compile, if NVRTC got that far (it does when only ptxas failed)."""
    try:
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
            return None
        buf = bytearray(size)
        (err,) = nvrtc.nvrtcGetPTX(prog, buf)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None
        return bytes(buf).rstrip(b"\x00").decode(errors="replace")
    except Exception:
        return None


def _nvrtc_compile(source: str, arch: str, all_options: tuple[str, ...],
                   filename: str) -> tuple[bytes, str, str]:
    """One NVRTC compile; returns (cubin, log, ptx) or raises CompileError.  The program is always
    destroyed, also when compiling fails."""
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    _check_nvrtc(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in all_options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _program_log(nvrtc, prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            ptx = _program_ptx(nvrtc, prog) if "ptxas" in log else None
            message = format_compile_error(log=log, source=source, filename=filename, arch=arch,
                                           result=_nvrtc_error_name(err), ptx=ptx)
            raise CompileError(message, log=log, source=source)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check_nvrtc(err, "nvrtcGetCUBINSize")
        buf = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        _check_nvrtc(err, "nvrtcGetCUBIN")
        cubin = bytes(buf)
        if not cubin:
            raise CompileError(f"NVRTC produced no CUBIN for {arch}", log=log, source=source)
        ptx = _program_ptx(nvrtc, prog)
        if not ptx:
            raise CompileError(f"NVRTC produced a CUBIN but no PTX for {arch} (nvrtcGetPTX)", log=log,
                               source=source)
        return cubin, log, ptx
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cuda(source: str, *, arch: str | None = None, options: tuple[str, ...] = (),
                 filename: str = "firesched_kernel.cu", use_cache: bool = True) -> CompiledModule:
    """Compile CUDA C++ ``source`` to a CUBIN and its PTX for ``arch`` (None: the default target,
    ``hardware.target.default_target``: the GPU present, else sm_90a).

    Every compile passes ``--gpu-architecture=<arch>`` and ``DEFAULT_OPTIONS`` (plus
    ``--no-cache`` on NVRTC 12.9+, see ``_NO_DRIVER_CACHE``), then ``options``.  Kernels should be ``extern "C"`` so that they are found by their plain names.
    With ``use_cache`` an identical earlier compile (same source, options, file name and NVRTC)
    is read back from ``cache_dir()`` instead of recompiled.  Raises ``CompileError`` with the
    offending source lines when NVRTC rejects the source or cannot build ``arch`` (sm_70),
    ``ValueError`` for an unknown arch.
    """
    start = time.perf_counter()
    if not isinstance(source, str):
        raise TypeError(f"source must be a str of CUDA C++, got {type(source).__name__}")
    if arch is None:
        arch = default_target().arch
    _check_arch(arch)
    user = _check_options(options)
    defaults = DEFAULT_OPTIONS
    if nvrtc_version() >= (12, 9):
        defaults = (*defaults, _NO_DRIVER_CACHE)
    if any(o.startswith(("-std=", "--std=")) for o in user):
        defaults = tuple(o for o in defaults if not o.startswith("-std="))
    all_options = (f"--gpu-architecture={arch}", *defaults, *user)

    key = cache_key(source, arch, all_options, filename) if use_cache else None
    if key is not None:
        hit = _read_entry(key)
        if hit is not None:
            cubin, meta = hit
            try:
                resources = {n: KernelResources(**r) for n, r in meta["resources"].items()}
                log = clean_log(str(meta["log"]))     # entries written before logs were cleaned
                ptx = meta["ptx"]
            except (KeyError, TypeError, AttributeError):
                resources = None
            if resources is not None and isinstance(ptx, str) and ptx:
                return CompiledModule(cubin=cubin, arch=arch, source=source, options=all_options,
                                      log=log, resources=resources,
                                      compile_seconds=time.perf_counter() - start, from_cache=True,
                                      ptx=ptx)

    cubin, log, ptx = _nvrtc_compile(source, arch, all_options, filename)
    # a kernel that compiled keeps no warnings about the prelude's unused helpers
    log = clean_log(log)
    resources = parse_ptxas_resources(log)
    seconds = time.perf_counter() - start
    if key is not None:
        meta = {
            "arch": arch,
            "options": list(all_options),
            "log": log,
            "resources": {n: attrs.asdict(r) for n, r in resources.items()},
            "nvrtc": list(nvrtc_version()),
            "compile_seconds": seconds,
            "ptx": ptx,
        }
        _write_entry(key, cubin, meta)
    return CompiledModule(cubin=cubin, arch=arch, source=source, options=all_options, log=log,
                          resources=resources, compile_seconds=seconds, from_cache=False, ptx=ptx)
