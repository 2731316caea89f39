"""Mutation testing of firesched's CPU test suite: apply one small, meaningful change to the code
at a time, run the tests, and report which changes no test notices.

    python tools/mutate.py                      # every mutation of tools/mutations.toml
    python tools/mutate.py --only ops-relu-abs,printer-loop-le --jobs 2
    python tools/mutate.py --list               # the mutations, and whether each still applies
    python tools/mutate.py --write-results      # also rewrite tools/mutation-results.md

The working tree is never touched.  The code under test is a copy in a temporary directory:
``git archive`` of a commit (``--ref``, default HEAD) or, with ``--working-tree``, the files git
tracks or would track in the working tree as they are now.  Each mutation replaces one exact
text (``original``, which must occur exactly once in its file) by ``replacement`` in that
copy; a mutation whose original text is gone (after a refactor) is reported *stale*, not run.

Each mutant runs ``pytest -x -q -p no:cacheprovider`` in its copy, first on the test files the
mutation names as ``tests`` (a fast kill), then, if those pass, on the whole suite.  The golden
CUDA comparisons (``tests/test_golden.py``'s ``*_matches_golden``) are deselected unless
``--golden`` is given: a mutation counts as killed only when a test that states a property
fails, not when a snapshot differs.  A run that exceeds ``--timeout`` counts as killed (the
change made the suite hang).  ``FIRESCHED_CACHE_DIR`` points at a temporary directory shared by
the runs (the NVRTC cache is keyed by the source, so a mutant never reuses another's cubin;
mutations of the cache code itself get a fresh directory).

Results: a table on stdout and, with ``--write-results``, ``tools/mutation-results.md`` (date,
commit, counts, every mutation with the test that killed it, each survivor with the
justification from the data file's ``survives`` field).  ``--json PATH`` writes the raw results.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the data file needs 3.11's TOML reader
    tomllib = None

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tools" / "mutations.toml"
RESULTS = ROOT / "tools" / "mutation-results.md"
GOLDEN_TESTS = ("tests/test_golden.py::test_variant_compiles_and_matches_golden",
                "tests/test_golden.py::test_hopper_variant_compiles_and_matches_golden")


def load_mutations(path: pathlib.Path = DATA) -> list[dict]:
    """The mutation records: id, file, original, replacement, breaks, and optional tests, survives."""
    if tomllib is None:
        raise SystemExit("tools/mutate.py reads its TOML data file with tomllib: run it with Python 3.11 or later")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = data.get("mutation", [])
    ids = [m["id"] for m in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SystemExit(f"{path}: mutation ids used twice: {dup}")
    for m in out:
        for key in ("id", "file", "original", "replacement", "breaks"):
            if not isinstance(m.get(key), str) or not m[key]:
                raise SystemExit(f"{path}: mutation {m.get('id', '?')} needs a non-empty string {key!r}")
        if m["original"] == m["replacement"]:
            raise SystemExit(f"{path}: mutation {m['id']} changes nothing")
    return out


# --------------------------------------------------------------------------- copies of the code

def _git(*args: str, cwd=ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_copy(dest: pathlib.Path, ref: str | None) -> str:
    """Fill ``dest`` with the code under test; return a description (commit, or the working tree's
    HEAD with a marker)."""
    dest.mkdir(parents=True, exist_ok=True)
    if ref is not None:
        commit = _git("rev-parse", ref).strip()
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return commit
    files = _git("ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for rel in files:
        if not rel:
            continue
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return _git("rev-parse", "HEAD").strip() + "+working-tree"


def status_of(m: dict, tree: pathlib.Path) -> str:
    """``ready`` when the original text occurs exactly once in the copy, else ``stale`` (absent)
    or ``ambiguous`` (several occurrences: the record must be made more specific)."""
    path = tree / m["file"]
    if not path.is_file():
        return "stale"
    n = path.read_text().count(m["original"])
    return "ready" if n == 1 else "stale" if n == 0 else "ambiguous"


# --------------------------------------------------------------------------- running

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def _pytest(tree: pathlib.Path, args: list[str], env: dict, timeout: float) -> tuple[str, str, float]:
    """Run pytest in ``tree``: ("pass" | "fail" | "timeout" | "error", first failing test, seconds)."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-rfE", *args]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.monotonic() - t0
    dt = time.monotonic() - t0
    out = r.stdout + r.stderr
    if r.returncode == 0:
        return "pass", "", dt
    if r.returncode == 5:                      # no tests collected (a hint that matched nothing)
        return "pass", "", dt
    m = _FAILED.search(out)
    if m:
        return "fail", m.group(1), dt
    tail = " ".join(out.strip().splitlines()[-3:])[:300]
    return ("fail" if r.returncode == 1 else "error"), tail, dt


