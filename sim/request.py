"""A request's live state in the engine, and its status codes."""

from __future__ import annotations

import numpy as np

WAITING, RUNNING, FINISHED, REJECTED, ONBOARDING = 0, 1, 2, 3, 4
STATUS_NAMES = {WAITING: "waiting", RUNNING: "running", FINISHED: "finished", REJECTED: "rejected",
                ONBOARDING: "onboarding"}

class Request:
    """One request's live state. Token counts in tokens, times in simulated seconds."""

    __slots__ = (
        "idx", "rid", "arrival", "input", "output", "keys", "blocks", "n_blocks", "n_cached",
        "n_computed", "n_generated", "status", "first_scheduled", "first_token", "finish",
        "hit_tokens", "computed_prompt_tokens", "preemptions", "reason", "total_blocks",
        "hit_tier", "onboard_s", "onboard_tier_s", "load_event",
        "gen", "layout", "pstate", "n_placed", "compressed", "tokens_evicted", "blocks_freed",
        "peak_blocks", "end_live", "end_blocks", "pending", "blocks_since", "phys_base",
        "next_round", "prefill_end", "recompute_cut", "hit_remote", "onboard_remote_s", "pd",
        "intact_blocks",
    )

    def __init__(self, idx: int, rid: int, arrival: float, input_tokens: int, output_tokens: int):
        self.idx = idx
        self.rid = rid
        self.arrival = arrival
        self.input = input_tokens
        self.output = output_tokens
        self.keys = None
        self.blocks = None
        self.n_blocks = 0
        self.n_cached = 0
        self.n_computed = 0
        self.n_generated = 0
        self.status = WAITING
        self.first_scheduled = np.nan
        self.first_token = np.nan
        self.finish = np.nan
        self.hit_tokens = 0
        self.computed_prompt_tokens = 0
        self.prefill_end = 0  # the tokens the prefill of its latest admission reaches
        self.preemptions = 0
        self.reason = ""
        self.total_blocks = 0
        # prefix-hit tokens served by each level below the GPU (sim.tiers; level 1 first),
        # set at its first admission with a tier chain; None: none
        self.hit_tier = None
        self.hit_remote = 0  # prefix-hit tokens a cluster's shared store served (sim.kv_store)
        self.onboard_s = 0.0
        # seconds its onboarding before the first token read out of each level (level 1
        # first; sim.tiers.TierManager.onboard); None: none
        self.onboard_tier_s = None
        self.onboard_remote_s = 0.0
        self.load_event = None
        self.gen = 0  # incremented at preemption (invalidates in-flight loads)
        self.layout = None  # policies.PagedLayout when a compression policy is active
        self.pstate = None
        self.n_placed = 0
        self.compressed = False
        self.tokens_evicted = 0
        self.blocks_freed = 0
        self.peak_blocks = 0
        self.end_live = 0
        self.end_blocks = 0
        # the prefix-hit tokens its latest walk gave up to recompute them (tiers.load_or_recompute:
        # from the first disk page on), and of them those held on disk: (tokens, disk tokens)
        self.recompute_cut = (0, 0)
        # prefill/decode disaggregation (sim.cluster): on a decode replica, None or a
        # sim.cluster.Handoff (its prefill replica, the prefill's request and the KV transfer)
        self.pd = None
        # with compression, from its first round on: its leading blocks that hold the
        # uncompressed prompt (wholly inside the pinned part; they stay in the prefix cache)
        self.intact_blocks = 0

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV the request needs now: prompt + generated so far."""
        return self.input + self.n_generated
