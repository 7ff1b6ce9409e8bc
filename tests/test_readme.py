"""The README and the docs keep their promises: examples run, commands parse, links and named files exist.

Every ```python block of README.md and docs/*.md runs as written; every `hybrid ...` line of their ```bash
blocks is a command the `hybrid` entry point accepts (its keys exist, its config groups compose); every
relative link resolves, anchors included; every repository path and `hybrid.*` name they quote in code exists;
and the README's two set-up commands are the ones a fresh user and CI run.
"""

import importlib.metadata
import pydoc
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hybrid import MIXERS
from hybrid.cli import VERBS
from hybrid.cli.generate import qualify_generation_option
from hybrid.cli.overrides import CONFIG_MODULE, check_command_line, read_command_line

ROOT = Path(__file__).resolve().parents[1]
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
README = PAGES["README.md"]
CI_SCRIPT = (ROOT / ".ci" / "run").read_text()
REPOSITORY_FOLDERS = (".ci/", "configs/", "docs/", "hybrid/", "notebooks/", "results/", "tests/")


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the fenced code blocks of ``language`` in ``text``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line), up to the next heading of the same level."""
    level = heading.split()[0]
    return text.split(f"\n{heading}\n")[1].split(f"\n{level} ")[0]


def setup_commands() -> list[str]:
    commands = [block.strip() for block in fenced(section(README, "## Install"), "bash")]
    assert len(commands) == 2, "the README's Install section holds exactly two commands"
    return commands


def hybrid_commands(block: str) -> list[str]:
    """Each ``hybrid ...`` command of a bash block, as the shell would pass its words: continued lines joined,
    split at pipes, ``&&`` and ``;``, redirections and comments left out."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        redirected = False
        for word in [*lexer, ";"]:
            if word in ("<", ">", ">>"):
                redirected = True  # the next word names a file, not an argument
            elif set(word) <= set("|&;()"):  # an operator: the command so far ends
                if command[:1] == ["hybrid"]:
                    commands.append(shlex.join(command))
                command, redirected = [], False
            elif redirected:
                redirected = False
            else:
                command.append(word)
    return commands


def python_examples() -> dict[str, str]:
    """Every distinct Python example, keyed by where it first appears."""
    examples = {}
    for page, text in PAGES.items():
        for number, block in enumerate(fenced(text, "python"), 1):
            if block not in examples.values():
                examples[f"{page}:{number}"] = block
    return examples


def shell_commands() -> list[tuple[str, str]]:
    return [(page, command) for page, text in PAGES.items() for block in fenced(text, "bash")
            for command in hybrid_commands(block)]


