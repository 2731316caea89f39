"""Overlap within a warpgroup (``pipeline(overlap=True)``): the MMA that opens a key-loop step
issues before the previous step's closing MMA has retired, so the element-wise work between them
runs while the tensor cores compute (FlashAttention-3's intra-warpgroup overlap).

A consumer loop whose body is ``G1 = one wgmma group; X = work on its result; G2 = a wgmma group
that reads what X made`` (attention: S = Q Kᵀ; softmax; O += P V) is rotated::

    step 0:          wait full[0]; G1(0); wait 0; X(0)
    step j = 1..N-1: wait full[j]; G1(j) + G2(j-1) issued as one turn; wait 1 (G1(j) is done)
                     X_free(j)                  the work G2(j-1) cannot see: softmax of S(j)
                     wait 0; release stage j-1  (G2(j-1) is done)
                     X_after(j)                 the work that touches G2's registers: O *= alpha,
                                                P = S, and what depends on it
    after:           G2(N-1); wait 0; release stage N-1

``X`` splits by dependence, in program order: a statement goes after the wait if it reads or
writes a register buffer G2 uses (its accumulator, its A operand), or depends on (or overwrites
what is read by) a statement already placed after.  The order of the rotated steps computes the
same values: each statement still sees the values it saw, and G2(j-1) reads P(j-1) and adds into
O before O is rescaled for step j.  The interpreter checks the registers in flight, as always.

With a ring per operand (``pipeline(separate=True)``, ``transforms.pipeline.OperandRings``) each
operand is waited for with the first group that reads it and released once the last group that
reads it has retired::

    step j:  wait K(j); wait V(j-1); G1(j) + G2(j-1); wait 1; release K(j)
             X_free(j); wait 0; release V(j-1); X_after(j)

so K's stage goes back to the producer a whole step before V's.  An operand read outside the two
groups keeps the one-ring order (waited at the top of its step, released after G2).
"""

from __future__ import annotations

from ... import ir
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import WGMMA
from ...ir.rewrite import flat
from ...ir.rewrite import walk as walk_ir
from ..context import err
from ..rules.turns import is_turn, take_turn


def _is(st, name: str) -> bool:
    return isinstance(st, ir.AtomCall) and st.atom.name == name


def split_body(node, body: list):
    """``body`` as ``(pre, g1, x, g2)``: the statements before the first wgmma group, the wgmma of
    the first group (between its fence and commit), those between the groups, the wgmma of the
    second; a ``ScheduleError`` when the body is not two groups with work between them."""
    stmts = [s for s in flat(body) if not is_turn(s)]      # the turn is re-taken around the combined issue
    fences = [i for i, s in enumerate(stmts) if _is(s, "wgmma_fence")]
    commits = [i for i, s in enumerate(stmts) if _is(s, "wgmma_commit")]
    stray = [s for s in stmts if isinstance(s, (ir.For, ir.If))
             and any(isinstance(x, ir.AtomCall) and x.atom.family == WGMMA for x in walk_ir([s]))]
    if len(fences) != 2 or len(commits) != 2 or stray:
        raise err(node, "pipeline(overlap=True) rotates a key loop whose body is two wgmma groups with work between "
                        f"them (S = Q Kᵀ; softmax; O += P V); this body issues {len(fences)} group(s)",
                  field="overlap", value=True, allowed="False here",
                  fix="overlap=False, or a fused body of MatMul, element-wise parts, MatMul")
    (f1, f2), (c1, c2) = fences, commits
    w1 = c1 + 1
    if not (f1 < c1 < w1 < f2 < c2) or not _is(stmts[w1], "wgmma_wait"):
        raise err(node, "pipeline(overlap=True): the first wgmma group is not retired before the work that reads it",
                  field="overlap", value=True, allowed="False here")
    rest = [s for s in stmts[c2 + 1:] if not isinstance(s, ir.Comment)]
    if len(rest) != 1 or not _is(rest[0], "wgmma_wait"):
        raise err(node, "pipeline(overlap=True): the second wgmma group must close the loop's body",
                  field="overlap", value=True, allowed="False here")
    return stmts[:f1], stmts[f1 + 1:c1], stmts[w1 + 1:f2], stmts[f2 + 1:c2]


def _regs(st) -> tuple[set, set]:
    """The register buffers ``st`` (and what it nests) reads and writes, by name."""
    reads: set = set()
    writes: set = set()
    for s in walk_ir([st]):
        if isinstance(s, ir.AtomCall):
            roles = {o.name: o.role for o in s.atom.operands}
            for n, a in s.args:
                if isinstance(a, ir.RegRef):
                    role = roles.get(n, "in")
                    if role in ("out", "inout"):
                        writes.add(a.buffer.name)
                    if role in ("in", "inout"):
                        reads.add(a.buffer.name)
        elif isinstance(s, ir.Pointwise):
            if isinstance(s.dst, ir.RegRef):
                writes.add(s.dst.buffer.name)
            reads.update(r.buffer.name for r in s.srcs if isinstance(r, ir.RegRef))
        elif isinstance(s, ir.RegFill) and isinstance(s.ref, ir.RegRef):
            writes.add(s.ref.buffer.name)
    return reads, writes


def partition(x: list, g2: list) -> tuple[list, list]:
    """``x`` as (free, after): ``after`` holds every statement that touches a register of ``g2``
    or depends on one placed there (see the module docstring); both keep program order."""
    busy: set = set()
    for s in g2:
        r, w = _regs(s)
        busy |= r | w
    free, after = [], []
    after_reads: set = set()
    after_writes: set = set()
    for s in x:
        r, w = _regs(s)
        late = bool((r | w) & busy) or bool(r & after_writes) or bool(w & (after_reads | after_writes))
        if late:
            after.append(s)
            after_reads |= r
            after_writes |= w
        else:
            free.append(s)
    return free, after


