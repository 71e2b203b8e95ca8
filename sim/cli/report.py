"""What ``kvsim`` prints after a run: the summary table (:func:`format_summary`) and the notes
and warnings on what the run's settings did (:func:`run_notes`), among them the overrides that
changed nothing (:func:`inert_override_notes`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..config import TiersConfig


def _rate(v: float) -> str:
    """A throughput for the table: whole numbers from 100 up, else three significant digits
    (an idle trace's 0.45 tok/s is not '0')."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def format_summary(s: dict) -> "rich.table.Table":  # noqa: F821
    """A rich table of the headline numbers of a summary dict."""
    from rich.table import Table

    def times(d, scale, digits):
        """p50 / p90 / p99 of a latency dict (seconds) times ``scale``, to ``digits`` decimals."""
        return " / ".join("-" if d.get(k) is None else f"{d[k] * scale:,.{digits}f}"
                          for k in ("p50", "p90", "p99"))

    src = s.get("trace_source") or ""
    trace = s.get("trace")
    if src and any(str(o).lstrip("+").startswith("trace.path=") for o in s.get("overrides") or []):
        trace = f"{Path(src).name}" + (f" (trace preset {trace})" if trace else "")  # (the user's)
    elif src and not src.endswith(("mooncake_conversation_10min.jsonl",)) and trace and trace not in src:
        trace = f"{trace} ({Path(src).name})"
    tp = s.get("tensor_parallel_size") or 1
    title = f"kvsim: {trace} | {s.get('model')} on {f'{tp} x ' if tp > 1 else ''}{s.get('gpu')}"
    # the memory setup when it is not the default: policy + compaction, tiers + codec
    if s.get("policy", "full") != "full":
        comp = s.get("compaction", "none")
        title += f" | {s['policy']}" + (f" + {comp}" if comp != "none" else "")
    if s.get("tiers", "gpu_only") != "gpu_only":
        title += f" | tiers {s['tiers']}, codec {s.get('codec', 'identity')}"
    cl = s.get("cluster")  # (a cluster's summary: the replicas and the router)
    if cl:
        title += f" | {cl['replicas']} replicas, {cl['router']} router"
    # what the command line changed (the run's outputs and progress bar aside)
    shown = [o for o in s.get("overrides") or []
             if not o.lstrip("+~").startswith(("output.", "hydra.", "sim.progress"))]
    # (rich wraps a title to the table's width: the table is made as wide as its title)
    t = Table(title=title, caption=f"overrides: {' '.join(shown)}" if shown else None,
              show_header=True, min_width=len(title))
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("requests (finished / rejected / total)",
              f"{s['requests_finished']:,} / {s['requests_rejected']:,} / {s['requests_total']:,}")
    if s.get("rejected_by_reason"):
        t.add_row("rejected by reason", ", ".join(f"{k}: {v:,}" for k, v in s["rejected_by_reason"].items()))
    # one unit per row, whatever the values (a sweep's tables compare line by line): TTFT and
    # E2E in s to the ms (an overloaded run queues for minutes), TPOT in ms
    for name, unit, scale, digits in (("ttft_s", "s", 1.0, 3), ("tpot_s", "ms", 1e3, 1),
                                      ("e2e_s", "s", 1.0, 3)):
        t.add_row(f"{name[:-2].upper()} {unit}  p50 / p90 / p99", times(s[name], scale, digits))
    thr = s.get("throughput_tokens_per_s")
    othr = s.get("output_throughput_tokens_per_s")
    t.add_row("throughput tok/s (total / output)",
              "-" if thr is None else f"{_rate(thr)} / {_rate(othr)}")
    hr = s.get("prefix_hit_ratio")
    hm = s.get("prefix_hit_ratio_mean_per_request")
    t.add_row("prefix-hit ratio (tokens / mean per request)",
              "-" if hr is None else f"{hr:.1%} / {hm:.1%}")
    pc = s.get("provider_cache") or {}
    if pc.get("provider_cached_tokens"):  # (a trace that records the provider's cache reads)
        t.add_row("prefix-hit tokens kvsim / provider's cache reads",
                  f"{pc['kvsim_hit_tokens']:,} / {pc['provider_cached_tokens']:,} "
                  f"({pc['difference_pct']:+.1f}%)")
    # (the levels below the GPU by name, level 1 first: host / disk in the default chain)
    levels = [k for k in (s.get("bytes_offloaded") or {"host": 0, "disk": 0})]
    if s.get("tiers", "gpu_only") != "gpu_only" or (s.get("hit_ratio") or {}).get(levels[0]):
        h = s["hit_ratio"]
        t.add_row(f"hit ratio by tier (GPU / {' / '.join(levels)})",
                  " / ".join("-" if h[k] is None else f"{h[k]:.1%}" for k in ("gpu", *levels)))
    pl = s.get("preempted_lookups") or {}
    if pl.get("requests"):
        ht = pl["hit_tokens"]
        t.add_row(f"re-admissions after preemption / their hit tokens GPU / {' / '.join(levels)}",
                  f"{pl['requests']:,} / " + " / ".join(f"{ht[k]:,}" for k in ("gpu", *levels)))
    if s.get("policy", "full") != "full" and s.get("rounds") is not None:
        t.add_row("compression rounds / tokens evicted / blocks freed",
                  f"{s['rounds']:,} / {s.get('tokens_evicted_total', 0):,} / "
                  f"{s.get('blocks_freed_total', 0):,}")
    if s.get("write_back_stalls"):
        t.add_row("steps held for write-back copies / time s",
                  f"{s['write_back_stalls']:,} / {s['write_back_stall_s']:,.2f}")
    # (a cluster's: the fullest replica's peak and one replica's pool)
    t.add_row("peak GPU blocks used / total" + (" (fullest replica / each)" if cl else ""),
              f"{s['peak_gpu_blocks_used']:,} / {s['gpu_blocks_total']:,}")
    t.add_row("preemptions", f"{s['preemptions']:,}")
    t.add_row("engine steps", f"{s['engine_steps']:,}")
    t.add_row("simulated time s / wall s",
              f"{s['sim_duration_s']:,.1f} / {s['wall']['wall_s']:,.1f}")
    tc = s.get("tier_copies_end_s")
    if tc is not None and tc > s["sim_duration_s"]:
        t.add_row("last tier copy landed s (after the last request)", f"{tc:,.1f}")
    return t


# tier options that only matter with a host or disk tier: all but the preset name and sizes
TIER_ONLY_FIELDS = tuple(f.name for f in dataclasses.fields(TiersConfig)
                         if f.name not in ("name", "host_gib", "disk_gib"))


# compaction option -> the compactions that read it (policies.compaction; pin_prompt only when
# Compactor.apply is called without the engine's pinned_len)
COMPACTION_READERS = {"position_index_bytes": ("hole_fill",), "position_index_per_group": ("hole_fill",),
                      "pin_prompt": ()}


# cost settings only the per-operator models read (sim.operator_cost)
OPERATOR_ONLY_COST = ("fp8_mfu", "fp4_mfu", "expert_mfu", "attention_mbu", "seq_overhead_s",
                      "prefill_overhead_s", "layer_overhead_s", "comm_efficiency",
                      "gemm_precision", "expert_parallel")


def inert_override_notes(overrides: list[str], trace_format: str, tiers: str,
                         cost_kind: str = "analytic", policy: str = "full",
                         compaction: str = "none", codec: str = "identity",
                         store: bool = False, pd: bool = False) -> list[str]:
    """Notes for command-line overrides that change nothing in this run: a trace option of
    another kind of trace (``trace_format``: the run's ``trace.format``; ``trace.path`` of a
    synthetic one, which is generated), a tier option with no host or disk tier (``tiers``: the
    summary's ``tiers``, e.g. ``gpu_only``), ``cost.file`` without ``cost.kind=calibrated``, a
    policy option or a compaction with ``policy=full`` (no round ever runs), a compaction
    option with ``compaction=none``, a codec option with ``codec=identity``, a shared KV
    store's option without the store (``store``: ``cluster.store.enabled``) and a P/D option
    without prefill/decode disaggregation (``pd``: ``cluster.pd.prefill_replicas`` > 0)."""
    from traces.registry import all_formats, readers_of

    notes = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        group, _, field = key.partition(".")
        if group == "trace":
            # (trace options that only some formats read: their options classes, traces.formats)
            readers = readers_of(field)
            if readers and trace_format not in readers:
                notes.append(f"{key} is read by {' and '.join(readers)} traces only; this run's "
                             f"trace is {trace_format}: it changes nothing")
            fmt = all_formats().get(trace_format)
            if field in ("path", "cache", "cache_dir") and fmt is not None and fmt.generated:
                notes.append(f"{key} is read by traces loaded from files; this run's trace is "
                             f"{trace_format}, generated from its options: it changes nothing")
        elif key == "cost.file" and cost_kind != "calibrated":
            notes.append(f"cost.file is read with cost.kind=calibrated; this run's cost.kind is "
                         f"{cost_kind}: it changes nothing")
        elif key == "cost.kind":
            notes.append(f"cost.kind={cost_kind} keeps the other cost.* settings of the cost "
                         f"preset; cost={cost_kind} selects that model with its own (fitted) "
                         f"settings")
        elif group == "cost" and field in OPERATOR_ONLY_COST and cost_kind == "analytic":
            notes.append(f"{key} is read by cost.kind=operator and calibrated; this run's "
                         f"cost.kind is analytic: it changes nothing")
        elif group == "tiers" and field in TIER_ONLY_FIELDS and tiers == "gpu_only":
            notes.append(f"{key} applies to host and disk tiers; with none (tiers.host_gib = "
                         f"tiers.disk_gib = 0) it changes nothing")
        elif group in ("policy", "compaction") and field and field != "name" and policy == "full" \
                or key == "compaction" and compaction != "none" and policy == "full":
            notes.append(f"{key} applies to a compression policy's rounds; policy=full keeps "
                         f"every token and runs none: it changes nothing")
        elif group == "compaction" and field in COMPACTION_READERS \
                and compaction not in COMPACTION_READERS[field]:
            readers = COMPACTION_READERS[field]
            notes.append(f"{key} is read by compaction={' and '.join(readers)}; this run's "
                         f"compaction is {compaction}: it changes nothing" if readers else
                         f"{key} is not read in a simulation (the engine pins the slots the "
                         f"policy protects, policy.protect_prompt): it changes nothing")
        elif key.startswith("cluster.store.") and key != "cluster.store.enabled" and not store:
            notes.append(f"{key} is read by the KV store the replicas share; this run has none "
                         f"(cluster.store.enabled=false): it changes nothing")
        elif key.startswith("cluster.pd.") and key != "cluster.pd.prefill_replicas" and not pd:
            notes.append(f"{key} is read with prefill/decode disaggregation; this run has none "
                         f"(cluster.pd.prefill_replicas=0): it changes nothing")
        elif group == "codec" and field and field != "name" and codec == "identity":
            notes.append(f"{key} is read by the fp8 and nvfp4 codecs; this run's codec is "
                         f"identity (pages copied as they are): it changes nothing")
    return notes


def zero_level_notes(levels) -> list[str]:
    """Notes for the ``tiers.levels`` entries of 0 GiB (``levels``: the config's list, level 1
    first): a level above one with capacity holds no page but still stages those passing
    through it (demoted down, read back up: their copies timed on its links); a level with no
    capacity below it is off, with the levels under it; every level of 0 GiB keeps nothing
    below the GPU (:class:`sim.tiers.TierManager`)."""
    gib = [float(lv.gib) for lv in levels]
    if not gib or all(g > 0 for g in gib):
        return []
    if not any(g > 0 for g in gib):
        return [f"every level of tiers.levels has 0 GiB: no page is kept below the GPU (the run "
                f"is gpu_only)"]
    last = max(i for i, g in enumerate(gib) if g > 0)
    notes = []
    for i, lv in enumerate(levels):
        if gib[i] > 0:
            continue
        if i < last:
            notes.append(f"tiers.levels[{i}] ({lv.name}) has 0 GiB: it keeps no page, but the "
                         f"pages moving between the levels above and below it pass through it "
                         f"(their copies timed on its links)")
        else:
            notes.append(f"tiers.levels[{i}] ({lv.name}) has 0 GiB and no level below it has "
                         f"capacity: it is off, no page is copied to it")
    return notes


# cost terms a calibration never covers (see sim.calibrated_cost): not worth a note
ALWAYS_ANALYTIC = ("collectives", "disk_read_write", "compaction_scoring")


def run_notes(summary: dict, cfg, overrides: list[str]) -> list[str]:
    """The ``kvsim: note: ...`` and ``kvsim: warning: ...`` lines for a finished run, in the
    order ``kvsim`` prints them: the cost model's notes and the terms a calibration left to the
    roofline, a ``cache.num_gpu_blocks`` beyond the GPU's memory, a tiers preset that runs as
    another, a policy whose rounds never started (with its threshold), a Quest budget above every
    context, kv_capacity rejections under a compression policy, what ``output.write_ops`` left
    out of ops.jsonl, the overrides that changed nothing (:func:`inert_override_notes`), a run in
    which no request finished, the trace loader's warnings and the rows
    ``trace.on_error=skip`` skipped. ``summary``: the run's summary dict; ``cfg``: its config;
    ``overrides``: the command line's overrides."""
    out: list[str] = []
    cm = summary.get("cost_model") or {}
    for note in cm.get("notes") or []:
        out.append(f"kvsim: note: {note}")
    if cm.get("kind") == "calibrated" and cm.get("analytic_fallback"):
        why = cm.get("fallback_reasons") or {}
        for term in cm["analytic_fallback"]:
            if term in ALWAYS_ANALYTIC:
                continue
            out.append(f"kvsim: note: cost.kind=calibrated: {term} uses the operator model's roofline"
                + (f" ({why[term]})" if why.get(term) else ""))
    mem = summary.get("memory_gib") or {}
    if cfg.cache.num_gpu_blocks is not None and mem:
        left = (mem["budget"] - mem["weights"] - mem["activation_reserve"]
                - mem["sliding_window_reserve"])
        per_block = summary["kv_bytes_per_block"] * summary.get("kv_replication", 1) / 2**30
        room = max(int(left // per_block), 0)  # (the blocks sim.hardware.plan_memory sizes)
        n = int(cfg.cache.num_gpu_blocks)
        if n > room:
            out.append(f"kvsim: note: cache.num_gpu_blocks={n:,} ({mem['kv_pool']:,.1f} GiB of KV) is "
                f"beyond the {room:,} blocks ({max(left, 0.0):,.1f} GiB) that "
                f"{summary.get('gpu')} has room for after weights and reserves (a what-if pool, "
                f"as vLLM's num_gpu_blocks_override; summary.json memory_gib)")
    levels = list(cfg.tiers.levels or ())
    if summary.get("tiers_preset") not in (None, summary.get("tiers")):
        sizes = (f"tiers.levels {', '.join(f'{lv.name} {float(lv.gib):g} GiB' for lv in levels)}"
                 if levels else f"tiers.host_gib={cfg.tiers.host_gib} and tiers.disk_gib="
                                f"{cfg.tiers.disk_gib}")
        out.append(f"kvsim: note: tiers={summary['tiers_preset']} with {sizes} runs as "
                   f"{summary['tiers']}")
    out.extend(f"kvsim: note: {n}" for n in zero_level_notes(levels))
    if summary.get("tiers") == "gpu_disk":
        out.append("kvsim: note: with no host tier, offloaded pages are staged through host memory on "
            "their way to disk (bytes_offloaded.host counts those GPU-to-host copies) and disk "
            "hits are read through it")
    if summary.get("codec", "identity") != "identity" and summary.get("tiers") == "gpu_only":
        out.append(f"kvsim: note: codec={summary['codec']} encodes pages copied below the GPU; with "
            f"no host or disk tier (tiers.host_gib = tiers.disk_gib = 0) it changes nothing")
    from policies.registry import POLICIES, policy_config

    frees = POLICIES[summary.get("policy", "full")].frees_memory  # (full: False)
    if frees and summary.get("rounds") == 0 and summary["requests_finished"]:
        pol = POLICIES[summary["policy"]](policy_config(cfg.policy))
        if pol.budget_scope == "prompt":  # (snapkv, pyramidkv, ada_kv: one round at prefill end)
            pol.num_groups(int(cfg.model.num_kv_heads), int(cfg.model.num_layers))
            thr = pol._min_budget()  # (pyramidkv: its smallest layer budget)
            what = (f"its smallest layer budget, policy.budget / policy.layer_budget_ratio with "
                    f"policy.observation_window as a floor = {thr:,} tokens"
                    if summary["policy"] == "pyramidkv" else f"policy.budget={thr:,} tokens")
            out.append(f"kvsim: note: policy={summary['policy']} ran no compression round: it "
                f"compresses a prompt once, at prefill end, when the prompt is longer than "
                f"{what}, and no prompt of this trace was (long outputs do not start it; use "
                f"longer prompts or a lower policy.budget)")
        elif hasattr(pol, "_threshold"):  # (the periodic policies: policies.eviction.PeriodicEviction)
            thr, beta = pol._threshold(), pol._period()
            first = -(-(thr + 1) // beta) * beta
            what = ("policy.sink_tokens + policy.recent_window" if summary["policy"] ==
                    "streaming_llm" else "policy.budget")
            unit = "decode tokens" if pol.budget_scope == "decode" else "tokens"
            out.append(f"kvsim: note: policy={summary['policy']} ran no compression round: its first "
                f"round comes at the first multiple of policy.beta={beta} past {what}={thr} "
                f"{unit} ({first:,} {unit}), and no request of this trace reached it before "
                f"it finished (a reasoning trace such as trace=servegen_r1 has long outputs; or "
                f"lower {what} or policy.beta)")
    longest = summary.get("longest_context_tokens")
    if summary.get("policy") == "quest" and longest:
        pol = POLICIES["quest"](policy_config(cfg.policy))
        B = int(cfg.cache.block_size)
        pages = pol.top_k(B)
        if pages * B >= longest - 1:  # (a step reads the KV of all tokens but the last)
            knob = (f"policy.top_k_pages={pages:,}" if pol.cfg.top_k_pages > 0
                    else f"policy.budget={int(pol.cfg.budget):,} tokens")
            out.append(f"kvsim: note: policy=quest read every page: it reads the top {pages:,} pages "
                f"of {B} tokens per step ({knob}), and no request's context passed that (the "
                f"longest: {longest:,} tokens); it saves reads only on longer contexts (lower "
                f"the budget or use a longer trace)")
    n_cap = (summary.get("rejected_by_reason") or {}).get("kv_capacity", 0)
    if n_cap and frees:
        out.append(f"kvsim: note: {n_cap:,} request(s) were rejected as kv_capacity: the check counts "
            f"each whole uncompressed sequence (input + output) against the pool and does not "
            f"credit policy={summary['policy']}'s evictions, under which some of them might run")
    if summary.get("ops_rounds_left_out"):
        out.append(f"kvsim: note: output.write_ops: {summary['ops_rounds_left_out']:,} of "
            f"{summary.get('rounds', 0):,} compaction rounds are not in ops.jsonl: the GPU replay's "
            f"mover is single-group forward packing (compaction=forward_pack, one selection "
            f"group); rounds of several groups or of hole filling are left out")
    disk = summary.get("ops_transfers_left_out") or {}
    if any(disk.values()):
        out.append(f"kvsim: note: output.write_ops: {disk.get('host_to_disk', 0):,} host-to-disk and "
            f"{disk.get('disk_to_host', 0):,} disk-to-host copies are not in ops.jsonl: the GPU "
            f"replay times GPU-host copies (d2h, h2d) only (summary.json ops_transfers_left_out)")
    over = {k: summary.get(f"ops_{k}_over_limit", 0) for k in ("rounds", "transfers")}
    if any(over.values()):
        out.append(f"kvsim: note: output.ops_limit={cfg.output.ops_limit}: ops.jsonl holds the first "
            f"{summary['ops_rounds_written']:,} compaction rounds and "
            f"{summary['ops_transfers_written']:,} host copies; {over['rounds']:,} rounds and "
            f"{over['transfers']:,} copies past the limit are left out (raise output.ops_limit "
            f"to replay more)")
    for n in inert_override_notes(overrides, str(cfg.trace.format), summary.get("tiers", "gpu_only"),
                                  str(cfg.cost.kind), str(summary.get("policy", "full")),
                                  str(summary.get("compaction", "none")),
                                  str(summary.get("codec", "identity")),
                                  store=bool(cfg.cluster.store.enabled),
                                  pd=int(cfg.cluster.pd.prefill_replicas) > 0):
        out.append(f"kvsim: note: {n}")
    if summary["requests_finished"] == 0:
        out.append(f"kvsim: warning: no request finished: all {summary['requests_rejected']:,} were "
            f"rejected ({', '.join(f'{k}: {v:,}' for k, v in summary['rejected_by_reason'].items())})")
    # the file the user gave (trace.path), else the trace preset read
    read = (f"trace file {summary.get('trace_source') or cfg.trace.path}" if cfg.trace.path
            else f"trace {summary['trace']}")
    for w in summary.get("trace_warnings") or []:
        if not w.endswith("(on_error=skip)"):  # the skipped rows get their own line below
            out.append(f"kvsim: warning: {read}: {w}")
    skipped = (summary.get("trace_skipped_rows") or {}).get("count", 0)
    if skipped:
        ex = (summary["trace_skipped_rows"].get("examples") or [""])[0]
        # (counted over the whole file, which a slice may not reach: traces.loader says so)
        scope = next((w[:w.index("): ") + 1] for w in summary.get("trace_warnings") or []
                      if w.endswith("(on_error=skip)") and w.startswith("in the whole ")),
                     None)
        out.append(f"kvsim: warning: trace.on_error=skip skipped {skipped} bad "
            f"row{'s' * (skipped != 1)}{' ' + scope if scope else ''} (first: {ex}); "
            f"see summary.json trace_skipped_rows")
    return out
