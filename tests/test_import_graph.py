"""The package's layering, proved on its import graph (function-local imports included).

Imports point down only: each layer below may import the layers under it and nothing above.  The
back ends that read the kernel IR (CUDA printer, interpreter, runtime, microkernels) are
independent of each other; ``api`` is the one place that joins them.  And no module imports
itself through a cycle.
"""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

# Top to bottom.  A set is one layer of siblings that must not import each other.
LAYERS = [
    "__main__",
    "cli",
    {"torch_ops", "tuner"},
    "timing",
    {"recipes", "testing"},
    {"api", "tuned"},
    {"cuda", "simulate", "runtime"},
    "lower",
    "strategies",
    "schedule",
    "strategy",
    "spec",
    "monoids",
    "ir",
    "hardware",
    "tensor",
    {"ops", "layout", "quant"},
    "packing",
    "draw",
    "dtypes",
    "errors",
    "version",
]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("firesched", include_external_packages=False)


def _layer_names():
    out = []
    for layer in LAYERS:
        out += sorted(layer) if isinstance(layer, set) else [layer]
    return out


def test_every_module_sits_in_a_layer(graph):
    """A new top-level module must be placed in ``LAYERS`` (and so in the architecture)."""
    names = set(_layer_names())
    top = {m.split(".")[1] for m in graph.modules if m.count(".") >= 1}
    assert top <= names, f"modules outside the layering: {sorted(top - names)}"


def test_imports_point_down(graph):
    layers = [grimp.Layer(*sorted(layer), independent=True) if isinstance(layer, set) else layer
              for layer in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={"firesched"})
    lines = []
    for dep in sorted(illegal, key=lambda d: (d.importer, d.imported)):
        for route in dep.routes:
            lines.append(f"{dep.importer} -> {dep.imported}: {sorted(route.heads)} -> {list(route.middle)} -> "
                         f"{sorted(route.tails)}")
    assert not lines, "imports that point up or sideways:\n  " + "\n  ".join(lines)


def test_no_import_cycles(graph):
    cycles = set()
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            back = graph.find_shortest_chain(importer=imported, imported=m)
            if back:
                cycles.add((m,) + tuple(back))
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in sorted(cycles))


def test_function_local_imports_are_seen(graph):
    """The graph includes imports inside functions (the layering holds for those too)."""
    # firesched.runtime imports the TMA format table inside encode_tensor_map_2d only
    assert "firesched.hardware.tma" in graph.find_modules_directly_imported_by("firesched.runtime")