def _env(cache: pathlib.Path, ci: bool) -> dict:
    env = dict(os.environ)
    env["FIRESCHED_CACHE_DIR"] = str(cache)
    env["PYTHONDONTWRITEBYTECODE"] = "1"       # a mutant of the same size and mtime must not reuse bytecode
    env.pop("PYTHONPATH", None)
    if ci:
        env["CI"] = "true"
    else:
        env.pop("CI", None)
        env["HYPOTHESIS_PROFILE"] = "dev"
    return env


def run_mutation(m: dict, tree: pathlib.Path, cache: pathlib.Path, opts) -> dict:
    """Apply ``m`` in ``tree`` (a private copy), run the tests, restore the file; the result record."""
    res = {"id": m["id"], "file": m["file"], "breaks": m["breaks"]}
    st = status_of(m, tree)
    if st != "ready":
        res.update(status=st)
        return res
    path = tree / m["file"]
    original = path.read_text()
    path.write_text(original.replace(m["original"], m["replacement"], 1))
    for d in tree.rglob("__pycache__"):
        shutil.rmtree(d, ignore_errors=True)
    try:
        own_cache = m["file"].startswith("firesched/cuda/nvrtc")
        c = pathlib.Path(tempfile.mkdtemp(prefix="cache-", dir=cache.parent)) if own_cache else cache
        env = _env(c, opts.ci)
        extra = [] if opts.golden else [a for t in GOLDEN_TESTS for a in ("--deselect", t)]
        total = 0.0
        hints = [t for t in m.get("tests", []) if (tree / t.split("::")[0]).exists()]
        if hints and not opts.full_only:
            outcome, where, dt = _pytest(tree, [*hints, *extra], env, opts.timeout)
            total += dt
            if outcome != "pass":
                res.update(status="killed", by=where or outcome, phase="hinted", seconds=round(total, 1))
                return res
        outcome, where, dt = _pytest(tree, extra, env, opts.timeout)
        total += dt
        if outcome == "pass":
            res.update(status="survived", seconds=round(total, 1), survives=m.get("survives", ""))
        else:
            res.update(status="killed", by=where or outcome, phase="suite", seconds=round(total, 1))
        return res
    finally:
        path.write_text(original)


def baseline(tree: pathlib.Path, cache: pathlib.Path, opts) -> tuple[str, str, float]:
    extra = [] if opts.golden else [a for t in GOLDEN_TESTS for a in ("--deselect", t)]
    return _pytest(tree, extra, _env(cache, opts.ci), opts.timeout)


# --------------------------------------------------------------------------- reporting

