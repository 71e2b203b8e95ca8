"""The ``kvsim`` command line's checks before Hydra composes the config: overrides Hydra's
grammar cannot parse or whose sweep Hydra would end with a traceback, a key given twice (Hydra
keeps the last), a kvsim setting deleted with ``~``, and a cluster launcher whose plugin or
scheduler is missing. Each returns the one-line error, or None. The check of true/false options
(:func:`non_boolean_override`) is :mod:`sim.validation`'s, which also checks a sweep's values
and the config files."""

from __future__ import annotations

from omegaconf import DictConfig

from ..validation import non_boolean_override, schema_type  # noqa: F401 - (the checks' home)


# kvsim's cluster launcher configs (experiments/conf/hydra/launcher/) -> (Hydra plugin module,
# the extra that installs it)
LAUNCHER_PLUGINS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                    "ray_cluster": ("hydra_plugins.hydra_ray_launcher", "ray")}


def missing_launcher_plugin(args: list[str]) -> str | None:
    """The error for ``hydra/launcher=slurm`` or ``=ray_cluster`` when the Hydra plugin it
    extends is not installed (Hydra's own message names a config it cannot load, exit 1), with
    the ``pip install`` that adds it; None otherwise."""
    import importlib.util

    for a in args:
        if a.lstrip("+").startswith("hydra/launcher="):
            name = a.split("=", 1)[1]
            if name in LAUNCHER_PLUGINS:
                mod, extra = LAUNCHER_PLUGINS[name]
                try:
                    found = importlib.util.find_spec(mod) is not None
                except ModuleNotFoundError:  # (the hydra_plugins namespace itself is absent)
                    found = False
                if not found:
                    return (f"{a}: its Hydra plugin ({mod}) is not installed; expected "
                            f"pip install -e '.[{extra}]' in this environment first")
    return None


def missing_cluster(args: list[str]) -> str | None:
    """The error for a sweep with ``hydra/launcher=slurm`` on a host where SLURM's ``srun``
    is not on the PATH (submitit ends with a traceback: Could not detect "srun"); None
    otherwise."""
    import shutil

    for a in args:
        if a.lstrip("+").startswith("hydra/launcher=") and a.split("=", 1)[1] == "slurm" \
                and shutil.which("srun") is None:
            return (f"{a}: this host has no SLURM (srun is not on the PATH); expected to run "
                    f"the sweep on a SLURM login node, or on this machine with "
                    f"hydra/launcher=local")
    return None


def duplicate_override_key(args: list[str]) -> str | None:
    """The error for the first override key given twice on the command line (``seed=1
    seed=2``, ``tiers=gpu_host tiers=gpu_only``): Hydra silently keeps the last value, which
    hides a typo or a sweep written as two overrides; or for a ``~key`` deletion of a kvsim
    setting (every one is typed and needed: Hydra failed with a traceback or exit 1). None when
    every key appears once. ``+``/``++`` prefixes count as the same key; options and
    ``~hydra...`` deletions are left to Hydra."""
    seen: dict[str, str] = {}
    for a in args:
        if a.startswith("~") and not a.startswith(("~hydra.", "~hydra/")):
            key = a[1:].split("=", 1)[0]
            return (f"cannot delete config key '{key}' ({a}): every kvsim setting needs a value; "
                    f"expected an override that sets it ({key}=...)")
        if a.startswith(("-", "~")) or "=" not in a:
            continue
        key = a.split("=", 1)[0].lstrip("+")
        if key in seen:
            v1, v2 = seen[key].split("=", 1)[1], a.split("=", 1)[1]
            both = ("" if "(" in v1 + v2 else  # (a comma list cannot hold range() or choice())
                    f" (for a sweep over both: kvsim -m {key}={v1},{v2})")
            return (f"override key '{key}' given twice ({seen[key]}, {a}); expected one value "
                    f"per key{both}")
        seen[key] = a
    return None


def unresolvable_interpolation(cfg: DictConfig, overrides: list[str]) -> str | None:
    """The error for the first ``${...}`` interpolation of the composed run config ``cfg`` that
    cannot be resolved (``cache.block_size=${nope}``: no such key; an unknown resolver; an
    unset environment variable), naming the override that set it when one did (``overrides``:
    the command line's, as given; :func:`sim.callbacks.interpolation_error`); None when all
    resolve. Hydra ended with a traceback from OmegaConf otherwise. (The folders Hydra makes
    before the job runs are checked by :class:`sim.callbacks.FailedRunsExit`.)"""
    from ..callbacks import first_unresolvable, interpolation_error

    found = first_unresolvable(cfg)
    return None if found is None else interpolation_error(found[0], found[1], overrides)


