"""Which default row plans differ between this tree and another checkout.

    PYTHONPATH=. python bench/row_plan_diff.py --old ../other            # every recipe, type, target
    PYTHONPATH=. python bench/row_plan_diff.py --old ../other --ops causal --dtypes bf16 --step 8

A change to the row model (``firesched/recipes/rows.py``: a rule of ``row_plan``, a measured table)
should move exactly the plans it was measured on.  This script asks both versions for the plan of
every recipe (``norms.plan_rows(..., op=...)`` with the recipe's arguments, ``norms.recipe_plan_args``), type, target
and row length from 1 to 262,144 columns (every ``--step``-th length up to 4,200, then the
multiples of 512 and the lengths one below them, and a few long ones), and prints, per recipe,
type and target, the runs of lengths whose plans differ with a plan before and after each run.
``RowPlan`` fields the other version lacks are left out of the comparison (a new field with its
default changes no plan).  Runs on the CPU; the plans only, no kernel is built.
"""

from __future__ import annotations

import argparse
import os
import sys

import attrs

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402

OPS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal")


def lengths(step: int = 7) -> list[int]:
    """The row lengths compared: every ``step``-th up to 4,200, then multiples of 512 and one
    below each up to 140,000, and a few long ones."""
    out = set(range(1, 4200, step)) | set(range(4096, 140000, 512)) | set(range(4095, 140000, 512))
    return sorted(out | {200000, 262143, 262144})


def _recipe_args(lib, op: str, dtype: str, arch: str) -> dict:
    """The ``plan_rows`` arguments of ``lib``'s recipe ``op``: ``norms.recipe_plan_args`` where
    ``lib`` has it; a checkout from before it, the arguments its recipes passed then."""
    norms = lib.recipes.norms
    if hasattr(norms, "recipe_plan_args"):
        return norms.recipe_plan_args(op, dtype, arch)
    if op == "add_rmsnorm":
        return {"max_values": 32}
    if op == "layernorm":
        window = 12 if dtype == "f32" else 24 if norms.get_target(arch).has_clusters else 16
        return {"max_values": 24 if dtype == "f32" else None, "odd_values": 20, "aligned_values": window}
    if op in ("softmax", "causal"):
        return {"odd_values": lib.recipes.rows.VALUES_IN_REGISTERS[2], "stage_few_passes": op != "causal"}
    return {}


def plan_of(lib, op: str, cols: int, dtype: str, arch: str, rows: int = 4096):
    """The plan ``lib``'s recipe ``op`` takes, as a dict, or the name of the error it raises."""
    try:
        return attrs.asdict(lib.recipes.norms.plan_rows(rows, cols, dtype, arch, op=op,
                                                        **_recipe_args(lib, op, dtype, arch)))
    except (ValueError, fs.ScheduleError) as e:
        return f"error: {type(e).__name__}"


def differences(new, old, ops=OPS, dtypes=("bf16", "f16", "f32"), archs=("sm_90a", "sm_80"), step: int = 7) -> dict:
    """``{(op, dtype, arch): [(cols, old plan, new plan), ...]}`` where the two versions differ."""
    out: dict = {}
    for op in ops:
        for dt in dtypes:
            for arch in archs:
                for c in lengths(step):
                    a, b = plan_of(old, op, c, dt, arch), plan_of(new, op, c, dt, arch)
                    if isinstance(a, dict) and isinstance(b, dict):
                        b = {k: v for k, v in b.items() if k in a}
                    if a != b:
                        out.setdefault((op, dt, arch), []).append((c, a, b))
    return out


#: fields ``_brief`` always shows (the others only where the two plans differ in them)
_SHOWN = ("lanes", "reps", "vec", "cluster", "row_memory", "blocks_per_sm")


def _brief(plan, other=None) -> str:
    """A plan in a few words, and ``field=value`` for each other field in which it differs from
    ``other`` (e.g. ``exchange``, ``guard``)."""
    if not isinstance(plan, dict):
        return plan
    text = f"{plan['lanes']} x {plan['reps'] * plan['vec']}"
    if plan["cluster"] > 1:
        text += f", cluster {plan['cluster']}"
    text += f", {plan['row_memory']}" + (f", {plan['blocks_per_sm']} an SM" if plan["blocks_per_sm"] else "")
    if isinstance(other, dict):
        text += "".join(f", {k}={v!r}" for k, v in plan.items()
                        if k not in _SHOWN and k in other and other[k] != v)
    return text


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="path of the other checkout (its firesched/ is imported)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--archs", default="sm_90a,sm_80")
    p.add_argument("--step", type=int, default=7, help="the step between the lengths compared up to 4,200")
    args = p.parse_args(argv)
    from bench.ab_versions import load_other

    other = load_other(args.old)
    found = differences(fs, other, [o for o in args.ops.split(",") if o], [d for d in args.dtypes.split(",") if d],
                        [a for a in args.archs.split(",") if a], args.step)
    if not found:
        print("no default row plan differs")
    for (op, dt, arch), rows in found.items():
        print(f"{op} {dt} {arch}: {len(rows)} lengths, {rows[0][0]} - {rows[-1][0]}")
        for c, a, b in rows[:3] + ([("...", None, None)] if len(rows) > 3 else []):
            if c == "...":
                print("    ...")
            else:
                print(f"    {c}: {_brief(a, b)} -> {_brief(b, a)}")
    return found


if __name__ == "__main__":
    main()
