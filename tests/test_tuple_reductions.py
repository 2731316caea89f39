"""Tuple reductions (``firesched.monoids``): a ``Reduce`` whose combine is a monoid over several
values, reduced in one exchange per level — lanes, warps, and the blocks of a cluster.

The monoids' programs against their numpy meaning (any split, empty parts, masked parts); the
spec's refusals; hand-written and recipe schedules (softmax's ``(max, sum)``, LayerNorm's Welford
tuple) interpreted against numpy formulas written here on small, odd and large-magnitude rows split
over clusters of 2, 4 and 8 blocks (hypothesis over shapes and cluster sizes); one
``barrier.cluster`` per row; a planted missing barrier; NVRTC compiles every cluster plan without
spills."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir, monoids, ops
from firesched.cuda import printer
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm90a
from firesched.ir.rewrite import replace_leaves
from firesched.simulate.interp import run_program
from firesched.spec import Reduce
from firesched.strategies import done, part, place, tile, to_blocks, to_threads, to_warps
from firesched.tensor import GL, KERNEL, RF, Tensor, Tile

RNG = np.random.default_rng(11)


# --------------------------------------------------------------------------- the monoids' programs

def _fold(m, xs):
    """One thread's tuple of the elements ``xs`` (the passes of ``fold_elements``), in numpy."""
    env = {f"b{j}": np.float64(v) for j, v in enumerate(m.identity)}
    for steps, between in zip(m.passes, m.between):
        for x in xs:
            env = monoids.run(steps, {**env, "x": np.float64(x)})
        env = monoids.run(between, env)
    return [env[f"b{j}"] for j in range(m.k)]


def _combine(m, a, b):
    env = {**{f"a{j}": v for j, v in enumerate(a)}, **{f"b{j}": v for j, v in enumerate(b)}}
    env = monoids.run(m.combine, env)
    return [env[f"a{j}"] for j in range(m.k)]


def _outputs(m, a):
    return [monoids.run(f, {f"a{j}": v for j, v in enumerate(a)})["y"] for f in m.finish]


def _reduce_in_parts(m, x, cuts):
    """``x`` folded part by part (cut at ``cuts``), the parts combined left to right onto the
    identity, as the lowering does at every level."""
    acc = list(m.identity)
    for p in np.split(x, cuts):
        acc = _combine(m, acc, _fold(m, p))
    return _outputs(m, acc)


@pytest.mark.parametrize("m", [monoids.softmax_stats(), monoids.softmax_stats(0.125), monoids.welford()],
                         ids=str)
@pytest.mark.parametrize("shift", [0.0, 3000.0, -3000.0])
def test_any_split_gives_the_reference(m, shift):
    x = RNG.standard_normal(37) * 3 + shift
    want = m.reference(x, 0)
    for cuts in ([], [1], [5, 5, 20], [0, 36], list(range(1, 37))):      # empty parts included
        got = _reduce_in_parts(m, x, cuts)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * max(1.0, abs(shift)))


def test_fully_masked_parts_give_no_nan():
    m = monoids.softmax_stats()
    x = np.array([-np.inf, -np.inf, 2.0, -np.inf, 1.0])
    got = _reduce_in_parts(m, x, [2, 3])        # the first part only masked elements
    assert got[0] == 2.0 and np.isclose(got[1], 1 + np.exp(-1.0))
    empty = _reduce_in_parts(m, np.array([-np.inf, -np.inf]), [1])
    assert empty[0] == -np.inf and empty[1] == 0.0


def test_welford_counts_only_the_elements_present():
    m = monoids.welford()
    x = np.array([3000.0, 3001.0, 3003.0])
    mean, var = _reduce_in_parts(m, x, [1, 1, 1])      # empty parts between
    assert np.isclose(mean, x.mean()) and np.isclose(var, x.var())


def test_a_program_reading_an_unwritten_value_is_refused():
    with pytest.raises(ValueError, match="reads 't5' before it is written"):
        attrs.evolve(monoids.welford(), combine=(monoids.Step("add", "a0", ("a0", "t5")),))
    with pytest.raises(ValueError, match="names op 'exp' with 2 args"):
        attrs.evolve(monoids.welford(), combine=(monoids.Step("exp", "a0", ("a0", "b0")),))
    with pytest.raises(ValueError, match="positive number"):
        monoids.softmax_stats(0.0)


