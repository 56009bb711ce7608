"""Every script under ``tests/`` that a test starts as its own processes (a ``__main__`` block) ends through
``probe_exit.leave()``: the process group left and the process ended without the interpreter's C++ teardown,
where a rank once aborted after its work was done (tests/probe_exit.py says why). Read with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    out = []
    for path in sorted(TESTS.glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            out.append(path)
    return out


def ends_by_leaving(path: Path) -> bool:
    """``main`` (the function the ``__main__`` block calls) calls ``leave()`` as its last statement."""
    tree = ast.parse(path.read_text())
    main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
    if main is None or not main.body:
        return False
    last = main.body[-1]
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and ast.unparse(last.value.func) == "leave"


def test_every_multi_process_script_ends_by_leaving_the_group() -> None:
    found = scripts()
    assert {p.name for p in found} >= {"media_spread_probe.py", "zero3_generation_probe.py", "deepspeed_nan_probe.py"}
    bad = [p.name for p in found if not ends_by_leaving(p)]
    assert not bad, f"scripts that do not end with probe_exit.leave(): {bad}"


def test_the_check_tells_a_script_that_does_not_leave(tmp_path: Path) -> None:
    """The checker itself, on planted scripts: one that leaves passes, one that stops after its work fails."""
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("def main():\n    work()\n    leave()\n\nif __name__ == '__main__':\n    main()\n")
    bad.write_text("def main():\n    work()\n    leave()\n    more()\n\nif __name__ == '__main__':\n    main()\n")
    assert ends_by_leaving(good) and not ends_by_leaving(bad)
