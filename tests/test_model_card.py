"""sim.model_card: a kvsim model card from a Hugging Face config.json. Small hand-written configs
of each family with hand-worked cards and parameter counts; errors that name the file and the
field; the command's YAML; and the shipped cards against the published configs in
tests/data/hf_configs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from sim.config import ModelConfig
from sim.errors import ConfigError
from sim.model_card import card_from_hf_config, main
from sim.run import compose_config
from sim.validation import validate_config

REPO = Path(__file__).resolve().parents[1]
HF = Path(__file__).parent / "data" / "hf_configs"

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 100, "max_position_embeddings": 256, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64},
}
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 4, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 96,
    "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "mlp_only_layers": [0], "decoder_sparse_step": 1, "vocab_size": 50,
    "tie_word_embeddings": True, "max_position_embeddings": 512, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 4,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 3, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
    "kv_lora_rank": 8, "q_lora_rank": 16, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
    "v_head_dim": 4, "intermediate_size": 64, "moe_intermediate_size": 8, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "vocab_size": 40,
    "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
}
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 16,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 50,
    "layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 16,
    "max_position_embeddings": 1024, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


def test_card_from_hf_config_llama_hand_worked():
    """head_dim 64 / 4 = 16; attention 64 x (4 + 2 x 2) x 16 + 4 x 16 x 64 = 12,288, MLP
    3 x 64 x 128 = 24,576 per layer; embedding and lm_head 100 x 64 each: 2 x 36,864 + 12,800
    = 86,528 parameters, all active."""
    c = card_from_hf_config(LLAMA, name="tiny-llama")
    want = dict(name="tiny-llama", num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=16,
                hidden_size=64, intermediate_size=128, vocab_size=100, attention="gqa",
                rope_dim=16, max_model_len=256, dtype="bf16", weight_quant="none",
                weight_quant_scope="linear", num_experts=0, sliding_window=0,
                num_sliding_window_layers=0, tie_word_embeddings=False, mlp_gated=True,
                rope_scaling="llama3 factor 8 over 64 original")
    assert {k: c[k] for k in want} == want
    assert c["num_params_b"] * 1e9 == pytest.approx(86_528)
    assert c["active_params_b"] * 1e9 == pytest.approx(86_528)
    assert c["embedding_params_b"] * 1e9 == pytest.approx(12_800)
    assert list(c) == [f for f in ModelConfig.__dataclass_fields__]  # every field, in order


def test_card_from_hf_config_qwen3_moe_hand_worked():
    """Layer 0 is dense (mlp_only_layers), 3 are MoE: intermediate_size stays the dense width
    96. Attention 32 x 8 x 8 + 4 x 8 x 32 = 3,072; dense MLP 3 x 32 x 96 = 9,216; expert
    3 x 32 x 16 = 1,536; router 32 x 8 = 256; tied embedding 50 x 32 = 1,600. Total 1,600 +
    4 x 3,072 + 9,216 + 3 x (8 x 1,536 + 256) = 60,736; active 1,600 + 12,288 + 9,216 +
    3 x (2 x 1,536 + 256) = 33,088. decoder_sparse_step 2 makes layers 0 and 2 dense."""
    c = card_from_hf_config(QWEN3_MOE, name="tiny-qwen3-moe")
    assert (c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"],
            c["num_shared_experts"], c["num_dense_layers"]) == (8, 2, 16, 0, 1)
    assert c["intermediate_size"] == 96 and c["tie_word_embeddings"] is True
    assert c["num_params_b"] * 1e9 == pytest.approx(60_736)
    assert c["active_params_b"] * 1e9 == pytest.approx(33_088)
    assert c["embedding_params_b"] * 1e9 == pytest.approx(1_600)
    assert card_from_hf_config(dict(QWEN3_MOE, decoder_sparse_step=2), name="q")["num_dense_layers"] == 2
    # no dense layer: intermediate_size is the per-token active width, top-2 x 16
    assert card_from_hf_config(dict(QWEN3_MOE, mlp_only_layers=[]), name="q")["intermediate_size"] == 32


def test_card_from_hf_config_deepseek_v3_hand_worked():
    """MLA: one latent KV head of qk_nope 4 + qk_rope 2 = 6; attention q_a 32 x 16 + q_b
    16 x 2 x 6 + kv_a 32 x (8 + 2) + kv_b 8 x 2 x (4 + 4) + o 2 x 4 x 32 = 1,408. First layer
    dense (3 x 32 x 64 = 6,144), two MoE layers of 4 experts (3 x 32 x 8 = 768), 1 shared, router
    128. Total 2,560 + 3 x 1,408 + 6,144 + 2 x (4 x 768 + 768 + 128) = 20,864; active 2,560 +
    4,224 + 6,144 + 2 x (2 x 768 + 768 + 128) = 17,792. FP8 weights on every linear layer."""
    c = card_from_hf_config(DEEPSEEK_V3, name="tiny-dsv3")
    want = dict(attention="mla", num_kv_heads=1, head_dim=6, kv_lora_rank=8, qk_rope_head_dim=2,
                rope_dim=2, q_lora_rank=16, qk_nope_head_dim=4, v_head_dim=4, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=8, num_shared_experts=1,
                num_dense_layers=1, intermediate_size=64, weight_quant="fp8",
                weight_quant_scope="linear", rope_scaling="yarn factor 40 over 4096 original")
    assert {k: c[k] for k in want} == want
    assert c["num_params_b"] * 1e9 == pytest.approx(20_864)
    assert c["active_params_b"] * 1e9 == pytest.approx(17_792)


def test_card_from_hf_config_gpt_oss_hand_worked():
    """layer_types: 2 of 4 layers keep a 16-token window. Experts of intermediate_size 16, top-2:
    the card's intermediate_size is 2 x 16 = 32. MXFP4 with attention, router, embeddings left
    out (modules_to_not_convert): scope experts. Total 3,200 + 4 x 3,072 + 4 x (8 x 1,536 +
    256) = 65,664; active 3,200 + 12,288 + 4 x (2 x 1,536 + 256) = 28,800."""
    c = card_from_hf_config(GPT_OSS, name="tiny-gpt-oss")
    want = dict(sliding_window=16, num_sliding_window_layers=2, num_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=16, intermediate_size=32,
                weight_quant="mxfp4", weight_quant_scope="experts", rope_dim=8)
    assert {k: c[k] for k in want} == want
    assert c["num_params_b"] * 1e9 == pytest.approx(65_664)
    assert c["active_params_b"] * 1e9 == pytest.approx(28_800)


def test_card_from_hf_config_sliding_window_and_quantization_rules():
    """Qwen2: use_sliding_window puts the window on the layers from max_window_layers on;
    compressed-tensors 4-bit float in groups of 16 is NVFP4; AWQ 4-bit group 128 is int4_awq;
    the keyword arguments override what the file says."""
    qwen2 = dict(LLAMA, architectures=["Qwen2ForCausalLM"], num_hidden_layers=28,
                 use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    c = card_from_hf_config(qwen2, name="q")
    assert (c["sliding_window"], c["num_sliding_window_layers"]) == (4096, 8)
    assert card_from_hf_config(dict(qwen2, use_sliding_window=False), name="q")["num_sliding_window_layers"] == 0
    nvfp4 = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}}
    c = card_from_hf_config(dict(LLAMA, quantization_config=nvfp4), name="n")
    assert (c["weight_quant"], c["weight_quant_scope"]) == ("nvfp4", "linear")
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    assert card_from_hf_config(dict(LLAMA, quantization_config=awq), name="a")["weight_quant"] == "int4_awq"
    c = card_from_hf_config(LLAMA, name="o", dtype="fp16", weight_quant="fp8", max_model_len=128)
    assert (c["name"], c["dtype"], c["weight_quant"], c["max_model_len"]) == ("o", "fp16", "fp8", 128)


def test_card_from_hf_config_names_from_the_file(tmp_path):
    d = tmp_path / "My-Model-7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    assert card_from_hf_config(d / "config.json")["name"] == "My-Model-7B"
    assert card_from_hf_config(dict(LLAMA, _name_or_path="org/Other-1B"))["name"] == "Other-1B"
    with pytest.raises(ConfigError, match=r"config dict: no name given and no _name_or_path"):
        card_from_hf_config(LLAMA)


def _write(tmp_path, cfg, text=None):
    p = tmp_path / "config.json"
    p.write_text(text if text is not None else json.dumps(cfg))
    return p


@pytest.mark.parametrize("cfg,pattern", [
    (dict(LLAMA, architectures=["BertModel"]),
     r"config\.json: architectures=\['BertModel'\]; expected one of \['DeepseekV2ForCausalLM'"),
    ({k: v for k, v in LLAMA.items() if k != "architectures"},
     r"config\.json: architectures=None; expected a list naming one of"),
    ({k: v for k, v in LLAMA.items() if k != "num_hidden_layers"},
     r"config\.json: no num_hidden_layers; expected an integer >= 1"),
    (dict(LLAMA, hidden_size="64"), r"config\.json: hidden_size='64'; expected an integer >= 1"),
    (dict(LLAMA, num_attention_heads=0), r"config\.json: num_attention_heads=0; expected an integer"),
    (dict(LLAMA, num_key_value_heads=3),
     r"config\.json: num_key_value_heads=3; expected a divisor of num_attention_heads=4"),
    (dict(LLAMA, hidden_size=66), r"config\.json: hidden_size=66; expected a multiple of "
                                  r"num_attention_heads=4 \(no head_dim given\)"),
    (dict(LLAMA, tie_word_embeddings="no"), r"config\.json: tie_word_embeddings='no'; expected true"),
    (dict(LLAMA, torch_dtype="float32"),
     r"config\.json: torch_dtype='float32'; expected one of \['bfloat16', 'float16'\]"),
    (dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=4096, num_hidden_layers=32),
     r"config\.json: sliding_window=4096 applies to every one of the 32 layers"),
    (dict(LLAMA, quantization_config={"quant_method": "bitsandbytes"}),
     r"config\.json: quantization_config\.quant_method='bitsandbytes'; expected fp8, mxfp4"),
    (dict(LLAMA, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 64}),
     r"config\.json: quantization_config\.group_size=64; expected 128"),
    (dict(LLAMA, quantization_config={"quant_method": "fp8", "modules_to_not_convert": ["self_attn"]}),
     r"config\.json: quantization_config leaves the attention unquantised .* on a dense model"),
    (dict(QWEN3_MOE, num_experts_per_tok=9),
     r"config\.json: num_experts_per_tok=9; expected at most the 8 routed experts"),
    (dict(QWEN3_MOE, mlp_only_layers=[0, 7]),
     r"config\.json: mlp_only_layers=\[0, 7\]; expected a list of layer indices in \[0, 4\)"),
    (dict(GPT_OSS, layer_types=["full_attention"]),
     r"config\.json: layer_types=\['full_attention'\]; expected a list of 4 layer types"),
    (dict(DEEPSEEK_V3, qk_nope_head_dim=None),
     r"config\.json: no qk_nope_head_dim; expected an integer >= 1"),
])
def test_card_from_hf_config_errors_name_the_file_and_field(tmp_path, cfg, pattern):
    p = _write(tmp_path, cfg)
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path)) + r".*" + pattern):
        card_from_hf_config(p)


def test_card_from_hf_config_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json: cannot read the config"):
        card_from_hf_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"config\.json: not JSON \(line 1, column 2"):
        card_from_hf_config(_write(tmp_path, None, text="{oops"))
    with pytest.raises(ConfigError, match=r"config\.json: a JSON list; expected a Hugging Face"):
        card_from_hf_config(_write(tmp_path, None, text="[1]"))
    with pytest.raises(ConfigError, match=r"dtype='int3' is not a known dtype"):
        card_from_hf_config(LLAMA, name="x", dtype="int3")
    with pytest.raises(ConfigError, match=r"weight_quant='int2'; expected one of"):
        card_from_hf_config(LLAMA, name="x", weight_quant="int2")


def test_model_card_command_prints_a_card_kvsim_accepts(tmp_path, capsys):
    """The YAML names its source file, loads into the ModelConfig schema and passes
    validate_config; an error is one line on stderr and exit status 2."""
    p = _write(tmp_path, GPT_OSS)
    assert main([str(p), "--name", "tiny-gpt-oss"]) == 0
    out = capsys.readouterr().out
    card = yaml.safe_load(out)
    assert card["source"].startswith(str(p)) and str(p) in out.splitlines()[0]
    assert card["name"] == "tiny-gpt-oss" and card["weight_quant_scope"] == "experts"
    cfg = compose_config()
    cfg.model = OmegaConf.merge(OmegaConf.structured(ModelConfig), card)
    validate_config(cfg)
    bad = _write(tmp_path, dict(GPT_OSS, architectures=["T5Model"]))
    r = subprocess.run([sys.executable, "-m", "sim.model_card", str(bad)], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"python -m sim.model_card: error: {bad}: architectures=")
    assert len(r.stderr.strip().splitlines()) == 1


# shipped card -> its published config.json (tests/data/hf_configs/README.md)
SHIPPED = {
    "llama3_1_8b": "Llama-3.1-8B.json", "llama3_1_70b": "Llama-3.1-70B.json",
    "llama3_3_70b": "Llama-3.3-70B-Instruct.json", "llama2_7b": "Llama-2-7b-hf.json",
    "codellama_34b": "CodeLlama-34b-Instruct-hf.json", "qwen3_8b": "Qwen3-8B.json",
    "qwen3_32b": "Qwen3-32B.json", "qwen3_235b_a22b": "Qwen3-235B-A22B.json",
    "deepseek_v3": "DeepSeek-V3.json", "deepseek_r1": "DeepSeek-R1.json",
    "gpt_oss_120b": "gpt-oss-120b.json",
}
ARCHITECTURE_FIELDS = (
    "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
    "vocab_size", "attention", "kv_lora_rank", "qk_rope_head_dim", "sliding_window",
    "num_sliding_window_layers", "rope_dim", "dtype", "weight_quant", "weight_quant_scope",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts",
    "num_dense_layers", "mlp_gated", "q_lora_rank", "qk_nope_head_dim", "v_head_dim",
    "tie_word_embeddings")


def test_every_shipped_card_has_a_config_fixture():
    assert sorted(SHIPPED) == sorted(p.stem for p in (REPO / "experiments/conf/model").glob("*.yaml"))


@pytest.mark.parametrize("model", sorted(SHIPPED))
def test_shipped_card_agrees_with_its_published_config(model):
    """The architecture fields of each shipped card are what card_from_hf_config reads from the
    model's config.json, and the published parameter counts on the card are within 2% (total)
    and 3% (active) of the counts computed from it."""
    shipped = compose_config([f"model={model}"]).model
    made = card_from_hf_config(HF / SHIPPED[model])
    assert {f: made[f] for f in ARCHITECTURE_FIELDS} == {f: shipped[f] for f in ARCHITECTURE_FIELDS}
    assert made["num_params_b"] == pytest.approx(shipped.num_params_b, rel=0.02)
    assert made["active_params_b"] == pytest.approx(shipped.active_params_b, rel=0.03)
    assert made["embedding_params_b"] == pytest.approx(shipped.embedding_params_b, rel=0.001)
