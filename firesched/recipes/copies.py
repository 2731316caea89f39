"""Memory-bound stock schedules: a transpose through shared memory and an element-wise cast.

Both are ``Move`` specs refined by the usual strategies (no rule knows these recipes); the
parameters come from ``transpose_params`` and ``cast_params``, small functions of the shape, the
dtypes and the target that say why they choose what they choose.  A caller may override them.
"""

from __future__ import annotations

from ..dtypes import dtype as get_dtype
from ..errors import ScheduleError
from ..hardware.target import target as get_target
from ..hardware.target import target_names
from ..layout import Swizzle
from ..schedule import Schedule
from ..spec import Move
from ..strategies import done, move_to_smem, pipeline, tile, to_blocks, to_threads

VECTOR_BYTES = 16            # the widest global access (ld/st.global.v4, cp.async 16)
LINE_BYTES = 128             # one shared-memory line: 32 banks of 4 bytes
MAX_THREAD_ELEMENTS = 64     # what an element-wise leaf may hold per thread (done() refuses more)
# the transpose's block: eight warps, 32 KB of f16 in flight.  Measured on an H100 (bench/membound.py
# --graph, f16 and bf16, 8192 x 8192 to 32768 x 4096): 2.73-2.80 TB/s against 2.68-2.74 with 128
# threads (16 KB tiles) and 2.67-2.74 with 64
BLOCK_THREADS = 256
# above this many bytes moved the transpose goes through shared memory on LARGE_BLOCK_THREADS-thread
# blocks, LARGE_OCCUPANCY an SM; up to it straight through registers (transpose_params says why)
UNSTAGED_BYTES = 64 << 20
LARGE_BLOCK_THREADS = 128
LARGE_OCCUPANCY = 8
CAST_THREADS = 256           # the cast's block
GRID_Y_LIMIT = 65535         # gridDim.y (and z); grid x takes 2**31 - 1


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _whole_bytes(name: str, what: str) -> int:
    try:
        dt = get_dtype(name)
    except ValueError as e:
        raise ScheduleError(str(e), field=what, value=name) from None
    if dt.bits % 8:
        raise ScheduleError(f"{what}: element-wise copies move whole bytes; {dt} is packed", field=what,
                            value=name, allowed="f32, f16, bf16, f8e4m3, f8e5m2, i8, u8, i32")
    return dt.bits // 8


def _sms(arch: str) -> int:
    try:
        return get_target(arch).sm_count
    except ValueError as e:
        raise ScheduleError(str(e), field="arch", value=arch, allowed=target_names(),
                            fix="pass arch='sm_80' (or another target above), or None for the GPU present") from None


# --------------------------------------------------------------------------- transpose

#: what ``transpose(params=)`` may set
TRANSPOSE_PARAMS = ("block_r", "block_c", "thread_r", "thread_c", "swizzle", "persistent", "occupancy", "stages",
                    "staged")


