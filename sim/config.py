"""Structured configuration schema of kvsim (Hydra / OmegaConf dataclasses).

Every Hydra config group (``model``, ``gpu``, ``trace``, ``cache``, ``scheduler``, ``cost``) is
typed by one dataclass here, so an override with a misspelt key or a wrong type fails before any
simulation starts instead of silently falling back to a default.

Units are in the field names: ``*_tokens`` tokens, ``*_s`` seconds, ``*_gib`` GiB (2**30 bytes),
``*_bytes`` bytes, ``*_gbps`` 1e9 bytes/s, ``*_tflops`` 1e12 FLOP/s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from policies import POLICY_CONFIGS, CompactionConfig, PolicyConfig
from traces import TraceConfig

from .folders import (RUN_LOCK, SWEEP_ID, blocking_file, foreign_folder, missing_top,
                      uncreatable_folder)


@dataclass
class ModelConfig:
    """A model card: the architecture numbers that decide KV size, weight bytes and FLOPs.

    Sources: each YAML under ``experiments/conf/model`` cites the model's published config.
    ``attention``: ``gqa`` (MHA/GQA/MQA: K and V per KV head) or ``mla`` (DeepSeek multi-head
    latent attention: one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token per layer,
    shared by K and V). ``num_sliding_window_layers`` of the ``num_layers`` keep at most
    ``sliding_window`` tokens (GPT-OSS alternates full and 128-token window layers).
    """

    name: str = MISSING
    num_layers: int = MISSING
    num_q_heads: int = MISSING
    num_kv_heads: int = MISSING
    head_dim: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING  # dense MLP width, or per-token active MoE width
    vocab_size: int = MISSING
    num_params_b: float = MISSING  # total parameters, billions
    active_params_b: float = MISSING  # parameters touched per token (MoE: active), billions
    embedding_params_b: float = MISSING  # input embedding + untied lm_head, billions
    attention: str = "gqa"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int = 0
    num_sliding_window_layers: int = 0
    rope_dim: int = 0  # rotary part of each K head (for codecs that keep RoPE at hot precision)
    max_model_len: int = MISSING  # published max context with published rope scaling
    rope_scaling: str = "none"  # documentation of how max_model_len is reached
    dtype: str = "bf16"  # vLLM --dtype: activations and unquantized weights
    weight_quant: str = "none"  # vLLM --quantization: none | fp8 | int4_awq | int4_gptq | mxfp4 | nvfp4
    # which linear layers weight_quant applies to: "linear" (every transformer linear layer;
    # embeddings and lm_head stay in dtype) | "experts" (routed experts only: gpt-oss MXFP4)
    weight_quant_scope: str = "linear"
    # Mixture of experts (0 = a dense MLP in every layer). A MoE layer routes each token to
    # num_experts_per_tok of num_experts experts of width moe_intermediate_size, plus
    # num_shared_experts always-active experts of that width; the first num_dense_layers layers
    # have a dense MLP of width intermediate_size (DeepSeek first_k_dense_replace).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    mlp_gated: bool = True  # SwiGLU-style MLP: gate, up and down projections (False: up, down)
    # MLA projections (DeepSeek): queries through a q_lora_rank bottleneck (0 = none); heads of
    # qk_nope_head_dim + qk_rope_head_dim for Q.K and v_head_dim for V
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    tie_word_embeddings: bool = False
    source: str = ""


@dataclass
class GPUConfig:
    """A GPU card. Datasheet numbers; the cost model applies efficiencies on top.

    ``memory_gib`` is what the device reports (nvidia-smi total), in GiB.
    """

    name: str = MISSING
    memory_gib: float = MISSING
    hbm_bandwidth_gbps: float = MISSING
    bf16_dense_tflops: float = MISSING
    pcie_bandwidth_gbps: float = MISSING  # one direction, pinned, large transfers
    pcie_overhead_s: float = 14e-6  # per individually issued copy
    fp8_dense_tflops: float = 0.0  # dense FP8 tensor-core peak; 0 = no FP8 tensor cores
    fp4_dense_tflops: float = 0.0  # dense FP4 (NVFP4 / MXFP4) peak; 0 = none
    nvlink_bandwidth_gbps: float = 0.0  # per GPU, one direction; 0 = no NVLink (PCIe peers)
    nvlink_latency_s: float = 0.0  # per collective call, small messages
    source: str = ""


@dataclass
class CacheConfig:
    """KV cache manager settings (vLLM names).

    ``num_gpu_blocks``: if set, overrides the computed pool size.
    ``activation_reserve_gib``: memory kept for activations and non-torch allocations;
    ``None`` estimates it (see :func:`sim.hardware.activation_reserve_bytes`).
    ``reuse_answer_blocks`` (kvsim's, not a vLLM flag): a request's generated tokens are the
    next turn's prompt tokens at the same positions where the trace says that turn continues
    it, so the next turn hits them as it does on vLLM (:mod:`sim.keys`); ``false`` keeps every
    generated token unique to its request (a chat template that re-renders answers differently).
    """

    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # auto (= model dtype) | fp16 | bf16 | fp8 | nvfp4
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None
    activation_reserve_gib: Optional[float] = None
    max_block_size: int = 256
    reuse_answer_blocks: bool = True


@dataclass
class SchedulerConfig:
    """Continuous-batching scheduler (vLLM v1 semantics, FCFS)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = no per-request cap inside the budget
    preemption_mode: str = "recompute"


@dataclass
class CostConfig:
    """Step-time model. ``analytic``: roofline from the model and GPU cards.

    Efficiencies are the achieved fraction of datasheet peak (defaults are typical values for
    well-tuned serving kernels, to be replaced by a calibration file).
    """

    kind: str = "analytic"
    file: Optional[str] = None
    mfu: float = 0.6  # achieved fraction of dense BF16 FLOP/s in GEMMs
    attention_efficiency: float = 0.5  # achieved fraction of peak FLOP/s in attention
    mbu: float = 0.8  # achieved fraction of HBM bandwidth
    step_overhead_s: float = 0.004  # scheduler + launch + sampling per engine step
    tensor_parallel_size: int = 1
    # kind=operator only (sim/operator_cost.py; experiments/conf/cost/operator.yaml sets the
    # fitted values): decode attention's fraction of HBM bandwidth; the routed experts' grouped
    # GEMMs' fraction of the peak (few tokens per expert, weight-only dequantisation); host time per scheduled
    # sequence, and extra host time of a step with prefill work (outside the decode CUDA graph);
    # GPU time per layer that no roofline term covers (kernel tails and gaps); fraction of the
    # NVLink bandwidth a collective reaches; GEMM precision (auto: the weights' precision where
    # the GPU has tensor cores for it, else BF16 after dequantisation); expert parallelism for
    # MoE layers (all-to-all instead of the MLP all-reduce)
    attention_mbu: float = 0.8
    expert_mfu: float = 0.6  # routed experts' grouped GEMMs: achieved fraction of the peak
    fp8_mfu: Optional[float] = None  # FP8 GEMMs' fraction of the FP8 peak (null: mfu)
    fp4_mfu: Optional[float] = None  # FP4 GEMMs' fraction of the FP4 peak (null: mfu)
    seq_overhead_s: float = 0.0
    prefill_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    comm_efficiency: float = 0.8
    gemm_precision: str = "auto"
    expert_parallel: bool = False
    # every cost kind: time between a client sending a request and the scheduler seeing it
    # (API server: HTTP, tokenisation, queue hand-off); added to TTFT, E2E and queue time as the
    # client measures them (sim.run.delay_workload)
    frontend_latency_s: float = 0.0


@dataclass
class LevelConfig:
    """One level of a tier chain listed in ``tiers.levels`` (:func:`sim.tiers.tier_specs`).

    ``name``: its name (the summary's and tables' columns, e.g. ``hit_tokens_<name>``);
    ``gib``: capacity (GiB; 0: off, and so is every level below the last one above 0);
    ``read_gbps`` / ``write_gbps``: GB/s of its link toward the GPU (reads into the level
    above; the first level: host-to-device) and of the link filling it (demotions from the
    level above; the first level: device-to-host); ``latency_s``: s per batch (an I/O or an
    issued copy) on both; null for the first level: the PCIe figures (``tiers.pcie_gbps`` /
    ``pcie_overhead_s`` or the GPU card's). ``replacement``: lru | arc, null for
    ``tiers.replacement``."""

    name: str = MISSING
    gib: float = 0.0
    read_gbps: Optional[float] = None
    write_gbps: Optional[float] = None
    latency_s: Optional[float] = None
    replacement: Optional[str] = None


@dataclass
class TiersConfig:
    """Host and disk tiers below the GPU (see :mod:`sim.tiers`).

    ``host_gib`` / ``disk_gib`` = 0 disables a tier. ``replacement``: lru | arc.
    ``write_policy``: write_back (copy a cached block down when the GPU evicts it; the step
    that reuses the block, and any onboarding into it, wait until the copy has landed, as
    SGLang HiCache's write_back eviction waits for its writes) | write_through (copy when it
    becomes full, asynchronously: the block stays on the GPU) | write_through_selective (after
    ``selective_min_hits`` hits). ``onboard``: blocking (load, then prefill) | layerwise (load
    overlapped with the prefill layer by layer). ``load_or_recompute``: recompute a disk hit
    when loading it would take longer. PCIe defaults come from the GPU card.

    ``levels``: the chain below the GPU as a list of :class:`LevelConfig`, level 1 first (then
    ``host_gib`` and ``disk_gib`` stay 0); empty: the two levels host (``host_gib``, PCIe) and
    disk (``disk_gib``, ``disk_read_gbps`` / ``disk_write_gbps`` / ``disk_latency_s``).
    """

    name: str = "gpu_only"
    host_gib: float = 0.0
    disk_gib: float = 0.0
    replacement: str = "lru"
    write_policy: str = "write_back"
    selective_min_hits: int = 2
    transfer_batch_pages: int = 64
    onboard: str = "blocking"
    load_or_recompute: bool = False
    pcie_gbps: Optional[float] = None
    pcie_overhead_s: Optional[float] = None
    disk_read_gbps: float = 7.0
    disk_write_gbps: float = 5.0
    disk_latency_s: float = 80e-6
    levels: List[LevelConfig] = field(default_factory=list)


@dataclass
class CodecConfig:
    """Cold-page codec applied when a page leaves the GPU; its page bytes come from its format
    (:func:`sim.tiers.cold_page_bytes`, :mod:`sim.codecs`). ``name``: identity | fp8 | nvfp4;
    ``keep_rope_hot``: K's RoPE part stays at the hot precision; ``tensor_scale``: where each
    tensor's FP32 scale lives, ``layer`` (held once by the server) or ``page`` (in every page);
    ``fp8_scale_block``: fp8's values per FP32 block scale (0: the tensor scale only);
    ``align_bytes``: each section of a page padded to a multiple of it."""

    name: str = "identity"
    keep_rope_hot: bool = False
    tensor_scale: str = "layer"
    fp8_scale_block: int = 0
    align_bytes: int = 1


@dataclass
class StoreConfig:
    """A KV store shared by a cluster's replicas, below each replica's host and disk tiers
    (:mod:`sim.kv_store`). ``enabled``: off by default (no store: tables unchanged).
    ``capacity_gib``: the store's capacity (GiB), in pages of its codec. ``replacement``: lru |
    arc. ``codec``: identity | fp8 | nvfp4, or null for the run's ``codec.name`` (the other
    ``codec.*`` fields apply). ``net_gbps`` (1e9 bytes/s, each direction) and ``net_latency_s``
    (s per batch): each replica's network link to the store (defaults: one 400 Gb/s RDMA NIC per
    GPU at the ~47 GB/s Mooncake's Transfer Engine reaches; 100 us per batch, assumed).
    """

    enabled: bool = False
    capacity_gib: float = 1024.0
    replacement: str = "lru"
    codec: Optional[str] = None
    net_gbps: float = 47.0
    net_latency_s: float = 100e-6


@dataclass
class PDConfig:
    """Prefill/decode disaggregation of a cluster's replicas (:mod:`sim.cluster`).
    ``prefill_replicas``: how many of ``cluster.replicas`` only prefill (0: every replica
    prefills and decodes; else 1 .. replicas - 1, the rest decode). ``decode_router``: the
    router of the decode pool (``cluster.router`` routes the prefill pool); round_robin as
    vLLM's disaggregated-serving proxy picks both. ``net_gbps`` (1e9 bytes/s) and
    ``net_latency_s`` (s per transfer): each replica's network link for the KV transfer, one
    way each (defaults: the ~47 GB/s Mooncake's Transfer Engine reaches on a 400 Gb/s RDMA NIC
    per GPU; 100 us per transfer, assumed)."""

    prefill_replicas: int = 0
    decode_router: str = "round_robin"
    net_gbps: float = 47.0
    net_latency_s: float = 100e-6


@dataclass
class ClusterConfig:
    """Replicas of the engine behind a router (:mod:`sim.cluster`, :mod:`sim.routers`).

    ``replicas``: engines, each with its own GPU pool, scheduler and host/disk tiers (1: the
    single engine, tables without a ``replica`` column; kvsim's root config,
    experiments/conf/config.yaml, sets 4 with ``prefix_aware``: docs/cluster.md). ``router``:
    round_robin | least_loaded | session_affinity | prefix_aware. ``event_staleness_s``: how long after a
    replica publishes its KV events (end of each engine step) the router applies them
    (prefix_aware). ``overlap_weight``: prefix_aware's weight of the prefill blocks against
    the active blocks (NVIDIA Dynamo's ``kv-overlap-score-weight``). ``store``: a KV store
    shared by the replicas (:class:`StoreConfig`). ``pd``: prefill/decode disaggregation
    (:class:`PDConfig`; off by default).
    """

    replicas: int = 1
    router: str = "round_robin"
    event_staleness_s: float = 0.0
    overlap_weight: float = 1.0
    store: StoreConfig = field(default_factory=StoreConfig)
    pd: PDConfig = field(default_factory=PDConfig)


@dataclass
class SimConfig:
    """Engine switches."""

    check_invariants: bool = False
    # a progress bar on stderr: true, false, or null (default) = the kvsim command draws it
    # when stderr is a terminal (a sweep's jobs, a pipe or a CI log get none: their bars ran
    # together on one line) and run_simulation() always
    progress: Optional[bool] = None
    fast_forward: bool = True
    max_sim_time_s: Optional[float] = None
    # prefix-index backend (same results, different speed): dict | table | auto (table when the
    # trace's mean prompt spans >= 256 blocks; see sim/block_pool.py)
    prefix_index: str = "auto"


@dataclass
class OutputConfig:
    """Where and what to write. ``dir`` defaults to the Hydra run directory."""

    dir: Optional[str] = None
    write_steps: bool = True
    print_summary: bool = True
    skip_completed: bool = False
    write_ops: bool = False  # ops.jsonl of compaction rounds and transfers for gpu_validation
    ops_limit: int = 500


@dataclass
class KvsimConfig:
    """The root config (``kvsim --cfg job`` prints it resolved)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    tiers: TiersConfig = field(default_factory=TiersConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    seed: int = 0


CONF_DIR = Path(__file__).resolve().parent.parent / "experiments" / "conf"  # the Hydra configs
REJECTED_RUN_PREFIX = "kvsim-rejected-run-"  # Hydra's run folder for an output.dir that is a file


# each output.dir the kvsim_run_dir resolver found missing in this process (its absolute path)
# -> the highest folder of its path that did not exist (the resolver's check makes them)
made_output_dirs: dict[str, Path] = {}


def _run_dir(output_dir, default: str) -> str:
    """``${kvsim_run_dir:${output.dir},default}``: ``output.dir`` if set, else ``default``.

    An ``output.dir`` naming an existing file or a path under one, a folder holding files that
    are not a kvsim run's (:func:`sim.folders.foreign_folder`) or a folder that cannot be
    created or written (:func:`sim.folders.uncreatable_folder`) gives a folder under the
    system's temporary directory instead, so Hydra can create its run directory (and log file)
    without writing into or beside it; the job then reports the bad ``output.dir`` itself (one
    clear line, exit 2). So does a folder another kvsim process holds (its lock,
    :func:`sim.run.hold_output_dir`) and a sweep job's results folder (the sweep's id,
    :data:`sim.folders.SWEEP_ID`; this resolver names a single run's folder only): the refused
    run writes nothing there, not even its log."""
    if output_dir is None or str(output_dir) == "":
        return default
    import os
    import tempfile

    from .locks import held_by_another

    p = Path(str(output_dir))
    top = missing_top(p)
    if top is not None:
        made_output_dirs.setdefault(os.path.abspath(p), Path(os.path.abspath(top)))
    if blocking_file(p) is not None or foreign_folder(p) is not None \
            or held_by_another(p / RUN_LOCK) or uncreatable_folder(p) is not None \
            or (p / SWEEP_ID).is_file():
        return str(Path(tempfile.gettempdir()) / f"{REJECTED_RUN_PREFIX}{os.getpid()}")
    return str(output_dir)


def _output_subdir(output_dir) -> Optional[str]:
    """``${kvsim_output_subdir:${output.dir}}``: Hydra's ``.hydra/`` record of the job, none
    with ``output.dir`` (the run writes its own ``config.yaml``, and a rejected re-run must
    leave an earlier run's directory as it was)."""
    return ".hydra" if output_dir is None or str(output_dir) == "" else None


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    # the root schema types every group node, so group options (YAML files) are validated
    # against their dataclass without being listed as selectable options themselves
    cs = ConfigStore.instance()
    cs.store(name="kvsim_schema", node=KvsimConfig)
    # each policy's options with their defaults, as plain values (the group's node stays typed
    # by the schema of every policy's options): a preset's defaults list starts with its
    # /policy_defaults/<name>, so the composed node holds every option the policy reads
    for name, options in POLICY_CONFIGS.items():
        cs.store(group="policy_defaults", name=name, node=dataclasses.asdict(options()))
    if not OmegaConf.has_resolver("kvsim_run_dir"):
        # hydra.run.dir is output.dir when that is set (Hydra's log file then sits beside the
        # results, and no outputs/<date>/<time>/ folder is created), else its default
        OmegaConf.register_new_resolver("kvsim_run_dir", _run_dir)
    if not OmegaConf.has_resolver("kvsim_output_subdir"):
        OmegaConf.register_new_resolver("kvsim_output_subdir", _output_subdir)
