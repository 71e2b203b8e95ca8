"""Glue between the engine and :mod:`policies`: per-request layouts, rounds and their costs.

The engine calls, per request with an active policy (anything but ``full``):

* :meth:`Compression.new_request` at admission (layout + policy state, mirroring TensorRT-LLM's
  ``on_request_init``), then :meth:`place` whenever tokens get slots;
* :meth:`after_step` at the end of every step the request took part in: ``on_prefill_end`` when
  its prompt completed this step, else ``on_decode``; if the policy says a round is due,
  :meth:`run_round` scores the live slots (importance model), selects survivors, lets the
  compactor reorganise memory and returns the block-table indices freed.

Round cost (added to the next engine step: rounds run between forward passes):
``launch overhead + bytes_moved x 2 / (HBM bw x mbu)`` for the mover (each moved byte is read and
written once) plus the policy's scoring bytes at HBM bandwidth, or the calibrated
``compaction_move`` op when a calibration file is loaded. Policies that need attention scores on
every step (H2O, TOVA) pay their score-matrix traffic on every decode step instead
(:meth:`step_extra_time`): FlashAttention never writes scores to HBM, so an eager pass must.

Prefix caching (design.md section 3): once a request had a round, its blocks after the pinned
prompt no longer hold the uncompressed text, so they are dropped from the prefix index and
nothing more is registered; blocks wholly inside the pinned (protected) prompt stay reusable.
Blocks shared with another request (ref count > 1, i.e. prefix hits) are never modified: their
slots are treated as pinned for this request's rounds.
"""

from __future__ import annotations

import numpy as np

from policies import (CompactionConfig, ModelShape, PagedLayout, PolicyConfig, make_compactor,
                      make_importance, make_policy, score_slots)

from .errors import ConfigError
from .hardware import kv_bytes_per_token

ROUND_LAUNCH_OVERHEAD_S = 10e-6  # one mover launch (H200 calibration: 10.4 us fixed cost)


def _plain(node, cls):
    """An OmegaConf node or dataclass -> the policies dataclass ``cls``."""
    if isinstance(node, cls):
        return node
    from omegaconf import OmegaConf

    return OmegaConf.to_object(node) if not isinstance(node, dict) else cls(**node)


