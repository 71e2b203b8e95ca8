"""Figures of a collected kvsim sweep (matplotlib), shared by the notebooks and ``kvsim-plot``.

Input is what :mod:`experiments.collect` writes: ``runs.parquet`` (one row per run: override,
config and flattened summary columns such as ``tiers.host_gib``, ``codec``, ``hit_ratio.host``,
``ttft_s.p90``) and the per-run tables (``requests/``, ``steps/``, ``rounds/``, ``transfers/``)
whose rows carry ``run_id`` and the override columns.

Every ``plot_*`` function takes DataFrames, draws into a new figure and returns it; nothing is
shown or saved (``fig.savefig(path)``, or :func:`save`, which also writes the table the figure
was drawn from beside it as CSV: :func:`figure_data`). A missing column raises
:class:`PlotError` naming the column, the table and the columns that are there.

Each figure answers one question, its title (the ``FIGURES`` table lists them; docs/FIGURES.md
shows a reference of each), with what it compares on the title's second line; legends sit
outside the data; curves differ in colour and line style (:func:`group_styles`); axes name
their units: seconds or milliseconds for times, GiB / MiB for bytes (2**30 / 2**20), ratios in
[0, 1], swept columns with their meaning (:func:`axis_label`).

Command line (headless, Agg backend)::

    kvsim-plot ttft-decomposition COLLECTED_DIR --out ttft_parts.png   # one bar per run
    kvsim-plot ttft-cdf COLLECTED_DIR --by codec --where tiers.host_gib=4 --out ttft_cdf.png
    kvsim-plot hit-by-tier COLLECTED_DIR --x tiers.host_gib --hue codec --out hit.png
    kvsim-plot blocks-freed COLLECTED_DIR --out freed.png --dpi 100   # + freed.csv, freed.held.csv
    kvsim-plot --help                     # all figures and options

Without ``--by`` (``--x`` / ``--hue``) a figure separates runs by the override keys that differ
between them (:func:`default_by`, :func:`default_x_hue`): one curve or bar per run of a sweep.
Run-level figures (``hit-by-tier``, ``disk-share``, ``ttft-vs``) draw one run per (``--x``,
``--hue``) cell: ``--x`` and ``--hue`` must differ, and runs sharing a cell (another parameter
varies) are an error unless ``--agg`` (mean, median, min or max of their values) combines them
(a warning says how many).
The per-request / per-round / per-step figures draw one curve (bar) per ``--by`` group; when a
group holds runs that differ in another override key, it is drawn pooled and a warning names
the key and how many runs each group pools (``--where KEY=VALUE`` or ``--by ...,KEY`` separates
them). Runs with nothing to draw (no finished request, a null summary value) are named in a
warning. Warnings are :class:`PlotWarning` (``kvsim-plot`` prints them on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import pandas as pd

from experiments.plot_common import (AGGS, COLORS, COLUMN_LABELS, Collected, LINESTYLES, MARKERS, PlotError,
                                     PlotWarning, TIERS, TIER_COLORS, TTFT_PARTS, TTFT_PART_COLORS,
                                     TTFT_PART_LABELS, _as_list, _label_order, _labels, _out_problem,
                                     _require, add_run_columns, axis_label, data_files, figure_data,
                                     group_styles, image_formats, load_collected, save)
from experiments.plot_requests import (plot_ttft_cdf, plot_ttft_decomposition, ttft_decomposition,
                                       ttft_part_values, ttft_parts)
from experiments.plot_rounds import (longest_request, plot_blocks_freed, plot_bytes_moved, plot_fragmentation,
                                     plot_pool_fragmentation)
from experiments.plot_runs import plot_disk_share, plot_hit_by_tier, plot_ttft_vs

# The figures, their helpers and the collection's loader, as notebooks and docs import them.
__all__ = [
    "AGGS", "COLORS", "COLUMN_LABELS", "Collected", "FIGURES", "LINESTYLES", "MARKERS", "PlotError",
    "PlotWarning", "TIERS", "TIER_COLORS", "TTFT_PARTS", "TTFT_PART_COLORS", "TTFT_PART_LABELS",
    "add_run_columns", "axis_label", "data_files", "figure_data", "group_styles", "image_formats",
    "load_collected", "longest_request", "main", "plot_blocks_freed", "plot_bytes_moved",
    "plot_disk_share", "plot_fragmentation", "plot_hit_by_tier", "plot_pool_fragmentation",
    "plot_ttft_cdf", "plot_ttft_decomposition", "plot_ttft_vs", "save", "ttft_decomposition",
    "ttft_part_values", "ttft_parts"]


def _filter_runs(runs: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    """Apply ``col=value`` filters (value compared as the column's type). PlotError when no run
    is left (or there was none: every run of the collection failed)."""
    if runs.empty:
        raise PlotError("the collection holds no completed run (kvsim-collect lists the failed "
                        "ones in failed_runs.csv); expected at least one")
    for w in where:
        if "=" not in w:
            raise PlotError(f"--where {w!r}: expected COLUMN=VALUE")
        col, val = w.split("=", 1)
        _require(runs, [col], "runs")
        s = runs[col]
        try:
            target = json.loads(val) if not pd.api.types.is_string_dtype(s) else val
        except ValueError:
            target = val
        runs = runs[s == target] if not pd.api.types.is_string_dtype(s) else runs[s.astype(str) == val]
    if runs.empty:
        raise PlotError(f"no run matches {where}")
    return runs


def _warn_pooled(df: pd.DataFrame, runs: pd.DataFrame, by: list[str], figure: str) -> None:
    """A PlotWarning when a ``by`` group of ``df`` (a per-request / per-round / per-step table
    with ``run_id``) holds runs that differ in an override key other than the ``by`` columns:
    its curve pools them. Names the keys and how many runs each curve pools. The override keys
    come from the ``overrides`` column of ``runs`` (bookkeeping keys left out); a key's value
    is the runs column of that name when there is one, else the override's text."""
    if (df.empty or "run_id" not in df.columns or "overrides" not in runs.columns
            or any(c not in df.columns for c in by)):  # (a missing column is the figure's error)
        return
    from experiments.collect_tables import BOOKKEEPING_PREFIXES, override_key

    pairs = df[[*dict.fromkeys([*by, "run_id"])]].drop_duplicates()
    pairs = pairs.assign(_g=_labels(pairs, by))
    sel = runs[runs["run_id"].isin(set(pairs["run_id"]))].set_index("run_id")
    literal: dict = {}
    for rid, ov in sel["overrides"].items():
        for o in str(ov).split() if isinstance(ov, str) else []:
            kv = override_key(o)
            if kv is not None and not kv[0].startswith(BOOKKEEPING_PREFIXES) and kv[0] not in by:
                literal.setdefault(kv[0], {})[rid] = kv[1]
    if not literal:
        return
    values = pd.DataFrame({k: (sel[k] if k in sel.columns else pd.Series(v, dtype=object))
                           for k, v in literal.items()}, index=sel.index).astype(str)
    varying: list[str] = []
    counts: dict[str, int] = {}
    for g, ids in pairs.groupby("_g", sort=False)["run_id"]:
        ids = list(dict.fromkeys(ids))
        if len(ids) < 2:
            continue
        keys = [k for k in values.columns if values.loc[ids, k].nunique(dropna=False) > 1]
        if keys:
            counts[g] = len(ids)
            varying += [k for k in keys if k not in varying]
    if not counts:
        return
    order = [g for g in _label_order(pairs, by) if g in counts]
    name = " / ".join(by)  # (the groups are named by their --by values: say whose)
    shown = ", ".join(f"{name}={g}: {counts[g]} runs" for g in order[:6])
    shown += f" and {len(order) - 6} more" if len(order) > 6 else ""
    keys = ", ".join(varying)
    which = ("each --by group (curve / bar) pools" if len(counts) == len(set(pairs["_g"]))
             else "some --by groups (curve / bar) pool")
    warnings.warn(
        f"{figure}: {which} runs that differ in {keys} ({shown}); pick one "
        f"value with --where {varying[0]}=VALUE, or add {'it' if len(varying) == 1 else 'them'} "
        f"to --by (--by {','.join([*by, *varying])}); drawn pooled", PlotWarning, stacklevel=2)


def varying_keys(runs: pd.DataFrame) -> list[str]:
    """The override keys (``overrides`` column; bookkeeping keys such as ``sim.progress`` and
    ``output.*`` left out) whose value differs between ``runs``, in the order the overrides first
    name them; only keys that are columns of ``runs``."""
    from experiments.collect_tables import BOOKKEEPING_PREFIXES, override_key

    keys: list[str] = []
    if "overrides" in runs.columns:
        for ov in runs["overrides"]:
            for o in ov.split() if isinstance(ov, str) else []:
                kv = override_key(o)
                if kv is not None and not kv[0].startswith(BOOKKEEPING_PREFIXES):
                    keys.append(kv[0])
    out = []
    for k in dict.fromkeys(keys):
        if k in runs.columns:
            col = runs[k].astype(object)
            if col.where(col.notna(), "null").astype(str).nunique() > 1:
                out.append(k)
    return out


def default_by(runs: pd.DataFrame) -> list[str]:
    """``kvsim-plot``'s grouping when ``--by`` is not given: :func:`varying_keys`, so that each
    curve or bar is one run of a sweep; ``run_id`` when runs differ in no override; none for a
    single run."""
    keys = varying_keys(runs)
    if keys:
        return keys
    return ["run_id"] if len(runs) > 1 else []


def default_x_hue(runs: pd.DataFrame, x: str | None, hue: str | None) -> tuple[str, str]:
    """``kvsim-plot``'s ``--x`` / ``--hue`` when not given, from :func:`varying_keys`: x is
    ``tiers.host_gib`` when it varies (or nothing does), else the first numeric varying key;
    hue is ``codec`` when it varies (or nothing else does), else the next varying key."""
    vary = varying_keys(runs)
    if x is None:
        num = [k for k in vary if k != hue and pd.api.types.is_numeric_dtype(runs[k])]
        x = ("tiers.host_gib" if "tiers.host_gib" in vary or not vary
             else (num or [k for k in vary if k != hue] or ["tiers.host_gib"])[0])
    if hue is None:
        rest = [k for k in vary if k != x]
        hue = "codec" if "codec" in rest or not rest else rest[0]
        if hue == x:
            hue = "trace" if x != "trace" else "model"
    return x, hue


def _draw(args, col: Collected):
    fig = _draw_figure(args, col)
    if args.where:  # (the title says which runs were kept)
        fig.suptitle(f"{fig.get_suptitle()}\nruns with {', '.join(args.where)}", fontsize=10)
    return fig


def _draw_figure(args, col: Collected):
    runs = _filter_runs(col.runs, args.where or [])
    ids = set(runs["run_id"])
    k = args.figure
    if FIGURES[k][0] == "runs":
        x, hue = default_x_hue(runs, args.x, args.hue)
        fn = {"hit-by-tier": plot_hit_by_tier, "disk-share": plot_disk_share,
              "ttft-vs": plot_ttft_vs}[k]
        return fn(runs, x=x, hue=hue, agg=args.agg)
    by = _as_list(args.by) if args.by is not None else default_by(runs)

    def table(name, need, warn=True):
        df = col.table(name, run_columns=[c for c in need if c in runs.columns])
        df = df[df["run_id"].isin(ids)]
        if warn:
            _warn_pooled(df, runs, by, args.figure)
        return df

    if k == "ttft-cdf":
        return plot_ttft_cdf(table("requests", by), by=by)
    if k == "ttft-decomposition":
        return plot_ttft_decomposition(table("requests", by), by=by, tail=args.tail)
    if k == "blocks-freed":
        rounds = table("rounds", [*by, "cache.block_size"])
        steps = None
        if not rounds.empty:  # (no rounds: the figure's own error says why)
            steps = table("steps", [*by, "cache.block_size", "policy"], warn=False)
        return plot_blocks_freed(rounds, by=by, steps=steps)
    if k == "fragmentation":
        return plot_fragmentation(table("rounds", by), request_id=args.request_id, by=by)
    if k == "bytes-moved":
        return plot_bytes_moved(table("rounds", by), by=by)
    if k == "pool-fragmentation":
        return plot_pool_fragmentation(table("steps", [*by, "cache.block_size"]), by=by)
    raise PlotError(f"unknown figure {k!r}")


# Each figure: the table it reads and the question it answers.
FIGURES = {
    "hit-by-tier": ("runs", "which tier serves the prefix hits?"),
    "disk-share": ("runs", "how much of the prefix hits comes from disk?"),
    "ttft-vs": ("runs", "how do TTFT p50/p90/p99 change with --x?"),
    "ttft-cdf": ("requests", "how long do requests wait for their first token?"),
    "ttft-decomposition": ("requests", "where does the time to first token go?"),
    "blocks-freed": ("rounds", "how many GPU blocks does evicting tokens save (net and gross)?"),
    "fragmentation": ("rounds", "how fragmented do one long request's blocks get?"),
    "bytes-moved": ("rounds", "how many KV bytes does compaction move?"),
    "pool-fragmentation": ("steps", "how full are the allocated KV slots?"),
}


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return v


def _cli_words(msg: str, figure: str) -> str:
    """``msg`` (a PlotError's or PlotWarning's, which starts with the drawing function's name:
    ``plot_ttft_vs: ...``) in ``kvsim-plot``'s words: the figure's subcommand
    (``ttft-vs: ...``) instead of the Python function."""
    import re

    return re.sub(r"^plot_[a-z_]+: ", f"{figure}: ", msg)


def main(argv: list[str] | None = None) -> int:
    """``kvsim-plot FIGURE COLLECTED_DIR --out FILE.png [options]``; exit 2 on bad input with one
    line naming the file or column (an ``--out`` without a supported image extension, or an
    ``--agg`` not in :data:`AGGS`, is an argparse usage error: SystemExit(2) before anything is
    read). Each :class:`PlotWarning` (runs left out for lack of a value, runs pooled into one
    curve) is printed on stderr as one ``kvsim-plot: warning:`` line; the figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    ap = argparse.ArgumentParser(prog="kvsim-plot",
                                 description="Draw a figure of a collected kvsim sweep (see kvsim-collect).")
    sub = ap.add_subparsers(dest="figure", required=True, metavar="FIGURE")
    parsers = {}
    options: dict[str, set[str]] = {}  # each figure's option strings

    for name, (src, question) in FIGURES.items():
        p = parsers[name] = sub.add_parser(name, help=f"{question} (from {src})")
        options[name] = {"-h", "--help"}

        def add(*flags, _p=p, _name=name, **kw):
            _p.add_argument(*flags, **kw)
            options[_name].update(f for f in flags if f.startswith("-"))

        add("collected", help="directory written by kvsim-collect")
        add("--out", required=True,
            help="output image; the extension picks the format (.png, .svg, .pdf, ...); the "
                 "figure's data is written beside it (the same name with .csv)")
        add("--where", action="append", metavar="COL=VALUE",
            help="keep runs with runs.parquet COL == VALUE (repeatable)")
        add("--dpi", type=_positive_int, default=150,
            help="resolution of a raster image (dots per inch; default 150)")
        if src == "runs":
            add("--x", default=None, help="x column (default: tiers.host_gib when it varies "
                                          "between the runs, else the first swept number)")
            add("--hue", default=None, help="one curve / panel per value (default: codec when "
                                            "it varies, else the other swept key)")
            add("--agg", default=None, choices=AGGS,
                help="combine runs sharing an (x, hue) cell (e.g. seeds) by this "
                     "statistic of their values (default: such runs are an error)")
        else:
            add("--by", default=None,
                help="comma-separated grouping columns (default: the override keys whose "
                     "values differ between the runs, one curve / bar per run)")
        if name == "ttft-decomposition":
            add("--tail", type=float, default=None,
                help="only requests at or above this TTFT quantile of their group")
        if name == "fragmentation":
            add("--request-id", type=int, default=None,
                help="request to follow (default: the one with most rounds)")
    argv = sys.argv[1:] if argv is None else list(argv)
    fig = next((a for a in argv if not a.startswith("-")), None)
    if fig in parsers:
        # an option of other figures only (--agg on ttft-cdf): named before parsing, so that it
        # is not taken for a stray positional, nor lost behind a missing --out
        for a in argv:
            opt = a.split("=", 1)[0]
            if opt.startswith("--") and opt not in options[fig]:
                takes = [k for k in parsers if opt in options[k]]
                if takes:
                    parsers[fig].error(f"argument {opt}: {fig} has no {opt}; "
                                       f"{', '.join(takes)} take{'s' * (len(takes) == 1)} it")
    args, extra = ap.parse_known_args(argv)
    if extra:  # (the figure's usage, not the top level's: the options are the figure's)
        parsers[args.figure].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = _out_problem(args.out)
    if problem is not None:  # before any work; argparse prints usage + one line and exits 2
        parsers[args.figure].error(f"argument --out: {problem}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlotWarning)
        try:
            fig = _draw(args, load_collected(args.collected))
            tables = data_files(fig, args.out)
            out = save(fig, args.out, dpi=args.dpi)
        except PlotError as e:
            err = e
        else:
            err = None
    for w in caught:  # PlotWarnings as one line each; anything else as Python shows it
        if issubclass(w.category, PlotWarning):
            print(f"kvsim-plot: warning: {_cli_words(str(w.message), args.figure)}",
                  file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if err is not None:
        print(f"kvsim-plot: error: {_cli_words(err.cli or str(err), args.figure)}",
              file=sys.stderr)
        return 2
    print(f"wrote {out}" + (f" (its data: {', '.join(str(t) for t in tables)})" if tables else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