def test_a_count_component_must_be_one_of_the_tuples():
    assert monoids.welford().count == 0 and monoids.softmax_stats().count is None
    with pytest.raises(ValueError, match="count=3; allowed: None or a component index 0..2"):
        attrs.evolve(monoids.welford(), count=3)


# --------------------------------------------------------------------------- the spec

def _t(name, dims, shape, dt="f32", mem=GL):
    return Tile(Tensor(name, dt, mem, dims, shape, dims[-1]), shape)


def _stats_spec(R, C, m=None, dt="f16"):
    """Mean and variance of each row as one kernel-level tuple reduction, written by hand."""
    x = _t("X", ("r", "c"), (R, C), dt)
    return Reduce(m or monoids.welford(), x, _t("Mean", ("r",), (R,)), ("c",), KERNEL,
                  more=(_t("Var", ("r",), (R,)),))


def test_the_spec_names_its_outputs_and_refuses_wrong_ones():
    sp = _stats_spec(3, 100)
    assert [t.name for t in sp.outputs] == ["Mean", "Var"] and [t.name for t in sp.inputs] == ["X"]
    assert "welford over c" in str(sp) and "Var" in str(sp)
    x, mean = sp.src, sp.dst
    with pytest.raises(ValueError, match="2 outputs: dst and more= with 1 tiles"):
        Reduce(monoids.welford(), x, mean, ("c",), KERNEL)
    with pytest.raises(ValueError, match="must have dst's dims"):
        Reduce(monoids.welford(), x, mean, ("c",), KERNEL, more=(_t("V", ("c",), (100,)),))
    with pytest.raises(ValueError, match="more= holds the further outputs of a monoid"):
        Reduce("sum", x, mean, ("c",), KERNEL, more=(_t("V", ("r",), (3,)),))
    with pytest.raises(ValueError, match="allowed: sum, max, min, mean or a firesched.monoids.Monoid"):
        Reduce(object(), x, mean, ("c",), KERNEL)
    with pytest.raises(ValueError, match="acc=f16; allowed: f32"):
        Reduce(monoids.welford(), x, mean, ("c",), KERNEL, acc="f16", more=(_t("V", ("r",), (3,)),))


BLOCK_CHAIN = (tile(c=256), tile(c=8) >> to_threads(), done())


