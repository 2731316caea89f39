"""``online_softmax(kv=)``: attention as a loop over key/value tiles with a running max and sum.

The softmax of a row needs its max and sum over every key before any probability is final;
the online softmax (FlashAttention) keeps a running max ``m`` and sum ``l`` per query row and
rescales what it accumulated whenever the max grows, so each key tile is read once::

    Attention<block>(Q:SH f16[128x128], K:GL f16[1x1x4096x128], V:GL ... -> O:GL ...)
      online_softmax(kv=64)
      Init<block>(O:RF f32[128x128] = 0); Init<block>(m:RF f32[128] = -inf); Init<block>(l:RF f32[128] = 0)
      Init<block>(c:RF f32[128] = scale·log2(e))
      for kv0 in seq(64) [until the diagonal of q, when causal]:
        Fused<block>[
          0  Init(S = 0)
          1  MatMul(Q, K -> S:GL f32[128x64])              S = Q Kᵀ  (place("S", RF) keeps it in registers)
          2  Pointwise(copy: S -> S) with edge, causal       masked keys -inf
          3  Reduce(max over kv: S -> mx)                    the tile's row max
          4  Pointwise(max: m, mx -> mx)                     the new running max
          5  Pointwise(exp2_sub_scaled: m, mx, c -> alpha)   alpha = 2^((m_old - m_new)·c)
          6  Move(mx -> m)
          7  Pointwise(exp2_sub_scaled: S, m, c -> S)        S = 2^(S·c - m·c): unnormalised probabilities
          8  Reduce(sum over kv: S -> rs)
          9  Pointwise(mul: l, alpha -> l);  10  Pointwise(add: l, rs -> l)      l = l·alpha + rowsum
         11  Pointwise(mul: O, alpha -> O)                   rescale what was accumulated
         12  Move(S -> P:GL f16[128x64])                     (place("P", RF): P never leaves registers)
         13  MatMul(P, V -> O)                                O += P V
        ]
      Pointwise<block>(div: O, l -> O); Move<block>(O:RF -> O:GL)
      [Pointwise<block>(log2: l -> lg); Pointwise<block>(mul: m, c -> m);
       Pointwise<block>(add: m, lg -> LSE:GL) with scale(ln 2)]

The scores stay unscaled and the exponentials are in the base 2: ``c = scale · log2(e)`` enters
each as one fma, ``2^(S·c - m·c)``, so every probability costs an fma and an ``ex2`` (the max of
unscaled scores is the same key for a positive scale; a negative one multiplies the scores by
``c`` in part 2 instead, and uses ``exp2_sub``).  The element-wise parts and the statistics are declared
``on_fragments()``: they run on the registers where the MMAs leave them.  The two MatMuls
(parts 1 and 13, or -1) are refined with ``part(i, ...)`` like any block-level MatMul, and K and
V are staged with ``move_to_smem`` on the fused focus (the copies go into the key loop, which
``pipeline`` then double-buffers).
"""

from __future__ import annotations

import math

import attrs

from .. import ops as fops
from ..errors import ScheduleError
from ..schedule import Loop, Node
from ..spec import Attention, Fused, Init, MatMul, Move, Pointwise, Reduce
from ..tensor import BLOCK, GL, RF, Tensor, Tile
from .base import Strategy, fresh_var, positive_int
from .done import on_fragments

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: the body's parts, by what they compute (``part(SCORES, ...)``, ``part(VALUES, ...)``)
SCORES = 1
VALUES = 13


