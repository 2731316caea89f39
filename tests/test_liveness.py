"""Register pressure from lifetimes (``lower.liveness``): buffers live at different times share
registers; a value carried around a loop lives through all of it."""

from __future__ import annotations

import firesched as fs
from firesched import dtypes as dt
from firesched import ir
from firesched.ir.expr import Var
from firesched.lower.liveness import pressure, words_of

A = ir.RegBuffer("a", dt.f32, 64)
B = ir.RegBuffer("b", dt.f32, 32)
H = ir.RegBuffer("h", dt.f16, 32)       # 16 registers: two halves a register
REGS = {b.name: b for b in (A, B, H)}


def fill(buf):
    return ir.RegFill(ir.RegRef(buf, 0), buf.size, 0.0)


def use(dst, src):
    return ir.Pointwise("add", ir.RegRef(dst, 0), (ir.RegRef(dst, 0), ir.RegRef(src, 0)))


def test_words_count_packed_halves():
    assert (words_of(A), words_of(H)) == (64, 16)


def test_buffers_live_one_after_the_other_share_registers():
    body = ir.Seq((fill(A), use(A, A), fill(B), use(B, B)))
    p = pressure(body, REGS)
    assert p.words == 64 and dict(p.live) == {"a": 64}


def test_overlapping_lifetimes_add():
    body = ir.Seq((fill(A), fill(B), use(A, B)))
    assert pressure(body, REGS).words == 96


def test_a_value_entering_a_loop_lives_through_it():
    # a is written before the loop and read in its first statement only; b lives inside the loop
    # after that read: they overlap because a's value is needed again next iteration
    k = Var("k", 4)
    body = ir.Seq((fill(A), ir.For(k, 4, ir.Seq((use(A, A), fill(B), use(B, B))))))
    assert pressure(body, REGS).words == 96


def test_a_loop_carried_value_born_inside_lives_through_the_loop():
    # h is read before it is written in each iteration: the previous iteration's value
    k = Var("k", 4)
    body = ir.Seq((ir.For(k, 4, ir.Seq((use(B, H), fill(H), fill(A), use(A, A)))),))
    p = pressure(body, REGS)
    assert p.words == 32 + 16 + 64


def test_temporaries_of_one_iteration_do_not_carry():
    k = Var("k", 4)
    body = ir.Seq((ir.For(k, 4, ir.Seq((fill(A), use(A, A), fill(B), use(B, B)))),))
    assert pressure(body, REGS).words == 64


def test_attention_scores_and_fragments_are_not_all_live_at_once():
    # 128 queries on 4 warps at head dim 128: the buffers add up to more than 255 registers,
    # but the output, the scores and one operand's fragments are what is live at the peak
    sched = fs.recipes.fmha(1, 1, 256, 256, 64, params=fs.recipes.FmhaParams(block_q=64, block_kv=64, warps=4))
    kernel = sched.lower("sm_90a").kernels[0]
    regs = {b.name: b for b in kernel.regs}
    total = sum(words_of(b) for b in regs.values())
    p = pressure(kernel.body, regs)
    assert p.words < total
    assert {"O_acc", "S_acc"} <= dict(p.live).keys()
