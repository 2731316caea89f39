"""Every recipe variant of a fixed list compiles for sm_80 and sm_90a with 0 spill bytes, and its
generated CUDA matches the golden file under tests/golden/ (``pytest --update-golden`` rewrites
them after an intended change to the code generator)."""

from __future__ import annotations

import pathlib
import re

import pytest

import firesched as fs
from firesched import ops

GOLDEN = pathlib.Path(__file__).parent / "golden"
BIG = dict(block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=4)
DEF = dict(block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=4, group_m=8)
WIDE = dict(block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=4, group_m=8)
SMALL = dict(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=2)

VARIANTS = {
    "f16_128x256x32_s4": ((4096, 4096, 4096), dict(BIG)),
    "f16_128x128x32_s4_g8": ((4096, 4096, 4096), dict(DEF)),
    "f16_256x128x32_s4_g8": ((8192, 8192, 8192), dict(WIDE)),
    "f16_128x128x64_s3_no_prefetch": ((4096, 4096, 4096), dict(DEF, block_k=64, stages=3)),
    "bf16_128x128x32_s4": ((2048, 2048, 2048), dict(DEF, dtype="bf16")),
    "f16_64x64x32_s2": ((1000, 1000, 1000), dict(SMALL)),
    "f16_stages1": ((512, 512, 512), dict(SMALL, stages=1)),
    "f16_splitk_warps2": ((1024, 1024, 2048), dict(SMALL, split_k_warps=2)),
    "f16_splitk_blocks4": ((512, 512, 8192), dict(SMALL, split_k_blocks=4)),
    "f16_bias_relu": ((8192, 8192, 1024), dict(WIDE, epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "f16_bias_gelu_f32out": ((1024, 1024, 1024), dict(DEF, out_dtype="f32",
                                                       epilogue_ops=(ops.bias("bias"), ops.gelu()))),
    "bf16_residual_scale": ((1024, 768, 512), dict(SMALL, dtype="bf16",
                                                    epilogue_ops=(ops.scale(0.5), ops.residual("residual")))),
    "bf16_layout_CC": ((1024, 1024, 1024), dict(DEF, dtype="bf16", layout="CC", prefetch=False)),
    "f16_layout_RC_sigmoid": ((1024, 1024, 1024), dict(SMALL, layout="RC", epilogue_ops=(ops.sigmoid(),))),
    "f16_prologue_relu": ((1024, 1024, 1024), dict(SMALL, prologue_ops=(ops.relu(),))),
    "f16_unaligned_4095x4097x1023": ((4095, 4097, 1023), dict(DEF, block_k=16, stages=4)),
    "f16_splitk_both_bias_tanh": ((768, 512, 4096), dict(SMALL, split_k_warps=2, split_k_blocks=2,
                                                          epilogue_ops=(ops.bias("bias"), ops.tanh()))),
}


def build(name):
    (M, N, K), kw = VARIANTS[name]
    kw = dict(kw)
    dt = kw.pop("dtype", "f16")
    return fs.recipes.gemm(M, N, K, dtype=dt, arch="sm_90a", atoms="sm80", **kw)


def _without_launch_control(src: str) -> str:
    """``src`` without the sm_90a prelude and the griddepcontrol statements (each a comment line and
    a four-line asm)."""
    src = re.sub(r"// ---- firesched sm_90a prelude[^\n]*\n#ifndef FIRESCHED_PRELUDE_SM90\n.*?"
                 r"#endif  // FIRESCHED_PRELUDE_SM90\n\n?", "", src, flags=re.S)
    return re.sub(r" *// sm90a\.griddep_[^\n]*\n *asm volatile\(\"griddepcontrol\.[a-z_]+;\"\n"
                  r"(?: *:[^\n]*\n){3}", "", src)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in VARIANTS])
