"""Block identity (the prefix-cache hash of each block) from a trace's prefix ids.

Traces identify prompt content at their own granularity ``G`` (Mooncake: 512 tokens, Weka: 64):
``ids[j]`` is a prefix-chained id, so equal ``ids[j]`` means equal prompt tokens ``[0, (j+1)G)``
(for the last, possibly partial, trace block: equal tokens up to that request's input length).

The simulator's block ``k`` covers tokens ``[kB, (k+1)B)``. Let ``e = (k+1)B`` be its end and
``covered = min(len(ids) x G, input_tokens)`` the prompt span the trace identifies. Then:

* if ``e <= covered``: the block's content is the prefix ``[0, e)``, identified by the trace block
  ``j = (e-1) // G`` that holds its last token and the end offset ``o = e - jG`` inside it:
  ``key = ids[j] x (G + 1) + o`` (non-negative). Because trace ids are prefix-chained this key
  already identifies the whole prefix, exactly like vLLM's chained block hash
  ``hash(parent_hash, block tokens)``; for B dividing G it is the issue's ``(ids[j], index in j)``.
* else, when the request has a *continuation* (below) whose ids identify its tokens up to
  ``reach = min(len(next_ids) x G, next_input, input + output)``, a block with ``e <= reach``
  takes the continuation's key by the first rule: the request's own generated tokens are the
  next prompt's tokens at the same positions, so the next turn hits them as vLLM does (vLLM
  hashes every full block of a request's token ids, outputs included, as it fills, and a
  finished request's blocks keep their hashes in the free queue: vllm/v1/core/block_pool.py
  ``BlockPool.cache_full_blocks``, vllm/v1/request.py ``Request.append_output_token_ids``).
* otherwise (tokens past the identified span: generated tokens without a continuation, Weka's
  tail below one 64-token block, traces without ids) the content is unknown and treated as
  unique to the request: ``key = -(request_id x 2**24 + k) - 1`` (negative, so never equal to a
  trace key). Such blocks are still cached, so a request preempted by recompute can hit its own
  earlier blocks.

Continuation (:func:`continues`): a closed-loop child of the request (the trace's
``parent_request_id``: the next turn of a chat, the next call of an agent session) whose prompt
is longer than the request's and whose ids begin with every id of the request's full trace
blocks (so the trace says the child's prompt starts with the request's prompt). A request whose
full trace blocks are not all identified (the bench format's random tails, traces without ids)
has no continuation. Among several such children the first in row order is taken. Whether the
child's prompt then holds the request's *answer* verbatim, token for token, the trace does not
say: the synthetic generators build it so; Weka's and other traces' ids past the parent's prompt
are the next prompt's, which holds the answer as the chat template re-renders it (a template that
drops reasoning or re-tokenises differently breaks the match; ``cache.reuse_answer_blocks=false``
keeps every generated token unique instead).

Keys are exact 64-bit integers, collision-free by construction (no hashing needed): ids must be
``< 2**63 / (G + 1)`` and a request must have fewer than ``2**24`` blocks.
"""

from __future__ import annotations

import numba
import numpy as np

from . import hash_tables
from .hash_tables import _home
from .jit import kernel

MAX_BLOCKS_PER_REQUEST = 1 << 24


def block_keys(ids: np.ndarray, G: int, input_tokens: int, B: int, request_id: int,
               n_blocks: int, next_ids: np.ndarray | None = None, next_reach: int = 0
               ) -> np.ndarray:
    """Keys of blocks ``0..n_blocks-1`` of one request.

    Args:
        ids: the request's trace prefix ids (int array, length ``ceil`` or ``floor`` of
            input/G depending on the trace; may be empty).
        G: trace granularity in tokens (0 = no identity).
        input_tokens: prompt length (tokens).
        B: simulator block size (tokens).
        request_id: unique request id (for keys of unidentified blocks).
        n_blocks: how many block keys to return.
        next_ids: the prefix ids of the request's continuation (:func:`continues`), or None.
        next_reach: tokens of the request the continuation's ids identify (the module
            docstring's ``reach``: ``min(len(next_ids) x G, next input, input + output)``);
            blocks ending past the request's own identified span and at most here take the
            continuation's keys. 0 = none.

    Returns: int64 array of shape ``(n_blocks,)``.
    Raises: ValueError if ``n_blocks`` exceeds ``2**24``.
    """
    if n_blocks > MAX_BLOCKS_PER_REQUEST:
        raise ValueError(f"request {request_id} needs {n_blocks} blocks; at most {MAX_BLOCKS_PER_REQUEST}")
    v = np.ascontiguousarray(ids, dtype=np.int64).view()
    v.flags.writeable = False  # one compiled signature (Arrow's arrays are read-only)
    if next_ids is None or next_reach <= 0:
        nv, next_reach = _NO_IDS, 0
    else:
        nv = np.ascontiguousarray(next_ids, dtype=np.int64).view()
        nv.flags.writeable = False
        next_reach = min(int(next_reach), len(nv) * int(G))
    return _block_keys(v, int(G), int(input_tokens), int(B), int(request_id), int(n_blocks), nv,
                       int(next_reach))


