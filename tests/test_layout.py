"""The package's layers, held by its import graph: no import circles, every module in a layer
that imports only its own layer or those beneath, engines never import a step, steps never
import each other (except `run`, their composition), nothing but the CLI's own modules at the
package root, and every verb of the CLI has its step module. Function-level imports count: a
lazy import is still a dependency; imports under `if TYPE_CHECKING:` (annotations only, never
run) do not."""

import ast
from pathlib import Path

import lorapilot

PKG = Path(lorapilot.__file__).parent
VERBS = (
    "check",
    "data",
    "inspect",
    "baseline",
    "smoke",
    "probe",
    "budget",
    "train",
    "eval",
    "verify",
    "export",
    "compare",
    "report",
    "run",
    "runs",
    "sync",
)


# Bottom to top. A module's layer is that of the longest name here it is, or lies under. A
# package may span two layers: its engines, and what several steps share (the modality seam,
# one evaluation inside a run, the budget gathered from the records, verify's fresh process).
LAYERS = {
    "lorapilot": 0,  # __init__: the version
    "lorapilot.errors": 0,
    "lorapilot.fsutil": 0,
    "lorapilot.spec": 0,
    "lorapilot.records": 1,
    "lorapilot.base": 2,
    "lorapilot.data": 3,
    "lorapilot.train": 3,
    "lorapilot.evaluate": 3,
    "lorapilot.sizing": 3,
    "lorapilot.decision": 3,
    "lorapilot.report": 3,
    "lorapilot.modality": 4,
    "lorapilot.modality.image_examples": 3,
    "lorapilot.modality.image_transforms": 3,
    "lorapilot.modality.image_model": 3,
    "lorapilot.modality.image_probe": 4,
    "lorapilot.modality.image_export": 3,
    "lorapilot.evaluate.session": 4,
    "lorapilot.evaluate.image_session": 4,
    "lorapilot.sizing.estimate": 4,
    "lorapilot.sizing.rental": 4,
    "lorapilot.decision.reload": 4,
    "lorapilot.export": 3,
    "lorapilot.export.gguf_export": 4,
    "lorapilot.steps": 5,
    "lorapilot.views": 6,
    "lorapilot.cli": 6,
    "lorapilot.__main__": 6,
}
ROOT_MODULES = {"__init__", "__main__", "cli", "views", "errors", "fsutil"}


def layer_of(module: str, layers: dict[str, int] = LAYERS) -> int | None:
    names = [n for n in layers if module == n or module.startswith(n + ".")]
    return layers[max(names, key=len)] if names else None


def against_the_layers(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import of a module from a higher layer than its own, as 'a -> b'."""
    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if (layer_of(d, layers) or 0) > (layer_of(m, layers) or 0)
    )


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):  # drop annotation-only blocks before walking
            if isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING",
                "typing.TYPE_CHECKING",
            ):
                node.body = []
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name in modules and name != mod and name != "lorapilot":
                    graph[mod].add(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_against_the_layers_finds_an_upward_import():
    layers = {"p.low": 0, "p.high": 1, "p.high.engine": 0}
    graph = {"p.low": {"p.high.x"}, "p.high.x": {"p.low"}, "p.high.engine": {"p.low"}}
    assert against_the_layers(graph, layers) == ["p.low -> p.high.x"]


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_layers():
    graph = import_graph()
    assert not [m for m in graph if layer_of(m) is None]
    assert against_the_layers(graph, LAYERS) == []


def test_the_package_root_holds_only_what_every_layer_uses_and_the_cli():
    root = {p.stem for p in PKG.glob("*.py")}
    assert root == ROOT_MODULES, sorted(root - ROOT_MODULES)
    for init in PKG.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 20, f"{init}: say what the package holds"


def test_engines_never_import_a_step_and_steps_never_import_each_other():
    graph = import_graph()
    for mod, deps in graph.items():
        steps = {d for d in deps if d.startswith("lorapilot.steps.")}
        if mod == "lorapilot.cli" or mod == "lorapilot.steps.run":
            continue
        assert not steps, f"{mod} imports {sorted(steps)}"


def test_every_verb_has_its_step_module_with_its_stage_function():
    for verb in VERBS:
        path = PKG / "steps" / f"{verb}.py"
        assert path.is_file(), path
        functions = {
            n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)
        }
        assert any(f.startswith("run_") for f in functions), (verb, functions)


def test_the_cli_only_dispatches_to_steps():
    """cli.py reaches the work through steps (and the few read-only helpers named here)."""
    allowed = {
        "lorapilot.records",
        "lorapilot.records.registry",
        "lorapilot.views",
        "lorapilot.errors",
        "lorapilot.spec",
        "lorapilot.base",
        "lorapilot.base.models",
        "lorapilot.base.image_models",  # `model fetch --image`, as `model fetch` uses models
        "lorapilot.spec.scaffold",
        "lorapilot.spec.reference",  # `schema --reference`, as `schema` uses the spec
    }
    deps = import_graph()["lorapilot.cli"]
    other = {d for d in deps if not d.startswith("lorapilot.steps.")} - allowed
    assert not other, sorted(other)


def test_run_records_are_opened_with_the_step_helpers():
    """registry.open_run is called only by steprun (and train.distributed, which gets the
    same record_kwargs): a step that opened its record by hand would skip the tracker hook."""
    callers = set()
    for path in PKG.rglob("*.py"):
        if "registry.open_run(" in path.read_text(encoding="utf-8"):
            callers.add(module_name(path))
    assert callers <= {"lorapilot.records.steprun", "lorapilot.train.distributed"}, sorted(callers)
