"""The scripts under bench/ are imported and run small, so they cannot rot."""

from __future__ import annotations

import importlib
import json
import os

import attrs
import numpy as np
import pytest

import firesched as fs

SCRIPTS = ["bench.gemm", "bench.sweep_gemm", "bench.sanitize_cases", "bench.sass_check", "bench.gemm_variants",
           "bench.w4a16_split_cost", "bench.profile_rows", "bench.row_spills", "bench.fmha_timeline",
           "bench.profile_w4a16", "bench.fmha_spills", "bench.layernorm_variants", "bench.launches",
           "bench.row_fixed_cost", "bench.row_plan_diff"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_profile_rows_smoke():
    from bench.profile_rows import main

    ks = main(["--smoke", "layernorm:4x1000:bf16", "softmax_causal:3x65:f16"])
    assert len(ks) == 2 and all(k.spills == 0 for k in ks)
    assert main(["--smoke", "--arch", "sm_80", "layernorm:2x32767:f16"])[0].spills == 0
    with pytest.raises(ValueError, match="op:ROWSxCOLS:dtype"):
        main(["--smoke", "layernorm:4096"])
    with pytest.raises(ValueError, match="allowed: rmsnorm"):
        main(["--smoke", "causal:3x65:f16"])


def test_launches_smoke():
    """The three ways a program launches: plain, the default (a split program's reduction does not
    let the next launch start), chained."""
    from bench.launches import main

    split, one = main(["--smoke"])
    assert split["launches"]["plain"] == [("firesched_matmul", False, True), ("firesched_reduce", True, False)]
    assert split["launches"]["default"] == [("firesched_matmul", True, True), ("firesched_reduce", True, False)]
    assert split["launches"]["chained"] == [("firesched_matmul", True, True), ("firesched_reduce", True, True)]
    assert one["launches"]["default"] == one["launches"]["chained"] == [("firesched_matmul", True, True)]
    assert one["launches"]["plain"] == [("firesched_matmul", False, False)]


def test_profile_w4a16_smoke():
    from bench.profile_w4a16 import main

    k = main(["--smoke", "1", "256"])
    assert k.spills == 0 and len(k.program.kernels) >= 1
    p = "W4A16Params(block_m=16, block_n=32, block_k=512, warps_n=2, warp_k=128, warps_k=4, stages=4)"
    assert len(main(["--smoke", "16", "1024", p]).program.kernels) == 1     # no K split: one launch
    with pytest.raises(SystemExit, match="M NK"):
        main(["--smoke", "1"])


def test_layernorm_variants_compile_small():
    from bench import layernorm_variants as lv
    from firesched.lower.transforms import early_loads

    keep = early_loads.EARLY_SHARE
    ks = lv.main(["64x1000", "bf16", "--smoke", "--variants", "plan,tuple_early2"])["kernels"]
    assert set(ks) == {"plan", "tuple_early2"} and all(k.spills == 0 for k in ks.values())
    assert early_loads.EARLY_SHARE == keep           # the what-if budget does not leak out
    with pytest.raises(SystemExit, match="allowed"):
        lv.main(["64x1000", "bf16", "--smoke", "--variants", "fast"])
    with pytest.raises(SystemExit, match="ROWSxCOLS"):
        lv.main(["4096", "bf16", "--smoke"])


def test_row_spills_runs_small():
    from bench.row_spills import main

    out = main(["--cols", "1000,65537", "--dtypes", "bf16", "--kinds", "layernorm,causal"])
    assert out["compiled"] == 4 and out["spilling"] == [] and out["refused"] == []
    with pytest.raises(SystemExit, match="allowed"):
        main(["--kinds", "norm"])


def test_fmha_spills_runs_small():
    from bench.fmha_spills import main

    # the script over one small shape (its four kernels: causal or not, f16 and bf16 with the
    # log-sum-exp); the head-dim-256 designs it once found spilling are tests/test_fmha.py's
    out = main(["--shapes", "32x16x384x64", "--archs", "sm_80"])
    assert out["compiled"] == 4 and out["spilling"] == [] and out["refused"] == []
    with pytest.raises(SystemExit, match="allowed"):
        main(["--archs", "sm_70"])


def test_fmha_timeline_smoke():
    """The attention plan's kernel with a stamp before each marked line (every mark found once),
    the block's entry and its end; it compiles without spills."""
    from bench.fmha_timeline import MARKS, main

    out = main(["--smoke", "--shape", "2x2x256x128"])
    assert out == {"spills": 0, "blocks": 16, "stamps": len(MARKS) + 2}     # 64-query tiles: 16 blocks


def test_w4a16_split_cost_smoke():
    from bench.w4a16_split_cost import main

    rows = main(["--smoke"])
    # both plans split K (two launches; one with the fix-up) and none spill
    assert [(r["kernels"], r["fixup_kernels"], r["spills"]) for r in rows] == [(2, 1, 0), (2, 1, 0)]
    # the first kernel overlaps the launch before the call, the second waits for the first
    assert all(r["programmatic"] == [True, True] for r in rows)


@pytest.mark.parametrize("name", SCRIPTS)
def test_imports(name):
    mod = importlib.import_module(name)
    assert mod.__doc__


def test_bench_parameters_schedule_every_shape():
    from bench.gemm import FUSED, QUICK, SHAPES, params_for

    for (M, N, K) in SHAPES + FUSED + QUICK:
        sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **params_for(M, N, K))
        sched.check("sm_90a")


