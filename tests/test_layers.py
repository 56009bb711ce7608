"""The layering of the packages, checked on the source: every ``import`` statement of every module, the ones
inside functions included, read with ``ast``.

* ``mmrl_common`` <- ``vision``, ``video`` <- ``rewards``, ``data_pipelines`` <- core ``mmrl`` <-
  ``mmrl.methods``: the leaf packages never import ``mmrl``; the core never imports ``mmrl.methods``;
* no import cycle between modules of the whole tree, ``perf`` included (a package's ``__init__`` counts as a
  module of its own), imports under ``if TYPE_CHECKING:`` included: a module that only names another's type
  still depends on it;
* the model package (``mmrl.model``) imports nothing of the engine: only itself and ``mmrl_common``;
* the packages of ``mmrl`` are its layers (``LAYERS``, top to bottom: the command line, the methods, the
  benchmarks, the run, the toy world, the engine, the settings, the model and the GRPO maths): no module imports
  a layer above its own, and no module lives outside them;
* the methods (``mmrl.methods``) import nothing of the command line (``mmrl.cli``) nor the pipeline
  (``mmrl.run.pipeline``, or the ``mmrl.run`` front that loads it): their commands read settings through
  ``mmrl.run.recipe`` and borrow ``mmrl.run.helpers``;
* no module writes an attribute of a :class:`~mmrl.model.Policy` or of a run config, or replaces one of their
  methods: a policy's settings change through ``Policy.configure``/``bind_ranks``, a config by a new object
  (``dataclasses.replace``).

Also: no module takes another first-party module's private (``_name``) names, by import or through a module
alias; no tracked text file points at research notes outside the repository (a source is cited directly or
written up under ``docs/``).

The checker itself is tested on a planted cycle and a planted upward import, so a green run means something.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mmrl_common", "vision", "video", "rewards", "data_pipelines", "mmrl")
TREE = (*PACKAGES, "perf")  # everything that is imported, the benchmarks included
LEAVES = ("mmrl_common", "vision", "video", "rewards", "data_pipelines")


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def import_source(package: str, node: ast.ImportFrom) -> str:
    """The dotted module a ``from ... import`` statement in ``package`` reads from (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - node.level + 1]  # from the package, up level - 1
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(files: dict[str, Path], *, type_only: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from pkg import name`` counts as ``pkg.name`` when that is
    a module, else as ``pkg``); ``type_only=False`` leaves out the imports under ``if TYPE_CHECKING:``."""
    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = set() if type_only else _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names if (t := known(a.name)))
            elif isinstance(node, ast.ImportFrom):
                source = import_source(package, node)
                for a in node.names:  # a submodule by that name, else the module that defines it
                    t = f"{source}.{a.name}" if f"{source}.{a.name}" in files else known(source)
                    if t:
                        targets.add(t)
        targets.discard(mod)
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports against the layering: a leaf package importing ``mmrl``, the core importing ``mmrl.methods``."""
    bad = []
    for mod, targets in graph.items():
        top = mod.split(".")[0]
        for t in targets:
            if top in LEAVES and t.split(".")[0] == "mmrl" or top == "mmrl" and not mod.startswith("mmrl.methods") and t.startswith("mmrl.methods"):
                bad.append((mod, t))
    return sorted(bad)


def test_no_module_imports_up_the_layers() -> None:
    bad = upward(import_graph(module_files(ROOT)))
    assert not bad, "imports against the layering:\n" + "\n".join(f"  {a} -> {b}" for a, b in bad)


def test_no_import_cycle() -> None:
    found = cycles(import_graph(module_files(ROOT, TREE)))
    assert not found, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def engine_imports(graph: dict[str, set[str]], package: str = "mmrl.model") -> list[tuple[str, str]]:
    """Imports of ``package``'s modules of anything of ``mmrl`` outside ``package``."""
    return sorted((mod, t) for mod, targets in graph.items() if mod == package or mod.startswith(package + ".")
                  for t in targets if t.split(".")[0] == "mmrl" and t != package and not t.startswith(package + "."))