@pytest.mark.parametrize("R, C", [(1, 1), (3, 100), (5, 1001), (2, 4096)])
def test_a_hand_written_tuple_reduction_matches_numpy(R, C):
    sp = _stats_spec(R, C)
    x = RNG.standard_normal((R, C)) * 3 + 3000.0
    xr = x.astype(np.float16).astype(np.float64)
    for sched in (sp.schedule(tile(r=1) >> to_blocks(), *BLOCK_CHAIN),
                  sp.schedule(tile(r=4) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=64),
                              tile(r=1, c=2) >> to_threads(), done())):
        mean, var = fs.interpret(sched, x, target="sm_90a")
        np.testing.assert_allclose(mean, xr.mean(1), rtol=1e-6)
        np.testing.assert_allclose(var, xr.var(1), rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("C, parts", [(1000, 4), (96, 2), (3001, 8), (23, 8)])
def test_a_hand_written_tuple_reduction_split_over_a_cluster(C, parts):
    sp = _stats_spec(3, C)
    width = -(-C // parts)
    sched = sp.schedule(tile(r=1, c=width) >> to_blocks(cluster=parts), *BLOCK_CHAIN)
    assert len(sched.lower("sm_90a").kernels) == 1
    x = RNG.standard_normal((3, C)) - 3000.0
    xr = x.astype(np.float16).astype(np.float64)
    mean, var = fs.interpret(sched, x, target="sm_90a")
    np.testing.assert_allclose(mean, xr.mean(1), rtol=1e-6)
    np.testing.assert_allclose(var, xr.var(1), rtol=5e-3)


def test_a_tuple_reduction_over_blocks_needs_a_cluster():
    with pytest.raises(ScheduleError, match="to_blocks\\(cluster=4\\)"):
        _stats_spec(3, 1000).schedule(tile(r=1, c=250) >> to_blocks())


# --------------------------------------------------------------------------- the row recipes

def softmax_ref(x, scale=1.0, causal=False, diagonal=0):
    z = scale * x
    if causal:
        r, c = np.indices(z.shape)
        z = np.where(c > r + diagonal, -np.inf, z)
    z = np.exp(z - z.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def ln_ref(x, eps=1e-5):
    mu = x.mean(1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + eps)


def rms_ref(x, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)


REFS = {"softmax": softmax_ref, "layernorm": ln_ref, "rmsnorm": rms_ref}


def _recipe(kind, R, C, dt, **kw):
    """The recipe with its statistics in one tuple reduction whatever the plan (by default only
    rows split over a cluster take it)."""
    if kind in ("softmax", "layernorm"):
        kw.setdefault("tuple_stats", True)
    if kind == "softmax":
        return fs.recipes.softmax(R, C, dtype=dt, arch="sm_90a", **kw)
    if kind == "layernorm":
        kw["bias"] = False
    return getattr(fs.recipes, kind)(R, C, dtype=dt, arch="sm_90a", weight=False, **kw)


def _on_cluster(sched, C, parts, span=1024, vec=8, exchange="barrier"):
    """The recipe's spec, its row split into ``parts`` blocks of a cluster (by hand)."""
    spec = sched.spec
    width = -(-C // parts)
    row = (tile(c=span), tile(c=vec) >> to_threads(), done())
    return spec.schedule(tile(r=1, c=width) >> to_blocks(cluster=parts, exchange=exchange),
                         *(place(t.name, RF) for t in spec.locals),
                         *(part(i, *row) for i, sp in enumerate(spec.body) if "c" in sp.dims))


def _close(got, want, dt, x=None):
    """Within the output type's rounding; a normalised row of a large mean is also off by its f32
    rounding of the mean, |mean| / std ulps of the output (``x``: the rows, for LayerNorm)."""
    tol = {"f16": 4e-3, "bf16": 3.2e-2, "f32": 2e-5}[dt]
    assert np.isfinite(got).all()
    err = np.abs(np.asarray(got, np.float64) - want).max(initial=0.0)
    cond = 0.0 if x is None else float(np.max(np.abs(x.mean(1)) / np.maximum(x.std(1), 1e-5 ** 0.5)))
    assert err <= tol * max(1.0, np.abs(want).max(initial=0.0)) + 8 * cond * 2.0 ** -24, err


@pytest.mark.parametrize("parts", [2, 4, 8])
@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("shift", [3000.0, -3000.0])
def test_odd_rows_over_clusters_of_2_4_8(kind, parts, shift):
    # 12,001 columns: the last block's part reaches past the row, whose padded elements no
    # statistic may count (a maximum of -3000 rows is below the zeros of padding registers)
    R, C = 2, 12001
    x = (RNG.standard_normal((R, C)) * 3 + shift).astype(np.float32)
    sched = _on_cluster(_recipe(kind, R, C, "f32"), C, parts, span=2048)
    x64 = x.astype(np.float64)
    _close(fs.interpret(sched, x, target="sm_90a"), REFS[kind](x64), "f32", x64 if kind == "layernorm" else None)


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
@pytest.mark.parametrize("R, C", [(3, 1), (2, 1), (3, 40001), (2, 65536), (1, 100003)])
def test_recipes_on_large_magnitudes(kind, R, C):
    x = RNG.standard_normal((R, C)) * 3 + 3000.0
    for sign in (1.0, -1.0):
        xs = (sign * x).astype(np.float32)
        x64 = xs.astype(np.float64)
        _close(fs.interpret(_recipe(kind, R, C, "f32"), xs, target="sm_90a"), REFS[kind](x64), "f32",
               x64 if kind == "layernorm" else None)


def test_causal_softmax_on_a_cluster_with_masked_parts():
    # diagonal 0 over 3 rows: every block but the first holds only masked elements of each row
    R, C = 3, 40001
    x = (RNG.standard_normal((R, C)) - 3000.0).astype(np.float32)
    got = fs.interpret(fs.recipes.softmax(R, C, dtype="f32", arch="sm_90a", causal=True, scale=0.5), x,
                       target="sm_90a")
    _close(got, softmax_ref(x.astype(np.float64), 0.5, causal=True), "f32")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 3), width=st.integers(1, 300), parts=st.sampled_from([2, 4, 8]),
       dt=st.sampled_from(["f16", "bf16", "f32"]), kind=st.sampled_from(["softmax", "layernorm", "rmsnorm"]),
       shift=st.sampled_from([0.0, 3000.0, -3000.0]), exchange=st.sampled_from(["barrier", "push"]),
       data=st.data())
def test_random_rows_over_random_clusters(R, width, parts, dt, kind, shift, exchange, data):
    # C such that a width-wide tile makes exactly ``parts`` block parts, the last one partial
    C = width * (parts - 1) + data.draw(st.integers(1, width), label="last")
    if dt == "f16" and kind == "rmsnorm" and shift:
        shift = shift / 100                 # squares past the f16 range are rmsnorm's own test
    x = RNG.standard_normal((R, C)) * 3 + shift
    xr = x.astype(fs.dtypes.dtype(dt).np).astype(np.float64)
    sched = _on_cluster(_recipe(kind, R, C, dt), C, parts, span=256, exchange=exchange)
    _close(fs.interpret(sched, x, target="sm_90a"), REFS[kind](xr), dt, xr if kind == "layernorm" else None)


# --------------------------------------------------------------------------- one exchange per row

def _count(src, text):
    return src.count(text)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_a_cluster_row_costs_one_exchange(kind):
    # one barrier.cluster per exchange, plus the one that keeps every block until the others read
    prog = _recipe(kind, 4096, 131072, "bf16", exchange="barrier").lower("sm_90a")
    (k,) = prog.kernels
    src = printer.emit(prog)
    assert _count(src, "barrier.cluster.arrive") == 2, kind
    # the staged row part is filled (cp.async), and the warps' partial results, once each
    assert _count(src, "__syncthreads()") == 2, kind




def test_a_missing_exchange_barrier_is_a_race():
    R, C = 2, 4000
    sched = _on_cluster(_recipe("layernorm", R, C, "f32"), C, 4, span=256)
    prog = sched.lower("sm_90a")
    (k,) = prog.kernels
    x = RNG.standard_normal((R, C)).astype(np.float32)
    run_program(prog, {"X": x})                  # the unplanted kernel runs clean

    def drop(s):
        hit = isinstance(s, ir.AtomCall) and s.atom is sm90a.barrier_cluster and "is in its shared memory" in s.comment
        return None if hit else s

    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=replace_leaves(k.body, drop)),))
    with pytest.raises(HazardError, match="race"):
        run_program(bad, {"X": x})


