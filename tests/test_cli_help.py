"""`--help` of every command line says what it does, names its guide (a file that exists)
and shows a command to start from; the launcher's names both engines and the default here."""

import pathlib
import re

import pytest

from mxrec import launch
from mxrec.serving import __main__ as serving_main
from mxrec.streaming import __main__ as streaming_main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _guides(text: str):
    return set(re.findall(r"docs/[A-Z_]+\.md", text))


@pytest.mark.parametrize("argv, guide", [
    (["--help"], "docs/STREAMING.md"),
    (["train", "--help"], "docs/STREAMING.md"),
    (["replay", "--help"], "docs/SERVING.md"),
])
def test_streaming_help_names_its_guides(capsys, argv, guide):
    text = _help(lambda a: streaming_main.build_parser().parse_args(a), argv, capsys)
    assert guide in text and "python -m mxrec.streaming train --data" in text
    assert all((ROOT / path).is_file() for path in _guides(text)), _guides(text)


def test_serving_help_names_its_guide_and_how_versions_are_published(capsys):
    text = _help(lambda a: serving_main.build_parser().parse_args(a), ["--help"], capsys)
    assert "docs/SERVING.md" in text and "export_version" in text
    assert "python -m mxrec.serving --export-base" in text
    assert all((ROOT / path).is_file() for path in _guides(text))


def test_launch_help_names_the_engines_and_the_default_here(capsys):
    text = _help(launch.main, ["--help"], capsys)
    assert len(text.splitlines()) > 20
    assert re.search(r"^  mpi ", text, re.M) and re.search(r"^  grpc ", text, re.M)
    assert f"On this machine the default engine is {launch.default_engine()}." in text
    assert "docs/MULTIWORKER.md" in text and "python -m mxrec.launch -n 2" in text
    assert all((ROOT / path).is_file() for path in _guides(text))