def shared_reads(stmts) -> set:
    """Names of the shared buffers ``stmts`` read: an atom's operand (a MemRef, or a wgmma's
    descriptor of its tile, a DescRef) or a pointwise source."""
    out = set()
    for s in walk_ir(stmts):
        refs = [a for _, a in s.args] if isinstance(s, ir.AtomCall) else list(s.srcs) if isinstance(s, ir.Pointwise) \
            else []
        out |= {a.buffer.name for a in refs
                if isinstance(a, (ir.MemRef, ir.DescRef)) and isinstance(a.buffer, ir.SharedBuffer)}
    return out


def operand_groups(rings: dict, pre: list, g1: list, x: list, g2: list) -> dict | None:
    """Operand name -> (the group that reads it first, the group that reads it last), 1 or 2; None
    when one is read outside the two groups (the rings then wait and release together)."""
    outside, in1, in2 = shared_reads(pre) | shared_reads(x), shared_reads(g1), shared_reads(g2)
    out = {}
    for name in rings:
        buf = f"{name}_smem"
        if buf in outside or buf not in in1 | in2:
            return None
        out[name] = (1 if buf in in1 else 2, 2 if buf in in2 else 1)
    return out


def overlapped_loop(node, ctx, lp, n: int, stop, it_base, S: int, ring, compute, kc_name: str,
                    visible=None) -> list:
    """The consumer loop of ``lp`` rotated (module docstring); ``compute(kt, stage, unmasked)``
    lowers the body of step ``kt`` (an expression) reading ring stage ``stage``, without the causal
    mask where ``unmasked``.  ``visible`` (a loop that stops at a diagonal): how many leading
    steps lie wholly on the visible side of it; the steady loop is then two loops, the first
    without the mask::

        step 0 (masked) | steps 1 .. V-1 (no mask) | steps max(1, V) .. N-1 (masked)
    """
    from ...ir.expr import Var, maximum, minimum

    N = n if stop is None else minimum(n, stop)
    lane = ctx.scope.tid % 128

    def parts(kt, unmasked=False):
        body, _ = compute(kt, (it_base + kt) % S, unmasked)
        return split_body(node, body)

    def group(*inner):
        out = [ir.AtomCall(sm90a.wgmma_fence, ())]
        for g in inner:
            out += [*g, ir.AtomCall(sm90a.wgmma_commit, ())]
        return take_turn(ctx, out)

    def wait(k, why):
        return ir.AtomCall(catalog.with_immediates(sm90a.wgmma_wait, n=k), (), comment=why)

    pre0, g10, x0, g20 = parts(0)
    groups = operand_groups(ring.rings, pre0, g10, x0, g20) if getattr(ring, "rings", None) else None

    def rings_where(i: int, at: int) -> list:
        """(name, ring) of the operands whose first (``i = 0``) or last (``i = 1``) group is ``at``."""
        return [(name, r) for name, r in ring.rings.items() if groups[name][i] == at]

    def wait_for(at: int, kt) -> list:
        """The waits before group ``at`` of step ``kt`` issues: with one ring, all at group 1."""
        if groups is None:
            return ring.wait(it_base + kt) if at == 1 else []
        return [x for _, r in rings_where(0, at) for x in r.wait(it_base + kt)]

    def release(at: int, kt, why) -> list:
        """The releases once group ``at`` of step ``kt`` retired: with one ring, all after group 2."""
        if groups is None:
            return [ir.If(ir.expr.lt(lane, 1), ring.release((it_base + kt) % S, why))] if at == 2 else []
        rs = rings_where(1, at)
        return [ir.If(ir.expr.lt(lane, 1), ir.Seq(tuple(
            r.release((it_base + kt) % S, f"{why} ({name})") for name, r in rs)))] if rs else []

    out = [ir.Comment(f"key loop over {n} tiles of {lp.step(lp.dim)}, rotated: each step's first wgmma group "
                      "issues with the previous step's second"),
           *wait_for(1, 0), *pre0, *group(g10), wait(0, "S of step 0 is done"),
           *release(1, 0, "release step 0's operands of the first group"), *x0]
    def steady(name, first, count_stop, unmasked):
        kc = Var(name, n - 1)
        kt = kc + first
        pre, g1, x, _ = parts(kt, unmasked)
        _, _, _, g2_prev = parts(kt - 1, unmasked)
        free, after = partition(x, g2_prev)
        body = [*wait_for(1, kt), *wait_for(2, kt - 1), *pre, *group(g1, g2_prev),
                wait(1, "this step's first group is done; the previous step's second may still run"),
                *release(1, kt, "release this step's operands of the first group"),
                *free, wait(0, "the previous step's second group is done"),
                *release(2, kt - 1, "release the previous step's stage"), *after]
        return ir.For(kc, n - 1, ir.Seq(tuple(body)), stop=count_stop)

    if n > 1 and visible is None:
        out.append(steady(kc_name, 1, None if stop is None else N - 1, False))
    elif n > 1:
        # the steps wholly left of the diagonal, then those it crosses (the body of the first
        # is lowered without the causal mask: 2 instructions an element a step fewer)
        V = maximum(minimum(visible, N), 1)
        out.append(steady(kc_name, 1, V - 1, True))
        out.append(steady(kc_name + "m", V, N - V, False))
    last = N - 1
    _, _, _, g2_last = parts(last)
    out += [*wait_for(2, last), *group(g2_last), wait(0, "the last step's second group is done"),
            *release(2, last, "release the last stage")]
    return out
