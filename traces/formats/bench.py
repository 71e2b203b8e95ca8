"""Seeded workloads shaped like a serving benchmark's client (format ``bench``).

Serving benchmarks (``vllm bench serve --dataset-name random``, SGLang's ``bench_serving``,
GuideLLM, SemiAnalysis InferenceMAX, now InferenceX) send ``num_prompts`` random prompts of
set lengths to a server in one of two shapes, and so does this generator:

* **Closed loop at concurrency N** (``max_concurrency``; vLLM's ``--max-concurrency N`` with the
  default ``--request-rate inf``): N requests in flight, each finish sends the next prompt at
  once. In the workload table these are N chains: prompts 0..N-1 are roots arriving at 0 s;
  every later prompt has a parent, the earlier prompt of its chain whose finish (or rejection)
  releases it, and ``think_s`` = 0; ``session_id`` is the chain, ``turn`` the prompt's place in
  it. A real client holds one semaphore for all N slots and gives the next prompt to whichever
  request finishes first, which a table fixed before the run cannot know; ``chain_assignment``
  picks how prompts are dealt to chains, always in prompt order:

  - ``earliest_free`` (default): replays that client with each request's time in flight taken
    as its output length: prompt i joins the chain whose prompts so far hold the fewest output
    tokens (ties: the lower chain). Under continuous batching the requests in flight decode in
    the same steps, so their times in flight go nearly as their output lengths (prefill and
    queueing aside), and the chains stay N busy until the last prompt is sent, as the
    semaphore keeps them. With equal output lengths it is ``round_robin``.
  - ``round_robin``: prompt i joins chain ``i mod N`` (parent i - N). The same as the client
    with equal lengths; with spread lengths a chain whose prompts happen to be short runs out
    early and fewer than N requests are in flight while other chains still hold unsent
    prompts (Qwen3-8B on an H200, N = 16, 160 prompts of 1024 in / 1024 out at vLLM's
    range_ratio 0.8: fewer than 16 in flight for 44 of the 115 s before the last send, and
    the run 16% longer than with ``earliest_free``, which kept 16 until then).

  ``max_concurrency`` > ``num_prompts`` sends every prompt at 0 s (the cap never binds; a
  warning says so), as does ``request_rate`` = inf without a cap (vLLM's default).
* **Open loop** (a finite ``request_rate`` in requests/s): every prompt is a root. Arrival of
  prompt i (seconds) is ``T x S(i+1) / S(n)`` with ``T = n / request_rate``, ``S(k)`` the sum of
  the first k inter-arrival draws, each Gamma(shape = ``burstiness``, scale = 1 /
  (request_rate x burstiness)), i.e. mean 1 / request_rate; ``burstiness`` 1 is a Poisson
  process, below 1 burstier, above 1 more regular. The rescaling to a last arrival of exactly
  ``T`` and the first prompt waiting one draw follow ``get_request`` of vLLM's
  ``vllm/benchmarks/serve.py`` (vllm-project/vllm @009e6d4). ``burstiness`` = inf is vLLM's fixed
  rate: prompt i at (i + 1) / request_rate. A client that caps concurrency AND paces arrivals
  makes a prompt wait for the later of its arrival and a free slot; the table holds one or the
  other, not the later of two, so a finite ``request_rate`` with ``max_concurrency`` is an error.

Lengths (tokens). Prompt i holds ``prefix_tokens`` shared tokens followed by a random part of
``in_i`` tokens (``input_tokens`` = prefix_tokens + in_i) and generates ``out_i`` tokens (the
benchmarks' ``--ignore-eos``: exactly that many). ``range_rule`` picks the bounds, both draws
uniform over the integers of the closed interval:

* ``symmetric`` (vLLM's random dataset, ``RandomDataset.get_sampling_params`` in
  ``vllm/benchmarks/datasets/random.py``, vllm-project/vllm @237145e, and the same rule in
  ``vllm/benchmarks/datasets.py`` before it moved): ``in_i`` in ``[floor(L x (1 - r)),
  ceil(L x (1 + r))]`` and ``out_i`` in ``[max(1, floor(O x (1 - r))), max(1, ceil(O x (1 + r)))]``
  for ``L`` = ``input_len``, ``O`` = ``output_len``, ``r`` = ``range_ratio`` in [0, 1) (vLLM
  refuses r >= 1), computed in float64 as vLLM does (L = 1024, r = 0.8 gives [204, 1844]). The
  draws are vLLM's: ``numpy.random.default_rng(seed)``, input lengths of all prompts first, then
  output lengths (``Generator.integers(low, high + 1, size=n)``). vLLM subtracts the tokens its
  tokenizer adds (``num_special_tokens_to_add``: 0 for Qwen3, 1 for Llama 3's BOS) from ``L``
  before the bounds, and re-encodes each prompt, which may move its length by a few tokens;
  kvsim has no tokenizer and takes ``L`` as given and the drawn length as exact.
* ``one_sided`` (InferenceMAX's own client, ``sample_random_requests`` in
  ``utils/bench_serving/benchmark_serving.py`` of SemiAnalysisAI/InferenceX @086eabb; SGLang's
  ``bench_serving`` has the same interval): ``in_i`` in ``[int(L x r), L]``, ``out_i`` in
  ``[int(O x r), O]`` for ``r`` in [0, 1] (1 = fixed lengths; L = 1024, r = 0.8 gives
  [819, 1024], mean 921.5, not 1024). Draws as that client makes them:
  ``numpy.random.RandomState(seed).randint(low, high + 1, size=n)``, inputs then outputs
  (its prefix draw, made first, is skipped: equal draws for ``prefix_tokens`` = 0 only; its
  ``--use-chat-template`` shortens ``L`` by the template's tokens, which kvsim cannot count). An
  interval that would allow a prompt of 0 tokens or an output of 0 tokens is an error (kvsim
  needs >= 1 of each; SGLang raises the input bound to 1).

With the same seed, these are the lengths that client draws (not checked against an install of
either; the arrival draws are not the client's, only their distribution).

Prefix identity (``traces/workload.py``'s ``prefix_ids``, G = ``block_tokens`` tokens per id):
with ``num_prefix_groups`` = K shared prefixes, prompt i carries prefix ``i mod K``
(round robin; vLLM's ``--random-prefix-len`` is K = 1), identified by its floor(prefix_tokens /
G) full blocks, ids ``g x floor(prefix_tokens / G) + j``; the random part gets no ids, so every
block holding a random token is unique to its request (``sim/keys.py``) and never hits the
prefix cache, as random tokens never would. A prefix block that is not full (prefix_tokens not
a multiple of G) is not identified either: set ``block_tokens`` to the simulated
``cache.block_size`` (or a divisor of it) for every full shared block to be found.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Optional

from .._common import MAX_ARRIVAL_S, Parsed, is_int, is_num
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register
from .synthetic import MAX_LENGTH

__all__ = ["generate", "bench_params", "length_bounds", "chain_parents", "RANGE_RULES",
           "CHAIN_ASSIGNMENTS", "BENCH_DEFAULTS"]

#: Valid values of ``range_rule``.
RANGE_RULES = ("symmetric", "one_sided")
#: Valid values of ``chain_assignment``.
CHAIN_ASSIGNMENTS = ("earliest_free", "round_robin")

#: Default of every bench field (vLLM's ``vllm bench serve`` defaults where it has one:
#: ``--random-input-len`` 1024, ``--random-output-len`` 128, ``--random-range-ratio`` 0,
#: ``--random-prefix-len`` 0, ``--burstiness`` 1; ``num_prompts`` has no default here).
BENCH_DEFAULTS: dict[str, Any] = dict(
    max_concurrency=None, request_rate=None, burstiness=1.0, input_len=1024, output_len=128,
    range_ratio=0.0, range_rule="symmetric", prefix_tokens=0, num_prefix_groups=1,
    block_tokens=16, chain_assignment="earliest_free")

# TraceConfig fields of the synthetic generators whose bench counterpart has another name: set
# with format=bench they would change nothing, so they are refused with the field to use
_SYNTHETIC_NEAR_MISSES = {
    "num_sessions": "num_requests", "arrival_rate_per_s": "request_rate",
    "shared_prefix_tokens": "prefix_tokens", "input_mean": "input_len",
    "output_mean": "output_len",
}


def length_bounds(length: int, range_ratio: float, range_rule: str, *,
                  output: bool) -> tuple[int, int]:
    """``(low, high)``, the closed interval (tokens) the module docstring's rule draws one
    length from: ``length`` = ``input_len`` (``output=False``) or ``output_len``
    (``output=True``; ``symmetric`` raises both bounds to at least 1, as vLLM does)."""
    if range_rule == "symmetric":
        lo = math.floor(length * (1 - range_ratio))
        hi = math.ceil(length * (1 + range_ratio))
        if output:
            lo, hi = max(lo, 1), max(hi, 1)
        return int(lo), int(hi)
    return int(length * range_ratio), int(length)


def _as_int(v: Any) -> Any:
    """``v`` as a Python int when it is an integer (numpy's included, ``bool`` not), else as
    given (the caller then names it)."""
    import numpy as np
    if isinstance(v, np.integer):
        return int(v)
    return v


def bench_params(values: dict, *, names: Optional[dict] = None) -> dict:
    """Checked bench parameters: ``values`` (keys of :data:`BENCH_DEFAULTS` plus
    ``num_prompts``; a missing or ``None`` key other than ``max_concurrency`` /
    ``request_rate`` takes its default) -> a dict with every key, ints as ``int`` and rates as
    ``float``, plus ``input_bounds`` / ``output_bounds`` (:func:`length_bounds`), ``chains``
    (requests in flight in a closed loop, else None) and ``paced`` (open loop).

    ``request_rate`` = inf is vLLM's default ``--request-rate inf``: no pacing, so with
    ``max_concurrency`` N it is the closed loop at N and alone it sends every prompt at 0 s
    (the closed loop with N = num_prompts).

    ``names`` maps a key to the name an error gives it (the trace config calls
    ``num_prompts`` ``num_requests``).

    Raises:
        TraceError: a value out of range or of the wrong type, naming the field and what was
            expected.
    """
    nm = dict(names or {})

    def bad(key: str, found: Any, expected: str) -> TraceError:
        return TraceError(field=nm.get(key, key), found=found, expected=expected)

    d = dict(BENCH_DEFAULTS)
    for k, v in values.items():
        if v is not None or k in ("max_concurrency", "request_rate"):
            d[k] = _as_int(v)
    d.setdefault("num_prompts", None)
    for k in ("num_prompts", "input_len", "output_len", "prefix_tokens", "num_prefix_groups",
              "block_tokens"):
        if not is_int(d[k]):
            raise bad(k, repr(d[k]), "an integer")
    for k, lo in (("num_prompts", 1), ("input_len", 1), ("output_len", 1), ("prefix_tokens", 0),
                  ("num_prefix_groups", 1), ("block_tokens", 1)):
        if d[k] < lo:
            raise bad(k, d[k], f">= {lo}")
    for k in ("input_len", "output_len", "prefix_tokens"):
        if d[k] > MAX_LENGTH:
            raise bad(k, d[k], f"<= {MAX_LENGTH:,} tokens (2**27; the longest context "
                                      f"windows offered are 10 M tokens)")
    conc, rate = d["max_concurrency"], d["request_rate"]
    if conc is not None:
        if not is_int(conc):
            raise bad("max_concurrency", repr(conc), "an integer (requests in flight) or null")
        if conc < 1:
            raise bad("max_concurrency", conc, ">= 1 (requests in flight) or null")
    if rate is not None:
        if not is_num(rate) or rate != rate:
            raise bad("request_rate", repr(rate), "a number of requests/s (inf: unpaced) or "
                                                  "null")
        if not rate > 0:
            raise bad("request_rate", rate, "> 0 requests/s (inf: unpaced) or null")
        d["request_rate"] = rate = float(rate)
    paced = rate is not None and math.isfinite(rate)
    if conc is None and rate is None:
        raise bad("max_concurrency", "null",
                  "a number of requests in flight, or a request_rate (both are null): "
                  "max_concurrency=N (closed loop, N requests in flight) or "
                  "request_rate=R (open loop, R requests/s); vllm bench serve's default "
                  "--request-rate inf without a cap (every prompt at 0 s) is request_rate=inf")
    if conc is not None and paced:
        raise bad("request_rate", rate,
                  f"null or inf with max_concurrency={conc} (one of them, not both: a prompt "
                  f"held back by the concurrency cap would arrive at the later of its paced "
                  f"arrival and a free slot, which the workload table cannot express; set "
                  f"max_concurrency=null for the open loop)")
    b = d["burstiness"]
    if not is_num(b) or not b > 0:
        raise bad("burstiness", repr(b), "a number > 0 (1 = Poisson; inf = fixed rate)")
    d["burstiness"] = b = float(b)
    if not paced and b != 1.0:
        raise bad("burstiness", b, "1 without a finite request_rate (it shapes the paced "
                                   "inter-arrival times; a closed loop has none)")
    if d["chain_assignment"] not in CHAIN_ASSIGNMENTS:
        raise bad("chain_assignment", repr(d["chain_assignment"]),
                  f"one of {list(CHAIN_ASSIGNMENTS)}")
    rule = d["range_rule"]
    if rule not in RANGE_RULES:
        raise bad("range_rule", repr(rule), f"one of {list(RANGE_RULES)}")
    r = d["range_ratio"]
    if not is_num(r):
        raise bad("range_ratio", repr(r), "a number")
    d["range_ratio"] = r = float(r)
    if rule == "symmetric" and not 0.0 <= r < 1.0:
        raise bad("range_ratio", r, "in [0, 1) with range_rule=symmetric (vLLM's random "
                                    "dataset refuses 1 and above)")
    if rule == "one_sided" and not 0.0 <= r <= 1.0:
        raise bad("range_ratio", r, "in [0, 1] with range_rule=one_sided (1 = fixed lengths)")
    ilo, ihi = length_bounds(d["input_len"], r, rule, output=False)
    olo, ohi = length_bounds(d["output_len"], r, rule, output=True)
    if d["prefix_tokens"] + ilo < 1:
        raise bad("range_ratio", r,
                  f"a range whose shortest prompt has >= 1 token (with input_len="
                  f"{d['input_len']}, range_rule={rule} and no prefix the random parts start at "
                  f"{ilo} tokens; raise input_len or prefix_tokens, or change range_ratio)")
    if olo < 1:
        raise bad("range_ratio", r,
                  f"a range whose shortest output has >= 1 token (with output_len="
                  f"{d['output_len']} range_rule={rule} draws outputs from int(output_len x "
                  f"range_ratio) = {olo})")
    if d["prefix_tokens"] + ihi > MAX_LENGTH:
        raise bad("input_len", d["input_len"],
                  f"prompts of at most {MAX_LENGTH:,} tokens (2**27): with prefix_tokens="
                  f"{d['prefix_tokens']} and range_ratio={r:g} they reach "
                  f"{d['prefix_tokens'] + ihi:,}")
    if ohi > MAX_LENGTH:
        raise bad("output_len", d["output_len"],
                  f"outputs of at most {MAX_LENGTH:,} tokens (2**27): with range_ratio={r:g} "
                  f"they reach {ohi:,}")
    if d["num_prefix_groups"] > 1 and d["prefix_tokens"] == 0:
        raise bad("num_prefix_groups", d["num_prefix_groups"],
                  "1 without a shared prefix (set prefix_tokens > 0 for several prefixes)")
    ids = d["num_prompts"] * (d["prefix_tokens"] // d["block_tokens"])
    if ids >= 2 ** 31:
        raise bad("prefix_tokens", d["prefix_tokens"],
                  f"fewer than 2**31 prefix ids in all (the workload table's limit): "
                  f"{d['num_prompts']:,} prompts x {d['prefix_tokens'] // d['block_tokens']:,} "
                  f"shared blocks of block_tokens={d['block_tokens']} make {ids:,}; raise "
                  f"block_tokens or lower num_prompts")
    if paced and not d["num_prompts"] / rate <= MAX_ARRIVAL_S:
        raise bad("request_rate", rate,
                  f"a rate whose last arrival is <= 2**32 s (~136 years, where float64 seconds "
                  f"still resolve a microsecond): {d['num_prompts']:,} prompts end at "
                  f"{d['num_prompts'] / rate:.3g} s")
    d["input_bounds"], d["output_bounds"] = (ilo, ihi), (olo, ohi)
    d["paced"] = paced
    d["chains"] = None if paced else min(conc if conc is not None else d["num_prompts"],
                                         d["num_prompts"])
    return d


def _check_config(cfg) -> dict:
    """:func:`bench_params` of a ``TraceConfig`` of format ``bench`` (errors name the config
    fields: ``num_requests`` for num_prompts)."""
    for f, use in _SYNTHETIC_NEAR_MISSES.items():
        if getattr(cfg, f) is not None:
            raise TraceError(field=f, found=repr(getattr(cfg, f)),
                             expected=f"null with format=bench (a synthetic generator's field; "
                                      f"the bench format reads {use})")
    vals = {k: getattr(cfg, k) for k in BENCH_DEFAULTS}
    vals["num_prompts"] = cfg.num_requests
    return bench_params(vals, names={"num_prompts": "num_requests"})


def _lengths(d: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The random part's and the output's lengths (int64 [n] each, tokens), drawn as the module
    docstring says for ``d['range_rule']``."""
    import numpy as np
    n = d["num_prompts"]
    (ilo, ihi), (olo, ohi) = d["input_bounds"], d["output_bounds"]
    if d["range_rule"] == "symmetric":
        g = np.random.default_rng(seed)
        ins = g.integers(ilo, ihi + 1, size=n)
        outs = g.integers(olo, ohi + 1, size=n)
    else:
        if not 0 <= seed < 2 ** 32:
            raise TraceError(field="seed", found=seed,
                             expected="0 .. 2**32 - 1 with range_rule=one_sided (the client's "
                                      "numpy RandomState takes no other seed)")
        rs = np.random.RandomState(seed)
        ins = rs.randint(ilo, ihi + 1, size=n)
        outs = rs.randint(olo, ohi + 1, size=n)
    return np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64)


