"""Policy configs and the registry: validation messages, presets composing to exactly the
options their policy reads, the policy group's schema, and registering a policy."""

from __future__ import annotations

import pytest

from policies import (CompactionConfig, ImportanceModel, ImportanceParams, PolicyConfig, make_compactor,
                      make_policy)

B = 16


# ------------------------------------------------------------------------- config validation
def test_config_validation_messages():
    with pytest.raises(ValueError, match="valid: .*triattention"):
        make_policy(PolicyConfig(name="nope"))
    with pytest.raises(ValueError, match="beta"):
        make_policy(PolicyConfig(name="triattention", beta=0))
    with pytest.raises(ValueError, match="unknown mode 'weird'"):
        make_policy(PolicyConfig(name="triattention", mode="weird"))
    with pytest.raises(ValueError, match="valid: none, forward_pack, hole_fill"):
        make_compactor(CompactionConfig(name="squash"))
    with pytest.raises(ValueError, match="head_correlation"):
        ImportanceModel(ImportanceParams(head_correlation=1.5))
    # the random policy's seed is an integer in [0, 2**32); r_kv does not read recent_window
    for bad in (-1, 2 ** 32, 1.5):
        with pytest.raises(ValueError, match=r"policy random: seed must be an integer in \[0, 2\*\*32\)"):
            make_policy(PolicyConfig(name="random", seed=bad))
    make_policy(PolicyConfig(name="random", seed=2 ** 32 - 1))
    with pytest.raises(ValueError, match=r"policy\.recent_window=100: policy r_kv does not read "
                                         r"recent_window .*its observation_window"):
        make_policy(PolicyConfig(name="r_kv", recent_window=100))


# ------------------------------------------------------------------------- policy registry
def test_every_preset_composes_to_exactly_the_options_its_policy_reads():
    """Each preset of experiments/conf/policy is a registered policy; composed, its node holds a
    value for every option of the policy's options class (the preset's, or the class default
    through /policy_defaults) and None for every other policy's, so ``kvsim --cfg job policy=X``
    shows what X reads; the node builds X with its options class."""
    from omegaconf import OmegaConf

    from policies import POLICIES, POLICY_CONFIGS
    from policies.registry import option_names, unread_options
    from sim.config import CONF_DIR
    from sim.run import compose_config

    presets = sorted(p.stem for p in (CONF_DIR / "policy").glob("*.yaml"))
    assert presets == sorted(POLICIES) == sorted(POLICY_CONFIGS)
    for name in presets:
        node = compose_config([f"policy={name}"]).policy
        d = OmegaConf.to_container(node)
        set_keys = {k for k, v in d.items() if v is not None and not (
            isinstance(v, dict) and all(x is None for x in v.values()))}
        assert set_keys == {"name", *option_names(POLICY_CONFIGS[name])}, name
        if "importance" in set_keys:
            assert None not in d["importance"].values()
        assert unread_options(node) == []
        pol = make_policy(node)
        assert type(pol) is POLICIES[name] and type(pol.cfg) is POLICY_CONFIGS[name]


def test_group_schema_holds_every_registered_option_unset():
    """PolicyConfig, the policy group's schema, is derived from the registered options classes:
    ``name`` (default full) and each option of any policy, None by default; two policies that
    declare one option with different types are refused."""
    import dataclasses

    from policies import POLICY_CONFIGS
    from policies.config import PolicyOptions
    from policies.config import group_schema, option_names

    fields = {f.name: f for f in dataclasses.fields(PolicyConfig)}
    assert set(fields) == {"name"} | {o for c in POLICY_CONFIGS.values() for o in option_names(c)}
    blank = PolicyConfig()
    assert blank.name == "full" and blank.budget is None and blank.importance.sigma is None
    assert "heavy_ratio: read by policy=h2o\n" in PolicyConfig.__doc__

    @dataclasses.dataclass
    class A(PolicyOptions):
        name: str = "a"
        budget: int = 1

    @dataclasses.dataclass
    class B(PolicyOptions):
        name: str = "b"
        budget: float = 1.0

    assert [f.name for f in dataclasses.fields(group_schema({"a": A}))] == ["name", "budget"]
    with pytest.raises(ValueError, match=r"policy option budget: A declares it <class 'int'>, B "
                                         r"<class 'float'>; expected one type per option name"):
        group_schema({"a": A, "b": B})


