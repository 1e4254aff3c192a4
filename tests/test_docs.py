"""User-facing text points only at files users have.

README.md, ARCHITECTURE.md, docs/ and every module of the package may refer to the behaviour
spec as ``docs/spec.md §n`` (in the repository), never to files outside it (the original's data,
a spec next to the checkout), and never by a bare ``SPEC §n``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "docs" / "spec.md"


def user_facing_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "ARCHITECTURE.md"]
    files += sorted((REPO / "docs").rglob("*.md"))
    files += sorted((REPO / "soulmem_torch").rglob("*.py"))
    return [f for f in files if f.is_file()]


def hits(pattern: str) -> list[str]:
    regex = re.compile(pattern)
    out = []
    for path in user_facing_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if regex.search(line):
                out.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    return out


def test_no_reference_to_files_outside_the_repository() -> None:
    found = hits(r"\.\./shared|/work/shared|SPEC\.md|shared/fixtures|shared/STYLE")
    assert not found, "references to files users do not have:\n" + "\n".join(found)


def test_the_spec_has_every_section_docstrings_cite() -> None:
    text = SPEC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))
    assert {str(n) for n in range(1, 10)} <= headings, sorted(headings)
    cited = set()
    for line in hits(r"(?:SPEC|spec\.md) §"):
        cited.update(re.findall(r"§\s?(\d+(?:\.\d+)?)", line))
    missing = sorted(c for c in cited if c not in headings and c.split(".")[0] not in headings)
    assert not missing, f"docs/spec.md has no section {missing}"


def test_spec_links_in_markdown_resolve() -> None:
    for path in [REPO / "README.md", REPO / "ARCHITECTURE.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)", path.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def test_no_bare_spec_references() -> None:
    found = hits(r"(?<![\w/.])SPEC §")
    assert not found, f"{len(found)} bare 'SPEC §n' references (should be 'docs/spec.md §n'):\n" + (
        "\n".join(found[:20])
    )


def readme_cli_commands() -> list[list[str]]:
    """The argument lists of every ``soulmem ...`` command in README's ```bash blocks
    (continuations joined, comments dropped, split at ``|``, ``&&``, ``;``, ``&``, redirections
    left out); usage synopses with ``[optional]`` parts and ``$(...)`` are left out."""
    import shlex

    text = (REPO / "README.md").read_text(encoding="utf-8")
    operators = {"|", "||", "&&", ";", "&"}
    redirections = {">", ">>", "<", ">&", "&>", "2>", "2>>"}
    commands = []
    for block in re.findall(r"^```bash[ \t]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if "[" in line or "$(" in line or "soulmem " not in line:
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            current: list[str] = []
            skip = False
            for token in [*lexer, ";"]:
                if skip:
                    skip = False
                elif token in redirections:
                    skip = True
                elif token in operators:
                    if current[:1] == ["soulmem"]:
                        commands.append(current[1:])
                    current = []
                else:
                    current.append(token)
    return commands


def test_readme_cli_commands_parse() -> None:
    """The flags the README shows exist (parsed by the real parser, nothing is run)."""
    from soulmem_torch.cli import build_parser

    commands = readme_cli_commands()
    assert any(c[:1] == ["add"] for c in commands)
    assert any("--dry-run" in c for c in commands)
    parser = build_parser()
    for args in commands:
        try:
            parser.parse_args(args)
        except Exception as exc:  # _UsageError: one line naming the bad flag
            raise AssertionError(f"README command does not parse: soulmem {args}: {exc}") from None
