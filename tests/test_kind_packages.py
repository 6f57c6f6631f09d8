"""A drafter kind is one package: code outside ``model_drafters/X`` reaches it only through its
registration (``model_drafters.X.kind``) and the names its package exports (``model_drafters.X``),
never through its other modules.

Read from the source (``ast``), every import anywhere in a module (inside functions too), over the
project's modules and scripts outside ``tests`` (the tests reach into a kind to test it). The shared
contract (``model_drafters.kind``) is everybody's. Mutations: a planted import of a kind's module
from outside, and the same import from inside the kind's own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS_DIR = ROOT / "model_drafters"
ALLOWED_MODULES = {"kind"}             # a kind's registration


def kind_packages() -> set[str]:
    return {p.parent.name for p in KINDS_DIR.glob("*/__init__.py")}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``source``; ``from a import b`` gives ``a.b`` too,
    since ``b`` may be a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def offences(path: str, source: str, kinds: set[str]) -> list[str]:
    """What ``source`` (the module at ``path``, relative to the root) imports of a kind's insides."""
    found = []
    for line, module in imported_modules(source):
        parts = module.split(".")
        if len(parts) < 3 or parts[0] != "model_drafters" or parts[1] not in kinds:
            continue
        if path.startswith(f"model_drafters/{parts[1]}/"):
            continue                                    # the kind's own package
        if parts[2] in ALLOWED_MODULES:
            continue
        offence = f"{path}:{line} imports {'.'.join(parts[:3])}"
        module_file = (KINDS_DIR / parts[1] / f"{parts[2]}.py").exists() or (KINDS_DIR / parts[1] / parts[2]).is_dir()
        if module_file and offence not in found:
            found.append(offence)
    return found


def checked_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if not p.relative_to(ROOT).parts[0].startswith((".", "tests"))
            and "site-packages" not in p.parts]


def test_code_outside_a_kind_reaches_it_only_through_its_registration_and_exports():
    kinds = kind_packages()
    assert {"selfdraft", "cross_tokenizer", "mtp", "eagle3", "gemma4_assistant"} <= kinds
    found = [o for p in checked_files() for o in offences(p.relative_to(ROOT).as_posix(), p.read_text(), kinds)]
    assert found == []


def test_mutation_an_import_of_a_kinds_module_is_found():
    kinds = kind_packages()
    planted = "def step():\n    from model_drafters.selfdraft.lean import lean_of\n    return lean_of\n"
    assert offences("advisor/costs.py", planted, kinds) == ["advisor/costs.py:2 imports model_drafters.selfdraft.lean"]
    assert offences("advisor/costs.py", "from model_drafters.selfdraft import shared_cache\n", kinds) == []  # not a module
    assert offences("model_drafters/selfdraft/drafter.py", planted, kinds) == []
    assert offences("engine/kinds.py", "from model_drafters.mtp.kind import KIND\n", kinds) == []