def test_the_policy_groups_schema_imports_no_numba():
    """The config schema that types the policy group (PolicyConfig, derived from the options
    classes in the policy modules) imports every policy module but not numba: the policy
    modules' kernels wait for their first call (sim.jit), so composing a config does not."""
    import subprocess
    import sys

    code = ("import sys, sim.config, policies.config; "
            "print(sorted(m for m in ('numba', 'policies.triattention', 'policies.registry') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "['policies.registry', 'policies.triattention']", r.stdout


def test_policy_config_by_name_mapping_schema_and_node_gives_the_same_options():
    """policy_config builds the chosen policy's options class from a name and fields, a mapping,
    a PolicyConfig or Hydra's node (None there: not set, the class default applies)."""
    from policies import policy_config
    from policies.h2o import H2OConfig
    from sim.run import compose_config

    by_name = policy_config("h2o", budget=100, heavy_ratio=0.25)
    assert by_name == H2OConfig(budget=100, heavy_ratio=0.25)
    assert policy_config({"name": "h2o", "budget": 100, "heavy_ratio": 0.25}) == by_name
    assert policy_config(PolicyConfig(name="h2o", budget=100, heavy_ratio=0.25)) == by_name
    node = compose_config(["policy=h2o", "policy.budget=100", "policy.heavy_ratio=0.25",
                           "policy.beta=128", "policy.mode=", "policy.protect_prompt=true"]).policy
    assert policy_config(node) == by_name
    assert policy_config(by_name) is by_name
    assert policy_config(by_name, budget=7).budget == 7 and by_name.budget == 100
    imp = policy_config({"name": "snapkv", "importance": {"sigma": 0.5}}).importance
    assert imp.sigma == 0.5 and imp.drift == 0.3
    assert policy_config() == policy_config("full")


def test_policy_config_rejects_an_unknown_name_and_an_option_the_policy_does_not_read():
    """An unknown name lists the valid ones; an option the policy does not read names the
    option and its value, the policy's options, a hint where the class has one, and the
    policies that read it."""
    import dataclasses

    from policies import POLICY_CONFIGS, policy_config
    from policies.registry import option_names, readers_of, unread_options

    with pytest.raises(ValueError, match=r"unknown policy 'nope'; valid: ada_kv, full, h2o, "):
        policy_config("nope")
    with pytest.raises(ValueError, match=r"^policy\.budget=128: policy full does not read budget "
                                         r"\(its options: none\); budget is read by policy=ada_kv, "
                                         r"h2o, pyramidkv, quest, r_kv, random, snapkv, tova, "
                                         r"triattention$"):
        policy_config("full", budget=128)
    with pytest.raises(ValueError, match=r"policy\.recent_window=0: policy tova does not read"):
        policy_config({"name": "tova", "recent_window": 0})
    with pytest.raises(ValueError, match=r"policy\.importance\.sigma=2\.0: policy quest does not "
                                         r"read importance"):
        policy_config(PolicyConfig(name="quest", importance={"sigma": 2.0}))
    with pytest.raises(ValueError, match=r"policy snapkv does not read beta"):
        policy_config(policy_config("snapkv"), beta=4)
    with pytest.raises(ValueError, match=r"policy\.name=h2o with the options of FullConfig"):
        policy_config(dataclasses.replace(policy_config("full"), name="h2o"))
    assert unread_options(PolicyConfig(name="quest", budget=5, beta=3, importance={"drift": 0.1})
                          ) == [("beta", 3), ("importance.drift", 0.1)]
    assert option_names(POLICY_CONFIGS["quest"]) == ["mode", "budget", "top_k_pages", "dense_layers"]
    assert readers_of("heavy_ratio") == ["h2o"]


def test_register_policy_checks_the_name_and_refuses_a_second_class():
    """register_policy links a policy class to the options class registered under its name; a
    name that differs, options not registered, or a second class under one name are refused."""
    import dataclasses

    from policies import POLICIES, TriAttentionConfig, register_policy
    from policies.config import PolicyOptions
    from policies.eviction import EvictionPolicy

    @dataclasses.dataclass
    class OtherConfig(PolicyOptions):
        name: str = "other"

    class Other(EvictionPolicy):
        name = "not_other"

    with pytest.raises(ValueError, match=r"OtherConfig\.name defaults to 'other'; expected the "
                                         r"policy's name 'not_other'"):
        register_policy(OtherConfig)(Other)

    class Second(EvictionPolicy):
        name = "triattention"

    with pytest.raises(ValueError, match=r"policy 'triattention' is already registered "
                                         r"\(policies\.triattention\.TriAttentionPolicy\)"):
        register_policy(TriAttentionConfig)(Second)
    with pytest.raises(ValueError, match="is not a PolicyOptions dataclass"):
        register_policy(dict)

    class Other2(EvictionPolicy):
        name = "other"

    with pytest.raises(ValueError, match=r"OtherConfig is not registered as the options of policy "
                                         r"'other'; expected @register_options on it"):
        register_policy(OtherConfig)(Other2)
    assert POLICIES["triattention"].__name__ == "TriAttentionPolicy"
    assert "not_other" not in POLICIES and "other" not in POLICIES