# --------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("cols", [65536, 131072, 262144])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_cluster_plans_compile_without_spills(kind, cols):
    for dt in ("f16", "bf16"):
        if kind == "causal":
            sched = fs.recipes.softmax(1024, cols, dtype=dt, arch="sm_90a", causal=True)
        else:
            sched = getattr(fs.recipes, kind)(1024, cols, dtype=dt, arch="sm_90a")
        k = fs.compile(sched, arch="sm_90a")
        # (RMSNorm's and add + RMSNorm's rows of 65,536 wait on one block: rows.STAGED_BLOCK_VALUES)
        one_block = kind in fs.recipes.rows.STAGED_BLOCK_VALUES and cols == 65536
        assert ("__cluster_dims__" in k.source) != one_block and k.spills == 0, (kind, cols, dt, k.resources)


def test_softmax_statistics_merge_in_the_exchange():
    src = fs.compile(fs.recipes.softmax(1024, 65536, dtype="bf16", arch="sm_90a", exchange="barrier"),
                     arch="sm_90a").source
    # the two statistics of each of the cluster's blocks (4 for 65,536 columns)
    blocks = fs.recipes.rows.row_plan(1024, 65536, "bf16", clusters=True, stage=True).cluster
    assert "__int_as_float(0xff800000)" in src and src.count("ld.shared::cluster") == 2 * blocks == 8


