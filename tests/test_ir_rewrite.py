"""Statement rewriting shared by the IR passes: substitution reaches every operand kind, and a
loop of wgmma issues is written out step by step (each descriptor a constant offset of one base)
with the same meaning as the loop."""

from __future__ import annotations

import numpy as np

import firesched as fs
from firesched import dtypes, ir
from firesched.hardware.atoms import sm90a
from firesched.ir import rewrite
from firesched.ir.expr import Var, lt


def _buffers():
    sh = ir.SharedBuffer("S", dtypes.f16, 4096)
    rg = ir.RegBuffer("R", dtypes.f32, 64)
    gl = ir.GlobalBuffer("G", dtypes.f16, (64, 64), (64, 1), role="in")
    return sh, rg, gl


def test_substitution_reaches_every_operand_and_statement_kind():
    sh, rg, gl = _buffers()
    k = Var("k", 4)
    body = ir.Seq((
        ir.AtomCall(sm90a.wgmma_m64n128k16_f16_f32_ss_tnspb,
                    (("d", ir.RegRef(rg, 0)), ("desc_a", ir.DescRef(sh, k * 16, 128, 16, 1024)),
                     ("desc_b", ir.DescRef(sh, 2048 + k * 1024, 128, 8192, 1024)), ("scale_d", ir.Scalar(k))),
                    pred=lt(k, 3)),
        ir.If(k, ir.Pointwise("add", ir.RegRef(rg, k), (ir.RegRef(rg, k + 1), 1.0))),
        ir.RegFill(ir.RegRef(rg, k * 2), 2),
        ir.Barrier("b", 1 + k, 128),
        ir.Comment("k stays a name in comments"),
    ))
    out = rewrite.substitute_stmt(body, {k: 2})
    assert not any(k in ir.expr.free_vars(x) for x in _exprs(out))
    call = out.body[0]
    assert call.arg("desc_a").offset == 32 and call.arg("desc_b").offset == 4096
    assert call.arg("scale_d").value == 2 and call.pred == 1
    assert out.body[1].cond == 2 and out.body[1].then.dst.offset == 2
    assert out.body[2].ref.offset == 4 and out.body[3].bar_id == 3


def _exprs(st):
    """Every index expression of ``st`` (operands, predicates, conditions, barrier ids)."""
    found = []

    def e(x):
        found.append(x)
        return x

    rewrite.map_stmt(st, e)
    for s in rewrite.walk([st]):
        if isinstance(s, ir.AtomCall):
            for _, a in s.args:
                for f in ("offset", "value"):
                    if hasattr(a, f):
                        found.append(getattr(a, f))
    return found


def test_expand_writes_each_iteration_with_the_variable_constant():
    sh, rg, _ = _buffers()
    k = Var("k1", 3)
    loop = ir.For(k, 3, ir.Seq((ir.RegFill(ir.RegRef(rg, k * 4), 4, 1.0),)), unroll=True)
    out = rewrite.expand(loop)
    fills = [s for s in rewrite.walk([out]) if isinstance(s, ir.RegFill)]
    comments = [s.text for s in rewrite.walk([out]) if isinstance(s, ir.Comment)]
    assert [f.ref.offset for f in fills] == [0, 4, 8]
    assert comments == ["k1 = 0", "k1 = 1", "k1 = 2"]


def test_hopper_k_steps_are_written_out_and_still_compute_the_product():
    # the K steps of one tile are straight-line wgmma issues, no loop around them
    sched = fs.recipes.gemm(128, 128, 128, arch="sm_90a", atoms="sm90a", warp_specialized=False,
                            block_m=128, block_n=128, stages=2)
    prog = sched.lower("sm_90a")
    for kern in prog.kernels:
        for s in rewrite.walk([kern.body]):
            if isinstance(s, ir.For):
                inner = [x for x in rewrite.flat([s.body]) if not isinstance(x, ir.Comment)]
                assert not all(isinstance(x, ir.AtomCall) and x.atom.family == "wgmma" for x in inner), \
                    f"loop {s.var.name} still wraps wgmma issues"
    rng = np.random.default_rng(3)
    A = rng.standard_normal((128, 128)).astype(np.float16)
    B = rng.standard_normal((128, 128)).astype(np.float16)
    C = fs.interpret(sched, A, B, target="sm_90a")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C.astype(np.float64) - ref).max() < 0.05 * np.abs(ref).max()


def test_replace_leaves_keeps_the_shape_and_drops_or_swaps_leaves():
    _, rg, _ = _buffers()
    k = Var("k", 4)
    body = ir.Seq((
        ir.Barrier("first"),
        ir.For(k, 4, ir.Seq((ir.If(k, ir.Barrier("inner")), ir.RegFill(ir.RegRef(rg, k), 1)))),
        ir.Comment("kept"),
    ))
    out = rewrite.replace_leaves(body, lambda s: None if isinstance(s, ir.Barrier) else s)
    assert [type(s).__name__ for s in rewrite.walk([out])] == ["Seq", "For", "Seq", "If", "Seq", "RegFill", "Comment"]
    swapped = rewrite.replace_leaves(body, lambda s: ir.Comment("was a barrier") if isinstance(s, ir.Barrier) else s)
    assert sum(isinstance(s, ir.Comment) for s in rewrite.walk([swapped])) == 3
    assert rewrite.replace_leaves(body, lambda s: s) == body