@pytest.mark.parametrize("block", list(python_examples().values()), ids=list(python_examples()))
def test_every_python_example_runs_as_written(block, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # examples write model folders where they run
    exec(compile(block, "example", "exec"), {})


@pytest.mark.parametrize("page, command", shell_commands(), ids=[f"{p}: {c}" for p, c in shell_commands()])
def test_every_hybrid_command_is_one_the_command_line_accepts(page, command):
    _, verb, *arguments = shlex.split(command, comments=True)
    assert verb in VERBS, f"{page}: unknown verb {verb!r}"
    if verb in ("generate", "distill-data"):  # as hybrid.cli.run_verb reads these verbs' bare generation options
        arguments = [qualify_generation_option(argument) for argument in arguments]
    parsed = read_command_line(arguments)
    assert parsed is not None, f"{page}: Hydra cannot parse {command!r}"
    check_command_line(verb, VERBS[verb].config, arguments)  # raises naming an unknown or missing key
    # The groups it picks exist and the whole config composes, with each value of each sweep.
    values = [[override.input_line] if not override.is_sweep_override()
              else [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
              for override in parsed[1] if not override.key_or_group.startswith("hydra")]
    firsts = [choices[0] for choices in values]
    variants = {tuple(firsts[:i] + [value] + firsts[i + 1:]) for i, choices in enumerate(values) for value in choices}
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        for overrides in variants or {()}:
            compose(VERBS[verb].config, overrides=list(overrides))


def test_the_two_setup_commands_are_what_a_fresh_user_and_ci_run():
    user, developer = (command.split(" && ") for command in setup_commands())
    *fresh, install, main_job = user
    assert developer[:len(fresh)] == fresh, "both start from the same fresh environment and torch"
    assert install == "pip install -e .", "the main job runs on the default install, no extra"
    assert developer[len(fresh)] == 'pip install -e ".[dev]"'
    assert " && ".join(developer) in CI_SCRIPT.splitlines(), ".ci/run runs the README's test command as written"
    # The Quickstart's quoted figures are this command's: results/quickstart/run.sh runs it.
    assert shlex.split(main_job)[:2] == ["hybrid", "fit"]
    assert main_job in (ROOT / "results" / "quickstart" / "run.sh").read_text()


def test_ci_runs_only_tools_the_test_command_installs():
    test_command = setup_commands()[1]
    lines = CI_SCRIPT.splitlines()
    tools = {words[0] for line in lines[lines.index(test_command) + 1:] if (words := shlex.split(line, comments=True))}
    assert tools, ".ci/run checks more than the tests (the linter, the docs)"
    installed = installed_by(re.search(r'-e "\.\[([\w,]+)\]"', test_command).group(1).split(","))
    for tool in tools:
        assert any(installs_command(name, tool) for name in installed), f"no extra .ci/run installs brings {tool}"


def installs_command(distribution: str, command: str) -> bool:
    """Whether the installed ``distribution`` puts ``command`` on the PATH (a console script or a binary)."""
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    scripts = {entry.name for entry in found.entry_points if entry.group == "console_scripts"}
    binaries = {Path(file).stem for file in found.files or [] if Path(file).parent.name in ("bin", "Scripts")}
    return command in scripts | binaries


def installed_by(extras: list[str]) -> set[str]:
    """The distributions pyproject.toml's ``extras`` install, with everything they require, by canonical name."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pending = [Requirement(f"{project['name']}[{','.join(extras)}]")]
    seen: set[tuple[str, str]] = set()
    names = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        for extra in requirement.extras or {""}:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            names.add(name)
            if name == canonicalize_name(project["name"]):
                listed = project["dependencies"] + project["optional-dependencies"].get(extra, [])
                pending += [Requirement(line) for line in listed]
                continue
            try:
                required = importlib.metadata.requires(requirement.name) or []
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed here: what it requires cannot be read, and the check names what is missing
            for line in required:
                dependency = Requirement(line)
                if not dependency.marker or dependency.marker.evaluate({"extra": extra}):
                    pending.append(dependency)
    return names


def anchors(text: str) -> set[str]:
    """The ids of a page's headings: an explicit ``{#id}``, else the heading slugified as Python-Markdown does."""
    ids = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        explicit = re.search(r"\{#([\w-]+)\}\s*$", heading)
        if explicit:
            ids.add(explicit.group(1))
            continue
        plain = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
        ids.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", plain).strip().lower()))
    return ids


def links() -> list[tuple[str, str]]:
    return [(page, target) for page, text in PAGES.items()
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page, target", links(), ids=[f"{p} -> {t}" for p, t in links()])
def test_every_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    resolved = (ROOT / page).parent / path if path else ROOT / page
    assert resolved.exists(), f"{page} links to {target}, which does not exist"
    if anchor:
        assert anchor in anchors(resolved.read_text()), f"{page} links to {target}: no such heading"


def quoted(pattern: str) -> list[str]:
    """Every code span of the README and the docs (outside fenced blocks) that matches ``pattern`` whole."""
    spans = set()
    for text in PAGES.values():
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        spans |= {span for span in re.findall(r"`([^`\n]+)`", prose) if re.fullmatch(pattern, span)}
    return sorted(spans)


@pytest.mark.parametrize("path", quoted(rf"(?:{'|'.join(map(re.escape, REPOSITORY_FOLDERS))})[\w./*-]*(?:::\w+)?"))
def test_every_file_the_docs_name_exists(path):
    path, _, test = path.partition("::")
    matches = list(ROOT.glob(path.rstrip("/")))
    assert matches, f"{path} is named in the docs but does not exist"
    if test:
        assert re.search(rf"^def {test}\(", matches[0].read_text(), flags=re.M), f"{path} has no {test}"


@pytest.mark.parametrize("name", quoted(r"hybrid(?:\.\w+)+"))
def test_every_hybrid_name_the_docs_quote_exists(name):
    assert pydoc.locate(name) is not None, f"{name} is quoted in the docs but cannot be imported"


def test_every_verb_has_its_line_in_the_getting_started_table():
    table = section(PAGES["docs/getting-started.md"], "## The command line")
    for verb in VERBS:
        assert re.search(rf"^\| `hybrid {verb}` \|", table, flags=re.M), verb


def test_cli_help_lists_every_verb_on_a_line_of_its_own():
    result = subprocess.run([sys.executable, "-m", "hybrid.cli", "--help"], capture_output=True, text=True,
                            check=True)
    lines = result.stdout.splitlines()
    for verb in VERBS:
        assert sum(line.split()[:1] == [verb] for line in lines) == 1, verb


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
    # A test that skips for a missing package has never run in CI: the extras the README's test command
    # installs must bring every package that a test imports with pytest.importorskip.
    extras = re.search(r'-e "\.\[([\w,]+)\]"', setup_commands()[1]).group(1).split(",")
    imported = {re.match(r"[\w-]+", name).group(0) for path in (ROOT / "tests").rglob("*.py")
                for name in re.findall(r'importorskip\("([\w.]+)"', path.read_text())}
    missing = {name for name in imported - {"tomllib"} if canonicalize_name(name) not in installed_by(extras)}
    assert not missing, missing
