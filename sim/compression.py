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

import dataclasses

import numpy as np

from policies import (CompactionConfig, ImportanceModel, ModelShape, PagedLayout, RoundResult,
                      make_compactor, make_importance, make_policy, policy_config, score_slots)
from policies.compaction import _forward_pack
from policies.guarded import GuardedRanking
from policies.selection import RULE_H2O, RULE_TOP

from .errors import ConfigError
from .hardware import kv_bytes_per_token
from .jit import kernel

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
            pc = policy_config(policy_cfg)
            cc = _plain(compaction_cfg, CompactionConfig)
            if hasattr(pc, "seed"):
                # the random policy and the importance model draw from policy.seed + the run seed
                pc = dataclasses.replace(pc, seed=int(pc.seed) + int(seed))
            self.policy = make_policy(pc)
            self.compactor = make_compactor(cc)
            # (the importance model of a policy that ranks by scores: only those read it)
            self.importance = make_importance(pc) if self.policy.uses_scores else None
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
        # (H2O, TOVA: their per-step bytes are linear in the sequence length)
        self.step_bytes_per_token = self.policy.scoring_bytes_per_token(self.shape)
        self.quest = self.policy.reads_fraction(1_000_000, int(model.num_layers),
                                                int(cache.block_size)) < 1.0
        self.num_layers = int(model.num_layers)
        # on the generative model's fused path, rounds of a score-ranking policy score only
        # the candidates they rank, and SnapKV's family pools log-scores, in compiled passes
        # (select_from_terms: "dense" terms for the former, the static fields' lattice for
        # the latter, whose rounds score whole prompts in every group once)
        self.terms_select = None
        if (self.policy.uses_scores and isinstance(self.importance, ImportanceModel)
                and self.importance._fused):
            if self.policy.score_rule is not None:
                self.terms_select = "dense"
            elif getattr(self.policy, "pools_logs", False):
                self.terms_select = "lattice"
        # compactors whose round is one compiled pass here (_apply_keep); hole_fill: its own
        self.fast_apply = self.compaction in ("none", "forward_pack")
        # SnapKV's family under the none compactor: a round on a layout not yet brought up to
        # date (every group holds the same positions) ranks one shared row and writes the
        # kept slots' table once (_row_round)
        self.row_rounds = (self.terms_select == "lattice" and self.compaction == "none"
                           and not self.hole_fill and self.policy.scoring_when == "round"
                           and hasattr(self.policy, "select_row_from_terms"))
        # per-step H2O and TOVA under the none compactor keep their ranking between rounds
        # (GuardedRanking; a round works on the few candidates near its threshold) while
        # every round evicts a few tokens a group
        self.guarded = (self.terms_select == "dense" and self.compaction == "none"
                        and self.policy.score_rule in (RULE_TOP, RULE_H2O)
                        and int(self.policy.cfg.beta) <= 8
                        and self.compactor.cfg.release_empty_blocks)
        # a window policy (StreamingLLM) under the none compactor: a round evicts the live
        # slots of a range of positions, found and emptied with the freed blocks in one
        # compiled pass (_window_evict)
        self.window = (self.compaction == "none" and not self.hole_fill
                       and self.compactor.cfg.release_empty_blocks
                       and self.policy.evict_range(0) is not None)
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
        self._apply_pending(req)
        self._rebase(req)

    def _apply_pending(self, req) -> None:
        """:meth:`sync` without the summary's update (a round updates it after)."""
        lay = req.layout
        if req.blocks_since:
            lay.add_blocks(req.blocks_since)
        if req.pending:
            lay.commit_next(req.pending)
        req.pending = 0
        req.blocks_since = 0

    def _rebase(self, req) -> None:
        lay = req.layout
        if self.hole_fill:
            req.phys_base = int(lay.free_slots_for_reuse().size)
        else:
            ptr = lay.append_ptr
            req.phys_base = int(ptr[0]) if ptr.shape[0] == 1 else int(ptr.max())

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
        if self.step_bytes_per_token is not None:
            return self.step_bytes_per_token * req.n_computed / self.bw
        b = self.policy.scoring_bytes(self.shape, req.n_computed, req.input, req.layout.n_blocks)
        return b / self.bw

    def due(self, req, prefill_done_now: bool) -> bool:
        """Policy hook at the end of a step (prefill end or decode). The decode hook is only
        consulted when the cached next round point is reached (the policy's cadence depends only
        on the token count, so skipping the steps in between changes nothing)."""
        if prefill_done_now:
            if req.pstate.prefill_done:
                # a decode replica's first step on KV a prefill replica computed: that
                # replica ran the prefill-end hook and its round (sim.pd)
                return False
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
        if (self.row_rounds and self.ops is None and req.pending
                and req.layout.n_blocks == 0 and req.layout.next_position == 0):
            done = self._row_round(req, shared_blocks)
            if done is not None:
                res, pinned = done
                self._rebase(req)
                dur = self.round_time(res.bytes_moved) + self.policy.scoring_bytes(
                    self.shape, req.n_computed, req.input, res.blocks_before) / self.bw
                return res, dur, pinned
        self._apply_pending(req)  # (the summary: after the round)
        lay = req.layout
        st = req.pstate
        pol = self.policy
        keep = None
        if self.guarded and self.ops is None:
            done = self._guarded_round(req, shared_blocks)
            if done is not None:
                res, pinned = done
                self._rebase(req)
                return res, self.round_time(res.bytes_moved), pinned
        elif self.guarded:
            st.extra.pop("guard", None)
        elif self.window and self.ops is None:
            res, pinned = self._window_round(req, shared_blocks)
            self._rebase(req)
            return res, self.round_time(res.bytes_moved), pinned
        if self.terms_select is not None and lay.next_position > 0:
            seq = lay.next_position  # (every position held is below it: the scores' seq_len)
            terms = self.importance.log_score_terms(lay.request_key, lay.num_groups, st.generated,
                                                    seq, seq, self.terms_select == "lattice")
            keep = pol.select_from_terms(lay, terms, req.n_computed)
        if keep is None:
            try:
                scores = (score_slots(self.importance, lay, step=st.generated,
                                      from_pos=pol.scores_from(lay)) if pol.uses_scores else None)
            except KeyError as e:  # (a recorded file without the scores this round needs)
                raise ConfigError(f"policy.importance_file: {e.args[0]}; expected scores for "
                                  f"every position a round scores") from None
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
        if self.fast_apply:
            res = self.apply_keep(lay, keep, pinned)
        else:
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

    def run_rounds(self, reqs, shared_blocks) -> list:
        """:meth:`run_round` on each of ``reqs`` (the rounds one engine step makes due, in the
        engine's order) with ``shared_blocks[i]`` leading shared blocks: the list of their
        ``(RoundResult, duration_s, pinned)``, equal to calling :meth:`run_round` request by
        request. A round reads and writes its own request's layout and policy state only,
        and never frees a shared block (so no other request's shared count changes), so the
        caller may take the results after all rounds ran: freeing each one's blocks and
        recording its row in the list's order gives the pool the frees of the one-by-one
        calls in their order."""
        return [self.run_round(r, int(n)) for r, n in zip(reqs, shared_blocks)]

    def _row_round(self, req, shared_blocks: int):
        """:meth:`run_round`'s selection and ``none`` compaction on a layout with no blocks
        and no token yet, every token placed still pending (positions ``0..n-1`` in slots
        ``0..n-1`` of every group): the policy ranks the one row
        (``select_row_from_terms``) and :meth:`policies.PagedLayout.fill_kept` writes the
        kept slots' table; ``(RoundResult, pinned)``, the same as the round on the table
        brought up to date, or None (nothing changed) where the policy's compiled round does
        not apply."""
        lay = req.layout
        n = int(req.pending)
        nb = int(req.blocks_since)
        row = np.full(nb * self.B, -1, dtype=np.int32)
        row[:n] = np.arange(n, dtype=np.int32)
        terms = self.importance.log_score_terms(lay.request_key, lay.num_groups,
                                                req.pstate.generated, n, n, True)
        keep = self.policy.select_row_from_terms(row, lay.num_groups, lay.prompt_len, terms)
        if keep is None:
            return None
        pinned = self.policy.pinned_len(lay)
        if shared_blocks:
            shared_slots = shared_blocks * self.B
            keep[:, :min(shared_slots, n)] = True
            pinned = max(pinned, shared_slots)
        cnt, freed = lay.fill_kept(n, nb, keep, self.compactor.cfg.release_empty_blocks)
        req.pending = 0
        req.blocks_since = 0
        return self._round_result(lay, cnt, freed, cnt[2].copy(), _NO_MOVES, nb), pinned

    def _guarded_round(self, req, shared_blocks: int):
        """:meth:`run_round`'s selection and ``none`` compaction from the request's
        :class:`policies.guarded.GuardedRanking` (built here when missing) and
        :class:`_UnmovedLayout`: ``(RoundResult, pinned)``, the same as the full round's; None
        (the state dropped) where they do not apply: the full round runs."""
        lay = req.layout
        st = req.pstate
        state = st.extra.get("guard")
        if state is None:
            un = _UnmovedLayout.build(lay)
            gr = None
        else:
            gr, un = state
        pinned = self.policy.pinned_len(lay)
        pin_below = 0
        if un is not None and shared_blocks:
            pinned = max(pinned, shared_blocks * self.B)
            # (a block holds positions from its base on, fewer than B of them)
            pin_below = int(un.base[shared_blocks - 1]) + self.B
        if gr is None:
            if un is not None:
                gr = GuardedRanking.build(self.policy, self.importance, lay, pin_below)
            if gr is None:
                return None
            st.extra["guard"] = (gr, un)
        ev = gr.round(lay.request_key, st.generated, lay.next_position, req.n_computed, pin_below)
        if ev is None:
            del st.extra["guard"]
            return None
        return un.evict(lay, ev[0], ev[1], self.kv_tok), pinned

    def _window_round(self, req, shared_blocks: int):
        """:meth:`run_round`'s selection and ``none`` compaction for a policy whose round
        evicts a range of positions (:meth:`policies.EvictionPolicy.evict_range`), the slots of
        the ``shared_blocks`` leading blocks kept: ``(RoundResult, pinned)``, the same as the
        round through ``select`` and :meth:`apply_keep`."""
        lay = req.layout
        H = lay.num_groups
        pinned = self.policy.pinned_len(lay)
        shared_slots = shared_blocks * self.B
        if shared_blocks:
            pinned = max(pinned, shared_slots)
        lo, hi = self.policy.evict_range(req.n_computed)
        cnt = np.empty((3, H), dtype=np.int64)
        freed = np.empty(lay.n_blocks, dtype=np.int64)
        nf = _window_evict(lay.slot_pos, self.B, lo, hi, shared_slots, cnt, freed)
        return self._unmoved_result(lay, cnt, freed[:nf]), pinned

    def _unmoved_result(self, lay: PagedLayout, cnt: np.ndarray, freed: np.ndarray) -> RoundResult:
        """The ``none`` compactor's :class:`policies.RoundResult` of a round that emptied its
        evicted slots: ``cnt`` (``int64[3, H]``: live slots before, kept, 1 + last kept slot
        per group), ``freed`` the blocks left empty (ascending block-table indices), dropped
        from the layout here."""
        return self._round_result(lay, cnt, freed, cnt[2].copy(), _NO_MOVES)

    def _round_result(self, lay: PagedLayout, cnt: np.ndarray, freed: np.ndarray,
                      lengths: np.ndarray, moves: np.ndarray,
                      blocks_before: int | None = None) -> RoundResult:
        """The :class:`policies.RoundResult` of a round: ``cnt`` as :meth:`_unmoved_result`
        takes it, ``freed`` the empty blocks (dropped from the layout here), ``lengths``
        (``int64[H]``) each group's slots after the round, ``moves`` (``int64[m, 3]``) the
        slot moves, each of one group's token (``kv_tok / H`` bytes). ``blocks_before``: the
        table's blocks before the round where ``lay`` already has ``freed`` removed."""
        H = lay.num_groups
        before, kept = cnt[0].copy(), cnt[1].copy()
        if blocks_before is None:
            blocks_before = lay.n_blocks
            if len(freed):
                lay._drop_blocks(freed)
        per_group_bytes = self.kv_tok / H
        waste = int((lengths.max() - lengths).sum()) if H > 1 else 0
        if H == 1:
            b0, k0 = int(before[0]), int(kept[0])
            t_before, t_kept, t_evicted = float(b0), float(k0), float(b0 - k0)
        else:  # (the groups' means: integer sums, exact in float64, over H)
            t_before, t_kept = int(before.sum()) / H, int(kept.sum()) / H
            t_evicted = int((before - kept).sum()) / H
        return RoundResult(
            tokens_before=t_before, tokens_kept=t_kept, tokens_evicted=t_evicted,
            blocks_before=blocks_before, blocks_after=lay.n_blocks, freed_block_indices=freed,
            bytes_moved=moves.shape[0] * per_group_bytes, moves=moves, kept_per_group=kept,
            group_lengths=lengths, ragged_waste_slots=waste,
            ragged_waste_bytes=waste * per_group_bytes, metadata_bytes=0.0)

    def apply_keep(self, lay: PagedLayout, keep: np.ndarray, pinned: int) -> RoundResult:
        """``self.compactor.apply(lay, keep, self.kv_tok, pinned_len=pinned)`` for the ``none``
        and ``forward_pack`` compactors, with the per-group counts, the eviction and the
        group lengths in one compiled pass (:func:`_apply_keep`): the same layout and
        :class:`policies.RoundResult`. ``keep`` must hold only live slots (what every policy's
        ``select`` gives; the compactor's own check is not repeated)."""
        H = lay.num_groups
        cnt = np.empty((3, H), dtype=np.int64)  # live before, kept, last live slot + 1 after
        pack = self.compaction == "forward_pack"
        if pack and lay.hole_fill:
            raise ValueError("forward_pack on a hole_fill layout: slot order is not position order")
        nk = _apply_keep(lay.slot_pos, keep, not pack, cnt)
        if pack:
            moves = np.empty((nk, 3), dtype=np.int64)
            moves = moves[:_forward_pack(lay.slot_pos, keep, lay.append_ptr, int(pinned), moves)]
        # (the blocks empty after the eviction, and after the moves when packing)
        freed = (lay.empty_blocks() if self.compactor.cfg.release_empty_blocks
                 else np.zeros(0, dtype=np.int64))
        if not pack:
            return self._unmoved_result(lay, cnt, freed)
        return self._round_result(lay, cnt, freed, lay.append_ptr.astype(np.int64).copy(), moves)

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


