"""Model cards read for per-operator timing: the flat YAML of a kvsim model card
(:func:`parse_flat_yaml`, :func:`read_card`), the MoE / MLA fields a card may lack filled from the
models' published config.json (:data:`KNOWN_MODELS`) or a ``--moe`` override
(:func:`parse_moe_override`), and the shapes one layer has (:func:`model_shapes` ->
:class:`ModelShapes`). Standard library only. Errors: :class:`CardError` naming the file and key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


# Hugging Face config.json values for MoE / MLA fields the cards may not carry yet (read from
# the models' published config.json; a card's own field, then --moe, override these).
KNOWN_MODELS = {
    "gptoss120b": dict(num_experts=128, num_experts_per_tok=4, moe_intermediate_size=2880,
                       num_shared_experts=0, num_dense_layers=0, mlp_gated=True),
    "qwen3235ba22b": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536,
                          num_shared_experts=0, num_dense_layers=0, mlp_gated=True),
    "deepseekv3": dict(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                       num_shared_experts=1, num_dense_layers=3, mlp_gated=True,
                       q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128),
}
KNOWN_SOURCE = {
    "gptoss120b": "huggingface.co/openai/gpt-oss-120b config.json (num_local_experts 128, "
                  "num_experts_per_tok 4, intermediate_size 2880)",
    "qwen3235ba22b": "huggingface.co/Qwen/Qwen3-235B-A22B config.json (num_experts 128, "
                     "num_experts_per_tok 8, moe_intermediate_size 1536)",
    "deepseekv3": "huggingface.co/deepseek-ai/DeepSeek-V3 config.json (n_routed_experts 256, "
                  "num_experts_per_tok 8, moe_intermediate_size 2048, n_shared_experts 1, "
                  "first_k_dense_replace 3, q_lora_rank 1536, qk_nope_head_dim 128, v_head_dim 128)",
}
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts",
            "num_dense_layers", "mlp_gated")
MLA_KEYS = ("q_lora_rank", "qk_nope_head_dim", "v_head_dim")


class CardError(ValueError):
    """A model card (or a --moe override) is unreadable or lacks / mistypes a key; the message
    names the file and the key."""


def norm_name(s: str) -> str:
    """Lower-cased, letters and digits only ('Qwen3-235B-A22B' -> 'qwen3235ba22b')."""
    return re.sub(r"[^a-z0-9]", "", str(s).lower())


def _scalar(raw: str):
    """One flat YAML value: a quoted string, true/false, null, an int, a float, else the text."""
    v = raw.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def parse_flat_yaml(text: str, path: str = "<text>") -> dict:
    """Parse the flat ``key: value`` YAML of a model card (comments, quoted strings, ints,
    floats, booleans, null) without PyYAML. Indented or list lines are a CardError naming the
    file and line (the cards have none)."""
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        s = line
        if not s.strip() or s.lstrip().startswith("#"):
            continue
        quote = None
        for j, ch in enumerate(s):  # cut a comment that is not inside quotes
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and (j == 0 or s[j - 1] in " \t"):
                s = s[:j]
                break
        if s[:1] in (" ", "\t", "-"):
            raise CardError(f"{path}:{i}: nested or list YAML is not supported by the flat "
                            f"parser (install PyYAML): {line.strip()!r}")
        if ":" not in s:
            raise CardError(f"{path}:{i}: expected 'key: value', got {line.strip()!r}")
        k, v = s.split(":", 1)
        out[k.strip()] = _scalar(v)
    return out


def read_card(path) -> dict:
    """The card at ``path`` as a dict (PyYAML's safe_load when installed, else
    :func:`parse_flat_yaml`). CardError naming the file when missing or not a mapping."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise CardError(f"{p}: model card not readable ({e})") from e
    try:
        import yaml  # noqa: PLC0415
    except ImportError:
        d = parse_flat_yaml(text, str(p))
    else:
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise CardError(f"{p}: not valid YAML ({e})") from e
    if not isinstance(d, dict):
        raise CardError(f"{p}: a model card must be a mapping of keys to values")
    return d


@dataclass
class ModelShapes:
    """The sizes of one model card that decide its operator shapes (elements, heads, tokens)."""
    name: str
    path: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    attention: str = "gqa"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    mlp_gated: bool = True
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sources: dict = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


REQUIRED = ("name", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size",
            "intermediate_size", "vocab_size")


def _int_field(d, key, path, minimum=1):
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise CardError(f"{path}: key '{key}' = {v!r}; expected an integer >= {minimum}")
    return v