def test_sweep_configs_are_valid_recipes():
    from bench.sweep_gemm import CONFIGS, CONFIGS_SM90

    for cfg in CONFIGS + CONFIGS_SM90:
        fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", **cfg)


@pytest.mark.parametrize("case", ["pipelined-partial", "unaligned-rows", "splitk-blocks", "hopper-plain",
                                  "hopper-ws-direct-store"])
def test_sanitizer_cases_interpret(case):
    """The sanitizer's cases are valid schedules that the interpreter runs clean at their size, and
    compute the GEMM (and epilogue) of ``tests/oracles.py``'s formulas."""
    import numpy as np
    import oracles

    from bench.sanitize_cases import CASES

    c = CASES[case]
    kw = c["kw"]
    sched = fs.recipes.gemm(c["M"], c["N"], c["K"], arch="sm_90a", **kw)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((c["M"], c["K"])), rng.standard_normal((c["K"], c["N"]))
    epi = kw.get("epilogue_ops", ())
    by_name, extras = oracles.extras_for(epi, c["M"], c["N"], rng)
    out = fs.interpret(sched, A, B, *extras)
    dtype = kw.get("dtype", "f16")
    want = oracles.gemm(A, B, dtype=dtype, out_dtype=kw.get("out_dtype"), ops=epi, extras=by_name)
    oracles.assert_close(out, want, out=oracles.out_type(kw.get("out_dtype"), dtype, epi), what=case)


@pytest.mark.gpu
def test_bench_gemm_quick(tmp_path):
    pytest.importorskip("torch")
    from bench import gemm

    out = tmp_path / "r.json"
    rows = gemm.main(["--quick", "--dtypes", "f16", "--out", str(out)])
    assert rows and all(r["rel_err"] < 2e-2 for r in rows)
    assert json.loads(out.read_text())["rows"]


def test_row_plans_names_a_malformed_passes_value(capsys):
    from bench import row_plans

    with pytest.raises(SystemExit):
        row_plans.main(["--op", "layernorm", "--shape", "64x2560", "--passes", "544"])
    assert "--passes '544': LANESxREPS" in capsys.readouterr().err