_NO_MOVES = np.zeros((0, 3), dtype=np.int64)


class _UnmovedLayout:
    """The block bookkeeping of a layout whose tokens never move (``none`` compactor, order
    preserving, empty blocks released every round), for rounds given as evicted positions:
    ``base`` (``int64[n_blocks]``: the position each block's first slot holds), ``blive``
    (live (group, slot) entries per block), ``live`` (live slots per group), ``next`` (tokens
    counted). A block holds consecutive positions from its first slot on: appends fill it in
    order, and a block is dropped whole (a dropped trailing block leaves the next append at a
    block's start, :meth:`policies.PagedLayout._drop_blocks`), so position p sits in the last
    block whose base is at most p, at offset ``p - base``."""

    def __init__(self, base, blive, live, nxt):
        self.base, self.blive, self.live, self.next = base, blive, live, nxt

    @classmethod
    def build(cls, lay: PagedLayout):
        """From the layout's slots; None when a block holds no live token or a token is not
        where the rule puts it (a layout whose tokens moved)."""
        if lay.hole_fill:
            return None
        nb = lay.n_blocks
        base = np.empty(nb, dtype=np.int64)
        blive = np.empty(nb, dtype=np.int64)
        live = np.empty(lay.num_groups, dtype=np.int64)
        if not _unmoved_scan(lay.slot_pos, lay.block_size, base, blive, live):
            return None
        return cls(base, blive, live, lay.next_position)

    def evict(self, lay: PagedLayout, groups, positions, kv_tok: float) -> RoundResult:
        """Count the tokens placed since (positions ``next..lay.next_position-1`` in every
        group, in consecutive slots up to the append pointer, new blocks at the end), then
        empty the slots of the (group, position) pairs and free the blocks left with no live
        entry: the :class:`policies.RoundResult` of the ``none`` compactor's round with that
        keep mask (the same counts, lengths and freed blocks)."""
        H = lay.num_groups
        B = lay.block_size
        new = lay.n_blocks - self.base.size
        if new:
            # the slot before the append pointer holds the last position placed
            top = lay.next_position - int(lay.append_ptr[0])
            self.base = np.concatenate([self.base, top + B * np.arange(self.base.size, lay.n_blocks,
                                                                       dtype=np.int64)])
            self.blive = np.concatenate([self.blive, np.zeros(new, dtype=np.int64)])
        before = np.empty(H, dtype=np.int64)
        lengths = np.empty(H, dtype=np.int64)
        freed = np.empty(len(positions), dtype=np.int64)
        nf = _unmoved_round(lay.slot_pos, B, self.base, self.blive, self.live, self.next,
                            lay.next_position, groups, positions, lay.append_ptr, before, lengths,
                            freed)
        if nf < 0:
            raise RuntimeError("guarded round: an evicted position is not where the layout's "
                               "block map puts it")
        self.next = lay.next_position
        freed = freed[:nf]
        kept = self.live.copy()
        blocks_before = lay.n_blocks
        if nf:
            lay._drop_blocks(freed)
            self.base = np.delete(self.base, freed)
            self.blive = np.delete(self.blive, freed)
        per_group_bytes = kv_tok / H
        if H == 1:
            b0, k0 = int(before[0]), int(kept[0])
            t_before, t_kept, t_evicted = float(b0), float(k0), float(b0 - k0)
            waste = 0
        else:
            waste = int((lengths.max() - lengths).sum())
            # (the groups' means: integer sums, exact in float64, over H)
            t_before, t_kept = int(before.sum()) / H, int(kept.sum()) / H
            t_evicted = int((before - kept).sum()) / H
        return RoundResult(
            tokens_before=t_before, tokens_kept=t_kept, tokens_evicted=t_evicted,
            blocks_before=blocks_before, blocks_after=lay.n_blocks, freed_block_indices=freed,
            bytes_moved=0 * per_group_bytes, moves=_NO_MOVES, kept_per_group=kept,
            group_lengths=lengths, ragged_waste_slots=waste,
            ragged_waste_bytes=waste * per_group_bytes, metadata_bytes=0.0)