def test_variant_compiles_and_matches_golden(name, update_golden):
    sched = build(name)
    sources = {}
    for arch in ("sm_80", "sm_90a"):
        k = fs.compile(sched, arch=arch)
        for kname, r in k.resources.items():
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (arch, kname, r)
            assert r.stack_frame_bytes == 0, (arch, kname, r)
        sources[arch] = k.source
    # the printed CUDA does not depend on the target (the cubins do), except that on sm_90a a
    # program's kernels launch programmatically (lower.transforms.launches): their griddepcontrol
    # statements, and the sm_90a prelude that comes with them
    assert "griddepcontrol" not in sources["sm_80"] and "griddepcontrol.wait;" in sources["sm_90a"]
    assert _without_launch_control(sources["sm_90a"]) == sources["sm_80"]
    path = GOLDEN / f"{name}.cu"
    if update_golden or not path.exists():
        if not update_golden:
            pytest.fail(f"no golden file {path.name}; run pytest --update-golden to create it")
        path.write_text(sources["sm_90a"])
        return
    want = path.read_text()
    assert sources["sm_90a"] == want, (
        f"generated CUDA for {name} differs from {path}; if the change is intended, run "
        f"pytest tests/test_golden.py --update-golden and review the diff")


def test_golden_files_are_exactly_the_variants():
    """Every variant has its golden file and every golden file a variant: a renamed or dropped
    variant leaves no stale snapshot behind, and no snapshot goes unchecked."""
    files = {p.stem for p in GOLDEN.glob("*.cu")}
    names = set(VARIANTS) | set(HOPPER)
    assert not names - files, f"variants without a golden file: {sorted(names - files)}"
    assert not files - names, f"golden files no variant checks: {sorted(files - names)}"
    assert len(names) == len(VARIANTS) + len(HOPPER), "a Hopper variant reuses an sm_80 variant's name"


def test_emission_is_deterministic():
    a = fs.cuda.emit(build("f16_splitk_blocks4").lower("sm_80"))
    b = fs.cuda.emit(build("f16_splitk_blocks4").lower("sm_80"))
    assert a == b


# --------------------------------------------------------------------------- Hopper (sm_90a only)

HOPPER = {
    "sm90a_plain_128x256_s4": ((4096, 4096, 4096), dict(block_m=128, block_n=256, stages=4, warp_specialized=False)),
    "sm90a_ws_persistent_128x256": ((4096, 4096, 4096), dict(block_m=128, block_n=256, group_m=8, cluster=1)),
    "sm90a_ws_persistent_bias_relu": ((8192, 8192, 1024), dict(block_m=128, block_n=256, group_m=8, cluster=1,
                                                               epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "sm90a_ws_bf16_f32out_RC_64B": ((2048, 2048, 2048), dict(dtype="bf16", out_dtype="f32", layout="RC",
                                                             block_m=128, block_n=128, block_k=32, group_m=8,
                                                             cluster=1)),
    "sm90a_ws_padded_4095x4097x1023": ((4095, 4097, 1023), dict(block_m=192, block_n=128, group_m=8, cluster=1)),
    "sm90a_cluster2_multicast_128x256": ((4096, 4096, 4096), dict(block_m=128, block_n=256, cluster=2)),
}


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in HOPPER])
def test_hopper_variant_compiles_and_matches_golden(name, update_golden):
    (M, N, K), kw = HOPPER[name]
    kw = dict(kw)
    sched = fs.recipes.gemm(M, N, K, dtype=kw.pop("dtype", "f16"), arch="sm_90a", **kw)
    k = fs.compile(sched, arch="sm_90a")
    for kname, r in k.resources.items():
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_frame_bytes == 0, (kname, r)
    with pytest.raises(fs.ScheduleError, match="wgmma needs sm_90a"):
        fs.compile(sched, arch="sm_80")
    path = GOLDEN / f"{name}.cu"
    if update_golden or not path.exists():
        if not update_golden:
            pytest.fail(f"no golden file {path.name}; run pytest --update-golden to create it")
        path.write_text(k.source)
        return
    assert k.source == path.read_text(), (
        f"generated CUDA for {name} differs from {path}; if the change is intended, run "
        f"pytest tests/test_golden.py --update-golden and review the diff")
