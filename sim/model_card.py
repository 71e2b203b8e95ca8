"""A model card (the ``model`` config group, :class:`sim.config.ModelConfig`) from a Hugging Face
``config.json``.

:func:`card_from_hf_config` reads the architecture fields of the families below and returns the
card's fields as a dict; ``python -m sim.model_card CONFIG.json [--name N] >
experiments/conf/model/<name>.yaml`` prints it as a YAML card whose ``source`` line names the
file. Every error is a :class:`sim.errors.ConfigError` naming the file, the field and what was
expected.

Families (``architectures``): LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM (dense); MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
GptOssForCausalLM (MoE); DeepseekV2ForCausalLM, DeepseekV3ForCausalLM (MoE with MLA).

What is read (Hugging Face's field names; units: counts of layers, heads, values, tokens):

* shape: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
  ``num_key_value_heads`` (absent: one per query head, as Hugging Face's configs default it),
  ``head_dim`` (absent: ``hidden_size / num_attention_heads``), ``intermediate_size``,
  ``vocab_size``, ``tie_word_embeddings`` (absent: false), ``partial_rotary_factor`` (the rotary
  part of a head, absent: all of it);
* MLA (DeepSeek): ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``,
  ``q_lora_rank`` (null: none); the card has one latent "KV head" of ``qk_nope + qk_rope``;
* experts: ``num_local_experts`` (Mixtral, gpt-oss) / ``num_experts`` (Qwen-MoE) /
  ``n_routed_experts`` (DeepSeek), ``num_experts_per_tok``, ``moe_intermediate_size`` (Mixtral
  and gpt-oss: ``intermediate_size`` is the expert's width), shared experts (DeepSeek
  ``n_shared_experts``; Qwen2-MoE ``shared_expert_intermediate_size`` in expert widths), dense
  layers (DeepSeek ``first_k_dense_replace`` and ``moe_layer_freq``; Qwen-MoE
  ``mlp_only_layers`` and ``decoder_sparse_step``; counted wherever they are). The card's
  ``intermediate_size`` is the dense width when some layer is dense, else the per-token active
  width ``(num_experts_per_tok + shared) x moe_intermediate_size``, as the shipped cards have it;
* sliding windows: ``layer_types`` (``sliding_attention`` entries) where given; else Qwen's
  ``use_sliding_window`` with ``sliding_window`` on the layers from ``max_window_layers`` on;
  else Mistral's ``sliding_window`` on every layer (which kvsim cannot hold: an error);
* ``torch_dtype`` (or ``dtype``) -> ``dtype``; ``max_position_embeddings`` -> ``max_model_len``;
  ``rope_scaling`` -> its description;
* ``quantization_config``: ``quant_method`` fp8 -> ``fp8``; mxfp4 -> ``mxfp4``; awq / gptq
  (4 bits, group 128) -> ``int4_awq`` / ``int4_gptq``; compressed-tensors with 4-bit float
  weights in groups of 16 -> ``nvfp4`` and 8-bit float -> ``fp8``. ``modules_to_not_convert``
  (compressed-tensors: ``ignore``) naming the attention of a MoE model gives
  ``weight_quant_scope: experts`` (gpt-oss: MXFP4 experts, BF16 attention and router).

Parameter counts (``num_params_b``, ``active_params_b``, ``embedding_params_b``, billions) come
from the architecture (:func:`sim.hardware.linear_param_counts`), not from the model's page.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Union

from .errors import ConfigError
from .hardware import WEIGHT_QUANT_BYTES, dtype_bytes, linear_param_counts

__all__ = ["card_from_hf_config", "card_yaml", "ARCHITECTURES", "main"]

#: architectures -> family
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
}

#: torch dtype names of config.json -> the card's dtype
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


class _Reader:
    """Typed access to one config.json's fields; errors name the file and the field."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def error(self, field: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.where}: {field}={value!r}; expected {expected}")

    def has(self, field: str) -> bool:
        return self.cfg.get(field) is not None

    def int(self, field: str, default: Optional[int] = None, lo: int = 1) -> int:
        """An integer >= ``lo`` (``default`` when the field is absent or null; required when
        ``default`` is None)."""
        v = self.cfg.get(field)
        if v is None:
            if default is None:
                raise ConfigError(f"{self.where}: no {field}; expected an integer >= {lo}")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < lo:
            raise self.error(field, v, f"an integer >= {lo}")
        return int(v)

    def bool(self, field: str, default: bool) -> bool:
        v = self.cfg.get(field)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(field, v, "true or false")
        return v


