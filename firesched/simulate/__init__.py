"""The CPU interpreter of the kernel IR, and the hazard checker that makes it worth having.

``run_program(program, arrays)`` executes every kernel of a ``Program`` in order on numpy arrays
and returns the final global buffers.  Blocks run one after another (grid x fastest, then y,
then z); the threads of a block run in lockstep, vectorised over numpy: the index variable
``tid`` is ``np.arange(threads)``, every index expression evaluates to one value per thread (or
to an int), registers are ``[threads, size]`` arrays, loop variables are ints and ``If`` is an
active-thread mask.

While it runs, the interpreter checks what the GPU would not tell us, and raises
``HazardError`` with the buffer, the offsets, the threads, the kernel, the block and the
statement involved.  Its first line is short: the kind of hazard, the buffer, and the strategy
whose lowering emitted the faulting statement (with that of the other access of a race); the
lines after it name the schedule nodes (from the statements' ``ir.Origin``), the thread's units
and tiles in the schedule's loop names, and the node whose loop orders the two accesses:

* shared-memory races: a read of an element another thread wrote since the last barrier (RAW), a
  write of an element another thread wrote (WAW) or read (WAR) since the last barrier.  Every
  shared element remembers the barrier epoch and the thread of its last write and of up to two
  distinct readers; a ``Barrier`` starts a new epoch.  Collective atoms (ldmatrix) access memory
  on behalf of the thread whose address they use.
* cp.async: the destination of an issued copy is *in flight* until an ``AsyncWait`` of the
  issuing thread completes its group; any access to it before then is a hazard, and the landing
  counts as a write by the issuing thread at the wait.  Copies still in flight when a block
  ends are a hazard too.
* bounds: global, shared and register offsets outside their buffer; misaligned addresses of
  atoms that declare an alignment.
* divergence: a ``Barrier`` some threads of the block do not reach, a collective atom (warp,
  quad-pair) issued by part of its thread group.

Semantics decided here, beyond what ``ir`` states:

* shared memory and registers start as zeros in every block;
* a statement reads before it writes: within one statement, two threads writing one shared
  element race (WAW), and a write to an element another thread reads in the same statement is a
  WAR; several threads reading one element is fine;
* ``pred`` and the ``If`` mask both disable a thread; a disabled COPY load zeroes its registers
  without reading (or bounds-checking) its source, a disabled CP_ASYNC zero-fills its
  destination (still in flight until waited for), a disabled store does nothing; MMA,
  LDMATRIX and SHUFFLE run for whole thread groups or not at all;
* CONVERT atoms (int4 dequantisation, f16x2 / bf16x2 scales) run per enabled thread on the bits
  its registers would hold (elements packed into 32-bit words, element 0 lowest), through the
  atom's bit-exact semantics; a disabled thread's destination is left as it was;
* moves (COPY, CP_ASYNC, LDMATRIX) move bits: buffers of equal width but different dtypes are
  reinterpreted; ``Pointwise`` computes in float64 and rounds once to the destination dtype
  (integers: to nearest, saturated), ``cvt`` likewise;
* SYNC atoms issued as ``AtomCall``: ``cp_async_commit`` is ``AsyncCommit``, a wait whose PTX
  names its count (``catalog.with_immediates``) is ``AsyncWait``, any other (``bar_sync``) is a
  ``Barrier``.

Hopper (sm_90a) atoms, modelled asynchronously (only kernels that use them pay for the tracking):

* wgmma: issued by whole warpgroups.  Its result is computed at issue (D = A @ B + D in float64,
  rounded once to f32; D = A @ B where ``scale_d`` is 0), but its accumulator registers (and the
  A registers of the ``_rs`` form) are *in flight* until a ``wgmma.wait_group`` of the issuing
  threads retires its group: any other access of them before that is a hazard ("... before
  wgmma.wait_group"), and so is a write of shared memory it read.  A warpgroup's first wgmma
  must follow a ``wgmma.fence``, and a register that another instruction accessed since the
  thread's last fence may not be used by a wgmma ("missing wgmma.fence"); wgmma after wgmma on
  the same accumulators needs no fence.  Shared
  operands are read through their descriptors (``descriptors.operand_byte_offsets``, all four swizzle
  modes; the descriptor start must be 16-byte aligned and, swizzled, at an 8-row swizzle-atom
  boundary of the shared window) on behalf of the warpgroup's first thread.
* async proxy: shared memory written by a thread through ordinary stores (st.shared, stmatrix,
  cp.async) must be covered by a ``fence.proxy.async`` of that thread before a wgmma or a TMA
  store reads it ("missing fence.proxy.async"); the usual race rules (a ``Barrier`` between
  other threads' writes and the read) apply on top.
* mbarrier: ``init`` sets the arrival count of each phase; ``arrive`` counts one arrival,
  ``arrive.expect_tx`` adds transaction bytes first; a phase completes when its arrivals and its
  bytes are all in.  Using a barrier before its init, or in the init's barrier epoch by another
  thread, is a hazard.  ``try_wait.parity(P)`` on a barrier whose completed-phase count is ``c``
  returns at once when ``P != c % 2`` (the last phase of parity P is complete; the thread has
  then observed phases ``0..c-1``), and otherwise waits for phase ``c``.  Every asynchronous
  contribution (a TMA's bytes) is accounted at issue, so in lockstep code a phase that is
  incomplete when a wait reaches it can never complete: that wait is reported as a deadlock
  ("mbarrier wait on parity P that can never complete").  Waiting on the wrong parity is thus
  either that deadlock or a wait that returns at once on a stale phase, after which reading the
  data is "read before mbarrier phase completes".
* warp specialization (``ir.Roles``): each role is a lockstep group of its own, run as a
  coroutine (a Python thread holding a baton, so exactly one runs); a role whose mbarrier wait
  cannot return yet hands the baton to the next role that can run, round robin, and when none
  can the block is reported as a deadlock with every role's wait.  A block-wide ``Barrier``
  inside a role is a hazard; named barriers (``Barrier(threads=...)``, an id per group of
  threads) synchronise the threads that reach them with the same id, which must be exactly
  ``threads`` whole warps of one lockstep group.
* happens-before: besides barrier epochs, every thread carries a vector clock.  A barrier (block
  or named) joins the clocks of its threads; an mbarrier arrive releases the thread's clock (and
  the mbarrier phases it has observed) into the phase, and a wait that sees the phase complete
  acquires them.  A shared-memory access by another thread in the same epoch is a race only if
  it is not ordered by these clocks — so a TMA refill after the consumers released the stage
  through an "empty" mbarrier is fine, and one without that release is a race.
* TMA load: the box (zeros outside the tensor) is written at issue, tagged with its barrier and
  the phase its bytes complete; a thread may read (or overwrite) a tagged element only after it
  has observed that phase.  TMA store: reads its box from shared memory at issue (checked like a
  read of the issuing thread, plus the proxy fence), writes the in-bounds elements to global
  memory, and keeps the source in flight until a ``cp.async.bulk.wait_group[.read]`` of the
  thread retires its bulk group.  Swizzled boxes must have an inner extent equal to the swizzle
  span.  A TMA load into memory that other threads read must be ordered after those reads (a
  barrier, or the vector clocks of an "empty" mbarrier); wgmma operand reads count as reads by
  the warpgroup's first thread.
* wgmma operations, TMA stores and TMA loads still outstanding when a block ends are hazards.
* setmaxnreg: a no-op that must be executed by whole warpgroups; stmatrix: the inverse of
  ldmatrix.

The package, one concern a module (each module's docstring says what it models):

* ``kernel``: ``run_program``, ``run_kernel``; the block loop, statement execution
  (Seq/For/If, RegFill, Pointwise) and the dispatch of atoms and roles;
* ``lockstep``: the threads of a block (cluster), the active mask, the index variables, the
  current statement and how a hazard names it;
* ``order``: happens-before (barrier epochs, vector clocks, observed mbarrier phases);
* ``memory``: global and shared buffers, bounds, alignment, races and the async-proxy rules;
* ``registers``: the register file and the registers an in-flight wgmma owns;
* ``mbarriers``: mbarrier arrivals, transaction bytes and phases;
* ``asyncs``: cp.async groups, TMA operations and wgmma groups in flight;
* ``families``: one executor per atom family (``copies``, ``collectives``, ``wgmma``, ``tma``,
  ``barriers``, ``conversions``), sharing ``operands``;
* ``roles``: warp specialization, roles run as coroutines;
* ``stacked``: loop nests of register-only MMAs, run a few iterations per numpy call;
* ``exprs``, ``tables``, ``convert``, ``messages``: compiled index expressions, per-atom index
  tables, rounding into dtypes, descriptions of statements for messages;
* ``interp``: the entry points under their historical module name.
"""

from .kernel import run_kernel, run_program
from .messages import describe

__all__ = ["describe", "run_kernel", "run_program"]