@attrs.frozen(repr=False)
class online_softmax(Strategy):
    """``online_softmax(kv=64)``: decompose a block's ``Attention`` into a sequential loop over
    key/value tiles of ``kv`` positions whose body is a ``Fused`` spec (the module docstring
    shows the tree), with the running max ``m``, sum ``l`` and output ``O`` in registers across
    the loop.  The focus becomes the fused body: ``move_to_smem("K")``, ``move_to_smem("V")``,
    ``place("S", RF)``, ``place("P", RF)``, then ``part(SCORES, ...)`` and ``part(VALUES, ...)``.

    * ``kv``: keys per tile, a multiple of 16 (the k of the second MMA); a last partial tile is
      masked (``ops.edge``).
    * ``diagonal``: on a causal spec, the key loop of a block stops after the tile that holds
      the diagonal of its last query (``Loop.diagonal``): the tiles past it are masked whole,
      so they would add nothing.  ``diagonal=False`` visits (and masks) every tile.
    """

    kv: int = 64
    diagonal: bool = True

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if not isinstance(spec, Attention):
            raise ScheduleError("online_softmax() decomposes an Attention spec", strategy=self, spec=spec,
                                fix="build it with firesched.Attention.kernel(...)")
        if spec.level != BLOCK:
            raise ScheduleError("online_softmax() runs inside a block: map the queries onto blocks first",
                                strategy=self, spec=spec, field="level", value=str(spec.level), allowed="block",
                                fix="tile(b=1, hk=1, g=1, q=128) >> to_blocks()")
        positive_int(self, spec, "kv", self.kv)
        if self.kv % 16:
            raise ScheduleError("the key tile is the k of the second MatMul's MMA (16)", strategy=self, spec=spec,
                                field="kv", value=self.kv, allowed="a multiple of 16")
        for d in ("b", "hk", "g"):
            if spec.o.extent(d) != 1:
                raise ScheduleError(f"a block holds one head of one batch: its {d} extent is {spec.o.extent(d)}",
                                    strategy=self, spec=spec, field=d, value=spec.o.extent(d), allowed="1",
                                    fix="tile(b=1, hk=1, g=1, q=...) >> to_blocks()")
        bq, d = spec.o.extent("q"), spec.o.extent("d")
        skv = spec.k.extent("kv")
        tk = self.kv
        dt = spec.q.dtype

        def reg(name, dims, shape, dtype="f32", mem=RF):
            t = Tensor(name, dtype, mem, dims, shape, dims[-1])
            return Tile(t, shape)

        o = reg("O", ("q", "d"), (bq, d))
        m, l, mx = reg("m", ("q",), (bq,)), reg("l", ("q",), (bq,)), reg("mx", ("q",), (bq,))
        alpha, rs = reg("alpha", ("q",), (bq,)), reg("rs", ("q",), (bq,))
        s = reg("S", ("q", "kv"), (bq, tk), mem=GL)
        p = reg("P", ("q", "kv"), (bq, tk), dt, mem=GL)
        k, v = spec.k.with_extent(kv=tk), spec.v.with_extent(kv=tk)
        # a positive scale is folded into the exponentials (one fma an element instead of a
        # multiply and a subtraction; the max of unscaled scores is the same key), so m holds
        # unscaled maxima and c the scale; any other scale multiplies the scores first
        fold = spec.scale > 0
        c = reg("c", ("q",), (bq,))
        masks = (() if fold else (fops.scale(spec.scale * LOG2E),)) + (fops.edge("kv"),)
        if spec.causal:
            masks += (fops.causal(row="q", col="kv"),)

        def exp2_sub(x, mm, out):
            if fold:
                return Pointwise("exp2_sub_scaled", (x, mm, c), out, BLOCK)
            return Pointwise("exp2_sub", (x, mm), out, BLOCK)

        body = (
            Init(s, 0.0, BLOCK),
            MatMul(spec.q, k, s, BLOCK, "f32", roles=("q", "kv", "d")),
            Pointwise("copy", (s,), s, BLOCK, masks),
            Reduce("max", s, mx, ("kv",), BLOCK),
            Pointwise("max", (m, mx), mx, BLOCK),
            exp2_sub(m, mx, alpha),
            Move(mx, m, BLOCK),
            exp2_sub(s, m, s),
            Reduce("sum", s, rs, ("kv",), BLOCK),
            Pointwise("mul", (l, alpha), l, BLOCK),
            Pointwise("add", (l, rs), l, BLOCK),
            Pointwise("mul", (o, alpha), o, BLOCK),
            Move(s, p, BLOCK),
            MatMul(p, v, o, BLOCK, "f32", roles=("q", "d", "kv")),
        )
        fused = Fused(body, BLOCK)
        leaf = on_fragments()
        parts = tuple(Node(sp, strategy=leaf) if isinstance(sp, (Pointwise, Move, Reduce)) else Node(sp)
                      for sp in body)
        # the output's rows divided by their sums: one reciprocal a row, then a multiply an element
        # (a division an element took ~10 instructions each, 64 a thread at 128 x 128)
        rl = reg("rl", ("q",), (bq,))
        post = [Node(Pointwise("rcp", (l,), rl, BLOCK), strategy=leaf),
                Node(Pointwise("mul", (o, rl), o, BLOCK), strategy=leaf), Node(Move(o, spec.o, BLOCK))]
        if spec.lse is not None:
            lg = reg("lg", ("q",), (bq,))
            post += [Node(Pointwise("log2", (l,), lg, BLOCK), strategy=leaf)]
            if fold:
                post.append(Node(Pointwise("mul", (m, c), m, BLOCK), strategy=leaf))      # the scaled max
            post.append(Node(Pointwise("add", (m, lg), spec.lse, BLOCK, (fops.scale(LN2),)), strategy=leaf))
        if not isinstance(self.diagonal, bool):
            raise ScheduleError("diagonal is a bool", strategy=self, spec=spec, field="diagonal",
                                value=self.diagonal, allowed="True, False")
        loop = Loop(fresh_var(sched, "kv"), -(-skv // tk), (("kv", tk),),
                    diagonal=("q", 0) if spec.causal and self.diagonal else ())
        new = attrs.evolve(node, strategy=self, loops=(loop,),
                           pre=(Node(Init(o, 0.0, BLOCK)), Node(Init(m, -math.inf, BLOCK)), Node(Init(l, 0.0, BLOCK)),
                                *([Node(Init(c, spec.scale * LOG2E, BLOCK))] if fold else [])),
                           body=(Node(fused, body=parts),), post=tuple(post))
        return sched.replace_focus(new)

    def __repr__(self):
        extra = "" if self.diagonal is True else f", diagonal={self.diagonal!r}"
        return f"online_softmax(kv={self.kv!r}{extra})"

    __str__ = __repr__
