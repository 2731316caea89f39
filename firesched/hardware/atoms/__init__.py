"""The atom catalog: one ``Atom`` record per hardware instruction variant, by target generation.

* ``base`` — the ``Atom`` and ``Operand`` records and the families (``Atom.family``) the lowering
  and the interpreter dispatch on;
* ``sm70`` — ``mma`` (quad-pair ``mma.m8n8k4``), ``copy`` (per-thread ``ld``/``st`` of 1 to 16
  bytes, global and shared), ``shuffle`` (``shfl.sync``), ``sync`` (``bar.sync``);
* ``sm80`` — ``mma`` (``mma.sync`` m16n8k16 f16/bf16, m16n8k8 tf32), ``ldmatrix`` (x1/x2/x4,
  ``.trans``), ``cp_async`` (4/8/16 bytes) and its ``sync`` (commit, wait);
* ``sm90a`` — ``wgmma``, ``wgmma_sync``, ``tma``, ``mbarrier``, ``fence``, ``setmaxnreg``,
  ``stmatrix``, ``cluster``;
* ``convert`` — ``convert``: a thread's register -> register int4 dequantisation (``lop3`` magic
  numbers into f16x2 / bf16x2) and group scaling (``mul`` / ``fma`` on f16x2 / bf16x2);
* ``catalog`` — every record, and the look-ups by name, target, dtypes and width.

``done(atom)`` takes a record of these tables; ``firesched.hardware.sm80`` etc. are the same
modules.
"""