def _load(path_or_dict: Union[str, Path, dict]) -> tuple[dict, str, Optional[Path]]:
    if isinstance(path_or_dict, dict):
        return path_or_dict, "config dict", None
    path = Path(path_or_dict)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e.strerror or e}); expected a "
                          f"Hugging Face config.json") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; expected a Hugging Face config.json") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                          f"expected a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: a JSON {type(cfg).__name__}; expected a Hugging Face "
                          f"config.json object")
    return cfg, str(path), path


def _family(r: _Reader) -> tuple[str, str]:
    arch = r.cfg.get("architectures")
    if not isinstance(arch, list) or not arch or not all(isinstance(a, str) for a in arch):
        raise r.error("architectures", arch, f"a list naming one of {sorted(ARCHITECTURES)}")
    for a in arch:
        if a in ARCHITECTURES:
            return a, ARCHITECTURES[a]
    raise r.error("architectures", arch,
                  f"one of {sorted(ARCHITECTURES)} (an architecture kvsim can read)")


def _dense_layers(r: _Reader, family: str, layers: int) -> int:
    """Layers with a dense MLP in a MoE model (counted wherever they are)."""
    if family == "deepseek":
        first = r.int("first_k_dense_replace", 0, lo=0)
        freq = r.int("moe_layer_freq", 1)
        return sum(1 for i in range(layers) if not (i >= first and i % freq == 0))
    if family in ("qwen2_moe", "qwen3_moe"):
        only = r.cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 and 0 <= i < layers for i in only):
            raise r.error("mlp_only_layers", only, f"a list of layer indices in [0, {layers})")
        step = r.int("decoder_sparse_step", 1)
        return sum(1 for i in range(layers) if i in only or (i + 1) % step)
    return 0


def _experts(r: _Reader, family: str, layers: int) -> dict:
    """num_experts, num_experts_per_tok, moe_intermediate_size, num_shared_experts,
    num_dense_layers (all 0 for a dense family)."""
    if family in ("llama", "mistral", "qwen2"):
        return dict(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                    num_shared_experts=0, num_dense_layers=0)
    if family in ("mixtral", "gpt_oss"):
        e, width, shared = r.int("num_local_experts"), r.int("intermediate_size"), 0
    elif family == "deepseek":
        e, width = r.int("n_routed_experts"), r.int("moe_intermediate_size")
        shared = r.int("n_shared_experts", 0, lo=0)
    else:  # qwen2_moe, qwen3_moe
        e, width = r.int("num_experts"), r.int("moe_intermediate_size")
        shared = 0
        if family == "qwen2_moe" and r.has("shared_expert_intermediate_size"):
            s = r.int("shared_expert_intermediate_size", lo=0)
            if s % width:
                raise r.error("shared_expert_intermediate_size", s,
                              f"a multiple of moe_intermediate_size={width} (kvsim's shared "
                              f"experts have the routed experts' width)")
            shared = s // width
    k = r.int("num_experts_per_tok")
    if k > e:
        raise r.error("num_experts_per_tok", k, f"at most the {e} routed experts")
    dense = _dense_layers(r, family, layers)
    if dense >= layers:
        raise ConfigError(f"{r.where}: every one of the {layers} layers has a dense MLP "
                          f"(first_k_dense_replace / mlp_only_layers / decoder_sparse_step); "
                          f"expected a MoE layer")
    return dict(num_experts=e, num_experts_per_tok=k, moe_intermediate_size=width,
                num_shared_experts=shared, num_dense_layers=dense)


