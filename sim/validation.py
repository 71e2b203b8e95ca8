"""Every check a config must pass before a simulation starts.

:func:`validate_config` (called by :func:`sim.run.validate_config`, hence by ``run_simulation``
before anything is loaded or simulated) raises :class:`sim.errors.ConfigError` naming the config
field, the value found and what was expected. ``kvsim`` turns it into one ``kvsim: error: ...``
line and exit status 2; the results directory then holds only the ``INCOMPLETE`` marker, or is
removed when the run made it (:mod:`sim.cli.job`).

It runs the checks that live next to the code using the values (memory plan, cost model, codec,
tier manager, policy registry, trace config) and adds those nobody else makes (model and GPU card
numbers that would divide by zero or give a negative pool, tier options that are only read when a
tier exists, ``sim.max_sim_time_s``, ``output.ops_limit``).

:func:`validate_workload` checks what needs the loaded workload as well (a policy budget below
a protected prompt); it is cheap (one pass over the lengths) and meant to run right after the
trace is loaded, before the simulator is built.

True/false options take only booleans wherever a value comes from: an override or a sweep's
values (:func:`non_boolean_override`), a user's config file (:func:`non_boolean_config_value`,
:func:`non_boolean_file_value`); :func:`schema_type` gives a key's type in the schema.
"""

from __future__ import annotations

import math
from pathlib import Path

from .errors import ConfigError
from .hardware import check_prefill_budget

__all__ = ["validate_config", "validate_workload", "check_model_card"]


def _need(section: str, node, name: str, ok, expected: str) -> None:
    v = getattr(node, name)
    bad = v is None or isinstance(v, bool) or not ok(v)
    if isinstance(v, float) and not math.isfinite(v):
        bad = True
    if bad:
        raise ConfigError(f"{section}.{name}={v!r}; expected {expected}")


def _pos(v) -> bool:
    return v > 0


def _nonneg(v) -> bool:
    return v >= 0


def _ge1(v) -> bool:
    return v >= 1


def _pow2(v: int) -> bool:
    return v > 0 and not (v & (v - 1))


# ---------------------------------------------------------------------------------- sections
def _check_scheduler(cfg) -> None:
    s, m = cfg.scheduler, cfg.model
    _need("scheduler", s, "max_num_seqs", _ge1, ">= 1")
    _need("scheduler", s, "max_num_batched_tokens", _ge1, ">= 1")
    _need("scheduler", s, "long_prefill_token_threshold", _nonneg, ">= 0 (0 = no cap)")
    if s.max_num_batched_tokens < s.max_num_seqs:
        # vLLM rejects it too (vllm/config/scheduler.py, SchedulerConfig._verify_args): a full
        # batch of decodes would not fit one step
        raise ConfigError(
            f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens} < scheduler.max_num_seqs="
            f"{s.max_num_seqs}; expected a token budget of at least one token per sequence")
    if s.preemption_mode != "recompute":
        raise ConfigError(f"scheduler.preemption_mode={s.preemption_mode!r}; expected 'recompute'")
    # the engine makes the same check; here it comes before the memory plan and the trace
    check_prefill_budget(s.max_num_batched_tokens, m.max_model_len, s.enable_chunked_prefill)