def test_ops_reach_each_output():
    # Z holds 1 / sum (the reciprocal on the second output only), M the maximum itself
    spec = fs.recipes.softmax(2, 8, dtype="f32", tuple_stats=True).spec
    red = spec.body[1]
    assert red.monoid is not None and red.output_ops()[1][1] == (ops.reciprocal(),) and red.ops == ()
    # by default only a row split over a cluster takes the tuple; one block reduces twice
    assert [type(p).__name__ for p in fs.recipes.softmax(2, 8, dtype="f32").spec.body] == \
        ["Move", "Reduce", "Pointwise", "Reduce", "Pointwise"]
    assert fs.recipes.softmax(4, 65536, dtype="bf16", arch="sm_90a").spec.body[1].monoid is not None
    with pytest.raises(ValueError, match="tuple_stats"):
        fs.recipes.layernorm(2, 8, tuple_stats=1)


@pytest.mark.parametrize("cols", [4096, 32768, 40000, 40960])
@pytest.mark.parametrize("kind", ["layernorm", "softmax"])
def test_one_block_plans_compile_without_spills(kind, cols):
    # 1,024 threads x 40 values at the top: the warps' tuples merge in a butterfly over lanes
    # (log2(32) combines, not 31 in a row), which also keeps the register budget
    for dt in ("f16", "bf16"):
        for one in (None, True) if cols == 40960 else (None,):
            k = fs.compile(getattr(fs.recipes, kind)(4096, cols, dtype=dt, arch="sm_90a", tuple_stats=one),
                           arch="sm_90a")
            assert "__cluster_dims__" not in k.source and k.spills == 0, (kind, cols, dt, one, k.resources)


# --------------------------------------------------------------------------- even counts

@pytest.mark.parametrize("C, even", [(4096, True), (4095, False)])
def test_an_even_row_does_not_exchange_its_count(C, even):
    # every thread folds as many elements of a row of 4,096 (no element skipped): Welford's
    # count is the same in every part, so the lanes and warps move only (mean, M2), and the
    # divisions by the counts fold into constants — the means' and the variance's IEEE divisions
    # (the merges' approximate ones, div.approx, stay: ptxas's to fold); an odd row's edge
    # threads count fewer: IEEE divisions at run time
    sched = fs.recipes.layernorm(8, C, dtype="bf16", arch="sm_90a", tuple_stats=True)
    k = fs.compile(sched, arch="sm_90a", use_cache=False)
    warps = k.program.kernels[0].threads // 32
    levels = 5 + warps.bit_length() - 1        # lanes of a warp, then the warps' tuples over lanes
    assert k.source.count("shfl.sync.bfly") == levels * (2 if even else 3)
    assert ("div.rn.f32" in k.ptx or "div.full.f32" in k.ptx) != even
    assert "__fdividef" in k.source


@pytest.mark.parametrize("stats", [True, False])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_even_counts_where_the_warps_fold_in_a_row(stats, dt):
    # with the statistics stored (stats=True) one thread folds the 8 warps' tuples one after
    # another, each of one warp's count (not of everything folded so far); rows constant within
    # each thread and varying across lanes and warps put all of the variance in the merges
    C = 4096
    x = ((np.arange(C) // 8) % 64).astype(np.float32)[None].repeat(3, 0) * np.array([[1.0], [-2.0], [0.5]],
                                                                                    np.float32)
    x = (x + 3000.0 * (dt == "f32")).astype(np.float32)
    sched = fs.recipes.layernorm(3, C, dtype=dt, arch="sm_90a", bias=False, weight=False, stats=stats,
                                 tuple_stats=True)
    xr = x.astype(fs.dtypes.dtype(dt).np).astype(np.float64)
    out = fs.interpret(sched, xr.astype(fs.dtypes.dtype(dt).np), target="sm_90a")
    y = out[0] if stats else out
    _close(y, REFS["layernorm"](xr), dt, xr)
    if stats:
        assert np.allclose(out[1], xr.mean(1), rtol=1e-6)
        assert np.allclose(out[2], 1 / np.sqrt(xr.var(1) + 1e-5), rtol=1e-5)