def _sliding(r: _Reader, family: str, layers: int) -> tuple[int, int]:
    """(sliding_window tokens, layers that keep only that window)."""
    types = r.cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise r.error("layer_types", types, f"a list of {layers} layer types "
                                                f"(num_hidden_layers)")
        n = sum(1 for t in types if t == "sliding_attention")
        if n == 0:
            return 0, 0
        w = r.int("sliding_window")
    elif family in ("qwen2", "qwen2_moe", "qwen3_moe"):
        if not r.bool("use_sliding_window", False):
            return 0, 0
        w = r.int("sliding_window")
        n = layers - min(r.int("max_window_layers", 0, lo=0), layers)
    elif family in ("mistral", "mixtral") and r.has("sliding_window"):
        w, n = r.int("sliding_window"), layers
    else:
        return 0, 0
    if n >= layers:
        raise ConfigError(f"{r.where}: sliding_window={w} applies to every one of the {layers} "
                          f"layers; expected at least one full-attention layer (kvsim's paged "
                          f"pool holds the full-attention layers; a window-only model is not "
                          f"modelled)")
    return w, n


def _quant(r: _Reader, moe: bool) -> tuple[str, str]:
    """(weight_quant, weight_quant_scope) of quantization_config."""
    q = r.cfg.get("quantization_config")
    if q is None:
        return "none", "linear"
    if not isinstance(q, dict):
        raise r.error("quantization_config", q, "an object with a quant_method")
    method = str(q.get("quant_method", "")).lower()
    keep = q.get("modules_to_not_convert")
    if method == "fp8":
        wq = "fp8"
    elif method == "mxfp4":
        wq = "mxfp4"
    elif method in ("awq", "gptq"):
        bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
        if bits != 4:
            raise r.error("quantization_config.bits", bits, f"4 ({method} 4-bit)")
        if group != 128:
            raise r.error("quantization_config.group_size", group,
                          f"128 (kvsim's int4_{method} layout: one scale and zero point per "
                          f"128 weights)")
        wq = f"int4_{method}"
    elif method == "compressed-tensors":
        wq = _compressed_tensors(r, q)
        keep = q.get("ignore")
    else:
        raise r.error("quantization_config.quant_method", q.get("quant_method"),
                      "fp8, mxfp4, awq, gptq or compressed-tensors (or pass weight_quant)")
    if keep is not None and not (isinstance(keep, list) and all(isinstance(m, str) for m in keep)):
        raise r.error("quantization_config.modules_to_not_convert", keep, "a list of module names")
    attn_kept = any("attn" in m for m in keep or [])
    if attn_kept and not moe:
        raise ConfigError(
            f"{r.where}: quantization_config leaves the attention unquantised ({keep}) on a "
            f"dense model; expected a scope kvsim has: every linear layer, or a MoE model's "
            f"routed experts (pass weight_quant to choose)")
    return wq, "experts" if attn_kept else "linear"


def _compressed_tensors(r: _Reader, q: dict) -> str:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise r.error("quantization_config.config_groups", groups, "at least one group")
    found = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise r.error("quantization_config.config_groups.*.weights", w, "an object")
        bits, typ, group = w.get("num_bits"), w.get("type"), w.get("group_size")
        if bits == 4 and typ == "float" and group == 16:
            found.add("nvfp4")
        elif bits == 8 and typ == "float":
            found.add("fp8")
        else:
            raise r.error("quantization_config.config_groups.*.weights",
                          {"num_bits": bits, "type": typ, "group_size": group},
                          "4-bit float in groups of 16 (NVFP4) or 8-bit float (FP8)")
    if len(found) > 1:
        raise r.error("quantization_config.config_groups", sorted(found),
                      "one weight precision for every group")
    return found.pop()