def _check_model(cfg) -> None:
    m = cfg.model
    sec = "model"
    if m.attention not in ("gqa", "mla"):
        raise ConfigError(f"model.attention={m.attention!r}; expected 'gqa' or 'mla'")
    _need(sec, m, "max_model_len", _pos, "> 0")
    for f in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size",
              "intermediate_size", "vocab_size"):
        _need(sec, m, f, _ge1, ">= 1")
    _need(sec, m, "num_params_b", _pos, "> 0 (billions)")
    _need(sec, m, "embedding_params_b", _nonneg, ">= 0 (billions)")
    if not m.embedding_params_b < m.active_params_b <= m.num_params_b:
        raise ConfigError(
            f"model.active_params_b={m.active_params_b}; expected embedding_params_b "
            f"({m.embedding_params_b}) < active_params_b <= num_params_b ({m.num_params_b})")
    if m.attention == "gqa" and m.num_q_heads % m.num_kv_heads:
        raise ConfigError(
            f"model.num_q_heads={m.num_q_heads} is not a multiple of model.num_kv_heads="
            f"{m.num_kv_heads}; expected whole query groups per KV head (GQA)")
    if m.attention == "mla":
        _need(sec, m, "kv_lora_rank", _ge1, ">= 1 with model.attention=mla")
        _need(sec, m, "qk_rope_head_dim", _nonneg, ">= 0")
    _need(sec, m, "sliding_window", _nonneg, ">= 0 (0 = none)")
    if not 0 <= m.num_sliding_window_layers < m.num_layers:
        raise ConfigError(
            f"model.num_sliding_window_layers={m.num_sliding_window_layers}; expected 0 <= n < "
            f"model.num_layers={m.num_layers} (at least one full-attention layer holds the pool)")
    if m.num_sliding_window_layers > 0 and m.sliding_window < 1:
        raise ConfigError(
            f"model.sliding_window={m.sliding_window} with model.num_sliding_window_layers="
            f"{m.num_sliding_window_layers}; expected a window >= 1 token")
    if not 0 <= m.rope_dim <= m.head_dim:
        raise ConfigError(f"model.rope_dim={m.rope_dim}; expected 0 <= rope_dim <= model.head_dim={m.head_dim}")
    _check_model_experts(m)
    _check_model_mla(m)


def check_model_card(model) -> None:
    """validate_config's model-card checks on a card alone (a ``ModelConfig`` node):
    ConfigError naming the field (:mod:`sim.model_card` checks the cards it makes)."""
    from types import SimpleNamespace

    _check_model(SimpleNamespace(model=model))


def _check_model_experts(m) -> None:
    """The MoE fields are set together: a MoE card (num_experts >= 1) routes each token to
    1..num_experts experts of width >= 1 and keeps at least one MoE layer; a dense card
    (num_experts = 0) sets none of them. weight_quant_scope is a known scope, and 'experts'
    needs a MoE card."""
    from .hardware import WEIGHT_QUANT_SCOPES

    sec = "model"
    for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "num_shared_experts", "num_dense_layers"):
        _need(sec, m, f, _nonneg, ">= 0")
    if m.num_experts >= 1:
        if not 1 <= m.num_experts_per_tok <= m.num_experts:
            raise ConfigError(
                f"model.num_experts_per_tok={m.num_experts_per_tok}; expected 1 <= "
                f"num_experts_per_tok <= model.num_experts={m.num_experts}")
        _need(sec, m, "moe_intermediate_size", _ge1, ">= 1 with model.num_experts >= 1")
        if not m.num_dense_layers < m.num_layers:
            raise ConfigError(
                f"model.num_dense_layers={m.num_dense_layers}; expected fewer than "
                f"model.num_layers={m.num_layers} (at least one MoE layer)")
    else:
        set_ = [f"{f}={getattr(m, f)}" for f in ("num_experts_per_tok", "moe_intermediate_size",
                                                 "num_shared_experts", "num_dense_layers")
                if getattr(m, f)]
        if set_:
            raise ConfigError(
                f"model.num_experts=0 with model.{', model.'.join(set_)}; expected the MoE "
                f"fields set together: num_experts >= 1 for a MoE card, all 0 for a dense one")
    if m.weight_quant_scope not in WEIGHT_QUANT_SCOPES:
        raise ConfigError(f"model.weight_quant_scope={m.weight_quant_scope!r}; expected one of "
                          f"{list(WEIGHT_QUANT_SCOPES)}")
    if m.weight_quant_scope == "experts" and m.num_experts < 1:
        raise ConfigError(
            f"model.weight_quant_scope='experts' with model.num_experts={m.num_experts}; "
            f"expected a MoE card (num_experts >= 1) or scope 'linear'")


