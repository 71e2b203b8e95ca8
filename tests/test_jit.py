"""sim.jit's kernels: compiled on their first call, not at import, with the behaviour of a
kernel numba compiled for its signatures at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from sim.jit import kernel

REPO = Path(__file__).resolve().parents[1]

TWO_KERNELS = '''
from sim.jit import kernel


@kernel("i8(i8)")
def plus_one(x):
    return x + 1


@kernel("i8(i8)")
def plus_two(x):
    return plus_one(plus_one(x))


@kernel("f8(f8)")
def half(x):
    return x / 2
'''


def test_a_kernel_compiles_on_its_first_call_not_at_import(tmp_path):
    """Importing a module of kernels compiles none of them (numba's cache gets no index); a
    call compiles that kernel and the kernels it calls, no other; a later process loads the
    called ones from the cache and compiles nothing."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "twokern.py").write_text(TWO_KERNELS)
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "mod"), str(REPO)]))
    env.pop("NUMBA_DISABLE_JIT", None)

    def run(code):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r

    def indexed():
        return sorted(p.name.split("-")[0] for p in cache.rglob("*.kvsim.nbi"))

    r = run("import twokern")
    assert indexed() == [] and "compiling" not in r.stderr
    r = run("import twokern; print(twokern.plus_two(40))")
    assert r.stdout.split() == ["42"]
    assert indexed() == ["twokern.plus_one", "twokern.plus_two"]
    assert r.stderr.count("kvsim: compiling the simulator's kernels") == 1, r.stderr
    r = run("import twokern; print(twokern.plus_two(1), twokern.plus_one(1))")
    assert r.stdout.split() == ["3", "2"] and "compiling" not in r.stderr


HELPERS = '''
from sim.jit import inline, kernel


@inline
def scale(x):
    return x * 3


@kernel("i8(i8)")
def plus_one(x):
    return x + 1
'''

USER = '''
import helpers
from helpers import plus_one, scale
from sim.jit import kernel


@kernel("i8(i8)", depends=(helpers,))
def scaled_plus_one(x):
    return plus_one(scale(x))
'''


def test_declaring_kernels_imports_no_numba_until_one_is_called(tmp_path):
    """Modules declaring kernels and inline helpers import no numba; the first call imports it,
    builds every declared kernel and helper, and puts numba's object in place of each stand-in
    in every module holding it (a name imported from another module included), so a kernel
    calling another module's kernel and helper compiles and returns their result."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "helpers.py").write_text(HELPERS)
    (tmp_path / "mod" / "user.py").write_text(USER)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "mod"), str(REPO)]))
    env.pop("NUMBA_DISABLE_JIT", None)
    code = ("import sys, helpers, user; print('numba' in sys.modules); "
            "print(user.scaled_plus_one(4)); print('numba' in sys.modules); "
            "print(type(user.plus_one).__name__, type(helpers.plus_one).__name__, "
            "type(user.scaled_plus_one).__name__, type(user.scale).__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:4] == ["False", "13", "True",
                                        "_LazyKernel _LazyKernel _LazyKernel CPUDispatcher"]


@kernel("i8(i8)")
def _lazy_plus_one(x):
    return x + 1


@numba.njit("i8(i8)", nogil=True)
def _eager_plus_one(x):
    return x + 1


@pytest.mark.parametrize("arg", [41, 3.7, True, np.int32(-5), np.float32(2.5), np.uint64(7)])
def test_a_kernel_converts_arguments_as_numba_njit_with_signatures(arg):
    """A first call with any argument numba can convert to the declared signature gives what
    ``numba.njit(signature)`` gives (numba's unsafe conversions: a float is truncated)."""
    assert _lazy_plus_one(arg) == _eager_plus_one(arg)
    assert _lazy_plus_one.signatures == _eager_plus_one.signatures


def test_a_kernel_refuses_arguments_no_signature_takes():
    """An argument no declared signature takes raises numba's TypeError, as a kernel compiled at
    import does; no new signature is compiled for it."""
    for f in (_lazy_plus_one, _eager_plus_one):
        with pytest.raises(TypeError, match="No matching definition"):
            f("forty-one")
        with pytest.raises(TypeError, match="No matching definition"):
            f(np.ones(2))
    assert _lazy_plus_one.signatures == _eager_plus_one.signatures


def _compiled_defs(tree):
    """Names of the module's functions decorated with ``kernel(...)`` or ``inline``, each with
    its decorator's ``depends`` module names (a set) and the names its body calls."""
    import ast
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            call = dec if isinstance(dec, ast.Call) else None
            name = (call.func if call else dec)
            name = getattr(name, "id", getattr(name, "attr", None))
            if name not in ("kernel", "inline"):
                continue
            deps = set()
            for kw in (call.keywords if call else ()):
                if kw.arg == "depends" and isinstance(kw.value, (ast.Tuple, ast.List)):
                    deps = {getattr(e, "id", getattr(e, "attr", None)) for e in kw.value.elts}
            calls = {n.func.id for n in ast.walk(node)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            out[node.name] = (name, deps, calls)
    return out


def test_every_kernel_names_the_modules_of_the_compiled_helpers_it_calls():
    """numba's cache stamps a kernel with its own file only: a kernel that calls a ``kernel`` or
    ``inline`` function defined in another module of sim/ or policies/ lists that module in
    ``kernel(..., depends=...)``, so a change there compiles the caller again (sim.jit.kernel)."""
    import ast
    import importlib

    files = sorted(p for d in ("sim", "policies") for p in (REPO / d).rglob("*.py"))
    trees = {p: ast.parse(p.read_text()) for p in files}
    compiled = {}  # (module, name) -> kind
    for p, tree in trees.items():
        mod = ".".join(p.relative_to(REPO).with_suffix("").parts)
        for fn, (kind, _, _) in _compiled_defs(tree).items():
            compiled[(mod, fn)] = kind
    origins = {}
    for p, tree in trees.items():
        mod = ".".join(p.relative_to(REPO).with_suffix("").parts)
        pkg = mod.rsplit(".", 1)[0] if p.name != "__init__.py" else mod
        origin = {}  # local name -> (module it comes from, its name there)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                   pkg) if node.level else node.module
                for a in node.names:
                    origin[a.asname or a.name] = (base, a.name)
        origins[p] = (mod, origin)
    reexports = {(mod, local): src for mod, origin in origins.values() for local, src in origin.items()}
    missing = []
    checked = 0
    for p, tree in trees.items():
        mod, origin = origins[p]
        for fn, (kind, deps, calls) in _compiled_defs(tree).items():
            if kind != "kernel":
                continue
            for c in calls:
                src = origin.get(c)
                while src is not None and src not in compiled and src in reexports:
                    src = reexports[src]  # (a name imported through a module that imports it)
                if src is None or src not in compiled:
                    continue
                checked += 1
                if src[0].rsplit(".", 1)[-1] not in deps:
                    missing.append(f"{mod}.{fn} calls {src[0]}.{src[1]} without depends")
    assert checked > 10
    assert not missing, "\n".join(missing)