def command_line_overrides(argv: list[str]) -> list[str]:
    """The overrides among the command's arguments, as Hydra's own argument parser separates
    them from its options and their values (``--config-dir DIR``, ``--cfg job``, ``--info
    config``); none for shell completion (``-sc install=bash``: Hydra's, not overrides) or
    arguments Hydra's parser rejects (Hydra prints its usage error)."""
    from hydra._internal.utils import get_args_parser

    import contextlib
    import io

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ns = get_args_parser().parse_args(argv)
    except SystemExit:  # (--version, or an option Hydra's parser rejects: Hydra says so)
        return []
    return [] if ns.shell_completion else list(ns.overrides)


def unparsable_override(args: list[str], sweep: bool = True, single: bool | None = None) -> str | None:
    """The error for the first ``key=value`` argument Hydra's override grammar cannot parse
    (``cache.block_size=16,,32``; an unquoted ``~``, or a character outside ASCII, in a path),
    or, in a ``sweep``, ``hydra.launcher.n_jobs`` 0 (joblib ends with a traceback), with how to
    write it; None when every one parses. Hydra exits 1 with its grammar error otherwise.
    ``args``: the overrides (:func:`command_line_overrides`); arguments without ``=`` are left
    to Hydra. ``single`` (default: not ``sweep``): a single run, where a sweep's values are an
    error (:func:`_sweep_problem`)."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    if single is None:
        single = not sweep
    sweeper = not any(a.lstrip("+").startswith("hydra/sweeper=") for a in args)
    parser = None
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        parser = parser or OverridesParser.create()
        try:
            o = parser.parse_override(a)
            if sweep and key.lstrip("+") == "hydra.launcher.n_jobs" and not o.is_sweep_override() \
                    and re.fullmatch(r"[+-]?0+", str(o.value()).strip()):
                return (f"{a}: joblib cannot run a sweep on 0 workers; expected a positive count, "
                        f"or -1 for every core")
            bad = _sweep_problem(a, o, single, sweeper)
            if bad is not None:
                return bad
        except Exception as e:  # noqa: BLE001 - (Hydra's grammar errors have several types)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            odd = [c for c in value if c == "~" or c == " " or not c.isascii()]
            hint = ("; expected range(start, stop) or range(start, stop, step), step not 0"
                    if value.strip().startswith("range(") and not odd else
                    f"; a value with {odd[0]!r} needs quotes inside the argument: "
                    f"\"{key}='{value}'\"" if odd and "'" not in value else
                    f"; a value with {odd[0]!r} needs quotes inside the argument (Hydra's quoted "
                    f"string, key='...', with \\' for a quote in it)" if odd else
                    "; a sweep's values are separated by single commas (key=a,b,c), and a value "
                    "with Hydra's special characters needs quotes: \"key='a,b'\"")
            return f"{a}: not an override Hydra can parse ({why}){hint}"
    return None


def _sweep_problem(arg: str, o, single: bool, basic_sweeper: bool = True) -> str | None:
    """The error for the parsed override ``o`` (``arg`` as given) when it is a sweep that Hydra
    would end with a traceback or a usage error: several values in a ``single`` run (Hydra's
    "Ambiguous value"), a comma list holding a ``range()`` / ``choice()`` / ``glob()``
    (Hydra's sweeper failed on it), a ``range()`` with step 0 or no values (0 jobs, exit 0),
    or, with Hydra's basic sweeper (``basic_sweeper``: no ``hydra/sweeper=`` override), an
    ``interval()``, which only a sampling sweeper takes; None otherwise."""
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep, Sweep

    if not o.is_sweep_override():
        return None
    if single:
        return (f"{arg}: a sweep (several values) runs with kvsim -m, one job per value; "
                f"expected kvsim -m {arg} ..., or a single value (a value holding commas is "
                f"quoted: key='a,b')")
    v = o.value()
    if isinstance(v, IntervalSweep) and basic_sweeper:
        return (f"{arg}: interval() is sampled by a sampling sweeper (hydra/sweeper=optuna, "
                f"nevergrad), not Hydra's basic sweeper, which runs listed values; expected "
                f"range(), choice() or a comma list")
    if isinstance(v, ChoiceSweep) and any(isinstance(x, (Sweep, Glob)) for x in v.list):
        return (f"{arg}: a sweep's comma list cannot hold range(), choice(), interval() or "
                f"glob(); expected one of them alone, or the values listed: key=1,2,5")
    if isinstance(v, RangeSweep):
        try:
            first = _range_values(o, 1)
        except ValueError as e:
            return f"{arg}: {e}; expected range(start, stop) or range(start, stop, step), step not 0"
        if not first:
            return (f"{arg}: the range has no values (it stops before its first); expected "
                    f"start < stop for a positive step (start > stop for a negative one)")
    return None


def _range_values(o, limit: int) -> list:
    """The first ``limit`` values of the parsed ``range(...)`` override ``o``, as Hydra's
    sweeper lists them (ValueError for step 0)."""
    import itertools

    return list(itertools.islice(o.sweep_iterator(), limit))