def _rope_scaling(r: _Reader) -> str:
    s = r.cfg.get("rope_scaling")
    if s is None:
        return "none"
    if not isinstance(s, dict):
        raise r.error("rope_scaling", s, "an object or null")
    kind = s.get("rope_type", s.get("type", "?"))
    out = f"{kind}"
    if s.get("factor") is not None:
        out += f" factor {s['factor']:g}"
    if s.get("original_max_position_embeddings") is not None:
        out += f" over {s['original_max_position_embeddings']} original"
    return out


def _name(cfg: dict, path: Optional[Path], where: str) -> str:
    n = cfg.get("_name_or_path")
    if isinstance(n, str) and n.strip():
        return n.rstrip("/").split("/")[-1]
    if path is not None:
        return path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    raise ConfigError(f"{where}: no name given and no _name_or_path; expected name=...")


def card_from_hf_config(path_or_dict: Union[str, Path, dict], *, name: Optional[str] = None,
                        dtype: Optional[str] = None, weight_quant: Optional[str] = None,
                        max_model_len: Optional[int] = None) -> dict:
    """The model card (:class:`sim.config.ModelConfig` fields, in its order) of a Hugging Face
    ``config.json`` (a path, or the parsed dict).

    ``name`` (default: the config's ``_name_or_path`` or the folder holding ``config.json``),
    ``dtype`` (default: ``torch_dtype``), ``weight_quant`` (default: from
    ``quantization_config``; the scope still follows ``modules_to_not_convert``) and
    ``max_model_len`` (tokens; default: ``max_position_embeddings``) override what the file
    says. Parameter counts are billions, from :func:`sim.hardware.linear_param_counts`.

    Raises ConfigError naming the file and the field for a missing or wrong field, an
    architecture outside :data:`ARCHITECTURES`, a quantization kvsim has no bytes for.
    """
    cfg, where, path = _load(path_or_dict)
    r = _Reader(cfg, where)
    arch, family = _family(r)
    layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    card: dict = {"name": name or _name(cfg, path, where)}
    ex = _experts(r, family, layers)
    if family == "deepseek":
        rope, nope = r.int("qk_rope_head_dim", lo=0), r.int("qk_nope_head_dim")
        mla = dict(attention="mla", num_kv_heads=1, head_dim=nope + rope,
                   kv_lora_rank=r.int("kv_lora_rank"), qk_rope_head_dim=rope, rope_dim=rope,
                   q_lora_rank=r.int("q_lora_rank", 0, lo=0), qk_nope_head_dim=nope,
                   v_head_dim=r.int("v_head_dim"))
    else:
        kv = r.int("num_key_value_heads", heads)
        if heads % kv:
            raise r.error("num_key_value_heads", kv,
                          f"a divisor of num_attention_heads={heads} (whole query groups)")
        if r.has("head_dim"):
            hd = r.int("head_dim")
        elif hidden % heads:
            raise r.error("hidden_size", hidden, f"a multiple of num_attention_heads={heads} "
                                                 f"(no head_dim given)")
        else:
            hd = hidden // heads
        frac = cfg.get("partial_rotary_factor", 1.0)
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
            raise r.error("partial_rotary_factor", frac, "a fraction in (0, 1]")
        mla = dict(attention="gqa", num_kv_heads=kv, head_dim=hd, kv_lora_rank=0,
                   qk_rope_head_dim=0, rope_dim=int(hd * frac), q_lora_rank=0,
                   qk_nope_head_dim=0, v_head_dim=0)
    window, n_window = _sliding(r, family, layers)
    if ex["num_experts"] and not ex["num_dense_layers"]:
        inter = (ex["num_experts_per_tok"] + ex["num_shared_experts"]) * ex["moe_intermediate_size"]
    else:
        inter = r.int("intermediate_size")
    wq, scope = _quant(r, bool(ex["num_experts"]))
    if weight_quant is not None:
        wq = str(weight_quant)
        if wq != "none" and wq not in WEIGHT_QUANT_BYTES:
            raise ConfigError(f"weight_quant={weight_quant!r}; expected one of "
                              f"{['none'] + sorted(WEIGHT_QUANT_BYTES)}")
    if dtype is None:
        td = cfg.get("torch_dtype", cfg.get("dtype"))
        if td not in TORCH_DTYPES:
            raise r.error("torch_dtype", td,
                          f"one of {sorted(TORCH_DTYPES)} (vLLM serves float32 checkpoints in "
                          f"a 16-bit dtype: pass dtype, as vLLM's --dtype)")
        dtype = TORCH_DTYPES[td]
    else:
        dtype_bytes(dtype, "dtype")  # (a known dtype name)
    if max_model_len is None:
        max_model_len = r.int("max_position_embeddings")
    elif isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ConfigError(f"max_model_len={max_model_len!r}; expected an integer >= 1 (tokens)")
    card.update(
        num_layers=layers, num_q_heads=heads, num_kv_heads=mla["num_kv_heads"],
        head_dim=mla["head_dim"], hidden_size=hidden, intermediate_size=inter,
        vocab_size=r.int("vocab_size"), num_params_b=0.0, active_params_b=0.0,
        embedding_params_b=0.0, attention=mla["attention"], kv_lora_rank=mla["kv_lora_rank"],
        qk_rope_head_dim=mla["qk_rope_head_dim"], sliding_window=window,
        num_sliding_window_layers=n_window, rope_dim=mla["rope_dim"],
        max_model_len=max_model_len, rope_scaling=_rope_scaling(r), dtype=str(dtype),
        weight_quant=wq, weight_quant_scope=scope, **ex, mlp_gated=True,
        q_lora_rank=mla["q_lora_rank"], qk_nope_head_dim=mla["qk_nope_head_dim"],
        v_head_dim=mla["v_head_dim"], tie_word_embeddings=r.bool("tie_word_embeddings", False),
        source=f"{where} ({arch}); parameter counts from the architecture "
               f"(sim.hardware.linear_param_counts)")
    from omegaconf import OmegaConf

    from .config import ModelConfig

    from .validation import check_model_card

    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), card)  # (the schema's types)
    p = linear_param_counts(node)
    card.update(num_params_b=p.total / 1e9, active_params_b=p.active / 1e9,
                embedding_params_b=(p.embedding + p.lm_head) / 1e9)
    try:
        check_model_card(OmegaConf.merge(node, card))
    except ConfigError as e:
        raise ConfigError(f"{where}: the card made from it fails a check: {e}") from None
    return card


