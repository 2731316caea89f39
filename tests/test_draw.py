"""Pictures of layouts (firesched.draw): the grids' contents, well-formed SVG with one cell per
element, bank colouring of swizzles, thread/value names of TV layouts, and the notebook hooks."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from firesched import draw
from firesched.errors import FireschedError
from firesched.layout import SW32, SW64, SW128, ComposedLayout, Layout, Swizzle, TVLayout
from firesched.lower.layouts import SmemLayout

SVG = "{http://www.w3.org/2000/svg}"

# The A operand of mma.sync m16n8k16 (drawn in the comment above TVLayout in firesched/layout.py).
MMA_A = TVLayout(Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))), (16, 16))


def _cells(svg_text: str) -> list[ET.Element]:
    root = ET.fromstring(svg_text)          # raises on malformed XML
    assert root.tag == SVG + "svg"
    return [e for e in root.iter(SVG + "rect") if e.get("class") == "cell"]


def _labels(svg_text: str) -> list[str]:
    root = ET.fromstring(svg_text)
    return [e.text for e in root.iter(SVG + "text") if e.get("class") == "label"]


def _by_position(cells: list[ET.Element]) -> dict[tuple[int, int], ET.Element]:
    return {(int(c.get("data-row")), int(c.get("data-col"))): c for c in cells}


# --------------------------------------------------------------------------- layouts


def test_layout_grid_holds_the_offsets():
    g = draw.layout_grid(Layout((4, 8), (8, 1)))
    assert (g.rows, g.cols) == (4, 8)
    assert g.labels() == [[str(8 * i + j) for j in range(8)] for i in range(4)]


def test_layout_svg_is_well_formed_with_one_cell_per_element():
    lay = Layout((4, (2, 3)), (1, (4, 8)))
    svg = draw.svg(draw.layout_grid(lay))
    cells = _cells(svg)
    assert len(cells) == lay.size()
    pos = _by_position(cells)
    assert set(pos) == {(i, j) for i in range(4) for j in range(6)}
    # cell (i, j) is the coordinate (i, j): mode 0 down, the hierarchical mode 1 across
    offs = lay.offsets().reshape(6, 4).T
    labels = _labels(svg)
    assert labels == [str(int(o)) for o in offs.ravel()]


def test_rank1_layout_is_one_row_and_composed_layouts_draw_swizzled_offsets():
    g = draw.layout_grid(Layout(8, 2))
    assert g.labels() == [[str(2 * j) for j in range(8)]]
    comp = ComposedLayout(Swizzle(1, 0, 1), 0, Layout((2, 2), (2, 1)))
    assert draw.layout_grid(comp).labels() == [["0", "1"], ["3", "2"]]


def test_text_rendering_has_headings_rows_and_legend():
    out = draw.text(draw.layout_grid(Layout((2, 3), (3, 1))))
    lines = out.splitlines()
    assert lines[0] == "Layout (2,3):(3,1)"
    assert lines[1].split() == ["0", "1", "2"]
    assert lines[2].split() == ["0", "0", "1", "2"]
    assert lines[3].split() == ["1", "3", "4", "5"]
    assert lines[4].startswith("cell (i, j)")
    coloured = draw.text(draw.layout_grid(Layout((2, 3), (3, 1))), colour=True)
    assert "\x1b[48;2;" in coloured


# --------------------------------------------------------------------------- swizzles


def test_sw128_bank_map_is_the_xor_of_row_and_chunk():
    """SW128 on bytes: 16-byte chunk c of 128-byte row r lands at chunk c ^ r, banks 4 (c ^ r) .. +3."""
    g = draw.swizzle_grid(SW128)
    assert (g.rows, g.cols) == (8, 8)
    for r in range(8):
        for c in range(8):
            bank = 4 * (c ^ r)
            assert g.cells[r][c].label == str(bank)
            assert g.cells[r][c].fill == draw.bank_colour(bank)
    assert "conflict-free" in g.legend
    pos = _by_position(_cells(draw.svg(g)))
    assert len(pos) == 64
    for (r, c), rect in pos.items():
        assert rect.get("fill") == draw.bank_colour(4 * (c ^ r))


def test_element_swizzles_match_their_byte_modes():
    # Sw<3,3,3> on 2-byte elements is SW128; Sw<2,2,3> on 4-byte elements is SW64
    assert draw.swizzle_grid(Swizzle(3, 3, 3)).labels() == draw.swizzle_grid(SW128).labels()
    assert draw.swizzle_grid(Swizzle(2, 2, 3), elem_bytes=4).labels() == draw.swizzle_grid(SW64).labels()
    sw32 = draw.swizzle_grid(SW32)
    assert (sw32.rows, sw32.cols) == (2, 8)
    assert sw32.labels()[1] == [str(4 * (c ^ 1)) for c in range(8)]


def test_bank_colours_are_distinct_and_checked():
    colours = [draw.bank_colour(b) for b in range(32)]
    assert len(set(colours)) == 32
    with pytest.raises(FireschedError, match="bank"):
        draw.bank_colour(32)


def test_identity_swizzle_is_refused_with_the_fix():
    with pytest.raises(FireschedError, match="identity.*bits >= 1"):
        draw.swizzle_grid(Swizzle(0, 0, 0))


def test_bank_conflict_ways():
    rows = np.arange(8)[:, None]
    cols = np.arange(8)[None, :]
    assert draw.bank_conflict_ways(4 * (rows ^ cols)) == 1
    assert draw.bank_conflict_ways(np.broadcast_to(4 * cols, (8, 8))) == 8     # unswizzled 128-byte rows
    assert draw.bank_conflict_ways(4 * ((cols + 4 * (rows % 2)) % 8)) == 4      # 256-byte rows


def test_smem_grid_of_a_lowered_layout():
    """A 8x64 f16 tile with Sw<3,3,3>: one cell per 16-byte chunk, conflict-free; unswizzled: 8-way."""
    g = draw.smem_grid(SmemLayout(("m",), "k", 8, 64, 64, Swizzle(3, 3, 3)), 2, name="A")
    assert (g.rows, g.cols) == (8, 8)
    assert g.col_labels == tuple(str(8 * j) for j in range(8))
    assert g.labels() == [[str(4 * (c ^ r)) for c in range(8)] for r in range(8)]
    assert "conflict-free" in g.legend and "shared A 8x64" in g.title
    plain = draw.smem_grid(SmemLayout(("m",), "k", 8, 64, 64, None), 2, name="A")
    assert "8-way bank conflict" in plain.legend and "unswizzled" in plain.title


# --------------------------------------------------------------------------- TV layouts


def test_tv_grid_names_thread_and_value_of_every_element():
    g = draw.tv_grid(MMA_A)
    assert (g.rows, g.cols) == (16, 16)
    lab = g.labels()
    # the table in firesched/layout.py's comment
    assert lab[0][:4] == ["T0V0", "T0V1", "T1V0", "T1V1"]
    assert lab[8][0] == "T0V2" and lab[0][8] == "T0V4" and lab[15][15] == "T31V7"
    for t in range(32):
        for v in range(8):
            r, c = MMA_A.coord(t, v)
            assert lab[r][c] == f"T{t}V{v}"
            assert g.cells[r][c].fill == draw.palette_colour(t)


def test_tv_svg_has_one_labelled_cell_per_element():
    svg = draw.svg(draw.tv_grid(MMA_A))
    assert len(_cells(svg)) == 256
    labels = _labels(svg)
    assert len(labels) == 256 and len(set(labels)) == 256


def test_tv_grid_shows_replication_and_holes():
    # 2 threads holding the same 2 values of a 1x4 tile (thread stride 0): elements 2, 3 are held by none
    tv = TVLayout(Layout((2, 2), (0, 1)), (1, 4))
    g = draw.tv_grid(tv)
    assert g.labels() == [["T0V0+1", "T0V1+1", "", ""]]
    assert g.cells[0][2].fill is None
    assert "+n" in g.legend


def test_atom_grids_draw_every_register_operand():
    from firesched.hardware.atoms import catalog

    grids = draw.atom_grids(catalog.by_name("mma_m16n8k16_f16_f32"))
    assert sorted(g.title.split()[2] for g in grids) == ["a", "b", "c", "d"]
    a = next(g for g in grids if g.title.split()[2] == "a")
    assert a.labels() == draw.tv_grid(MMA_A).labels()


# --------------------------------------------------------------------------- notebooks, PNG, errors


@pytest.mark.parametrize("obj", [Layout((4, 8), (8, 1)), SW128, Swizzle(3, 3, 3), MMA_A,
                                 ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))])
def test_repr_svg_hooks_give_well_formed_svg(obj):
    svg = obj._repr_svg_()
    assert _cells(svg)


def test_repr_svg_declines_huge_pictures_and_the_identity():
    assert Layout(draw.MAX_REPR_CELLS + 1)._repr_svg_() is None
    assert Swizzle(0, 0, 0)._repr_svg_() is None


def test_several_grids_stack_in_one_svg():
    svg = draw.svg([draw.layout_grid(Layout((2, 2))), draw.swizzle_grid(SW128)])
    root = ET.fromstring(svg)
    groups = [g for g in root.iter(SVG + "g") if g.get("class") == "grid"]
    assert [(g.get("data-rows"), g.get("data-cols")) for g in groups] == [("2", "2"), ("8", "8")]
    assert len(_cells(svg)) == 4 + 64


def test_titles_and_labels_are_escaped():
    g = draw.Grid("a <b> & c", ((draw.Cell("<&>", "#ffffff"),),))
    root = ET.fromstring(draw.svg(g))
    assert [e.text for e in root.iter(SVG + "text") if e.get("class") == "label"] == ["<&>"]


def test_ragged_grids_are_refused():
    with pytest.raises(FireschedError, match="rows of different lengths"):
        draw.Grid("x", ((draw.Cell("a"),), (draw.Cell("b"), draw.Cell("c"))))


def test_png_needs_matplotlib(monkeypatch, tmp_path):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    with pytest.raises(FireschedError, match="pip install matplotlib"):
        draw.png(draw.swizzle_grid(SW128), tmp_path / "x.png")


def test_png_is_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sw.png"
    draw.png([draw.swizzle_grid(SW128), draw.tv_grid(MMA_A)], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