def transpose_params(rows: int, cols: int, dtype: str = "f16", sms: int = 132) -> dict:
    """The transpose's tiles for ``rows x cols`` elements of ``dtype`` on ``sms`` SMs.

    * ``thread_r = thread_c = v`` with ``v = 16 B / element`` (8 for f16, 4 for f32): a thread
      reads ``v`` rows of ``v`` contiguous elements from shared memory (``ld.shared.v4``) and
      writes ``v`` columns of ``v`` elements, each contiguous in the transposed output
      (``st.global.v4``), so both sides move 16 bytes per access.  One-byte types are capped at
      8 x 8 (the 64 elements a thread's leaf may hold): 8-byte accesses on both sides.
    * ``block_c = 128 B / element`` (64 f16): each shared row is one 128-byte line; the ``block_c
      / v = 8`` threads along it read its 8 distinct 16-byte chunks, which is what a quarter warp
      of 16-byte loads (or the 8 lanes of one cp.async quarter) must touch to be free of bank
      conflicts (``tests/test_recipes_copies.py`` evaluates the addresses).  The automatic
      swizzle (``Sw<3,3,3>`` for f16: chunk ``c`` of row ``r`` at ``c ^ r % 8``) permutes chunks
      within a line, so it keeps that property, and it also spreads a quarter warp that walks down
      8 rows of one chunk column (another thread arrangement, through ``params``) over 8 banks.
    * ``block_r`` for ``BLOCK_THREADS = 256`` threads (256 rows of f16: a 32 KB tile, 512-byte
      runs of the output per column); halved (down to 32 threads) while the grid has fewer blocks
      than SMs, so small problems still spread over the chip.
    * Both are clamped to the problem for tiny shapes (a 1 x 7 transpose takes one 8 x 8 tile).
    * Up to ``UNSTAGED_BYTES`` moved (64 MiB), where rows and cols are whole vectors, no shared
      memory (``staged=False``): each thread loads its ``v`` rows straight from global memory
      (``ld.global.v4``, a warp's load covering four whole 128-byte lines) and stores its ``v``
      columns from registers — the same accesses as through shared memory without the copy's
      wait and barrier, which at these sizes are a large part of a block's short life.
    * Above it, ``LARGE_BLOCK_THREADS = 128`` threads a block (16 KB f16 tiles), ``LARGE_OCCUPANCY
      = 8`` blocks an SM: the copies of more, smaller tiles in flight at once.

    Both for elements of 2 bytes or more.  Measured on an H200 (``bench/membound.py``, bench/README.md,
    "The transpose through registers up to 64 MiB"): f16 through registers 3.49 against 3.25 TB/s at
    4096 x 4096 and 3.60 against 3.40 at 32768 x 256, but 3.64 against 3.71 at 8192 x 8192;
    128-thread blocks eight an SM 3.78 – 3.85 against 3.71 – 3.78 from 256 MiB; the rule against
    the plans before, time 0.909 – 0.995 over 14 shapes (f16, bf16) and 0.905 – 0.994 over 7 (f32).
    Persistent blocks copying their next tile while they store one measured slower at every size
    (3.2 – 3.5 TB/s).
    """
    eb = _whole_bytes(dtype, "dtype")
    v = VECTOR_BYTES // eb
    while v * v > MAX_THREAD_ELEMENTS:
        v //= 2
    # one-byte elements (8-byte accesses) keep 256-thread blocks through shared memory at every size:
    # both rules below measured slower for them (f8e4m3 4096 x 4096 1.86 -> 1.42 TB/s unstaged)
    wide = eb >= 2
    large = wide and 2 * rows * cols * eb > UNSTAGED_BYTES
    staged = not wide or large or rows % v != 0 or cols % v != 0
    block_c = LINE_BYTES // eb
    block_r = (LARGE_BLOCK_THREADS if large else BLOCK_THREADS) * v * v // block_c
    while block_r > 4 * v and -(-rows // block_r) * -(-cols // block_c) < sms:
        block_r //= 2
    block_r = min(block_r, max(v, _pow2_at_least(rows)))
    block_c = min(block_c, max(v, _pow2_at_least(cols)))
    return dict(block_r=block_r, block_c=block_c, thread_r=v, thread_c=v, swizzle=None, persistent=False,
                occupancy=LARGE_OCCUPANCY if large else 1, stages=1, staged=staged)


def transpose(rows: int, cols: int, dtype: str = "f16", arch: str | None = None, *, params: dict | None = None,
              check: bool = True) -> Schedule:
    """``Y = X`` with X ``rows x cols`` stored row-major and Y stored column-major: as arrays,
    ``Y[c, r] = X[r, c]`` (torch: ``x.t().contiguous()``).  Kernels take ``k(X, Y)`` with X of
    shape ``(rows, cols)`` and Y the logical ``(rows, cols)`` view of a ``(cols, rows)`` array
    (``y.t()`` in torch).  ``params`` overrides ``transpose_params`` (``block_r``, ``block_c``,
    ``thread_r``, ``thread_c``, ``swizzle``, ``persistent``, ``occupancy``, ``stages``,
    ``staged``): ``staged=False`` leaves out the shared-memory copy; with ``persistent=True`` a
    grid of ``occupancy`` blocks an SM walks the tiles (``to_blocks(persistent=True,
    occupancy=)``), and ``stages=2`` or more then copies a block's next tiles into shared memory
    while it stores the current one (``pipeline(stages=)``; 16-byte-aligned rows only).

    The schedule for 8192 x 8192 f16 on sm_90a::

        Move<kernel>(X:GL f16[8192x8192] -> Y:GL f16[8192x8192])
          tile(r=128, c=64) >> to_blocks(occupancy=8)
          for r0 in block(64) occupancy(8), c0 in block(128) occupancy(8):
            Move<block>(X:GL f16[128x64] -> Y:GL f16[128x64])
              move_to_smem('X')
              Move<block>(X:GL f16[128x64] -> X:SH f16[128x64] Sw<3,3,3>)
              Move<block>(X:SH f16[128x64] Sw<3,3,3> -> Y:GL f16[128x64])
                tile(r=8, c=8) >> to_threads()
                for r1 in thread(16), c1 in thread(8):
                  Move<thread>(X:SH f16[8x8] Sw<3,3,3> -> Y:GL f16[8x8])
                    done()

    * ``tile(...) >> to_blocks(occupancy=8)``: one block per 128 x 64 tile, eight blocks an SM
      (``transpose_params`` says why).
    * ``move_to_smem('X')``: the block copies its tile of X row by row into shared memory with
      16-byte ``cp.async`` (8 threads per 128-byte row, so reads of X are whole lines), then waits
      and synchronises.  X is read once, so the copy is not pipelined: the eight blocks resident
      per SM (16 KB of shared memory each) keep enough loads in flight.
    * ``tile(r=8, c=8) >> to_threads()``, ``done()``: each thread reads its 8 x 8 sub-tile as
      8 ``ld.shared.v4`` (along c, conflict-free: see ``transpose_params``), rearranges it in
      registers into the output's storage order (register moves, and byte permutes where two
      16-bit elements share a register), and stores 8 ``st.global.v4`` along r, predicated at the
      edges.

    Up to 64 MiB moved (4096 x 4096 f16) the same schedule without ``move_to_smem``: each thread
    loads its 8 x 8 sub-tile with 8 ``ld.global.v4`` (a warp's load four whole 128-byte lines)::

        Move<kernel>(X:GL f16[4096x4096] -> Y:GL f16[4096x4096])
          tile(r=256, c=64) >> to_blocks()
          for r0 in block(16), c0 in block(64):
            Move<block>(X:GL f16[256x64] -> Y:GL f16[256x64])
              tile(r=8, c=8) >> to_threads()
              for r1 in thread(32), c1 in thread(8):
                Move<thread>(X:GL f16[8x8] -> Y:GL f16[8x8])
                  done()

    Edges: rows and cols of any size.  Tiles past the tensor are zero-filled on load and not
    stored; when ``cols`` (``rows``) is not a multiple of the vector, the load (store) side takes
    element accesses, since a vector must lie wholly inside or outside every row."""
    for name, n in (("rows", rows), ("cols", cols)):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ScheduleError(f"transpose: {name} is a positive int", field=name, value=n)
    p = transpose_params(rows, cols, dtype, _sms(arch))
    params = dict(params or {})
    if "staged" not in params and (params.get("stages", 1) != 1 or params.get("swizzle") is not None):
        params["staged"] = True          # a ring of stages or a swizzle asks for the shared-memory copy
    p.update(params)
    unknown = set(p) - set(TRANSPOSE_PARAMS)
    if unknown:
        raise ScheduleError("unknown transpose parameters", field="params", value=sorted(unknown),
                            allowed=", ".join(TRANSPOSE_PARAMS))
    for f in ("persistent", "staged"):
        if not isinstance(p[f], bool):
            raise ScheduleError(f"{f} is a bool", field=f, value=p[f])
    if isinstance(p["stages"], bool) or not isinstance(p["stages"], int) or p["stages"] < 1:
        raise ScheduleError("stages is the tiles a persistent block holds in shared memory, an int >= 1",
                            field="stages", value=p["stages"], allowed="1 (no ring), 2 or more with persistent=True")
    if not p["staged"] and (p["stages"] != 1 or p["swizzle"] is not None):
        f = "stages" if p["stages"] != 1 else "swizzle"
        raise ScheduleError(f"{f} is for the copy through shared memory, which staged=False leaves out",
                            field=f, value=p[f], allowed="1" if f == "stages" else "None",
                            fix="params={'staged': True, ...} or leave it out")
    if p["stages"] > 1 and not p["persistent"]:
        raise ScheduleError("stages > 1 copies a block's next tile while it stores one: only a persistent block "
                            "has a next tile", field="stages", value=p["stages"], allowed="1 without persistent",
                            fix="params={'persistent': True, 'stages': 2} or stages=1")
    sw = p["swizzle"]
    if sw is not None and not isinstance(sw, Swizzle):
        raise ScheduleError("swizzle is a Swizzle(bits, base, shift) or None (automatic)", field="swizzle", value=sw)
    spec = Move.kernel({"r": rows, "c": cols}, src=dtype, dst_major="r")
    group = 8 if -(-rows // p["block_r"]) > GRID_Y_LIMIT else 1
    sched = spec.schedule(
        tile(r=p["block_r"], c=p["block_c"]) >> to_blocks(group=group, persistent=p["persistent"],
                                                           occupancy=p["occupancy"]),
        *([move_to_smem("X", swizzle=sw)] if p["staged"] else []),
        *([pipeline(stages=p["stages"])] if p["stages"] > 1 else []),
        tile(r=p["thread_r"], c=p["thread_c"]) >> to_threads(),
        done(),
    )
    return sched.check(arch) if check else sched


# --------------------------------------------------------------------------- cast

def _dims(shape) -> dict[str, int]:
    if isinstance(shape, dict):
        return dict(shape)
    shape = tuple(shape)
    names = {1: ("c",), 2: ("r", "c"), 3: ("b", "r", "c")}.get(len(shape))
    if names is None:
        raise ScheduleError("cast: give the shape as a dict of dim -> extent, or a tuple of 1 to 3 extents",
                            field="shape", value=shape)
    return dict(zip(names, shape))


def cast_params(shape, src: str = "f32", dst: str = "bf16", sms: int = 132) -> dict:
    """The cast's tiles: ``{"thread": v, "block": {dim: extent}}`` over the dims of ``shape``
    (the last dim contiguous).

    * ``v = 16 B / the narrower element`` (8 for f32 -> bf16, 16 for f32 -> f8): the narrower side
      then moves one 16-byte vector per thread and the wider side two (or four) — 16-byte accesses
      on both sides, where ``4`` elements (16 B of f32) would leave the bf16 side at 8 bytes.
    * a block of ``CAST_THREADS = 256`` threads: ``v * 256`` elements of one row, or several rows
      when rows are shorter (threads along the row: the row's vectors rounded up to a power of
      two); fewer threads when the whole tensor is smaller.
    * extents of the dims before the last two are tiled by 1.
    """
    dims = _dims(shape)
    eb = min(_whole_bytes(src, "src"), _whole_bytes(dst, "dst"))
    names = list(dims)
    c = names[-1]
    v = VECTOR_BYTES // eb
    v = min(v, _pow2_at_least(dims[c]))
    along = min(CAST_THREADS, _pow2_at_least(-(-dims[c] // v)))
    block = {d: 1 for d in names}
    block[c] = along * v
    if len(names) > 1:
        r = names[-2]
        block[r] = min(CAST_THREADS // along, _pow2_at_least(dims[r]))
    return dict(thread=v, block=block)


def cast(shape, src: str = "f32", dst: str = "bf16", arch: str | None = None, *, params: dict | None = None,
         check: bool = True) -> Schedule:
    """``Y = dst(X)`` element by element: X of ``src``, Y of ``dst``, both row-major of ``shape``
    (a dict such as ``{"r": 4096, "c": 4096}`` or a tuple: ``(c,)``, ``(r, c)``, ``(b, r, c)``).
    Floats round to nearest even (as ``x.to(torch.bfloat16)`` and ml_dtypes); a cast to the same
    dtype copies the bits.  Kernels take ``k(X, Y)``.  ``params`` overrides ``cast_params``
    (``thread``, ``block``).

    The schedule for 4096 x 4096 f32 -> bf16::

        Move<kernel>(X:GL f32[4096x4096] -> Y:GL bf16[4096x4096])
          tile(r=1, c=2048) >> to_blocks()
          for r0 in block(4096), c0 in block(2):
            Move<block>(X:GL f32[1x2048] -> Y:GL bf16[1x2048])
              tile(r=1, c=8) >> to_threads()
              for r1 in thread(1), c1 in thread(256):
                Move<thread>(X:GL f32[1x8] -> Y:GL bf16[1x8])
                  done()

    * each thread loads 8 f32 (two ``ld.global.v4``), converts each once (``cvt.rn.bf16.f32``),
      and stores 8 bf16 (one ``st.global.v4``): ``cast_params`` says why 8.
    * no shared memory: nothing is reused, so registers are the whole path.

    Edges: a vector must lie wholly inside or outside a row, so rows whose length is not a
    multiple of ``v`` take element accesses (predicated); a contiguous tensor may be cast as its
    flat buffer (``cast({"n": rows * cols})``) to keep the vectors."""
    dims = _dims(shape)
    for d, n in dims.items():
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ScheduleError(f"cast: extent of {d} is a positive int", field=d, value=n)
    p = cast_params(dims, src, dst, _sms(arch))
    p.update(params or {})
    block, v = dict(p["block"]), p["thread"]
    names = list(dims)
    c = names[-1]
    thread = {d: 1 for d in names}
    thread[c] = v
    spec = Move.kernel(dims, src=src, dst=dst)
    # grid y and z hold at most 65535 blocks: beyond that, the two inner loops share grid x
    counts = [-(-dims[d] // block[d]) for d in names]
    group = 8 if len(names) == 2 and counts[0] > GRID_Y_LIMIT else 1
    sched = spec.schedule(tile(**block) >> to_blocks(group=group), tile(**thread) >> to_threads(), done())
    return sched.check(arch) if check else sched


__all__ = ["transpose", "transpose_params", "cast", "cast_params"]
