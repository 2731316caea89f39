"""NVRTC errors a reader can use: the error first, without the generated prelude's warnings about
helpers the kernel does not call, the rest of the log after it, the whole log on the exception.
Every compile here is a real NVRTC compile (no GPU needed)."""

from __future__ import annotations

import re
import warnings

import pytest

import firesched as fs
from firesched.cuda import nvrtc, printer
from firesched.cuda.nvrtc import clean_log, compile_cuda, split_log
from firesched.errors import CompileError

# NVRTC 13's wording, as compiling a program with an unused static function shows it.
UNUSED = re.compile(r'warning #177-D: function "[^"]*" was declared but never referenced')

# A prelude of static helpers the kernel does not use, as the printer writes one, then a kernel.
PRELUDE = r"""
static __device__ __forceinline__ float helper_a(float x) { return x * 2.0f; }
static __device__ __forceinline__ float helper_b(float x) { return x + 1.0f; }
static __device__ __forceinline__ int helper_c(int x) { return x ^ 1; }
static __device__ const int table_unused = 7;
"""

CXX_ERROR = PRELUDE + r"""
extern "C" __global__ void broken(float* x, int n) {
  int i = threadIdx.x;
  if (i < n) x[i] = undefined_thing * 2.0f;
}
"""

CLEAN = PRELUDE + r"""
extern "C" __global__ void fine(float* x, int n) {
  int i = threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i];
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path / "fscache"))
    return tmp_path / "fscache"


def _body(msg: str) -> list[str]:
    """The lines of a CompileError message after its head line."""
    return msg.splitlines()[1:]


def test_a_cxx_error_comes_first_without_the_unused_helper_warnings(cache):
    with pytest.raises(CompileError) as info:
        compile_cuda(CXX_ERROR, arch="sm_80", filename="gen.cu")
    e = info.value
    msg = str(e)
    assert msg.startswith("NVRTC could not compile gen.cu for sm_80 (NVRTC_ERROR_COMPILATION); 1 error(s):")
    assert re.match(r'gen\.cu\(\d+\): error: identifier "undefined_thing" is undefined', _body(msg)[0])
    assert "never referenced" not in msg and "helper_a" not in msg and "-diag-suppress" not in msg
    assert "4 warning(s) about unused functions and variables, left out here" in msg
    # the whole log, warnings included, stays on the exception
    assert "undefined_thing" in e.log
    assert len(UNUSED.findall(e.log)) == 3
    assert 'variable "table_unused" was declared but never referenced' in e.log
    assert e.source == CXX_ERROR


def _insufficient_registers_source() -> str:
    """The Hopper GEMM kernel with its launch bounds raised to 1024 threads: 64 registers per
    thread, fewer than one wgmma m64n256 needs for its accumulators (ptxas gives up)."""
    sched = fs.recipes.gemm(256, 256, 256, dtype="f16", arch="sm_90a", warp_specialized=False, persistent=False)
    src = printer.emit_kernel(sched.lower("sm_90a").kernels[0])
    bad, n = re.subn(r"__launch_bounds__\(\d+, 1\)", "__launch_bounds__(1024, 1)", src)
    assert n == 1
    return bad


def test_insufficient_registers_comes_first_with_the_instruction_it_is_about(cache):
    with pytest.raises(CompileError) as info:
        compile_cuda(_insufficient_registers_source(), arch="sm_90a")
    e = info.value
    msg = str(e)
    body = _body(msg)
    assert body[0].strip().startswith("ptxas fatal")
    assert "Insufficient registers (64) to compile instruction at line" in body[0]
    # the PTX instruction and the generated line it came from
    assert body[1].strip().startswith("PTX:") and "wgmma.mma_async" in body[1]
    assert "generated from firesched_kernel.cu line" in msg and "asm volatile" in msg
    assert "never referenced" not in msg and "fs_bf16_to_f32" not in msg
    assert len(max(msg.splitlines(), key=len)) < 400        # 130-register asm lines are clipped
    assert "Ptx assembly aborted due to errors" in msg
    # the raw log opens with a dozen warnings about the prelude; they are still there
    assert UNUSED.search(e.log.splitlines()[0])
    assert len(UNUSED.findall(e.log)) >= 10 and "Insufficient registers" in e.log


def test_a_successful_compile_keeps_no_unused_function_warning(cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # nothing is printed or warned either
        first = compile_cuda(CLEAN, arch="sm_80")
        second = compile_cuda(CLEAN, arch="sm_80")  # from the cache
    assert second.from_cache
    for m in (first, second):
        assert "never referenced" not in m.log and "-diag-suppress" not in m.log
        assert "Compiling entry function 'fine'" in m.log
        assert m.resources_of("fine").registers > 0


def test_a_generated_kernel_compiles_with_a_clean_log(cache):
    k = fs.compile(fs.recipes.gemm(128, 128, 64, dtype="f16", arch="sm_80"), arch="sm_80")
    for m in k.modules:
        assert "warning" not in m.log
        assert m.resources


def test_a_cache_entry_written_with_the_warnings_is_read_back_clean(cache):
    """Entries written before logs were cleaned hold the raw log: it is cleaned on the way out."""
    m = compile_cuda(CLEAN, arch="sm_80")
    key = nvrtc.cache_key(CLEAN, "sm_80", m.options, "firesched_kernel.cu")
    cubin, meta = nvrtc._read_entry(key)
    raw = ('firesched_kernel.cu(2): warning #177-D: function "helper_a" was declared but never referenced\n'
           "  static __device__ __forceinline__ float helper_a(float x) { return x * 2.0f; }\n"
           "                                          ^\n\n"
           'Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"\n\n' + meta["log"])
    nvrtc._write_entry(key, cubin, dict(meta, log=raw))
    hit = compile_cuda(CLEAN, arch="sm_80")
    assert hit.from_cache and hit.log == m.log


def test_split_log_keeps_other_warnings_and_their_remark():
    log = ('t.cu(2): warning #177-D: function "h" was declared but never referenced\n'
           "  static __device__ int h(int x) { return x; }\n"
           "                        ^\n\n"
           'Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"\n\n'
           't.cu(9): warning #550-D: variable "v" was set but never used\n'
           "    int v; v = 3;\n"
           "        ^\n\n"
           't.cu(12): warning #1234-D: something worth reading\n'
           "    foo();\n"
           "    ^\n\n"
           "t.cu(14): error: expected a \";\"\n"
           "    bar()\n"
           "         ^\n\n"
           "1 error detected in the compilation of \"t.cu\".\n")
    parts = split_log(log)
    assert parts.unused_warnings == 2
    assert parts.errors[0].startswith("t.cu(14): error: expected")
    assert parts.errors[1].startswith("1 error detected")
    assert parts.rest[0].startswith("Remark: The warnings")          # another warning is left
    assert parts.rest[1].startswith("t.cu(12): warning #1234-D") and "foo();" in parts.rest[1]
    assert clean_log(log).splitlines()[0].startswith("t.cu(14): error")
    only_unused = log.split("t.cu(12)")[0]
    assert clean_log(only_unused) == ""                               # the remark goes with them