@pytest.mark.gpu
def test_row_plans_runs_small(capsys):
    """bench/row_plans.py times the recipe's plan and a plan of the caller's in one set."""
    pytest.importorskip("torch")
    from bench import row_plans

    row_plans.main(["--op", "layernorm", "--shape", "64x2560", "--together", "--plan", "default",
                    "--plan", "128,8,3,1", "--passes", "96x4", "--rounds", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "TB/s" in line]
    assert len(lines) == 3 and "the recipe's plan" in lines[0] and "threads  128" in lines[1], lines
    assert "threads   96" in lines[2] and "values  32" in lines[2], lines


@pytest.mark.gpu
def test_sanitize_cases_run():
    torch = pytest.importorskip("torch")
    from bench.sanitize_cases import CASES, run_case

    for name in CASES:
        assert run_case(torch, name), name


def test_sass_check_compiles_its_variants(tmp_path):
    """The SASS check's variants compile to CUBINs (the SASS itself is checked where cuobjdump is)."""
    from bench import sass_check

    blobs = sass_check.cubins(512, 512, 512)
    assert set(blobs) == set(sass_check.VARIANTS)
    assert all(b[:4] == b"\x7fELF" for b in blobs.values())


def test_sass_opcode_count():
    from bench.sass_check import count_opcodes

    sass = """
        /*0a30*/                   HGMMA.64x256x16.F32 R24, gdesc[UR4], R24, gsb0 ;
        /*0a40*/              @P0  UTMALDG.2D [UR8], [UR10] ;
        /*0a50*/                   UTMASTG.2D [UR4], [UR6] ;
        /*0a60*/                   HMMA.16816.F32 R0, R4, R8, R0 ;
    """
    assert count_opcodes(sass) == {"HGMMA": 1, "UTMALDG": 1, "UTMASTG": 1}


def test_membound_runs_small(tmp_path):
    """bench/membound.py on small and odd shapes: without a GPU it compiles every case with NVRTC and
    checks it in the interpreter against the case's numpy meaning (timing skipped); with one it
    checks against torch and times both."""
    from bench import membound

    out = tmp_path / "membound.json"
    rows = membound.main(["--shapes", "33x65,64x64", "--dtypes", "f16,bf16", "--rounds", "2", "--reps", "2",
                          "--out", str(out)])
    ours = [r for r in rows if r["op"] in ("transpose", "cast")]
    assert len(ours) == 2 * 2 * 2 and all(r["max_err"] == 0 for r in ours)       # both are exact
    assert all(r["spills"] == 0 and r["max_err"] <= membound.CASES[r["op"]].tol for r in rows)
    data = json.loads(out.read_text())
    assert data["rows"] and {"device", "date", "driver", "torch", "nvrtc", "command"} <= set(data["meta"])


def test_rows_runs_small(tmp_path):
    """bench/rows.py on one small shape: without a GPU it compiles every op at 4096 x 4096 and
    interprets it at 5 x 100; with one it checks against torch in f32 and times both."""
    from bench import rows as rows_bench

    out = tmp_path / "rows.json"
    got = rows_bench.main(["--dtypes", "bf16", "--shapes", "256x1000", "--rounds", "2", "--out", str(out)])
    assert {r["op"] for r in got} == set(rows_bench.OPS)
    assert all(r["spills"] == 0 for r in got)


def test_rows_shapes_name_the_odd_set_and_refuse_malformed_values():
    from bench import rows as rows_bench

    assert rows_bench.parse_shapes("odd") == rows_bench.ODD_SHAPES
    assert all(c % 8 for _, c in rows_bench.ODD_SHAPES)
    assert rows_bench.parse_shapes("16384x1535,8x3,") == [(16384, 1535), (8, 3)]
    for bad in ("16384", "0x5", "ax3", "4096x4096x2"):
        with pytest.raises(SystemExit, match="ROWSxCOLS"):
            rows_bench.parse_shapes(bad)


def test_gemm_w4a16_smoke_runs():
    """bench/gemm_w4a16.py --smoke: its instance interpreted against numpy, and the plain byte
    layout the torch path unpacks (code k of row n in byte k / 2, low nibble for even k)."""
    from bench import gemm_w4a16 as b

    rows = b.main(["--smoke"])
    assert rows[0]["max_abs_err"] < 0.1
    q = np.arange(64).reshape(8, 8) % 16        # (K, N) codes
    plain = b.plain_bytes(q.astype(fs.dtypes.u4.np))
    assert plain.shape == (8, 4)
    assert plain[3, 1] == q[2, 3] | (q[3, 3] << 4)
    assert b.shapes_nk("4096,11008x4096") == [(4096, 4096), (11008, 4096)]
    wg = "W4A16WgmmaParams(block_m=128, block_n=128, producer=True, pingpong=False)"
    assert b.parse_params(f"{wg}; W4A16Params(stream_k=4)") == [
        fs.recipes.w4a16.W4A16WgmmaParams(block_m=128, block_n=128, producer=True, pingpong=False),
        fs.recipes.w4a16.W4A16Params(stream_k=4)]
    with pytest.raises(SystemExit, match="no W4A16Params"):
        b.parse_params("GemmParams(block_m=64)")
    # --vary: the plan with a field replaced (the wgmma plan at M = 64, K split in two), and the
    # other checkout's record of the same class (--old)
    vary = b.parse_vary(["cluster_combine=True,False", "stages=3"])
    assert vary == {"cluster_combine": [True, False], "stages": [3]}
    got = b.plan_variants(64, 4096, 4096, "f16", vary)
    base = fs.recipes.w4a16.plan(64, 4096, 4096, wgmma=True)
    assert base.cluster_combine and got == [attrs.evolve(base, stages=3),
                                            attrs.evolve(base, cluster_combine=False, stages=3)]
    assert b._other_params(fs, got[0]) == got[0] and b._other_params(fs, None) is None
    with pytest.raises(SystemExit, match="FIELD"):
        b.parse_vary(["blockm=64"])


def test_gemm_variants_smoke_and_vary():
    """bench/gemm_variants.py: the model's point and each combination of --vary over it; a
    combination that does not check is left out, and a bad field is a one-line exit."""
    from bench import gemm_variants as b

    rows = b.main(["--smoke"])
    assert rows[0]["variant"] == "model" and len(rows) >= 3
    assert all(r["spills"] == 0 for r in rows)
    assert b.parse_vary(["stages=6,8", "persistent=True,False"]) == {"stages": [6, 8], "persistent": [True, False]}
    with pytest.raises(SystemExit, match="FIELD"):
        b.parse_vary(["colour=1"])
    labels = [label for label, _ in b.variants(127, 4096, 4096, {"stages": [6, 12]})]
    assert labels == ["model", "stages=6"]          # the model's 64x64 pairs' ring is 12 deep already


def test_fmha_variants_build_and_bad_fields_exit():
    """bench/fmha.py --vary: the plan (None) first, then each combination that builds and
    checks; with wgmma, warps follow block_q; a field FmhaParams lacks is a one-line exit."""
    from bench import fmha as b

    vary = b.parse_vary(["block_kv=64,128", "warp_specialized=True,False"])
    assert vary == {"block_kv": [64, 128], "warp_specialized": [True, False]}
    got = b.variants(1, 2, 100, 64, False, b.parse_vary(["block_q=64,128"]))
    assert got[0] is None and [p.warps for p in got[1:]] == [8]
    with pytest.raises(SystemExit, match="FIELD"):
        b.parse_vary(["colour=1"])


def test_profile_fmha_smoke(capsys):
    """bench/profile_fmha.py --smoke compiles the planned kernel (here its persistent variant, and
    the sm_80 plan)."""
    from bench import profile_fmha

    profile_fmha.main(["--shape", "2x2x256x128", "--persistent", "--smoke"])
    profile_fmha.main(["--shape", "2x2x256x128", "--arch", "sm_80", "--smoke"])
    assert capsys.readouterr().out.count("compiled, 0 spill bytes") == 2


def test_row_fixed_cost_smoke():
    from bench.row_fixed_cost import fit, main

    ks = main(["--smoke", "--cols", "1001", "--rows", "8,16"])["kernels"]
    assert set(ks) == {"ln_wb", "ln_w", "ln", "rms", "softmax"}
    assert [b.name for b in ks["ln_w"].program.inputs] == ["X", "W"]
    assert [b.name for b in ks["ln"].program.inputs] == ["X"]
    # a line through (rows, µs): 2 µs fixed, then 1 µs a row of 1,000 2-byte elements (4 kB moved)
    fixed, rate = fit({1: 3.0, 2: 4.0, 4: 6.0}, 1000, 2)
    assert abs(fixed - 2.0) < 1e-9 and abs(rate - 0.004) < 1e-9
    with pytest.raises(SystemExit, match="at least two"):
        main(["--smoke", "--rows", "8"])
    with pytest.raises(SystemExit, match="at least two"):
        main(["--smoke", "--rows", "2048,4k"])


def test_row_plan_diff_finds_exactly_a_changed_rule(tmp_path):
    # the other checkout: this tree's firesched without RMSNorm's one staged block
    # (rows.STAGED_BLOCK_VALUES); the script must report that rule's lengths and nothing else
    import shutil

    from bench import row_plan_diff

    shutil.copytree(os.path.join(ROOT, "firesched"), tmp_path / "firesched",
                    ignore=shutil.ignore_patterns("__pycache__"))
    rows_py = tmp_path / "firesched" / "recipes" / "rows.py"
    text = rows_py.read_text()
    assert 'STAGED_BLOCK_VALUES = {"rmsnorm": 96, "add_rmsnorm": 96}' in text
    rows_py.write_text(text.replace('STAGED_BLOCK_VALUES = {"rmsnorm": 96, "add_rmsnorm": 96}',
                                    'STAGED_BLOCK_VALUES = {}'))
    found = row_plan_diff.main(["--old", str(tmp_path), "--ops", "rmsnorm,layernorm", "--dtypes", "bf16",
                                "--archs", "sm_90a,sm_80", "--step", "997"])
    assert list(found) == [("rmsnorm", "bf16", "sm_90a")]
    cols = [c for c, _, _ in found["rmsnorm", "bf16", "sm_90a"]]
    assert min(cols) > 40960 and max(cols) <= 98304
    assert all(new["cluster"] == 1 and new["row_memory"] == "SH" for _, _, new in found["rmsnorm", "bf16", "sm_90a"])
