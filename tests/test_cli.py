"""The command line: every subcommand runs, bad arguments are one-line errors with exit status 2
(never a traceback), and the demo's papercuts stay fixed."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from firesched import runtime
from firesched.cli import main
from firesched.cli.recipe_args import RECIPES

SMALL = {"gemm": "128 128 128", "bmm": "2 64 64 64", "rmsnorm": "64 256", "layernorm": "64 256",
         "add_rmsnorm": "64 256", "softmax": "64 256", "transpose": "128 128", "cast": "64 64"}


def run(capsys, line: str) -> tuple[int, str, str]:
    """``firesched <line>`` in this process: (exit status, stdout, stderr)."""
    rc = main(line.split())
    out, err = capsys.readouterr()
    return rc, out, err


def test_every_recipe_has_a_small_shape_here():
    assert set(SMALL) == set(RECIPES)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_show_every_recipe(capsys, name):
    rc, out, err = run(capsys, f"show {name} {SMALL[name]}")
    assert rc == 0, err
    head, tree = out.split("\n", 1)
    assert head.startswith(f"# {name} ")
    assert "<kernel>" in tree.splitlines()[0]


def test_show_gemm_with_params_and_epilogue(capsys):
    rc, out, _ = run(capsys, "show gemm 256 256 256 --arch sm_80 -p block_m=64 -p stages=2 --epilogue bias_relu")
    assert rc == 0
    assert "block_m=64" in out.splitlines()[0]
    assert "tile(m=64" in out and "pipelined(2 stages)" in out and "relu()" in out


def test_emit_cuda_to_stdout_and_file(capsys, tmp_path):
    rc, out, _ = run(capsys, "emit gemm 128 128 128 --arch sm_80")
    assert rc == 0 and "__global__" in out and "mma.sync" in out
    path = tmp_path / "k.cu"
    rc, out, err = run(capsys, f"emit transpose 128 128 -o {path}")
    assert rc == 0 and out == "" and f"wrote {path}" in err
    assert "__global__" in path.read_text()


def test_emit_ptx(capsys):
    from firesched.api import CompiledProgram

    rc, out, err = run(capsys, "emit cast 64 64 --ptx")
    if not hasattr(CompiledProgram, "ptx"):
        assert rc == 2 and err.startswith("error: PTX output is not available") and len(err.splitlines()) == 1
        return
    assert rc == 0, err
    assert ".version" in out and ".entry" in out


def test_check_ok_and_failed(capsys):
    rc, out, _ = run(capsys, "check gemm 1000 1000 1000 --arch sm_80")
    assert rc == 0 and out.startswith("ok: gemm 1000x1000x1000 f16 for sm_80")
    rc, out, err = run(capsys, "check gemm 1000 1000 1000 --arch sm_80 -p block_m=256 -p block_n=256 -p stages=4")
    assert rc == 1 and out == ""
    assert err.startswith("check failed: ") and "registers" in err and "fix:" in err


def test_layout_text_of_a_layout(capsys):
    rc, out, _ = run(capsys, "layout (4,8):(8,1) --no-color")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "Layout (4,8):(8,1)"
    assert lines[2].split() == ["0"] + [str(j) for j in range(8)]
    assert "\x1b[" not in out


def test_layout_of_a_tv_layout_swizzle_and_atom(capsys):
    rc, out, _ = run(capsys, "layout ((4,8),(2,2)):((32,1),(16,8)) --tile 16x8")
    assert rc == 0 and out.splitlines()[2].split()[:3] == ["0", "T0V0", "T0V1"]
    rc, out, _ = run(capsys, "layout SW128")
    assert rc == 0 and out.splitlines()[3].split() == ["1", "4", "0", "12", "8", "20", "16", "28", "24"]
    rc, out, _ = run(capsys, "layout sm80.mma_m16n8k16_f16_f32")
    assert rc == 0 and out.count("mma_m16n8k16_f16_f32 operand") == 4


def test_layout_of_a_schedules_shared_tiles(capsys):
    rc, out, _ = run(capsys, "layout gemm 256 256 256 --arch sm_80")
    assert rc == 0
    titles = [line for line in out.splitlines() if line.startswith("shared ")]
    assert [t.split()[1] for t in titles] == ["A", "B"]
    assert out.count("conflict-free") == 2       # move_to_smem picks bank-conflict-free swizzles


def test_layout_svg_file(capsys, tmp_path):
    path = tmp_path / "sw.svg"
    rc, out, _ = run(capsys, f"layout Sw<3,3,3> --svg {path}")
    assert rc == 0 and out.startswith(f"wrote {path}")
    root = ET.parse(path).getroot()
    cells = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "cell"]
    assert len(cells) == 64


def test_layout_png_without_matplotlib_is_one_error(capsys, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out, err = run(capsys, f"layout SW128 --png {tmp_path / 'x.png'}")
    assert rc == 2 and err.startswith("error: PNG output needs matplotlib") and len(err.splitlines()) == 1


BAD = [
    ("show gemm 0 128 128", "M=0"),
    ("show gemm 128 128", "takes 3 sizes"),
    ("show gemm x 1 1", "not an integer"),
    ("show nope 1 2", "no recipe named 'nope'"),
    ("show gemm 64 64 64 -p nope=1", "no parameter 'nope'"),
    ("show gemm 64 64 64 -p block_m=abc", "takes int"),
    ("show gemm 64 64 64 -p block_m", "NAME=VALUE"),
    ("show gemm 64 64 64 -p swizzle=xyz", "Sw<3,3,3>"),
    ("show rmsnorm 64 64 --epilogue bias", "no epilogue"),
    ("show cast 64 64 -p foo=1", "no parameter 'foo'"),
    ("show transpose 64 64 -p foo=1", "no parameter 'foo'"),
    ("show gemm 64 64 64 --epilogue nope", "no such epilogue"),
    ("emit gemm 64 64 64 -o /nonexistent-dir/k.cu", "No such file"),
    ("layout foo", "not a layout, a swizzle, an atom or a recipe"),
    ("layout (4,8):(8,1,2)", "not congruent"),
    ("layout SW128 1 2", "go with a recipe name"),
    ("layout (4,8) --tile 4", "ROWSxCOLS"),
    ("layout cast 64 64", "nothing in shared memory"),
    ("tune 64 64", "takes 3 sizes"),
    ("tune 64 64 64 --limit 0", "at least 1"),
    ("demo --size 0", "--size 0"),
    ("demo --size -5", "--size -5"),
    ("bogus", "invalid choice"),
    ("show", "required"),
    ("show gemm 1 1 1 --reps 3", "unrecognized arguments"),
]


@pytest.mark.parametrize("line,words", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_one_line_errors(capsys, line, words):
    rc, out, err = run(capsys, line)
    assert rc == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert "error: " in err and words in err and "Traceback" not in err


def test_demo_bad_size_fails_before_running_anything(capsys):
    """It used to run the whole demo (interpreter, compiles) and end in a traceback."""
    rc, out, err = run(capsys, "demo --size 0")
    assert rc == 2 and out == "" and err.startswith("error: --size 0")


def test_demo_no_fused_prints_no_fused_headings(capsys):
    """--no-fused used to print "GEMM + bias + ReLU" headings (and interpret the fused kernels)."""
    rc, out, err = run(capsys, "demo --size 64 --no-fused")
    assert rc == 0, err
    headings = [line for line in out.splitlines() if line.startswith("==")]
    assert len(headings) >= 5
    assert not any("bias" in h or "ReLU" in h for h in headings), headings
    assert "relu" not in out and "bias(" not in out


def test_tune_lists_candidates_that_check(capsys):
    rc, out, err = run(capsys, "tune 256 256 256 --arch sm_80 --limit 3")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("sm80", "sm90a")]
    if not runtime.gpu_available():
        assert len(rows) == 3 and all(len(r) == 13 for r in rows) and {r[0] for r in rows} == {"sm80"}
        assert "# not timed: " in out


@pytest.mark.skipif(runtime.gpu_available(), reason="a GPU is present: bench runs instead")
def test_bench_without_gpu_is_one_line(capsys):
    rc, out, err = run(capsys, "bench gemm 128 128 128")
    assert rc == 1 and out == ""
    assert err.startswith("error: bench needs an NVIDIA GPU") and len(err.splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.gpu_available(), reason="needs a GPU")
def test_bench_on_gpu(capsys):
    pytest.importorskip("torch")
    rc, out, err = run(capsys, "bench gemm 512 512 512 --reps 3 --samples 3")
    assert rc == 0, err
    assert "TFLOP/s" in out and " us" in out


@pytest.mark.parametrize("cmd", ["show", "emit", "check", "layout", "tune", "bench", "demo"])
def test_help_has_examples(capsys, cmd):
    rc, out, _ = run(capsys, f"{cmd} --help")
    assert rc == 0 and "examples:" in out and f"firesched {cmd}" in out


def test_no_command_prints_help_and_fails(capsys):
    rc, out, _ = run(capsys, "")
    assert rc == 2 and "COMMAND" in out


def test_python_dash_m_runs_the_cli():
    p = subprocess.run([sys.executable, "-m", "firesched", "layout", "(2,2):(1,2)"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "Layout (2,2):(1,2)"
    p = subprocess.run([sys.executable, "-m", "firesched", "show", "gemm", "0", "1", "1"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == "error: gemm: M=0; sizes are positive integers (>= 1)"
