"""The policy registry (policies/registry.py): each policy registered with its own config class,
configs built by name, from mappings and from Hydra's nodes, an option a policy does not read
rejected (by policy_config and by Hydra's composition of the presets)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from policies import POLICIES, POLICY_CONFIGS, PolicyConfig, make_policy, policy_config
from policies.config import H2OConfig, TriAttentionConfig
from policies.eviction import EvictionPolicy
from policies.registry import not_read_error, option_names, readers_of, register_policy
from sim.config import CONF_DIR
from sim.run import compose_config


def test_every_policy_has_its_config_class_and_a_preset_typed_by_it():
    presets = sorted(p.stem for p in (CONF_DIR / "policy").glob("*.yaml"))
    assert presets == sorted(POLICIES) == sorted(POLICY_CONFIGS)
    for name in presets:
        cfg = compose_config([f"policy={name}"])
        assert OmegaConf.get_type(cfg.policy) is POLICY_CONFIGS[name] is POLICIES[name].config_class
        pol = make_policy(cfg.policy)
        assert type(pol) is POLICIES[name] and type(pol.cfg) is POLICY_CONFIGS[name]


def test_policy_config_by_name_mapping_and_node_gives_the_same_config():
    by_name = policy_config("h2o", budget=100, heavy_ratio=0.25)
    assert by_name == H2OConfig(budget=100, heavy_ratio=0.25)
    assert policy_config({"name": "h2o", "budget": 100, "heavy_ratio": 0.25}) == by_name
    node = compose_config(["policy=h2o", "policy.budget=100", "policy.heavy_ratio=0.25",
                           "policy.beta=128", "policy.mode=", "policy.protect_prompt=true"]).policy
    assert policy_config(node) == by_name
    assert policy_config(by_name) is by_name
    assert policy_config(by_name, budget=7).budget == 7 and by_name.budget == 100
    imp = policy_config({"name": "snapkv", "importance": {"sigma": 0.5}}).importance
    assert imp.sigma == 0.5 and imp.drift == 0.3
    assert policy_config() == policy_config("full")


def test_policy_config_rejects_an_unknown_name_and_an_option_the_policy_does_not_read():
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; valid: ada_kv, full, h2o, "):
        policy_config("nope")
    with pytest.raises(ValueError, match=r"^policy full does not read budget \(its options: none\); "
                                         r"budget is read by policy=ada_kv, h2o, pyramidkv, quest, "
                                         r"r_kv, random, snapkv, tova, triattention$"):
        policy_config("full", budget=128)
    with pytest.raises(ValueError, match=r"policy tova does not read recent_window"):
        policy_config({"name": "tova", "recent_window": 0})
    with pytest.raises(ValueError, match=r"policy snapkv does not read beta"):
        policy_config(policy_config("snapkv"), beta=4)
    # a config of one policy's class named as another (policy.name=h2o with policy=full)
    with pytest.raises(ValueError, match=r"policy\.name=h2o with the options of FullConfig; "
                                         r"expected the options of policy h2o \(H2OConfig\)"):
        policy_config(dataclasses.replace(policy_config("full"), name="h2o"))


def test_not_read_error_lists_the_policy_options_readers_and_hint():
    assert option_names(POLICY_CONFIGS["quest"]) == ["mode", "budget", "top_k_pages", "dense_layers"]
    assert readers_of("heavy_ratio") == ["h2o"]
    assert not_read_error("r_kv", "recent_window").endswith(
        "r_kv's always-kept recent tokens are its observation_window (set "
        "policy.observation_window instead); recent_window is read by policy=h2o, "
        "streaming_llm, triattention")


def test_register_policy_checks_the_name_and_refuses_a_second_class():
    @dataclasses.dataclass
    class OtherConfig(PolicyConfig):
        name: str = "other"

    class Other(EvictionPolicy):
        name = "not_other"

    with pytest.raises(ValueError, match=r"OtherConfig\.name defaults to 'other'; expected the "
                                         r"policy's name 'not_other'"):
        register_policy(OtherConfig)(Other)

    class Second(EvictionPolicy):
        name = "triattention"

    with pytest.raises(ValueError, match=r"policy 'triattention' is already registered "
                                         r"\(policies\.eviction\.TriAttentionPolicy\)"):
        register_policy(TriAttentionConfig)(Second)
    with pytest.raises(ValueError, match="is not a PolicyConfig dataclass"):
        register_policy(dict)
    assert POLICIES["triattention"].__name__ == "TriAttentionPolicy" and "not_other" not in POLICIES


def test_hydra_rejects_an_option_the_chosen_policy_does_not_read():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match=r"Could not override 'policy\.budget'") as e:
        compose_config(["policy=full", "policy.budget=128"])
    assert "Key 'budget' not in 'FullConfig'" in str(e.value.__cause__)
    assert compose_config(["policy=quest", "policy.budget=128"]).policy.budget == 128
