"""traces.registry: the trace formats, their options in TraceConfig, and the presets."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from traces import TRACE_FORMATS, TraceConfig
from traces.registry import FORMATS, TraceFormat, option_fields, readers_of, register

PRESETS = Path(__file__).resolve().parents[1] / "experiments" / "conf" / "trace"


def test_trace_config_has_every_formats_options_with_their_defaults():
    """Every registered format's option is a TraceConfig field of the same type and default,
    and TraceConfig has no field that neither the common options nor a format declares."""
    from traces.config import CommonOptions

    have = {f.name: f for f in dataclasses.fields(TraceConfig)}
    declared = set(option_fields(CommonOptions))
    for fmt in FORMATS.values():
        for name, (typ, f) in option_fields(fmt.options).items():
            declared.add(name)
            assert name in have, (fmt.name, name)
            assert have[name].type == typ, (fmt.name, name)
            assert getattr(TraceConfig(), name) == (
                f.default if f.default is not dataclasses.MISSING else f.default_factory())
    assert set(have) == declared
    assert TRACE_FORMATS == tuple(FORMATS)


def test_every_preset_names_a_registered_format_and_only_known_options():
    """Each preset in experiments/conf/trace sets a registered format and TraceConfig fields."""
    names = {f.name for f in dataclasses.fields(TraceConfig)}
    presets = sorted(PRESETS.glob("*.yaml"))
    assert presets
    for p in presets:
        doc = yaml.safe_load(p.read_text())
        assert doc["format"] in FORMATS, p.name
        assert set(doc) <= names, (p.name, set(doc) - names)


def test_a_format_redeclaring_a_shared_option_with_another_default_is_refused():
    """Two formats share one trace.<field>: register refuses a second declaration whose type or
    default differs, naming the field and the other format, and leaves FORMATS unchanged."""

    @dataclasses.dataclass
    class Other:
        num_requests: int = 7

    before = dict(FORMATS)
    with pytest.raises(ValueError, match=r"option num_requests: .* but format '(bench|servegen)'"):
        register(TraceFormat(name="other", options=Other, load=lambda *a: None), "tests.other")
    assert FORMATS == before


def test_a_format_name_registered_by_another_module_or_an_option_without_default_is_refused():
    """A second module cannot take a registered name; every option needs a default."""

    @dataclasses.dataclass
    class NoDefault:
        x: int

    with pytest.raises(ValueError, match="registered by traces.formats.mooncake"):
        register(TraceFormat(name="mooncake", options=FORMATS["mooncake"].options,
                             load=lambda *a: None), "tests.other")
    with pytest.raises(ValueError, match="option x has no default"):
        register(TraceFormat(name="nodefault", options=NoDefault, load=lambda *a: None),
                 "tests.other")
    assert "nodefault" not in FORMATS


def test_readers_of_an_option_are_the_formats_declaring_it():
    """readers_of names the formats whose options declare the field (the recorded-clock
    formats for rebase_to_first_arrival; none for the other common options)."""
    assert readers_of("num_requests") == ["bench", "servegen"]
    assert readers_of("timestamp_spread") == ["mooncake"]
    assert readers_of("max_sessions") == ["claude_code", "openai_log", "weka"]
    assert set(readers_of("rebase_to_first_arrival")) == {"azure", "claude_code", "mooncake",
                                                         "openai_log", "weka"}
    assert readers_of("time_scale") == [] and readers_of("no_such_option") == []