def test_the_model_package_imports_nothing_of_the_engine() -> None:
    bad = engine_imports(import_graph(module_files(ROOT, TREE)))
    assert not bad, "mmrl.model imports the engine:\n" + "\n".join(f"  {a} -> {b}" for a, b in bad)


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (  # top to bottom
    ("the command line", ("mmrl.cli", "mmrl.__main__")),
    ("the methods", ("mmrl.methods",)),
    ("the benchmarks", ("mmrl.benchmarks",)),
    ("the run", ("mmrl.run",)),
    ("the toy world", ("mmrl.toy",)),
    ("the engine", ("mmrl.engine",)),
    ("the settings", ("mmrl.config",)),
    ("the model and the GRPO maths", ("mmrl.model", "mmrl.grpo")),
    ("the package's version", ("mmrl",)),
)
"""The packages of ``mmrl`` as its layers: a module imports modules of its own layer and of the layers below
it, never above (the methods register themselves by name; the run finds them through the registries)."""


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index of ``module``'s layer in ``layers`` (0: the top), None for a module outside ``mmrl``."""
    for i, (_, prefixes) in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "mmrl") or module == "mmrl" \
                and "mmrl" in prefixes:
            return i
    return None


def against_the_layers(graph: dict[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
                       ) -> list[tuple[str, str]]:
    """The imports of a module of a layer from a layer above it."""
    bad = []
    for mod, targets in graph.items():
        mine = layer_of(mod, layers)
        for t in targets:
            theirs = layer_of(t, layers)
            if mine is not None and theirs is not None and theirs < mine:
                bad.append((mod, t))
    return sorted(bad)


def test_the_packages_of_mmrl_are_its_layers() -> None:
    files = module_files(ROOT, TREE)
    outside = [m for m in files if (m == "mmrl" or m.startswith("mmrl.")) and layer_of(m) is None]
    flat = [m for m in files if m.count(".") == 1 and m.startswith("mmrl.") and m != "mmrl.__main__"
            and not (ROOT / m.replace(".", "/") / "__init__.py").is_file()]
    assert not outside and not flat, f"modules of mmrl outside its layer packages: {outside or flat}"
    bad = against_the_layers(import_graph(files))
    assert not bad, "imports of a layer above:\n" + "\n".join(
        f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b in bad)
    # the checker sees a planted import upwards, and none in an import downwards or within a layer
    planted = {"mmrl.engine.trainer": {"mmrl.run.pipeline", "mmrl.config", "mmrl.engine.batch"},
               "mmrl.cli.commands": {"mmrl.engine.trainer"}, "mmrl.config.schema": {"mmrl"}}
    assert against_the_layers(planted) == [("mmrl.engine.trainer", "mmrl.run.pipeline")]


def command_line_imports(graph: dict[str, set[str]], package: str = "mmrl.methods",
                         above: tuple[str, ...] = ("mmrl.cli", "mmrl.run.pipeline"),
                         fronts: tuple[str, ...] = ("mmrl.run",)) -> list[tuple[str, str]]:
    """Imports of the command line or the pipeline (``above``, or a package front that loads it: ``fronts``) by
    ``package``'s modules: a method's own command reads its settings through :mod:`mmrl.run.recipe` and
    borrows the run's helpers from :mod:`mmrl.run.helpers`."""
    return sorted((mod, t) for mod, targets in graph.items() if mod == package or mod.startswith(package + ".")
                  for t in targets if t in above or t in fronts or t.startswith(tuple(a + "." for a in above)))


def test_the_methods_import_nothing_of_the_command_line_or_the_pipeline() -> None:
    bad = command_line_imports(import_graph(module_files(ROOT, TREE)))
    assert not bad, "mmrl.methods imports the command line or the pipeline:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in bad)
    # the checker sees a planted import
    planted = {"mmrl.methods.x": {"mmrl.cli.commands", "mmrl.run.recipe"}, "mmrl.methods.y": {"mmrl.run"},
               "mmrl.methods.z": {"mmrl.run.pipeline", "mmrl.run.helpers"}, "mmrl.run.pipeline": {"mmrl.cli"}}
    assert command_line_imports(planted) == [("mmrl.methods.x", "mmrl.cli.commands"), ("mmrl.methods.y", "mmrl.run"),
                                             ("mmrl.methods.z", "mmrl.run.pipeline")]


POLICY_OWNERS = ("policy", "ref", "reference")  # names a Policy goes by outside its own class


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` -> ``["a", "b", "c"]`` (``?`` for a part that is not a name: a call, a subscript)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return parts[::-1]


def _is_config(part: str) -> bool:
    return part in ("cfg", "run_config") or part.endswith("_cfg")


def foreign_writes(files: dict[str, Path], root: Path = ROOT) -> list[str]:
    """``file:line: target`` for each statement that writes (assigns, augments, deletes, ``setattr``s) an
    attribute of a policy (an object named ``policy``/``ref``/``reference``, as an attribute or a variable: its
    methods included) or of a run config (anything reached through ``cfg``). Writing ``self.x`` in a class's own
    methods is not foreign, nor writing an attribute of an object a policy holds (``policy.base.x``: the
    Hugging Face model's)."""
    out = []
    for path in files.values():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "setattr", "delattr") and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="<setattr>")]
            else:
                continue
            for target in targets:
                for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(el, ast.Attribute):
                        continue
                    chain = _chain(el)
                    owner = chain[:-1]
                    if owner in (["self"], ["cls"]):
                        continue
                    if owner[-1] in POLICY_OWNERS or any(_is_config(p) for p in owner):
                        out.append(f"{path.relative_to(root)}:{node.lineno}: {'.'.join(chain)}")
    return sorted(out)


def test_no_module_writes_a_policy_or_a_config() -> None:
    found = foreign_writes(module_files(ROOT, TREE))
    assert not found, ("attributes of a policy or a run config written from outside (use Policy.configure / "
                       "bind_ranks, or dataclasses.replace for a config):\n  " + "\n  ".join(found))


def test_the_checker_finds_a_planted_cycle_and_an_upward_import(tmp_path: Path) -> None:
    for pkg, files in {
        "mmrl_common": {"__init__.py": "", "errors.py": ""},
        "rewards": {"__init__.py": "", "a.py": "from rewards import b\n",
                    "b.py": "def f():\n    from rewards.a import x\n    import mmrl.engine.trainer\n",
                    "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rewards import d\n",
                    "d.py": "from rewards import c\n"},
        "vision": {"__init__.py": ""}, "video": {"__init__.py": ""}, "data_pipelines": {"__init__.py": ""},
        "mmrl": {"__init__.py": "", "engine/__init__.py": "", "engine/trainer.py": "from mmrl.methods import acre\n",
                 "methods/__init__.py": "", "methods/acre.py": "from mmrl.engine import trainer\n"},
    }.items():
        for name, text in files.items():
            path = tmp_path / pkg / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    graph = import_graph(module_files(tmp_path))
    assert cycles(import_graph(module_files(tmp_path), type_only=False)) == [
        ["mmrl.engine.trainer", "mmrl.methods.acre"], ["rewards.a", "rewards.b"]]  # c <-> d is a type-only import
    assert ["rewards.c", "rewards.d"] in cycles(graph)
    assert upward(graph) == [("mmrl.engine.trainer", "mmrl.methods.acre"), ("rewards.b", "mmrl.engine.trainer")]


# A reference to the team's research notes outside the repository (the shared folder beside it): nobody who
# clones the repository can follow it. Sources are cited directly (paper, arXiv id, repository and file) or
# written up under docs/. The patterns are spelt so that this file does not match them itself.
OUTSIDE_NOTES = re.compile(r"shared/+research|\.\./+shared\b|(?<![\w./-])research/[\w-]+\.md")
TEXT_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".toml", ".json")


def outside_references(root: Path, names: list[str]) -> list[str]:
    """``file:line: text`` for every line of the text files ``names`` (relative to ``root``) that points at
    the research notes outside the repository."""
    bad = []
    for name in names:
        path = root / name
        if not name.endswith(TEXT_SUFFIXES) or not path.is_file():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_NOTES.search(line):
                bad.append(f"{name}:{no}: {line.strip()}")
    return bad


def test_no_reference_to_notes_outside_the_repository() -> None:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert names, "git ls-files listed nothing"
    bad = outside_references(ROOT, names)
    assert not bad, "references to notes outside the repository:\n" + "\n".join(f"  {b}" for b in bad)


def test_the_reference_check_finds_planted_references(tmp_path: Path) -> None:
    texts = {"a.py": '"""see shared' + '/research/earl.md"""\n', "b.yaml": "# ../" + "shared/notes.md\n",
             "c.md": "as research" + "/eval.md §3 says\n", "d.md": "runs go to /shared/runs/7b\n",
             "e.txt": "shared" + "/research\n"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    assert [b.split(":")[0] for b in outside_references(tmp_path, sorted(texts))] == ["a.py", "b.yaml", "c.md"]


# No module takes another module's private (``_name``) names: a name another module needs is public in its
# home module. A private module (``pkg/_util.py``) is bound by name only inside its own package; ``from
# pkg._util import name`` takes a public name and is not checked.
PRIVATE_CHECKED = PACKAGES + ("perf",)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(files: dict[str, Path]) -> list[str]:
    """``file:line: what`` for every first-party private name a module of ``files`` takes from another one:
    ``from m import _name`` (``m`` not the module itself), ``import m._private`` or ``from m import _private``
    (a private submodule) from outside ``m``, and ``alias._name`` where ``alias`` is bound to another
    first-party module by an import (module-wide: a local variable that shadows the alias is not told apart).
    Third-party modules are not checked."""
    def first_party(name: str) -> bool:
        return name in files or any(f.startswith(name + ".") for f in files)

    def private_module(name: str, package: str) -> bool:  # a private part, seen from outside its package
        parts = name.split(".")
        return any(_private(p) and not f"{package}.".startswith(".".join(parts[:i]) + ".")
                   for i, p in enumerate(parts) if i)

    bad = []
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}  # name bound by an import -> the first-party module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if not first_party(a.name):
                        continue
                    if private_module(a.name, package):
                        bad.append(f"{rel}:{node.lineno}: import {a.name}")
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                source = import_source(package, node)
                if not first_party(source):
                    continue
                for a in node.names:
                    full = f"{source}.{a.name}"
                    if first_party(full):  # a submodule
                        if private_module(full, package):
                            bad.append(f"{rel}:{node.lineno}: from {source} import {a.name}")
                        aliases[a.asname or a.name] = full
                    elif _private(a.name) and source != mod:
                        bad.append(f"{rel}:{node.lineno}: from {source} import {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = ast.unparse(node.value)
                head, _, rest = owner.partition(".")
                if head in aliases:
                    target = aliases[head] + ("." + rest if rest else "")
                    if target in files and target != mod:
                        bad.append(f"{rel}:{node.lineno}: {owner}.{node.attr}")
    return sorted(set(bad))


def test_no_module_takes_another_modules_private_names() -> None:
    bad = private_imports(module_files(ROOT, PRIVATE_CHECKED))
    assert not bad, "private names taken from another module (make them public at home):\n" + "\n".join(
        f"  {b}" for b in bad)


def test_the_private_check_finds_planted_private_imports(tmp_path: Path) -> None:
    files = {
        "rewards/__init__.py": "",
        "rewards/a.py": "def _f(): pass\ndef g(): pass\n",
        "rewards/_util.py": "def h(): pass\n",
        "rewards/b.py": ("from rewards.a import _f, g\nfrom . import a as A\nfrom ._util import h\n"
                         "import torch.optim.optimizer\nfrom torch.optim.optimizer import _x\n"
                         "def k():\n    return A._f(), A.g(), torch.optim.optimizer._y, A.__name__\n"),
        "rewards/c.py": "def _own(): pass\ndef run():\n    from rewards.c import _own\n",
        "mmrl/__init__.py": "",
        "mmrl/d.py": ("import rewards._util\nfrom rewards import _util\nfrom rewards._util import h\n"
                      "import rewards.a\nx = rewards.a._f\n"),
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = [b.split(": ", 1)[1] for b in private_imports(module_files(tmp_path, ("rewards", "mmrl")))]
    assert sorted(found) == sorted(["from rewards.a import _f", "A._f", "import rewards._util",
                                    "from rewards import _util", "rewards.a._f"])


def test_the_checkers_find_planted_engine_imports_and_foreign_writes(tmp_path: Path) -> None:
    for name, text in {
        "mmrl/__init__.py": "", "mmrl/engine/trainer.py": "", "mmrl/model/__init__.py": "",
        "mmrl/model/vision.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmrl.engine.trainer import T\n",
        "mmrl/run/pipeline.py": ("def f(policy, cfg, trainer, x):\n    policy.padding_free = True\n    cfg.train.lr = 1.0\n"
                        "    trainer.ref.media = {}\n    self.policy.encode = print\n    setattr(policy, 'a', 1)\n"
                        "    policy.base.rope_deltas = None\n    x.y = 2\n"),
        "mmrl/ok.py": "class A:\n    def f(self, cfg):\n        self.cfg = cfg\n        self.n = 1\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    files = module_files(tmp_path, ("mmrl",))
    assert engine_imports(import_graph(files)) == [("mmrl.model.vision", "mmrl.engine.trainer")]
    assert [w.split(": ", 1)[1] for w in foreign_writes(files, tmp_path)] == [
        "policy.padding_free", "cfg.train.lr", "trainer.ref.media", "self.policy.encode", "policy.<setattr>"]