def _check_model_mla(m) -> None:
    """MLA's projection widths (q_lora_rank, qk_nope_head_dim, v_head_dim) are >= 0, belong
    to attention=mla only, and a head of qk_nope + qk_rope values is model.head_dim."""
    sec = "model"
    for f in ("q_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        _need(sec, m, f, _nonneg, ">= 0")
    if m.attention != "mla":
        set_ = [f"{f}={getattr(m, f)}" for f in ("q_lora_rank", "qk_nope_head_dim", "v_head_dim")
                if getattr(m, f)]
        if set_:
            raise ConfigError(f"model.{', model.'.join(set_)} with model.attention="
                              f"{m.attention!r}; expected them only with attention=mla")
    elif m.qk_nope_head_dim and m.qk_nope_head_dim + m.qk_rope_head_dim != m.head_dim:
        raise ConfigError(
            f"model.qk_nope_head_dim={m.qk_nope_head_dim} + model.qk_rope_head_dim="
            f"{m.qk_rope_head_dim} != model.head_dim={m.head_dim}; expected a query/key head of "
            f"qk_nope + qk_rope values")


def _check_gpu(cfg) -> None:
    g = cfg.gpu
    for f in ("memory_gib", "hbm_bandwidth_gbps", "bf16_dense_tflops", "pcie_bandwidth_gbps"):
        _need("gpu", g, f, _pos, "> 0")
    _need("gpu", g, "pcie_overhead_s", _nonneg, ">= 0")
    for f in ("fp8_dense_tflops", "fp4_dense_tflops"):
        _need("gpu", g, f, _nonneg, ">= 0 (0 = no tensor cores of that precision)")
    _need("gpu", g, "nvlink_bandwidth_gbps", _nonneg, ">= 0 (0 = no NVLink)")
    _need("gpu", g, "nvlink_latency_s", _nonneg, ">= 0 s")


def _check_cache(cfg) -> None:
    c = cfg.cache
    _need("cache", c, "max_block_size", _pow2, "a power of two >= 1")
    bs = c.block_size
    if isinstance(bs, bool) or not _pow2(int(bs)) or bs > c.max_block_size:
        raise ConfigError(
            f"cache.block_size={bs}; expected a power of two between 1 and cache.max_block_size="
            f"{c.max_block_size}")
    u = c.gpu_memory_utilization
    if not 0.0 < float(u) <= 1.0:
        raise ConfigError(f"cache.gpu_memory_utilization={u}; expected 0 < u <= 1")
    if c.num_gpu_blocks is not None and c.num_gpu_blocks <= 0:
        raise ConfigError(f"cache.num_gpu_blocks={c.num_gpu_blocks}; expected a positive number "
                          f"of blocks or null (computed from memory)")
    if c.activation_reserve_gib is not None and not 0 <= c.activation_reserve_gib < float("inf"):
        raise ConfigError(f"cache.activation_reserve_gib={c.activation_reserve_gib}; expected a "
                          f"finite number >= 0 GiB or null (estimated)")
    from .keys import MAX_BLOCKS_PER_REQUEST

    most = -(-int(cfg.model.max_model_len) // int(bs))
    if most > MAX_BLOCKS_PER_REQUEST:
        # a request's blocks are numbered in its unidentified blocks' keys (sim/keys.py)
        raise ConfigError(
            f"model.max_model_len={cfg.model.max_model_len} with cache.block_size={bs}: a request "
            f"may need {most:,} blocks; expected at most {MAX_BLOCKS_PER_REQUEST:,} (2**24) per "
            f"request: raise cache.block_size or lower model.max_model_len")


def _check_cost(cfg) -> None:
    c = cfg.cost
    for f in ("mfu", "attention_efficiency", "mbu"):
        v = getattr(c, f)
        if not 0 < v <= 1:
            raise ConfigError(f"cost.{f}={v}; expected 0 < value <= 1 (a fraction of peak)")
    _need("cost", c, "step_overhead_s", _nonneg, ">= 0 s")
    _need("cost", c, "tensor_parallel_size", _ge1, ">= 1")


def _check_tiers(cfg) -> None:
    from .tiers import REPLACEMENTS, WRITE_POLICIES

    t = cfg.tiers
    # checked even when no tier is enabled: a typo must not pass silently
    for f in ("host_gib", "disk_gib"):
        _need("tiers", t, f, _nonneg, "a finite capacity >= 0 GiB")
    if t.replacement not in REPLACEMENTS:
        raise ConfigError(f"tiers.replacement={t.replacement!r}; expected one of {list(REPLACEMENTS)}")
    if t.write_policy not in WRITE_POLICIES:
        raise ConfigError(f"tiers.write_policy={t.write_policy!r}; expected one of {list(WRITE_POLICIES)}")
    if t.onboard not in ("blocking", "layerwise"):
        raise ConfigError(f"tiers.onboard={t.onboard!r}; expected one of ['blocking', 'layerwise']")
    _need("tiers", t, "selective_min_hits", _ge1, ">= 1")
    _need("tiers", t, "transfer_batch_pages", _ge1, ">= 1")
    if t.pcie_gbps is not None:
        _need("tiers", t, "pcie_gbps", _pos, "> 0 or null (the GPU card's)")
    if t.pcie_overhead_s is not None:
        _need("tiers", t, "pcie_overhead_s", _nonneg, ">= 0 or null (the GPU card's)")
    _need("tiers", t, "disk_read_gbps", _pos, "> 0")
    _need("tiers", t, "disk_write_gbps", _pos, "> 0")
    _need("tiers", t, "disk_latency_s", _nonneg, ">= 0 s")
    levels = list(t.levels or ())
    from .tiers.spec import LEVEL_NAME_RULE, level_name_problem

    for i, lv in enumerate(levels):
        sec = f"tiers.levels[{i}]"
        why = level_name_problem(lv.name, [str(x.name) for x in levels[:i]])
        if why is not None:
            raise ConfigError(f"{sec}.name={lv.name!r}: {why}; expected {LEVEL_NAME_RULE}")
        _need(sec, lv, "gib", _nonneg, "a finite capacity >= 0 GiB")
        for f in ("read_gbps", "write_gbps"):
            if getattr(lv, f) is not None or i > 0:
                _need(sec, lv, f, _pos, "> 0" + (" or null (the PCIe figure)" if i == 0 else ""))
        if lv.latency_s is not None or i > 0:
            _need(sec, lv, "latency_s", _nonneg,
                  ">= 0 s" + (" or null (the PCIe figure)" if i == 0 else ""))
        if lv.replacement is not None and lv.replacement not in REPLACEMENTS:
            raise ConfigError(f"{sec}.replacement={lv.replacement!r}; expected one of "
                              f"{list(REPLACEMENTS)} or null (tiers.replacement)")
    if levels and (t.host_gib != 0 or t.disk_gib != 0):
        raise ConfigError(f"tiers.levels lists {len(levels)} levels with tiers.host_gib="
                          f"{t.host_gib}, tiers.disk_gib={t.disk_gib}; expected both 0 "
                          f"(tiers.levels is the whole chain below the GPU)")
    from .tiers import tiers_enabled

    if tiers_enabled(t) and not cfg.cache.enable_prefix_caching:
        raise ConfigError(
            f"tiers.host_gib={t.host_gib}, tiers.disk_gib={t.disk_gib}"
            f"{', tiers.levels' if levels else ''}: tiers below the GPU need "
            f"cache.enable_prefix_caching=true")


def _check_policy(cfg) -> None:
    from policies import CompactionConfig
    from policies.config import validate_compaction_config
    from policies.registry import make_policy, policy_config

    cc = _to_dataclass(cfg.compaction, CompactionConfig, None)
    try:
        pc = policy_config(cfg.policy)  # (an option the policy does not read: its own line)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        # validates the policy config; the model shape binds the grouping and Quest's dense layers
        make_policy(pc).num_groups(int(cfg.model.num_kv_heads), int(cfg.model.num_layers))
    except ValueError as e:
        raise ConfigError(f"policy config (policy.*): {e}") from None
    try:
        validate_compaction_config(cc)
    except ValueError as e:
        raise ConfigError(f"compaction config (compaction.*): {e}") from None


def _to_dataclass(node, cls, importance_cls):
    if isinstance(node, cls):
        return node
    from omegaconf import DictConfig, OmegaConf

    obj = OmegaConf.to_object(node) if isinstance(node, DictConfig) else dict(node)
    if isinstance(obj, cls):
        return obj
    obj = dict(obj)
    if importance_cls is not None and isinstance(obj.get("importance"), dict):
        obj["importance"] = importance_cls(**obj["importance"])
    return cls(**obj)


def _check_sim_output(cfg) -> None:
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed!r}; expected an integer in [0, 2**32) (numpy seeds)")
    s = cfg.sim
    if s.max_sim_time_s is not None:
        _need("sim", s, "max_sim_time_s", _pos, "> 0 s or null (no limit)")
    if s.prefix_index not in ("auto", "dict", "table"):
        raise ConfigError(f"sim.prefix_index={s.prefix_index!r}; expected 'auto', 'dict' or 'table'")
    _need("output", cfg.output, "ops_limit", _nonneg, ">= 0")


def _check_trace(cfg) -> None:
    from traces import TraceError
    from traces.config import coerce_config

    try:
        coerce_config(cfg.trace)
    except TraceError as e:
        if e.field and e.path is None:
            raise ConfigError(f"trace.{e.field}={e.found}; expected {e.expected}") from None
        raise ConfigError(f"trace config: {e}") from None


# ---------------------------------------------------------------------------------- entry points
def _check_known_keys(cfg) -> None:
    """Every key must be a field of its schema: Hydra's ``+key=value`` can add keys to a
    structured config, and a misspelt added key would otherwise be ignored silently."""
    import dataclasses

    from .config import KvsimConfig

    def walk(node, schema, where):
        if not dataclasses.is_dataclass(schema) or not hasattr(node, "keys"):
            return
        fields = {f.name: f for f in dataclasses.fields(schema)}
        for k in node.keys():
            if k not in fields:
                raise ConfigError(
                    f"{where}{k}: unknown key; expected one of {sorted(fields)}")
            sub = fields[k].default_factory if fields[k].default_factory is not dataclasses.MISSING else None
            if sub is not None:
                walk(node[k], type(sub()), f"{where}{k}.")

    walk(cfg, KvsimConfig, "")


def _check_no_missing(cfg) -> None:
    """Every field has a value: OmegaConf lets a composed config keep a mandatory field unset
    (``???``, a model card without ``num_layers``, ``model.num_layers=???``) and raises only
    when it is read."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"{missing[0]}=???: the field has no value; expected a value "
                              f"(kvsim --cfg job prints the config)")


def validate_config(cfg) -> None:
    """Check a resolved kvsim config before anything runs; raise ConfigError naming the field.

    Order: every field set (no ``???``), scheduler, model card, GPU card, cache, cost efficiencies, trace options, tiers,
    policy and compaction, sim/output; then the derived checks of the code that uses the values:
    the memory plan (weights fit, at least one KV block), the cost model (``cost.kind``,
    calibration file), the cold-page codec (NVFP4 needs head dims in multiples of 16) and the
    tier manager (capacities, links).
    """
    _check_no_missing(cfg)
    _check_known_keys(cfg)
    _check_scheduler(cfg)
    _check_model(cfg)
    _check_gpu(cfg)
    _check_cache(cfg)
    _check_cost(cfg)
    _check_trace(cfg)
    _check_tiers(cfg)
    _check_policy(cfg)
    _check_sim_output(cfg)

    from .cost_models import build_cost_model
    from .hardware import plan_memory, weight_bytes
    from .tiers import TierManager, cold_page_bytes

    weight_bytes(cfg.model)  # model.dtype / model.weight_quant known
    plan = plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler, cfg.cost.tensor_parallel_size)
    build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    cold = cold_page_bytes(cfg.model, cfg.cache, cfg.codec)
    if cfg.tiers.host_gib > 0 or cfg.tiers.disk_gib > 0:
        import simpy

        TierManager(simpy.Environment(), cfg.tiers, cfg.codec, plan.block_bytes, cold, cfg.gpu,
                    float(cfg.gpu.hbm_bandwidth_gbps) * 1e9 * float(cfg.cost.mbu))


def validate_workload(cfg, workload) -> None:
    """Checks that need the workload: every request has >= 1 prompt and >= 1 output token
    (TraceError naming the request: the workload schema's contract, traces/workload.py); prefix
    ids lie in ``[0, (2**63 - 1 - G) // (G + 1)]``
    (``G``: the trace's prefix granularity; a block key ``id x (G + 1) + offset`` must not wrap)
    and no request repeats one (TraceError naming the file, the request and the id: trace ids
    are prefix-chained, see :mod:`sim.keys`); a policy
    that protects the prompt with a total budget (h2o, tova with ``policy.protect_prompt=true``)
    cannot serve a prompt longer than ``policy.budget`` (requests the engine rejects at arrival
    anyway, ``input + output > model.max_model_len``, are not counted; ConfigError naming the
    request, its prompt length and the field); with recorded importance scores the file must
    hold every admitted request longer than ``policy.budget`` (ConfigError naming the file, the
    count and the first missing request)."""
    import numpy as np

    from policies.registry import POLICIES, policy_config
    from traces import TraceError

    from .keys import first_repeated_id

    # the file the user gave (trace.path), else the trace preset read
    path = cfg.trace.get("path") if hasattr(cfg.trace, "get") else getattr(cfg.trace, "path", None)
    trace = f"the trace file {path}" if path else f"trace {workload.name!r}"

    for col, lo in (("input_tokens", 1), ("output_tokens", 1)):
        a = np.asarray(getattr(workload, col))
        if len(a) and int(a.min()) < lo:  # (every loader checks its rows; this is the contract)
            row = int(np.argmax(a < lo))
            raise TraceError(
                f"{col} out of range", path=workload.source,
                where=f"request {int(workload.request_id[row])} (session "
                      f"{int(workload.session_id[row])}, turn {int(workload.turn[row])})",
                field=col, found=int(a[row]), expected=f">= {lo} tokens")
    G = int(workload.prefix_block_tokens)
    vals = np.asarray(workload.prefix_values())
    if G > 0 and len(vals):
        # a block's key is id x (G + 1) + offset (sim.keys): it must fit int64 without wrapping
        limit = (2 ** 63 - 1 - G) // (G + 1)
        # (min and max first: two passes without the temporaries of the mask, 94 M Weka ids)
        if int(vals.min()) < 0 or int(vals.max()) > limit:
            bad = np.flatnonzero((vals < 0) | (vals > limit))
            off = np.asarray(workload.prefix_offsets())
            row = int(np.searchsorted(off, bad[0], side="right")) - 1
            raise TraceError(
                "prefix id out of range", path=workload.source,
                where=f"request {int(workload.request_id[row])} (session "
                      f"{int(workload.session_id[row])}, turn {int(workload.turn[row])})",
                field="prefix ids", found=f"id {int(vals[bad[0]])}",
                expected=f"ids in [0, {limit}] (block keys are id x {G + 1} + offset, exact "
                         f"64-bit integers; sim/keys.py)")
    row, rid = first_repeated_id(workload.prefix_offsets(), workload.prefix_values())
    if row >= 0:
        raise TraceError(
            "prefix ids repeat within a request", path=workload.source,
            where=f"request {int(workload.request_id[row])} (session {int(workload.session_id[row])}, "
                  f"turn {int(workload.turn[row])})",
            field="prefix ids", found=f"id {rid} twice",
            expected="prefix-chained ids: each names a distinct prefix, so no id appears twice in "
                     "one request")
    if str(cfg.policy.name) == "full" or len(workload) == 0:
        return
    try:
        pc = policy_config(cfg.policy)
    except ValueError:
        return  # (validate_config names the bad option)
    inp = np.asarray(workload.input_tokens)
    out = np.asarray(workload.output_tokens)
    ok = (inp + out) <= int(cfg.model.max_model_len)
    if not ok.any():
        return
    if getattr(pc, "importance_source", "") == "recorded" and POLICIES[pc.name](pc).uses_scores:
        import pyarrow.parquet as pq

        try:  # (only the ids: the whole file is read, and checked, when the model is built)
            have = pq.read_table(pc.importance_file, columns=["request_id"]).column(0).to_numpy()
        except (OSError, ValueError):
            have = None  # (an unreadable file: the importance model's error, before the run)
        # the requests longer than the budget have tokens to evict: their rounds read scores
        # (a round of another that reads a missing score stops the run with the same error)
        need = np.asarray(workload.request_id)[ok & (inp + out > pc.budget)]
        miss = need[~np.isin(need, have)] if have is not None else need[:0]
        if len(miss):
            raise ConfigError(
                f"policy.importance_file={pc.importance_file}: no scores recorded for "
                f"{len(miss)} of the {len(need)} requests of {trace} longer than "
                f"policy.budget={pc.budget} tokens (first: request {int(miss[0])}); expected a "
                f"file covering them (or a trace sliced to those it covers, e.g. "
                f"trace.max_requests)")
    i = int(np.flatnonzero(ok)[np.argmax(inp[ok])])
    policy = POLICIES[pc.name](pc)
    try:
        policy.check_request(int(inp[i]))
    except ValueError as e:
        raise ConfigError(
            f"policy.budget={pc.budget} cannot serve request {int(workload.request_id[i])} of "
            f"{trace} ({int(inp[i])} prompt tokens, the longest admitted): {e}; "
            f"raise policy.budget or set policy.protect_prompt=false") from None


def schema_type(key: str):
    """The type kvsim's config schema (:class:`sim.config.KvsimConfig`) gives the dotted
    ``key`` (``sim.progress``: ``Optional[bool]``; ``tiers.levels.0.gib``: float), or None
    where the schema does not type it (a group's free-form node, an unknown key)."""
    import dataclasses
    import typing

    from .config import KvsimConfig

    t = KvsimConfig
    for part in key.split("."):
        args = typing.get_args(t)
        if typing.get_origin(t) is typing.Union and type(None) in args and len(args) == 2:
            t = next(a for a in args if a is not type(None))  # (Optional[X]: X)
        if part.isdigit() and typing.get_origin(t) in (list, typing.List):
            t = (typing.get_args(t) or (None,))[0]
            continue
        if not (isinstance(t, type) and dataclasses.is_dataclass(t)):
            return None
        try:
            hints = typing.get_type_hints(t)
        except Exception:  # noqa: BLE001 - (a schema built at run time may not resolve)
            return None
        if part not in hints:
            return None
        t = hints[part]
    return t


def non_boolean_override(args: list[str]) -> str | None:
    """The error for the first override of a true/false option (a ``bool`` field of the
    schema, :func:`schema_type`) whose value, or one of whose sweep values (a comma list,
    ``choice``, ``range``, ``glob``), is not true or false (``sim.progress=5``,
    ``output.write_steps=2``, ``=yes``: OmegaConf takes any integer and yes/no/on/off for a
    boolean, so 5 would run as true); null is allowed where the field takes it
    (``sim.progress``). None when every such value is true or false. ``args``: the command
    line's overrides, a sweep's arguments (``hydra.sweeper.params`` included) or one job's."""
    import typing

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, Glob, Sweep

    parser = None
    for a in args:
        if a.startswith(("-", "~")) or "=" not in a:
            continue
        key = a.split("=", 1)[0].lstrip("+")
        if key.startswith("hydra.") or key.startswith("hydra/"):
            continue
        t = schema_type(key)
        nullable = t == typing.Optional[bool]
        if t is not bool and not nullable:
            continue
        parser = parser or OverridesParser.create()
        try:
            o = parser.parse_override(a)
        except Exception:  # noqa: BLE001 - (unparsable_override reports those)
            continue
        v = o.value()
        values = v.list if isinstance(v, ChoiceSweep) else \
            list(o.sweep_iterator()) if isinstance(v, Sweep) else [v]
        for x in values:
            if not _non_boolean(x, nullable):
                continue
            shown = "null" if x is None else a.split("=", 1)[1] if isinstance(v, Glob) else x
            return f"{key}={shown}: {key} is a true/false option; expected {_wanted(nullable)}"
    return None

def _non_boolean(x, nullable: bool) -> bool:
    """Whether the value ``x`` given for a true/false option is not one: true and false (the
    strings too, any case) are; null is where the field takes it (``nullable``)."""
    return not (isinstance(x, bool) or (x is None and nullable)
                or (isinstance(x, str) and x.lower() in ("true", "false")))


def _wanted(nullable: bool) -> str:
    return "true, false or null" if nullable else "true or false"


def non_boolean_config_value(config_name: str | None, overrides: list[str]) -> str | None:
    """The error for the first true/false option (a ``bool`` field of the schema,
    :func:`schema_type`) that a user's config file sets to anything but a boolean: each YAML
    file of the run's defaults list (Hydra's ``compute_defaults_list`` for the primary config
    ``config_name`` and the run's ``overrides``) that Hydra takes from a config folder other
    than kvsim's own (``--config-dir``, ``--config-path``, ``hydra.searchpath``): a user's
    primary config or group option. OmegaConf turns the strings ``"yes"``/``"no"``/``"on"``/
    ``"off"``/``"1"`` and the integers 1 and 0 into booleans as it merges a file into the typed
    config, where an override gets this check before Hydra (:func:`non_boolean_override`).
    kvsim's own presets (``experiments/conf``) are held to the same rule by its tests
    (:func:`non_boolean_file_value`), not at each run: listing the defaults costs about 0.1 s,
    spent only when a user's folder is on the search path. YAML's own booleans pass: the YAML
    loader Hydra uses (PyYAML's, YAML 1.1) reads unquoted ``yes``/``no``/``on``/``off`` as
    booleans, as it reads ``true``. Null passes where the field takes it; an interpolation
    (``${...}``) is left to the typed config. None when every such value is a boolean, or
    when Hydra cannot list the files (it reports that itself)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from .config import CONF_DIR

    try:
        loader = GlobalHydra.instance().config_loader()
        sources = list(loader.get_sources())
    except Exception:  # noqa: BLE001 - (Hydra's composition reports those)
        return None

    def users(src) -> bool:
        if src.scheme() == "file":
            return Path(src.path).resolve() != CONF_DIR
        return src.scheme() == "pkg" and not str(src.path).startswith("hydra")

    if not any(users(src) for src in sources):
        return None
    try:
        defaults = loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN).defaults
    except Exception:  # noqa: BLE001 - (as above)
        return None
    seen = set()
    for d in defaults:
        path = d.config_path
        if path is None or path in seen or path.startswith("hydra/") \
                or (d.package or "").split(".")[0] == "hydra":
            continue
        seen.add(path)
        # (the first source on the search path that has the config is the one Hydra loads)
        src = next((src for src in sources if src.is_config(path)), None)
        if src is None or not users(src):
            continue
        try:
            loaded = src.load_config(path)
        except Exception:  # noqa: BLE001 - (as above)
            continue
        bad = non_boolean_file_value(loaded.config, d.package or "",
                                     f"{src.path}/{path}.yaml")
        if bad is not None:
            return bad
    return None


def non_boolean_file_value(config, package: str, where: str) -> str | None:
    """The error for the first true/false option that one config file's content ``config`` (as
    Hydra's YAML loader read it, not merged into the typed config) sets to anything but a
    boolean (see :func:`non_boolean_config_value`); ``package``: where the file's content goes
    in the config (``cache`` for a ``cache`` group option, ``""`` for a primary config, whose
    ``defaults`` and ``hydra`` keys are not options); ``where``: the file, for the message.
    None when every such value is a boolean."""
    import typing

    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(config, resolve=False) if OmegaConf.is_config(config) else config
    stack = [("", raw)]
    while stack:
        within, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if not within and not package and k in ("defaults", "hydra"):
                continue
            key = f"{within}.{k}" if within else str(k)
            if isinstance(v, (dict, list)):
                stack.append((key, v))
                continue
            full = f"{package}.{key}" if package else key
            t = schema_type(full)
            nullable = t == typing.Optional[bool]
            if (t is not bool and not nullable) or \
                    (isinstance(v, str) and v.startswith("${")) or not _non_boolean(v, nullable):
                continue
            return (f"{where}: {key}: {v!r} ({type(v).__name__}); {full} is a true/false "
                    f"option; expected {_wanted(nullable)} (OmegaConf would take it as "
                    f"{'true' if _truthy(v) else 'false'})")
    return None


def _truthy(v) -> bool:
    """What OmegaConf's boolean node makes of ``v`` (a non-boolean value it accepts)."""
    if isinstance(v, str):
        return v.strip().lower() in ("y", "yes", "on", "1", "true")
    return bool(v)