def chain_parents(output_tokens: np.ndarray, chains: int,
                  assignment: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deal prompts 0..n-1 (in order) to ``chains`` chains, as the module docstring's
    ``chain_assignment`` says. ``output_tokens``: int64 [n], each prompt's output length.

    Returns ``(parent, chain, turn)``, int64 / int64 / int32 arrays [n]: the prompt whose
    finish releases each prompt (-1 for the first of a chain), its chain and its place in it.
    """
    import numpy as np
    n = len(output_tokens)
    idx = np.arange(n, dtype=np.int64)
    if assignment == "round_robin":
        return (np.where(idx >= chains, idx - chains, -1), idx % chains,
                (idx // chains).astype(np.int32))
    parent = np.full(n, -1, dtype=np.int64)
    chain = np.empty(n, dtype=np.int64)
    turn = np.empty(n, dtype=np.int32)
    # (output tokens sent so far on the chain, chain, its last prompt, prompts on it); integer
    # sums: ties are exact and go to the lower chain
    heap = [(0, c, -1, 0) for c in range(chains)]
    outs = [int(x) for x in output_tokens]
    for i in range(n):
        load, c, last, k = heap[0]
        parent[i], chain[i], turn[i] = last, c, k
        heapq.heapreplace(heap, (load + outs[i], c, i, k + 1))
    return parent, chain, turn


def _arrivals(d: dict, seed: int) -> np.ndarray:
    """Open-loop arrival times (float64 [n], seconds, non-decreasing), as the module docstring
    says. The draws come from their own stream (the seed and a constant), apart from the
    lengths'."""
    import numpy as np
    n, rate, b = d["num_prompts"], d["request_rate"], d["burstiness"]
    if math.isinf(b):
        return np.arange(1, n + 1, dtype=np.float64) / rate
    g = np.random.default_rng(np.random.SeedSequence([seed, 0xA7171]))
    s = np.cumsum(g.gamma(shape=b, scale=1.0 / (rate * b), size=n))
    if s[-1] > 0:  # (all draws 0 only for a burstiness so small they underflow: all at 0 s)
        s = s * ((n / rate) / s[-1])
    return s


def _parsed(d: dict, seed: int) -> Parsed:
    """The workload rows of checked parameters ``d`` (:func:`bench_params`) and ``seed``."""
    import numpy as np
    n, P, G, K = d["num_prompts"], d["prefix_tokens"], d["block_tokens"], d["num_prefix_groups"]
    rand_in, outs = _lengths(d, seed)
    idx = np.arange(n, dtype=np.int64)
    conc, chains = d["max_concurrency"], d["chains"]
    warnings = []
    if chains is not None:
        parent, session, turn = chain_parents(outs, chains, d["chain_assignment"])
        arrival = np.zeros(n, dtype=np.float64)
        if conc is not None and conc > n:
            warnings.append(f"max_concurrency={conc} exceeds the {n:,} prompts: all start at 0 s "
                            f"and the cap never binds")
    else:
        session = idx.copy()
        turn = np.zeros(n, dtype=np.int32)
        parent = np.full(n, -1, dtype=np.int64)
        arrival = _arrivals(d, seed)
    nb = P // G  # full blocks inside the shared prefix
    if 0 < P < G:
        warnings.append(f"prefix_tokens={P} is less than one block of block_tokens={G}: no "
                        f"block of the shared prefix is identified, so none can hit")
    if nb:
        vals = ((idx % K) * nb)[:, None] + np.arange(nb, dtype=np.int64)[None, :]
        values = vals.reshape(-1)
        offsets = np.arange(n + 1, dtype=np.int64) * nb
    else:
        values = np.zeros(0, dtype=np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
    params = {k: d[k] for k in (*BENCH_DEFAULTS, "num_prompts")}
    notes = {"params": {k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                        for k, v in params.items()},  # (JSON has no inf)
             "client": "open_loop" if d["paced"] else "closed_loop",
             "requests_in_flight": chains,
             "input_bounds": list(d["input_bounds"]), "output_bounds": list(d["output_bounds"])}
    return Parsed(
        session_id=session.astype(np.int64),
        turn=turn,
        arrival_s=arrival,
        think_s=np.zeros(n, dtype=np.float64),
        parent=parent.astype(np.int64),
        input_tokens=P + rand_in,
        output_tokens=outs,
        prefix_offsets=offsets,
        prefix_values=values,
        block_tokens=G if nb else 0,
        source="synthetic:bench",
        warnings=warnings,
        notes=notes,
    )


def generate(path, cfg, rng: np.random.Generator, sink: ErrorSink, seed: int = 0) -> Parsed:
    """The loader's entry (``traces.loader.load_workload``): the workload of ``cfg`` (a
    validated ``TraceConfig`` of format ``bench``) for run seed ``seed``. ``path``, ``rng`` and
    ``sink`` are unused (nothing is read; the draws are seeded from ``seed`` as the module
    docstring says)."""
    return _parsed(_check_config(cfg), int(seed))

@dataclass
class BenchOptions:
    """The serving benchmark client's options (the module docstring has the rules and their
    sources).

    Attributes:
        num_requests: prompts sent in all (``--num-prompts``).
        max_concurrency: closed loop, this many requests in flight (``--max-concurrency``); each
            finish sends the next prompt at once.
        request_rate: open loop, requests per second (``--request-rate``; ``inf`` = unpaced:
            with max_concurrency the closed loop, alone every prompt at 0 s). Set one of the two
            (a finite rate and a cap together are an error: the table cannot hold a prompt back
            for both).
        burstiness: gamma shape of the open loop's inter-arrival times (``--burstiness``; 1 =
            Poisson, ``inf`` = fixed rate); 1 for a closed loop.
        input_len, output_len: tokens around which the random part of each prompt and each
            output are drawn (``--random-input-len``, ``--random-output-len``; vLLM's defaults
            1024 and 128).
        range_ratio: their spread (``--random-range-ratio``, 0 = fixed).
        range_rule: ``symmetric`` (vLLM: uniform integers in [floor(L(1-r)), ceil(L(1+r))],
            r < 1) | ``one_sided`` (InferenceMAX's and SGLang's clients: [int(L r), L], r <= 1).
        prefix_tokens: shared tokens before every prompt's random part (``--random-prefix-len``;
            the prompt is input_len-drawn + prefix_tokens long), identified for the prefix cache
            in full blocks of ``block_tokens``.
        num_prefix_groups: that many distinct shared prefixes, given to the prompts round robin.
        block_tokens: G of the prefix ids (null: 16).
        chain_assignment: how a closed loop deals prompts to its N chains: ``earliest_free``
            (the chain with the fewest output tokens so far: the benchmark client's semaphore
            replayed with time in flight taken as output length) | ``round_robin`` (i mod N).
    """

    num_requests: int = 5000
    max_concurrency: Optional[int] = None
    request_rate: Optional[float] = None
    burstiness: float = 1.0
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    range_rule: str = "symmetric"
    prefix_tokens: int = 0
    num_prefix_groups: int = 1
    block_tokens: Optional[int] = None
    chain_assignment: str = "earliest_free"


register(TraceFormat(name="bench", options=BenchOptions, input="generated",
                     check=_check_config, infinite=("request_rate", "burstiness"),
                     load=generate), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
