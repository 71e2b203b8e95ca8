"""sim.validation's model- and GPU-card consistency checks for the MoE, MLA, quantised-scope and
NVLink fields: each inconsistent card is a ConfigError naming the field, the value and what was
expected; every shipped card passes."""

from __future__ import annotations

import pytest

from sim.config import CONF_DIR
from sim.errors import ConfigError
from sim.run import compose_config
from sim.validation import validate_config

# (overrides, regex the message must match)
CARD_CASES = [
    (["model=gpt_oss_120b", "model.num_experts_per_tok=129"],
     r"model\.num_experts_per_tok=129; expected 1 <= num_experts_per_tok <= "
     r"model\.num_experts=128"),
    (["model=gpt_oss_120b", "model.num_experts_per_tok=0"],
     r"model\.num_experts_per_tok=0; expected 1 <= num_experts_per_tok"),
    (["model=gpt_oss_120b", "model.moe_intermediate_size=0"],
     r"model\.moe_intermediate_size=0; expected >= 1 with model\.num_experts >= 1"),
    (["model=deepseek_v3", "model.num_dense_layers=61"],
     r"model\.num_dense_layers=61; expected fewer than model\.num_layers=61"),
    (["model.num_experts_per_tok=8", "model.moe_intermediate_size=1536"],
     r"model\.num_experts=0 with model\.num_experts_per_tok=8, "
     r"model\.moe_intermediate_size=1536; expected the MoE fields set together"),
    (["model.num_shared_experts=1"], r"model\.num_experts=0 with model\.num_shared_experts=1"),
    (["model=gpt_oss_120b", "model.num_shared_experts=-1"],
     r"model\.num_shared_experts=-1; expected >= 0"),
    (["model.weight_quant_scope=attention"],
     r"model\.weight_quant_scope='attention'; expected one of \['linear', 'experts'\]"),
    (["model.weight_quant_scope=experts"],
     r"model\.weight_quant_scope='experts' with model\.num_experts=0; expected a MoE card"),
    (["model.q_lora_rank=1536"],
     r"model\.q_lora_rank=1536 with model\.attention='gqa'; expected them only with "
     r"attention=mla"),
    (["model=deepseek_v3", "model.qk_nope_head_dim=64"],
     r"model\.qk_nope_head_dim=64 \+ model\.qk_rope_head_dim=64 != model\.head_dim=192"),
    (["model=deepseek_v3", "model.v_head_dim=-1"], r"model\.v_head_dim=-1; expected >= 0"),
    (["gpu.nvlink_bandwidth_gbps=-450"], r"gpu\.nvlink_bandwidth_gbps=-450\.0; expected >= 0"),
    (["gpu.nvlink_latency_s=-1e-6"], r"gpu\.nvlink_latency_s=-1e-06; expected >= 0 s"),
    (["gpu.fp8_dense_tflops=-1"], r"gpu\.fp8_dense_tflops=-1\.0; expected >= 0"),
    (["gpu.fp4_dense_tflops=nan"], r"gpu\.fp4_dense_tflops=nan; expected >= 0"),
]


@pytest.mark.parametrize("overrides,pattern", CARD_CASES, ids=[" ".join(c[0]) for c in CARD_CASES])
def test_validate_config_rejects_inconsistent_card_fields(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_config(compose_config(overrides))


# the MoE cards need more than one GPU's memory for their weights
SHARDED = {"deepseek_v3": 8, "deepseek_r1": 8, "qwen3_235b_a22b": 8, "llama3_1_70b": 2,
           "llama3_3_70b": 2}


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
def test_validate_config_accepts_every_shipped_model_card(model):
    tp = SHARDED.get(model, 1)
    validate_config(compose_config([f"model={model}", f"cost.tensor_parallel_size={tp}"]))


@pytest.mark.parametrize("gpu", sorted(p.stem for p in (CONF_DIR / "gpu").glob("*.yaml")))
def test_validate_config_accepts_every_shipped_gpu_card(gpu):
    # (32,768 tokens: on a 24 GB card the 131,072-token context does not fit the pool, and
    # vLLM refuses to start, as kvsim does)
    validate_config(compose_config([f"gpu={gpu}", "model=llama3_1_8b",
                                    "model.max_model_len=32768"]))
