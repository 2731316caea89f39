"""A cluster's split reduction combined by pushes (``to_blocks(cluster=C, exchange="push")``):
each block ``st.async``-stores its part into every block's shared memory, completing bytes on the
receiver's mbarrier, instead of meeting the others at a ``barrier.cluster``.

The atom's microkernel; the row recipes with ``exchange="push"`` against numpy (and bitwise against
the barrier exchange) on odd and large-magnitude rows split over 2, 4 and 8 blocks; planted
protocol errors the interpreter finds; the strategy's refusals; NVRTC compiles every cluster plan
without spills and with one ``barrier.cluster`` (the mbarriers' initialisation)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm90a
from firesched.ir.rewrite import replace_leaves
from firesched.simulate.interp import run_program
from firesched.strategies import done, part, place, tile, to_blocks, to_threads
from firesched.testing import microkernel as mk

RNG = np.random.default_rng(23)


# --------------------------------------------------------------------------- the atom

@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_each_block_receives_the_previous_blocks_row(cluster):
    prog, inputs, expected = mk.push_program(cluster=cluster)
    np.testing.assert_array_equal(run_program(prog, dict(inputs))["out"], expected(inputs))


def test_a_read_before_the_wait_is_a_hazard():
    prog, inputs, _ = mk.push_program(wait=False)
    with pytest.raises(HazardError, match="read before mbarrier phase completes"):
        run_program(prog, dict(inputs))


def test_the_atom_prints_mapa_and_st_async():
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32" in sm90a.st_async_cluster_4.ptx
    assert sm90a.st_async_cluster_4.ptx.count("mapa.shared::cluster") == 2
    assert ".acquire.cluster" in sm90a.mbarrier_try_wait_cluster.ptx


# --------------------------------------------------------------------------- row kernels

def _recipe(kind, R, C, dt="f32", **kw):
    if kind == "softmax":
        return fs.recipes.softmax(R, C, dtype=dt, arch="sm_90a", **kw)
    if kind == "layernorm":
        kw["bias"] = False
    return getattr(fs.recipes, kind)(R, C, dtype=dt, arch="sm_90a", weight=False, **kw)


def _on_cluster(kind, R, C, parts, exchange, span=256):
    spec = _recipe(kind, R, C).spec
    row = (tile(c=span), tile(c=8) >> to_threads(), done())
    return spec.schedule(tile(r=1, c=-(-C // parts)) >> to_blocks(cluster=parts, exchange=exchange),
                         *(place(t.name, fs.RF) for t in spec.locals), *(part(i, *row) for i in range(len(spec.body))))


def _ref(kind, x):
    if kind == "softmax":
        z = np.exp(x - x.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)
    if kind == "layernorm":
        mu = x.mean(1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    return x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)


@pytest.mark.parametrize("parts", [2, 4, 8])
@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_pushes_equal_the_barrier_exchange_bitwise(kind, parts):
    # an odd row: the last block's part is partial; a large negative mean
    R, C = 3, 4001
    x = (RNG.standard_normal((R, C)) * 3 - 3000.0).astype(np.float32)
    got = fs.interpret(_on_cluster(kind, R, C, parts, "push"), x, target="sm_90a")
    np.testing.assert_array_equal(got, fs.interpret(_on_cluster(kind, R, C, parts, "barrier"), x, target="sm_90a"))
    x64 = x.astype(np.float64)
    cond = np.max(np.abs(x64.mean(1)) / x64.std(1)) if kind == "layernorm" else 0.0
    assert np.abs(got - _ref(kind, x64)).max() <= 2e-5 * max(1.0, np.abs(_ref(kind, x64)).max()) + 8 * cond * 2.0 ** -24


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm", "add_rmsnorm"])
def test_recipes_with_pushes_equal_their_spec(kind):
    # (RMSNorm's and add + RMSNorm's rows of 50,000 wait on one block: rows.STAGED_BLOCK_VALUES)
    cols = 100000 if kind in fs.recipes.rows.STAGED_BLOCK_VALUES else 50000
    sched = getattr(fs.recipes, kind)(2, cols, arch="sm_90a", exchange="push")
    assert "exchange='push'" in repr(sched.strategies[0])
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_causal_softmax_with_pushes():
    R, C = 3, 40001
    x = (RNG.standard_normal((R, C)) + 3000.0).astype(np.float32)
    got = fs.interpret(fs.recipes.softmax(R, C, dtype="f32", arch="sm_90a", causal=True, exchange="push"), x,
                       target="sm_90a")
    r, c = np.indices(x.shape)
    z = np.where(c > r, -np.inf, x.astype(np.float64))
    z = np.exp(z - z.max(1, keepdims=True))
    assert np.abs(got - z / z.sum(1, keepdims=True)).max() < 1e-6


# --------------------------------------------------------------------------- planted protocol errors



def _drop(atom):
    return lambda s: None if isinstance(s, ir.AtomCall) and s.atom is atom else s


def _fewer_bytes(s):
    if isinstance(s, ir.AtomCall) and s.atom is sm90a.mbarrier_arrive_expect_tx:
        return attrs.evolve(s, args=tuple((n, ir.Scalar(v.value - 4) if n == "bytes" else v) for n, v in s.args))
    return s


def _more_bytes(s):
    if isinstance(s, ir.AtomCall) and s.atom is sm90a.mbarrier_arrive_expect_tx:
        return attrs.evolve(s, args=tuple((n, ir.Scalar(v.value + 4) if n == "bytes" else v) for n, v in s.args))
    return s


PLANTED = [
    pytest.param(_drop(sm90a.mbarrier_try_wait_cluster), "read before mbarrier phase completes", id="no-wait"),
    pytest.param(_drop(sm90a.barrier_cluster), "before mbarrier.init|init is not visible", id="no-init-barrier"),
    pytest.param(_fewer_bytes, "arrives on phase|before mbarrier phase completes|transaction",
                 id="expects-too-few-bytes"),
    pytest.param(_more_bytes, "can never complete|deadlock", id="expects-too-many-bytes"),
]


@pytest.mark.parametrize("fn, words", PLANTED)
def test_planted_protocol_errors_are_found(fn, words):
    R, C = 2, 4000
    prog = _on_cluster("layernorm", R, C, 4, "push").lower("sm_90a")
    (k,) = prog.kernels
    x = RNG.standard_normal((R, C)).astype(np.float32)
    run_program(prog, {"X": x})                     # the unplanted kernel runs clean
    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=replace_leaves(k.body, fn)),))
    with pytest.raises(HazardError, match=words):
        run_program(bad, {"X": x})


# --------------------------------------------------------------------------- refusals

def test_push_needs_a_reduction_split_over_a_cluster():
    spec = _recipe("rmsnorm", 4, 512).spec
    with pytest.raises(ScheduleError, match="exchange") as e:
        spec.schedule(tile(r=1) >> to_blocks(exchange="push"))
    assert "cluster > 1" in str(e.value)
    with pytest.raises(ScheduleError, match="exchange"):
        spec.schedule(tile(r=1, c=256) >> to_blocks(cluster=2, exchange="pull"))
    with pytest.raises(ScheduleError, match="not persistent"):
        spec.schedule(tile(r=1, c=256) >> to_blocks(cluster=2, exchange="push", persistent=True))
    with pytest.raises(ValueError, match="exchange='pull'; allowed: 'barrier'"):
        fs.recipes.softmax(2, 65536, arch="sm_90a", exchange="pull")


# --------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("cols", [65536, 131072, 262144])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_push_plans_compile_without_spills(kind, cols):
    for dt in ("f16", "bf16"):
        if kind == "causal":
            sched = fs.recipes.softmax(1024, cols, dtype=dt, arch="sm_90a", causal=True, exchange="push")
        else:
            sched = getattr(fs.recipes, kind)(1024, cols, dtype=dt, arch="sm_90a", exchange="push")
        k = fs.compile(sched, arch="sm_90a")
        assert k.spills == 0, (kind, cols, dt, k.resources)
        if kind in fs.recipes.rows.STAGED_BLOCK_VALUES and cols == 65536:
            # (on one block: rows.STAGED_BLOCK_VALUES)
            assert "st.async" not in k.source and "__cluster_dims__" not in k.source
            continue
        # the one barrier.cluster makes the mbarriers' init visible; none per exchange, none at the end
        assert k.source.count("barrier.cluster.arrive") == 1 and "st.async" in k.source
