"""``engine.run_strategy`` is the only way into decoding: no module calls the loops but it, and no
module outside the loops and the drafters drives a drafter's rounds itself.

Read from the source (``ast``), over every project module outside ``tests``: a call of
``verify_loop``, ``autoregressive_generate``, ``tree_round`` or the chain round ``_round`` (imported
from ``generation``, or read off a module) is allowed
only in ``engine/run.py`` (the way in) and ``generation/`` (the loops calling their own rounds); a
function that both asks a drafter for drafts (``.propose``, ``.propose_tree``,
``.propose_sampled_tree``) and tells it what was kept (``.update``), in one function or two, is a
round loop, allowed only in ``generation/`` and the drafters' own packages (``model_drafters/``,
``ngram_assisted/``) and inside a class deriving from ``Drafter`` (a drafter built on another). Mutations: planted modules with a loop call and with a private round loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOPS = {"verify_loop", "autoregressive_generate", "tree_round", "_round"}
PROPOSE = {"propose", "propose_tree", "propose_sampled_tree"}
LOOP_CALLERS = ("engine/run.py", "generation/")    # the way in, and the loops calling their own rounds
ROUND_OWNERS = ("generation/", "model_drafters/", "ngram_assisted/")


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def offences(path: str, source: str) -> list[str]:
    """What in ``source`` (the module at ``path``, relative to the root) goes around the one loop."""
    tree = ast.parse(source)
    found = []
    # The loops' names as this module has them: imported from ``generation``, or read off a module.
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("generation") for alias in node.names}

    def enters(call: ast.Call) -> bool:
        name = _name(call)
        on_module = (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                     and call.func.value.id != "self")         # ``verify.verify_loop(...)``, not a method
        return name in LOOPS and (on_module or name in imported)

    if not path.startswith(LOOP_CALLERS):
        found += [f"{path}:{node.lineno} calls {_name(node)}" for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and enters(node)]
    if not path.startswith(ROUND_OWNERS):
        # Calls on a drafter anywhere in the module but inside a drafter built on another (a class
        # deriving from ``Drafter``, whose methods pass each call on to the one it wraps).
        wrappers = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                    and any("Drafter" in ast.unparse(base) for base in node.bases)]
        inside = {id(n) for w in wrappers for n in ast.walk(w)}
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and id(node) not in inside
                 and isinstance(node.func, ast.Attribute)]
        proposes = [c for c in calls if c.func.attr in PROPOSE]
        if proposes and any(c.func.attr == "update" for c in calls):
            found.append(f"{path}:{proposes[0].lineno} proposes and updates a drafter: a round loop of its own")
    return found


def project_modules() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if not p.relative_to(ROOT).parts[0].startswith((".", "tests"))
            and "site-packages" not in p.parts]


def test_only_run_strategy_enters_the_loops_and_nobody_drives_rounds_of_their_own():
    found = [line for p in project_modules()
             for line in offences(p.relative_to(ROOT).as_posix(), p.read_text())]
    assert found == []
    assert len(project_modules()) > 100                  # the scan reads the project, not an empty tree


def test_mutation_a_private_loop_call_is_found():
    planted = "from generation.verify import verify_loop\n\ndef replay(p, d, t, o):\n    return verify_loop(p, d, t, o)\n"
    assert offences("advisor/replay.py", planted) == ["advisor/replay.py:4 calls verify_loop"]
    assert offences("engine/run.py", planted) == []
    assert offences("bench/x.py", "import generation.verify as v\nv.verify_loop(1, 2, 3, 4)\n") == \
        ["bench/x.py:2 calls verify_loop"]


def test_mutation_a_private_round_loop_is_found():
    planted = """
def drive(drafter, ids, output):
    while len(output):
        draft = one_round(drafter, ids)
        drafter.update(output[:1], None)
        output = output[1:]

def one_round(drafter, ids):
    return drafter.propose(ids, 3)[0]
"""
    assert len(offences("advisor/replay.py", planted)) == 1           # split over two functions, still found
    assert offences("generation/verify.py", planted) == []
    wrapper = """
class Cut(Drafter):
    def propose(self, ids, k, stop_below=None):
        return self.inner.propose(ids, k, stop_below)

    def update(self, new, top_k):
        self.inner.update(new, top_k)
"""
    assert offences("advisor/recorded.py", wrapper) == []
