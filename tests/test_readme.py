"""The README's examples run as written, and CI runs the README's test command."""

import re
import subprocess
import sys
from pathlib import Path

from hybrid import MIXERS
from hybrid.cli import VERBS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    commands = re.findall(r"```bash\n(.*?)\n```", README.split("## Quickstart")[1].split("\n## ")[0], flags=re.S)
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_cli_help_lists_every_verb_on_a_line_of_its_own():
    result = subprocess.run([sys.executable, "-m", "hybrid.cli", "--help"], capture_output=True, text=True,
                            check=True)
    lines = result.stdout.splitlines()
    for verb in VERBS:
        assert sum(line.split()[:1] == [verb] for line in lines) == 1, verb


def test_every_verb_is_in_the_readme():
    for verb in VERBS:
        assert f"hybrid {verb}" in README, verb


def test_cli_demo_runs_on_a_tiny_model(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hybrid.cli", "demo", "max_new_tokens=4", "d_model=16", "repeats=1", "uncached=true"],
        capture_output=True, text=True, check=True, cwd=tmp_path)
    growing = [name for name, mixer in MIXERS.items() if not mixer.constant_state]
    assert result.stdout.count("ms/token") == len(MIXERS) + len(growing)  # every mixer, and uncached ones
    for name in MIXERS:
        assert f"{name} decoder" in result.stdout
    assert not list(tmp_path.iterdir())  # no run folder, no log file


def test_the_readme_test_command_installs_every_optional_package_the_tests_import():
    # A test that skips for a missing package has never run in CI: the extra the README installs must
    # bring every package that a test imports with pytest.importorskip.
    import tomllib

    command = re.findall(r"```bash\n(.*?)\n```", README.split("## Quickstart")[1], flags=re.S)[1]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def resolve(extra: str) -> set[str]:
        names = set()
        for requirement in extras[extra]:
            name = re.split(r"[<>=\[ ]", requirement)[0]
            names |= resolve(re.search(r"\[(\w+)\]", requirement).group(1)) if name == "hybrid" else {name}
        return names

    installed = set().union(*(resolve(extra) for extra in re.search(r'-e "\.\[([\w,]+)\]"', command)
                              .group(1).split(",")))
    imported = {re.match(r"[\w-]+", name).group(0) for path in (ROOT / "tests").rglob("*.py")
                for name in re.findall(r'importorskip\("([\w.]+)"', path.read_text())}
    assert imported - {"tomllib"} <= installed, imported - installed