@kernel("b1(i4[:, :], i8, i8[:], i8[:], i8[:])")
def _unmoved_scan(slot_pos, B, base, blive, live):  # pragma: no cover (compiled)
    """:meth:`_UnmovedLayout.build`'s pass: each block's base position and live entries, each
    group's live slots; False when a block holds no live entry, a live slot's position is not
    its block's base plus its offset, or the bases do not increase by at least B."""
    H, S = slot_pos.shape
    for g in range(H):
        live[g] = 0
    prev = -B
    for b in range(S // B):
        bb = -1
        cnt = 0
        for g in range(H):
            for j in range(b * B, (b + 1) * B):
                p = slot_pos[g, j]
                if p >= 0:
                    x = p - (j - b * B)
                    if bb >= 0 and x != bb:
                        return False
                    bb = x
                    cnt += 1
                    live[g] += 1
        if bb < prev + B:
            return False
        base[b] = bb
        blive[b] = cnt
        prev = bb
    return True


@kernel("i8(i4[:, :], i8, i8[:], i8[:], i8[:], i8, i8, i8[:], i8[:], i8[:], i8[:], i8[:], "
        "i8[:])")
def _unmoved_round(slot_pos, B, base, blive, live, nxt, seq, groups, positions, append_ptr,
                   before, lengths, freed):  # pragma: no cover (compiled)
    """:meth:`_UnmovedLayout.evict`'s pass: counts positions ``nxt..seq-1`` in (every group,
    its block), copies the groups' live slots to ``before``, empties each (group, position)'s
    slot and counts it off, writes the blocks left empty into ``freed`` (ascending; their
    count returned, -1 when a position is not in its slot) and each group's length (1 + its
    last live slot, found back from its append pointer)."""
    H = slot_pos.shape[0]
    b = max(np.searchsorted(base, nxt, side="right") - 1, 0)
    for p in range(nxt, seq):
        while b + 1 < base.shape[0] and base[b + 1] <= p:
            b += 1
        blive[b] += H
    for g in range(H):
        live[g] += seq - nxt
        before[g] = live[g]
    nf = 0
    for q in range(positions.shape[0]):
        g = groups[q]
        p = positions[q]
        b = np.searchsorted(base, p, side="right") - 1
        if b < 0 or p - base[b] >= B or slot_pos[g, b * B + p - base[b]] != p:
            return -1
        slot_pos[g, b * B + p - base[b]] = -1
        blive[b] -= 1
        live[g] -= 1
        if blive[b] == 0:
            j = nf  # (insertion: a few blocks at most)
            while j > 0 and freed[j - 1] > b:
                freed[j] = freed[j - 1]
                j -= 1
            freed[j] = b
            nf += 1
    for g in range(H):
        j = append_ptr[g] - 1
        while j >= 0 and slot_pos[g, j] < 0:
            j -= 1
        lengths[g] = j + 1
    return nf


@kernel("i8(i4[:, :], i8, i8, i8, i8, i8[:, :], i8[:])")
def _window_evict(slot_pos, B, lo, hi, shared_slots, cnt, freed):  # pragma: no cover (compiled)
    """Per group ``g``: empties the live slots from ``shared_slots`` on holding positions
    ``lo <= p < hi``; ``cnt[0, g]`` live slots before, ``cnt[1, g]`` kept, ``cnt[2, g]`` 1 +
    the last kept slot (0 if none). Writes the blocks then empty in every group into ``freed``
    (ascending) and returns how many."""
    H, S = slot_pos.shape
    for g in range(H):
        live = 0
        kept = 0
        last = -1
        for j in range(S):
            p = slot_pos[g, j]
            if p >= 0:
                live += 1
                if j >= shared_slots and lo <= p < hi:
                    slot_pos[g, j] = -1
                else:
                    kept += 1
                    last = j
        cnt[0, g] = live
        cnt[1, g] = kept
        cnt[2, g] = last + 1
    m = 0
    for b in range(S // B):
        empty = True
        for g in range(H):
            for j in range(b * B, (b + 1) * B):
                if slot_pos[g, j] >= 0:
                    empty = False
                    break
            if not empty:
                break
        if empty:
            freed[m] = b
            m += 1
    return m


@kernel("i8(i4[:, :], b1[:, :], b1, i8[:, :])")
def _apply_keep(slot_pos, keep, evict, cnt):  # pragma: no cover (compiled)
    """Per group ``g``: ``cnt[0, g]`` live slots, ``cnt[1, g]`` kept ones (``keep`` True on
    live slots only); with ``evict`` the live slots ``keep`` drops are emptied and ``cnt[2,
    g]`` is the group's length after (1 + its last live slot, 0 if none). Returns the kept
    slots of all groups."""
    total = 0
    for g in range(slot_pos.shape[0]):
        live = 0
        kept = 0
        last = -1
        for j in range(slot_pos.shape[1]):
            if slot_pos[g, j] >= 0:
                live += 1
                if keep[g, j]:
                    kept += 1
                    last = j
                elif evict:
                    slot_pos[g, j] = -1
        cnt[0, g] = live
        cnt[1, g] = kept
        cnt[2, g] = last + 1
        total += kept
    return total


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