def summarize(results: list[dict]) -> dict:
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def write_markdown(results: list[dict], commit: str, opts, elapsed: float, base: tuple) -> str:
    counts = summarize(results)
    run = [r for r in results if r["status"] in ("killed", "survived")]
    lines = [
        "# Mutation testing: last full result",
        "",
        f"* date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"* code: `{commit}`",
        f"* command: `python tools/mutate.py {' '.join(opts.argv)}`".rstrip(),
        f"* golden comparisons: {'included' if opts.golden else 'deselected (kills come from tests that state properties)'}",
        f"* hypothesis profile: {'ci' if opts.ci else 'dev'}",
        f"* baseline (unmutated) suite: {base[0]} in {base[2]:.0f} s",
        f"* wall time: {elapsed / 60:.0f} min",
        "",
        f"**{counts.get('killed', 0)} killed, {counts.get('survived', 0)} survived** of {len(run)} mutations run; "
        f"{counts.get('stale', 0)} stale (original text gone, not run), {counts.get('ambiguous', 0)} ambiguous.",
        "",
    ]
    surv = [r for r in results if r["status"] == "survived"]
    if surv:
        lines += ["## Survivors", ""]
        for r in surv:
            why = r.get("survives") or "(no justification recorded: a test is missing)"
            lines += [f"* `{r['id']}` ({r['file']}): {r['breaks']}  ", f"  why it survives: {why}"]
        lines.append("")
    lines += ["## Every mutation", "", "| id | file | status | killed by | what it breaks |", "|---|---|---|---|---|"]
    for r in results:
        by = r.get("by", "")
        lines.append(f"| `{r['id']}` | {r['file']} | {r['status']} | {('`' + by + '`') if by else ''} | "
                     f"{r['breaks'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def render(path: pathlib.Path, opts) -> int:
    """Rewrite the results file from an earlier run's JSON (the survivors' ``survives`` text comes
    from the current data file, so a justification can be added without rerunning)."""
    data = json.loads(path.read_text())
    notes = {m["id"]: m.get("survives", "") for m in load_mutations(pathlib.Path(opts.data))}
    results = data["results"]
    for r in results:
        if r["status"] == "survived":
            r["survives"] = notes.get(r["id"], "")
    run_opts = argparse.Namespace(argv=data.get("argv", ["(see the log)"]), golden=data.get("golden", False),
                                  ci=data.get("ci", False))
    base = tuple(data.get("baseline", ("pass", "", 0.0)))
    RESULTS.write_text(write_markdown(results, data["commit"], run_opts, data.get("elapsed", 0.0), base))
    print(f"wrote {RESULTS}")
    return 0


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated mutation ids")
    ap.add_argument("--list", action="store_true", help="list the mutations and whether each applies")
    ap.add_argument("--ref", default="HEAD", help="the commit to mutate (default HEAD)")
    ap.add_argument("--working-tree", action="store_true", help="mutate the working tree's files as they are now")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (each in its own copy)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    ap.add_argument("--golden", action="store_true", help="keep the golden CUDA comparisons")
    ap.add_argument("--full-only", action="store_true", help="skip the hinted fast run")
    ap.add_argument("--ci", action="store_true", help="the CI hypothesis profile (CI=true)")
    ap.add_argument("--no-baseline", action="store_true", help="do not run the unmutated suite first")
    ap.add_argument("--write-results", action="store_true", help=f"rewrite {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--data", default=str(DATA), help="the mutation list (TOML)")
    ap.add_argument("--render", metavar="JSON", help="write the results file from a --json of an earlier run "
                                                      "(with the survivors' justifications of the data file)")
    opts = ap.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)
    if opts.render:
        return render(pathlib.Path(opts.render), opts)
    muts = load_mutations(pathlib.Path(opts.data))
    if opts.only:
        want = opts.only.split(",")
        unknown = sorted(set(want) - {m["id"] for m in muts})
        if unknown:
            raise SystemExit(f"unknown mutation ids: {unknown}")
        muts = [m for m in muts if m["id"] in want]

    work = pathlib.Path(tempfile.mkdtemp(prefix="firesched-mutate-"))
    try:
        base_tree = work / "tree0"
        commit = make_copy(base_tree, None if opts.working_tree else opts.ref)
        if opts.list:
            for m in muts:
                print(f"{status_of(m, base_tree):9s} {m['id']:40s} {m['file']}")
            return 0
        cache = work / "cache"
        cache.mkdir()
        t0 = time.monotonic()
        base = ("not run", "", 0.0)
        if not opts.no_baseline:
            base = baseline(base_tree, cache, opts)
            print(f"baseline: {base[0]} ({base[2]:.0f} s) {base[1]}", flush=True)
            if base[0] != "pass":
                print("the unmutated suite does not pass; mutants would be meaningless", file=sys.stderr)
                return 2
        trees = [base_tree] + [work / f"tree{i}" for i in range(1, max(1, opts.jobs))]
        for t in trees[1:]:
            shutil.copytree(base_tree, t)
        free = list(trees)
        lock = threading.Lock()
        results: dict[str, dict] = {}

        def job(m):
            with lock:
                tree = free.pop()
            try:
                return run_mutation(m, tree, cache, opts)
            finally:
                with lock:
                    free.append(tree)

        with cf.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            futs = {pool.submit(job, m): m for m in muts}
            for f in cf.as_completed(futs):
                r = f.result()
                results[r["id"]] = r
                extra = f" by {r['by']}" if r.get("by") else ""
                print(f"[{len(results)}/{len(muts)}] {r['status']:9s} {r['id']}{extra} "
                      f"({r.get('seconds', 0)} s)", flush=True)
        ordered = [results[m["id"]] for m in muts]
        elapsed = time.monotonic() - t0
        counts = summarize(ordered)
        print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        for r in ordered:
            if r["status"] == "survived":
                print(f"  survived: {r['id']} ({r['file']}): {r['breaks']}")
        if opts.json:
            pathlib.Path(opts.json).write_text(json.dumps(
                {"commit": commit, "results": ordered, "elapsed": elapsed, "baseline": list(base),
                 "argv": opts.argv, "golden": opts.golden, "ci": opts.ci}, indent=1))
        if opts.write_results:
            RESULTS.write_text(write_markdown(ordered, commit, opts, elapsed, base))
            print(f"wrote {RESULTS}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