class Compression:
    """Per-run compression machinery.

    Args:
        policy_cfg, compaction_cfg: ``policy`` / ``compaction`` config nodes.
        model, cache, cost: config nodes; hbm_Bps: HBM bandwidth (bytes/s, before mbu).
        seed: run seed (importance model and random policy draw from it).
        calibration: optional calibration (``compaction_move`` op).

    Raises ConfigError for unknown names or invalid parameters (the message lists valid names).
    """

    def __init__(self, policy_cfg, compaction_cfg, model, cache, cost, hbm_Bps: float, seed: int,
                 calibration=None):
        try:
            pc = _plain(policy_cfg, PolicyConfig)
            cc = _plain(compaction_cfg, CompactionConfig)
            # the random policy and the importance model draw from policy.seed + the run seed
            pc.seed = int(pc.seed) + int(seed)
            self.policy = make_policy(pc)
            self.compactor = make_compactor(cc)
            self.importance = make_importance(pc)
            self.groups = self.policy.num_groups(int(model.num_kv_heads), int(model.num_layers))
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"policy/compaction config: {e}") from None
        self.name = pc.name
        self.compaction = cc.name
        self.active = pc.name != "full"
        self.kv_tok = float(kv_bytes_per_token(model, cache))
        self.shape = ModelShape(int(model.num_layers), int(model.num_kv_heads), int(model.num_q_heads),
                                int(model.head_dim), self.kv_tok)
        self.bw = float(hbm_Bps) * float(cost.mbu)
        self.cal = calibration
        self.B = int(cache.block_size)
        self.layout_kwargs = self.compactor.layout_kwargs()
        self.hole_fill = bool(self.layout_kwargs.get("hole_fill", False))
        self.read_factor = self.compactor.read_overhead_factor(self.kv_tok, int(model.num_layers),
                                                               self.groups)
        self.step_scoring = self.policy.scoring_when == "step"
        self.quest = self.policy.reads_fraction(1_000_000, int(model.num_layers),
                                                int(cache.block_size)) < 1.0
        self.num_layers = int(model.num_layers)
        self.ops = None  # list of compaction ops for gpu_validation replay (output.write_ops)
        self.ops_limit = 0
        # rounds the ops file cannot hold: the replay's mover is single-group forward packing
        self.ops_left_out = 0
        self.ops_over_limit = 0  # rounds it could hold, past output.ops_limit

    # ------------------------------------------------------------------ per request
    def new_request(self, req) -> None:
        """Attach a fresh layout and policy state to ``req`` (at admission or re-admission)."""
        try:
            req.pstate = self.policy.new_state(req.rid, req.input)
        except ValueError as e:
            raise ConfigError(f"request {req.rid}: {e}") from None
        req.layout = PagedLayout(self.B, self.groups, req.input, request_key=req.rid,
                                 **self.layout_kwargs)
        req.n_placed = 0
        req.compressed = False
        req.pending = 0       # tokens placed since the layout was last brought up to date
        req.blocks_since = 0  # blocks added since then
        req.phys_base = 0     # order-preserving: longest group's append pointer at that time;
        #                       hole_fill: slots free for reuse at that time
        req.next_round = None

    def blocks_for(self, req, n: int) -> int:
        """New blocks needed to place ``n`` more tokens of ``req`` (integer arithmetic on the
        cached layout summary; equals ``PagedLayout.append`` on an up-to-date layout)."""
        B = self.B
        if self.hole_fill:
            short = max(0, req.pending + n - req.phys_base)
            return -(-short // B) - req.blocks_since
        need = req.phys_base + req.pending + n
        return max(0, -(-need // B) - (req.layout.n_blocks + req.blocks_since))

    def place(self, req, n: int, k: int) -> None:
        """Record ``k`` new blocks (already allocated by the engine) and ``n`` tokens placed.
        The layout itself is updated lazily (:meth:`sync`) before a round."""
        req.pending += n
        req.blocks_since += k
        req.n_placed += n

    def sync(self, req) -> None:
        """Apply pending appends to the layout (same result as appending token by token: new
        blocks go at the end, tokens take the lowest free slots or the append pointers)."""
        lay = req.layout
        if req.blocks_since:
            lay.add_blocks(req.blocks_since)
        if req.pending:
            lay.commit_append(req.pending)
        req.pending = 0
        req.blocks_since = 0
        self._rebase(req)

    def _rebase(self, req) -> None:
        lay = req.layout
        if self.hole_fill:
            req.phys_base = int(lay.free_slots_for_reuse().size)
        else:
            req.phys_base = int(lay.append_ptr.max())

    def physical_context(self, req) -> int:
        """Slots attention reads for ``req`` (longest group's physical length), with the
        hole-fill position-index overhead and Quest's page selection applied."""
        if not req.compressed:
            ctx = req.n_placed
        elif self.hole_fill:
            ctx = (req.layout.n_blocks + req.blocks_since) * self.B
        else:
            ctx = req.phys_base + req.pending
        f = self.read_factor if self.hole_fill else 1.0
        if self.quest:
            # (pages of the pool's block size: top_k_pages defaults to ceil(budget / block_size))
            f *= self.policy.reads_fraction(req.layout.n_blocks + req.blocks_since,
                                            self.num_layers, self.B)
        return int(round(ctx * f))

    def step_extra_time(self, req) -> float:
        """Extra seconds a decode step costs ``req`` for per-step scoring (eager attention)."""
        if not self.step_scoring:
            return 0.0
        b = self.policy.scoring_bytes(self.shape, req.n_computed, req.input, req.layout.n_blocks)
        return b / self.bw

    def due(self, req, prefill_done_now: bool) -> bool:
        """Policy hook at the end of a step (prefill end or decode). The decode hook is only
        consulted when the cached next round point is reached (the policy's cadence depends only
        on the token count, so skipping the steps in between changes nothing)."""
        if prefill_done_now:
            d = self.policy.on_prefill_end(req.pstate)
        elif req.next_round is not None and req.n_computed >= req.next_round:
            d = self.policy.on_decode(req.pstate, req.n_computed)
        else:
            return False
        req.next_round = self.policy.next_round_at(req.pstate)
        return d

    def next_round_at(self, req):
        """Token count at which ``req``'s next round fires (None = never)."""
        return self.policy.next_round_at(req.pstate)

    def run_round(self, req, shared_blocks: int):
        """One round on ``req``: returns ``(RoundResult, duration_s)``; the layout is updated and
        ``res.freed_block_indices`` are the block-table indices to return to the pool.

        ``shared_blocks``: leading blocks shared with other requests (kept untouched).
        """
        self.sync(req)
        lay = req.layout
        st = req.pstate
        pol = self.policy
        try:
            scores = (score_slots(self.importance, lay, step=st.generated,
                                  from_pos=pol.scores_from(lay)) if pol.uses_scores else None)
        except KeyError as e:  # (a recorded file without the scores this round needs)
            raise ConfigError(f"policy.importance_file: {e.args[0]}; expected scores for every "
                              f"position a round scores") from None
        keep = self.policy.select(lay, scores, req.n_computed, st.generated)
        pinned = self.policy.pinned_len(lay)
        if shared_blocks:
            shared_slots = shared_blocks * self.B
            keep[:, :shared_slots] |= lay.slot_pos[:, :shared_slots] >= 0
            pinned = max(pinned, shared_slots)
        n_ops = len(self.ops) if self.ops is not None else 0
        if self.ops is not None and (lay.num_groups != 1 or self.compaction != "forward_pack"):
            self.ops_left_out += 1
        elif self.ops is not None and len(self.ops) < self.ops_limit:
            pos_live = lay.slot_pos[0] >= 0
            valid = int(lay.append_ptr.max())
            kept = np.flatnonzero(keep[0, :valid] & pos_live[:valid])
            kept = kept[kept >= pinned]
            self.ops.append({"op": "compaction_move", "style": "forward", "block_size": self.B,
                             "time_s": None, "request_id": int(req.rid),
                             "requests": [{"kept": kept.tolist(), "prompt_len": int(pinned),
                                           "valid_len": valid, "tail": 0}]})
        elif self.ops is not None:
            self.ops_over_limit += 1
        res = self.compactor.apply(lay, keep, self.kv_tok, pinned_len=pinned)
        self._rebase(req)
        dur = self.round_time(res.bytes_moved)
        if self.ops is not None and len(self.ops) > n_ops:
            self.ops[-1]["predicted_s"] = dur
            self.ops[-1]["bytes_moved"] = float(res.bytes_moved)
            self.ops[-1]["blocks_after"] = int(res.blocks_after)
        if self.policy.scoring_when == "round":
            dur += self.policy.scoring_bytes(self.shape, req.n_computed, req.input, res.blocks_before) / self.bw
        return res, dur, pinned

    def round_time(self, bytes_moved: float) -> float:
        """Mover time for ``bytes_moved`` payload bytes (read once and written once)."""
        if self.cal is not None and self.cal.has("compaction_move"):
            return self.cal.op_time("compaction_move", bytes_moved, 1) if bytes_moved > 0 else 0.0
        if bytes_moved <= 0:
            return 0.0
        return ROUND_LAUNCH_OVERHEAD_S + 2.0 * bytes_moved / self.bw

    def finish(self, req) -> None:
        """Policy hook at finish or abort."""
        if getattr(req, "pstate", None) is not None:
            self.policy.on_finish(req.pstate)
            forget = getattr(self.importance, "forget", None)
            if forget is not None:
                forget(req.rid)


ROUND_COLUMNS = ["time_s", "request_id", "policy", "compaction", "tokens_before", "tokens_kept",
                 "tokens_evicted", "blocks_before", "blocks_after", "blocks_freed", "bytes_moved",
                 "tokens_moved", "ragged_waste_slots", "metadata_bytes", "fragmentation_after",
                 "duration_s"]


def check_policy_against_prompt(comp: Compression, prompt_len: int) -> None:
    """Raise ConfigError if the policy cannot serve a prompt of ``prompt_len`` tokens."""
    try:
        comp.policy.check_request(prompt_len)
    except ValueError as e:
        raise ConfigError(str(e)) from None


__all__ = ["Compression", "ROUND_COLUMNS", "check_policy_against_prompt", "np"]