def parse_moe_override(spec: str) -> tuple[str, dict]:
    """``NAME:num_experts=E,num_experts_per_tok=K,moe_intermediate_size=W[,num_shared_experts=S]
    [,num_dense_layers=D][,mlp_gated=0|1]`` (short keys experts, top_k, width, shared, dense_layers,
    gated accepted) -> (normalised NAME, fields). CardError on a malformed spec."""
    alias = {"experts": "num_experts", "top_k": "num_experts_per_tok", "topk": "num_experts_per_tok",
             "width": "moe_intermediate_size", "shared": "num_shared_experts",
             "dense_layers": "num_dense_layers", "gated": "mlp_gated"}
    if ":" not in spec:
        raise CardError(f"--moe {spec!r}: expected NAME:key=value,...")
    name, rest = spec.split(":", 1)
    out = {}
    for item in filter(None, rest.split(",")):
        if "=" not in item:
            raise CardError(f"--moe {spec!r}: {item!r} is not key=value")
        k, v = (x.strip() for x in item.split("=", 1))
        k = alias.get(k, k)
        if k not in MOE_KEYS + MLA_KEYS:
            raise CardError(f"--moe {spec!r}: unknown key {k!r} (known: {', '.join(MOE_KEYS + MLA_KEYS)})")
        try:
            out[k] = bool(int(v)) if k == "mlp_gated" else int(v)
        except ValueError:
            raise CardError(f"--moe {spec!r}: {k} = {v!r} is not an integer") from None
    return norm_name(name), out


def model_shapes(path, overrides: dict | None = None) -> ModelShapes:
    """Read a card into :class:`ModelShapes`. MoE / MLA fields come from the card when it has
    them (> 0), else from ``overrides`` (``--moe``; these win over the card), else from
    :data:`KNOWN_MODELS` for the models named there; ``sources`` says which, per field group."""
    d = read_card(path)
    p = str(path)
    for k in REQUIRED:
        if k not in d:
            raise CardError(f"{p}: missing key '{k}'")
    kw = {k: _int_field(d, k, p) for k in REQUIRED if k != "name"}
    kw["name"] = str(d["name"])
    kw["attention"] = str(d.get("attention", "gqa"))
    for k in ("kv_lora_rank", "qk_rope_head_dim"):
        if d.get(k) is not None:
            kw[k] = _int_field(d, k, p, minimum=0)
    key = norm_name(kw["name"])
    over = {}
    for nm in (key, norm_name(Path(p).stem)):
        over.update((overrides or {}).get(nm, {}))
    known = KNOWN_MODELS.get(key, {})
    sources = {}
    for group, keys, marker in (("moe", MOE_KEYS, ("num_experts",)),
                                ("mla", MLA_KEYS, ("q_lora_rank", "qk_nope_head_dim", "v_head_dim"))):
        card = {k: d[k] for k in keys if d.get(k) is not None}
        if any(card.get(k) for k in marker):
            # the card describes this part: its values, the simulator's defaults for the rest
            vals, src = card, f"card {Path(p).name}"
        elif any(k in known for k in keys):
            vals, src = {k: known[k] for k in keys if k in known}, KNOWN_SOURCE[key]
        else:
            vals, src = card, None
        mine = {k: over[k] for k in keys if k in over}
        if mine:
            vals = {**vals, **mine}
            src = f"{src or 'defaults'}; command line (--moe): {', '.join(sorted(mine))}"
        for k, v in vals.items():
            if k == "mlp_gated":
                if not isinstance(v, bool):
                    raise CardError(f"{p}: key 'mlp_gated' = {v!r}; expected true or false")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise CardError(f"{p}: key '{k}' = {v!r}; expected an integer >= 0")
            kw[k] = v
        if src and (kw.get("num_experts") if group == "moe" else kw["attention"] == "mla"):
            sources[group] = src
    if kw.get("num_experts", 0) > 0:
        for k in ("num_experts_per_tok", "moe_intermediate_size"):
            if kw.get(k, 0) < 1:
                raise CardError(f"{p}: num_experts = {kw['num_experts']} but '{k}' is missing or 0 "
                                f"(give it in the card or with --moe)")
        if kw["num_experts_per_tok"] > kw["num_experts"]:
            raise CardError(f"{p}: num_experts_per_tok {kw['num_experts_per_tok']} > num_experts "
                            f"{kw['num_experts']}")
    if kw["num_q_heads"] % kw["num_kv_heads"]:
        raise CardError(f"{p}: num_q_heads {kw['num_q_heads']} is not a multiple of num_kv_heads "
                        f"{kw['num_kv_heads']}")
    return ModelShapes(path=p, sources=sources, **kw)
