"""The command line starts at once: ``mmrl --help`` and ``mmrl data validate`` import no torch, the schema
(``mmrl.config``) imports none, and a command's listing line is the one its own parser gives, although the
listing is built without importing the command's module."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mmrl import cli

HEAVY = ("torch", "transformers", "mmrl.engine.trainer", "mmrl.toy.tiny_models", "mmrl.methods")


def imported_by(code: str) -> set[str]:
    """The heavy modules (:data:`HEAVY`) in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.splitlines()[-1].split()[1:])


@pytest.mark.parametrize(("argv", "needs"), [(["--help"], set()), ([], set()), (["data", "--help"], set()),
                                              (["data", "validate", "--help"], set()),
                                              (["models", "make-tiny", "--help"], {"mmrl.toy.tiny_models"})])
def test_the_help_and_data_commands_import_no_torch(argv: list[str], needs: set[str]) -> None:
    code = f"from mmrl.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert imported_by(code) == needs


def test_config_show_of_a_7b_sized_folder_imports_no_torch(tmp_path) -> None:
    from tiny_runs import as_7b, own_model

    big = as_7b(own_model(tmp_path / "tiny"))
    code = ("import contextlib, io\nfrom mmrl.cli import main\nwith contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    main(['config', 'show', '--sources', '--model', {str(big)!r}])\n"
            "assert 'model.dtype: bf16' in out.getvalue(), out.getvalue()[:2000]")  # the preset read: the folder seen
    assert imported_by(code) == set()


def test_the_schema_imports_no_torch_and_the_checker_sees_it() -> None:
    assert imported_by("import mmrl.config\nimport mmrl.run.recipe") == set()
    assert "torch" in imported_by("import mmrl.engine.trainer")  # the probe sees an import


def _listing(parser: argparse.ArgumentParser) -> dict[str, str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {c.dest: c.help for c in sub._choices_actions}


def _sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_each_listing_line_is_the_one_its_command_gives() -> None:
    stubs = _listing(cli.build_parser(only=""))
    built = _listing(cli.build_parser())
    assert set(stubs) == set(cli.COMMANDS) and stubs == built
    data_stubs = _listing(_sub(cli.build_parser(only="data", sub_only=""), "data"))
    data_built = _listing(_sub(cli.build_parser(only="data"), "data"))
    assert set(cli.DATA_COMMANDS) <= set(data_stubs) and data_stubs == data_built


def test_only_the_command_that_runs_is_built() -> None:
    parser = cli.build_parser(only="data", sub_only="validate")
    data = _sub(parser, "data")
    validate = _sub(data, "validate")
    assert validate.parse_args(["x.jsonl"]).path == "x.jsonl"
    with pytest.raises(SystemExit):  # a method's sub-command listed, not built: no options of its own
        _sub(data, "select-variance").parse_args(["--k", "4"])