def continues(ids: np.ndarray, input_tokens: int, G: int, child_ids: np.ndarray,
              child_input: int) -> bool:
    """Whether a closed-loop child is the request's continuation (the module docstring): the
    child's prompt (``child_input`` tokens) is longer than the request's (``input_tokens``),
    every full trace block of the request's prompt (``input_tokens // G`` of them) is
    identified, and the child's ids begin with those ids. ``G``: trace granularity (tokens;
    0 = no identity: never)."""
    if G <= 0 or child_input <= input_tokens:
        return False
    f = int(input_tokens) // int(G)
    if len(ids) < f or len(child_ids) < f:
        return False
    return bool(np.array_equal(np.asarray(ids[:f]), np.asarray(child_ids[:f])))


_RO_I8 = numba.types.Array(numba.types.int64, 1, "C", readonly=True)
_NO_IDS = np.empty(0, dtype=np.int64)
_NO_IDS.flags.writeable = False


@kernel(numba.types.int64[:](_RO_I8, numba.types.int64, numba.types.int64, numba.types.int64,
                             numba.types.int64, numba.types.int64, _RO_I8, numba.types.int64))
def _block_keys(ids, G, input_tokens, B, request_id, n_blocks, next_ids,
                next_reach):  # pragma: no cover (compiled)
    """:func:`block_keys` in one pass (the module docstring's three rules)."""
    keys = np.empty(n_blocks, dtype=np.int64)
    n_id = 0
    if G > 0 and ids.shape[0] > 0:
        covered = min(ids.shape[0] * G, input_tokens)
        n_id = min(covered // B, n_blocks)
    for k in range(n_id):
        e = (k + 1) * B
        j = (e - 1) // G
        keys[k] = ids[j] * (G + 1) + (e - j * G)
    n_next = n_id
    if G > 0 and next_reach > 0:
        n_next = max(n_id, min(next_reach // B, n_blocks))
    for k in range(n_id, n_next):
        e = (k + 1) * B
        j = (e - 1) // G
        keys[k] = next_ids[j] * (G + 1) + (e - j * G)
    for k in range(max(n_next, 0), n_blocks):
        keys[k] = -(request_id * MAX_BLOCKS_PER_REQUEST + k) - 1
    return keys


def first_repeated_id(offsets: np.ndarray, values: np.ndarray) -> tuple[int, int]:
    """The first request whose prefix ids repeat an id: ``(row, id)``, or ``(-1, 0)`` if none
    does. ``offsets``: int64 ``[N + 1]`` into ``values`` (int64), as
    ``Workload.prefix_offsets() / prefix_values()``. Trace ids are prefix-chained (the module
    docstring), so one id names one prefix and cannot appear twice in a request; a repeat would
    give two of its blocks one key. One compiled pass, O(ids): a strictly increasing row (a
    sequential read) is passed without its hash set."""
    off = np.ascontiguousarray(offsets, dtype=np.int64).view()
    val = np.ascontiguousarray(values, dtype=np.int64).view()
    if len(off) < 2 or len(val) == 0:
        return -1, 0
    off.flags.writeable = val.flags.writeable = False  # one compiled signature (Arrow's are read-only)
    longest = int(np.max(np.diff(off)))
    bits = max(4, (2 * longest - 1).bit_length())
    row, x = _first_repeat(off, val, bits)
    return int(row), int(x)


@kernel(numba.types.UniTuple(numba.types.int64, 2)(_RO_I8, _RO_I8, numba.types.int64), depends=(hash_tables,))
def _first_repeat(off, val, bits):  # pragma: no cover (compiled)
    size = 1 << bits
    mask = size - 1
    shift = 64 - bits
    keys = np.empty(size, dtype=np.int64)
    owner = np.full(size, -1, dtype=np.int64)  # the row whose id a slot holds (-1: none yet)
    for r in range(off.shape[0] - 1):
        inc = True  # a strictly increasing row repeats no id (every row of the real traces)
        for j in range(off[r] + 1, off[r + 1]):
            if val[j] <= val[j - 1]:
                inc = False
                break
        if inc:
            continue
        for j in range(off[r], off[r + 1]):
            x = val[j]
            s = _home(x, shift)
            while True:
                if owner[s] != r:  # empty for this row
                    owner[s] = r
                    keys[s] = x
                    break
                if keys[s] == x:
                    return r, x
                s = (s + 1) & mask
    return -1, 0