def card_yaml(card: dict) -> str:
    """The card as YAML text: a comment on where it came from, then ``key: value`` lines."""
    import yaml

    head = (f"# {card['name']}: generated by python -m sim.model_card from {card['source']}.\n"
            f"# num_params_b / active_params_b / embedding_params_b are computed, in billions;\n"
            f"# check them against the model's published counts before relying on them.\n")
    return head + yaml.safe_dump(card, sort_keys=False, default_flow_style=False, width=100)


def main(argv: Optional[list] = None) -> int:
    """``python -m sim.model_card CONFIG.json [--name N] [--dtype D] [--weight-quant Q]
    [--max-model-len N]``: print the YAML card on stdout; an error is one line on stderr,
    exit status 2."""
    ap = argparse.ArgumentParser(
        prog="python -m sim.model_card",
        description="Print a kvsim model card (experiments/conf/model/<name>.yaml) made from a "
                    "Hugging Face config.json.")
    ap.add_argument("config", help="path of the model's config.json")
    ap.add_argument("--name", help="the card's name (default: _name_or_path or the folder name)")
    ap.add_argument("--dtype", help="activation / unquantised weight dtype (default: torch_dtype)")
    ap.add_argument("--weight-quant", help="weight quantization (default: quantization_config)")
    ap.add_argument("--max-model-len", type=int,
                    help="context length in tokens (default: max_position_embeddings)")
    a = ap.parse_args(argv)
    try:
        card = card_from_hf_config(a.config, name=a.name, dtype=a.dtype,
                                   weight_quant=a.weight_quant, max_model_len=a.max_model_len)
    except ConfigError as e:
        print(f"python -m sim.model_card: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(card_yaml(card))
    return 0


if __name__ == "__main__":
    sys.exit(main())
