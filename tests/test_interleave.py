"""``lower.transforms.interleave``: a wgmma whose A fragment a body fills in registers issues as
soon as its slice is filled, with a fence before each batch; bodies the pass cannot reorder
safely are left as they are."""

from __future__ import annotations

from firesched import dtypes, ir
from firesched.hardware.atoms import catalog, sm90a
from firesched.lower.transforms.interleave import issue_when_ready

ACC = ir.RegBuffer("acc", dtypes.f32, 32)
FRAG = ir.RegBuffer("frag", dtypes.f16, 32)          # four k16 slices of 8 halves
CODES = ir.RegBuffer("codes", dtypes.u4, 32)
WG = sm90a.wgmma_atom(64, "f16", a_in_registers=True)
CONV = catalog.by_name("dequant_u4z8_f16")


def _fill(slice_: int) -> ir.AtomCall:
    return ir.AtomCall(CONV, (("dst", ir.RegRef(FRAG, 8 * slice_)), ("src", ir.RegRef(CODES, 8 * slice_))))


def _mma(slice_: int) -> ir.AtomCall:
    return ir.AtomCall(WG, (("d", ir.RegRef(ACC, 0)), ("a", ir.RegRef(FRAG, 8 * slice_))))


def _order(stmts) -> list[str]:
    """``fill<slice>``, ``mma<slice>`` (the slice of the fragment it writes or reads), ``fence``."""
    names = {CONV.name: ("fill", "dst"), WG.name: ("mma", "a"), sm90a.wgmma_fence.name: ("fence", None)}
    out = []
    for s in stmts:
        if isinstance(s, ir.AtomCall):
            name, arg = names[s.atom.name]
            out.append(name + (str(dict(s.args)[arg].offset // 8) if arg else ""))
    return out


def test_each_wgmma_issues_after_its_slice():
    body = [_fill(0), _fill(1), _fill(2), _fill(3), ir.AtomCall(sm90a.wgmma_fence, ()),
            *[ir.Seq((ir.Comment(f"k = {i}"), _mma(i))) for i in range(4)]]
    got = issue_when_ready(body)
    assert _order(got) == ["fill0", "fence", "mma0", "fill1", "fence", "mma1", "fill2", "fence", "mma2",
                           "fill3", "fence", "mma3"]
    # each wgmma keeps the comment before it
    assert [s.text for s in got if isinstance(s, ir.Comment)] == [f"k = {i}" for i in range(4)]


def test_a_slice_filled_late_holds_back_the_wgmmas_after_it():
    """Fills out of fragment order: the wgmmas still issue in order, each after its own slice and
    every earlier wgmma."""
    body = [_fill(1), _fill(0), _fill(3), _fill(2), *[_mma(i) for i in range(4)]]
    assert _order(issue_when_ready(body)) == ["fill1", "fill0", "fence", "mma0", "mma1", "fill3", "fill2", "fence",
                                              "mma2", "mma3"]


def test_bodies_it_cannot_reorder_are_kept():
    mmas = [_mma(i) for i in range(4)]
    fills = [_fill(i) for i in range(4)]
    # the fill touches the accumulator
    assert issue_when_ready([*fills, ir.Pointwise("mul", ir.RegRef(ACC, 3), (ir.RegRef(ACC, 3), 2.0)), *mmas]) is None
    # a barrier among the fills
    assert issue_when_ready([fills[0], ir.Barrier("x"), *fills[1:], *mmas]) is None
    # the first wgmma needs the whole fill: nothing to overlap
    assert issue_when_ready([*fills, _mma(3), _mma(0)]) is None
    # a statement after the first wgmma that is not one
    assert issue_when_ready([*fills, mmas[0], fills[0], *mmas[1:]]) is None
    # one wgmma
    assert issue_when_ready([*fills, mmas[0]]) is None
