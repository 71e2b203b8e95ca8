"""The ``kvsim`` command line's errors: what Hydra rejects composing the config (misspelt keys,
values of the wrong type, unknown group options, in a single run and in any job of a sweep) and
kvsim's checks before Hydra (keys given twice, unparsable overrides, unresolvable
interpolations, sweep forms Hydra would end with a traceback, Hydra's own settings) are each one
``kvsim: error:`` line (exit 2) naming the argument and what was expected, with no folder made."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import KVSIM, REPO, quiet_config, run_kvsim
from sim.console import hydra_error
from sim.run import MARKER


def composition_error(*overrides):
    """:func:`sim.console.hydra_error` of the exception Hydra raises composing ``overrides``
    (None when they compose)."""
    try:
        quiet_config(*overrides)
    except Exception as e:  # noqa: BLE001 - (the types are Hydra's)
        return hydra_error(e)
    return None


def test_a_misspelt_field_inside_a_list_or_dict_value_is_named():
    """An override whose value is a list of records or a record (``tiers.levels=[{...}]``,
    ``cluster.store={...}``) with a key its schema does not have names that key, its record
    type's fields and the closest one, not the override's own key as unknown."""
    err = composition_error("tiers=gpu_host_cxl_disk", "tiers.levels=[{name:host,gib:64,latency:1}]")
    assert err == ("tiers.levels: unknown key 'latency' in its value: LevelConfig has no field "
                   "'latency'; did you mean latency_s? (fields: name, gib, read_gbps, write_gbps, "
                   "latency_s, replacement)")
    err = composition_error("cluster.store={enabled:true,colour:red}")
    assert err.startswith("cluster.store: unknown key 'colour' in its value: StoreConfig has no "
                          "field 'colour' (fields: enabled, "), err


def test_a_bad_value_inside_a_list_of_records_names_its_entry_and_field():
    """A value of the wrong type inside an override's list of records (``tiers.levels=[{...},
    {...}]``) names the entry and field, ``tiers.levels[i].FIELD=value``, and what was
    expected; an entry that is not a record and a value that is not a list say so."""
    err = composition_error("tiers.levels=[{name:host,gib:1},{name:cxl,gib:1,read_gbps:x}]")
    assert err == "tiers.levels[1].read_gbps=x: expected a number"
    assert composition_error("tiers.levels=[{name:host,gib:abc}]") == \
        "tiers.levels[0].gib=abc: expected a number"
    assert composition_error("tiers.levels=[{name:host,gib:true}]") == \
        "tiers.levels[0].gib=True: expected a number"
    assert composition_error("tiers.levels=[{name:[a],gib:1}]") == \
        "tiers.levels[0].name=['a']: expected a string"
    assert composition_error("tiers.levels=[{name:host,gib:1},5]") == \
        "tiers.levels[1]: expected a LevelConfig record ({field: value, ...})"
    assert composition_error("tiers.levels=x") == "tiers.levels=x: expected a list"


def test_a_true_false_option_takes_only_true_or_false(tmp_path):
    """A boolean option given another value (an integer, yes/no, null where the field takes
    none; any value of a sweep) is refused before Hydra runs, naming the field and saying
    true or false is expected (OmegaConf would run 5 as true); exit 2, one line, no folder."""
    from sim.cli.overrides import non_boolean_override

    assert non_boolean_override(["sim.progress=5"]) == \
        "sim.progress=5: sim.progress is a true/false option; expected true, false or null"
    assert non_boolean_override(["seed=3", "output.write_steps=2"]) == \
        "output.write_steps=2: output.write_steps is a true/false option; expected true or false"
    assert non_boolean_override(["cluster.store.enabled=yes"]).startswith(
        "cluster.store.enabled=yes: cluster.store.enabled is a true/false option")
    assert non_boolean_override(["output.write_steps=null"]).startswith("output.write_steps=null:")
    assert non_boolean_override(["output.write_steps=true,3"]).startswith("output.write_steps=3:")
    assert non_boolean_override(["+compaction.pin_prompt=1"]).startswith("compaction.pin_prompt=1:")
    for ok in ("sim.progress=null", "sim.progress=True", "output.write_steps=false",
               "output.write_steps=true,false", "cluster.store.capacity_gib=5", "seed=1"):
        assert non_boolean_override([ok]) is None, ok
    r = run_kvsim(tmp_path / "r", "output.write_steps=2")
    assert r.returncode == 2 and r.stderr == (
        "kvsim: error: output.write_steps=2: output.write_steps is a true/false option; expected "
        "true or false\n"), r.stderr
    assert not (tmp_path / "r").exists()


def test_kvsims_own_presets_set_true_false_options_to_booleans():
    """Every YAML file of kvsim's configs (``experiments/conf``, Hydra's own settings aside)
    sets each true/false option to a boolean (or null where the field takes it): a run does
    not check them (only a user's config folder, :func:`sim.validation.non_boolean_config_value`)."""
    from omegaconf import OmegaConf

    from sim.config import CONF_DIR
    from sim.validation import non_boolean_file_value

    files = sorted(f for f in CONF_DIR.rglob("*.yaml") if f.relative_to(CONF_DIR).parts[0] != "hydra")
    assert len(files) > 20
    for f in files:
        rel = f.relative_to(CONF_DIR)
        package = ".".join(rel.parts[:-1])  # (a group option's content goes under its group)
        assert non_boolean_file_value(OmegaConf.load(f), package, str(rel)) is None
    assert non_boolean_file_value(OmegaConf.create({"write_steps": "no"}), "output", "x.yaml") == (
        "x.yaml: write_steps: 'no' (str); output.write_steps is a true/false option; expected "
        "true or false (OmegaConf would take it as false)")
    assert non_boolean_file_value(OmegaConf.create({"sim": {"progress": 1}}), "", "c.yaml") == (
        "c.yaml: sim.progress: 1 (int); sim.progress is a true/false option; expected true, "
        "false or null (OmegaConf would take it as true)")


def test_a_true_false_option_from_a_users_config_or_sweeper_params_takes_only_true_or_false(
        tmp_path):
    """A true/false option that a user's config file (``--config-dir``) sets to "yes" or 1,
    which OmegaConf would take as true, is one line naming the file, the key and what was
    expected, exit 2: for a single run before its folder is made; for a sweep's
    ``hydra.sweeper.params`` (a config file's) before the sweep starts; for a sweep's job
    whose group option is such a file, that job fails (marked INCOMPLETE with the line) and the
    others run."""
    conf = tmp_path / "conf"
    (conf / "cache").mkdir(parents=True)
    (conf / "cache" / "mine.yaml").write_text(
        'defaults:\n  - vllm\n  - _self_\nenable_prefix_caching: "yes"\n')
    (conf / "sweep.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n"
        "      output.write_steps: true,1\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    quick = ["trace.max_requests=5", "sim.progress=false", "output.print_summary=false",
             "cluster.replicas=1"]

    def kvsim(*args):
        return subprocess.run([*KVSIM, "--config-dir", str(conf), *args, *quick],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)

    r = kvsim("cache=mine")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == (f"kvsim: error: {conf}/cache/mine.yaml: enable_prefix_caching: 'yes' "
                        f"(str); cache.enable_prefix_caching is a true/false option; expected "
                        f"true or false (OmegaConf would take it as true)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]
    r = kvsim("--config-name", "sweep", "-m", f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1] == ("kvsim: error: output.write_steps=1: output.write_steps "
                                         "is a true/false option; expected true or false")
    assert not (tmp_path / "sw").exists()
    r = kvsim("-m", "cache=vllm,mine", f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"kvsim: sweep job 1 failed: {conf}/cache/mine.yaml: enable_prefix_caching" in r.stderr
    assert (tmp_path / "sw" / "0" / "summary.json").is_file()
    assert (tmp_path / "sw" / "1" / MARKER).read_text().startswith(
        f"this run failed: {conf}/cache/mine.yaml: enable_prefix_caching: 'yes'")


def test_misspelt_override_key_gets_kvsims_error_with_the_near_field():
    """A misspelt key is kvsim's error (exit 2) naming the closest field, not Hydra's hint to
    append it with '+'; a key the config does not have (a free-form "experiment") is refused."""
    err = composition_error("trace.max_request=200")
    assert err == ("unknown config key 'trace.max_request': trace has no field 'max_request'; "
                   "did you mean trace.max_requests? (kvsim --cfg job prints every key)")
    assert "did you mean" not in composition_error("sim.zzz=1")
    assert composition_error("experiment=hit_by_tier") == (
        "unknown config key 'experiment': the config has no field 'experiment' (kvsim --cfg job "
        "prints every key)")
    r = run_kvsim(Path(tempfile.mkdtemp()) / "r", "trace.max_request=200")
    assert r.returncode == 2 and r.stderr.startswith("kvsim: error: unknown config key "
                                                     "'trace.max_request'"), r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_unparsable_overrides_and_bad_sweep_values_get_kvsims_error(tmp_path):
    """Overrides Hydra's grammar rejects (an unquoted '~' or non-ASCII character in a path,
    '16,,32'), a sweep value of the wrong type (in any of choice(), quoted lists, booleans,
    ``++`` keys) and a sweep on 0 joblib workers are each one kvsim error line naming the
    argument, with how to write it, exit 2, before any folder is made; a quoted path, sweeps,
    ranges, lists, interpolations and the options of --cfg, --info and shell completion still
    parse."""
    from sim.cli.overrides import unparsable_override

    err = unparsable_override(["trace.path=~/x.jsonl"])
    assert err.startswith("trace.path=~/x.jsonl: not an override Hydra can parse (")
    assert "needs quotes inside the argument: \"trace.path='~/x.jsonl'\"" in err
    assert "'ü' needs quotes" in unparsable_override(["trace.path=/tmp/ü.jsonl"])
    assert "separated by single commas" in unparsable_override(["cache.block_size=16,,32"])
    assert "0 workers" in unparsable_override(["-m", "hydra.launcher.n_jobs=0"])
    assert unparsable_override(["-m", "trace.path='~/x b ü.jsonl'", "seed=range(1,3)", "a=[1,2]",
                                "trace.path=${oc.env:HOME}/x", "--cfg", "job", "--info",
                                "config", "hydra.launcher.n_jobs=2", "seed=1,2"]) is None
    # every spelling of 0 workers, and only in a sweep; options' values and shell completion's
    # words are not overrides
    for a in ("hydra.launcher.n_jobs=00", "hydra.launcher.n_jobs='0'", "hydra.launcher.n_jobs=-0"):
        assert "0 workers" in unparsable_override([a], sweep=True), a
    assert unparsable_override(["hydra.launcher.n_jobs=0"], sweep=False) is None
    assert "with \\' for a quote" in unparsable_override(["trace.path=~/it's.jsonl"])
    from sim.cli.overrides import command_line_overrides

    assert command_line_overrides(["--config-dir", "/x/cfg=1", "--cfg", "job", "-m", "seed=1,2",
                                   "--info", "config"]) == ["seed=1,2"]
    assert command_line_overrides(["-sc", "install=bash"]) == []
    # a sweep value Hydra cannot compose (in any spelling: a comma list, choice(), range()) or
    # an unknown option in a sweep's list: one line naming the job's override, no sweep folder
    for args, err in (
            (["-m", "trace.max_requests=10,abc"], "trace.max_requests=abc: expected an integer"),
            (["-m", "seed=1,2", "trace.max_requests=choice(20,abc)"],
             "trace.max_requests=abc: expected an integer"),
            (["-m", "cache.block_size=range(1.5,3)"], "cache.block_size=1.5: expected an integer"),
            (["-m", "trace=azure_conv,mooncake_conversaton"],
             "trace=mooncake_conversaton: no option 'mooncake_conversaton' in config group "
             "'trace'; did you mean trace=mooncake_conversation?"),
            (["trace.path=~/x.jsonl"], "trace.path=~/x.jsonl: not an override Hydra can parse"),
            (["-m", "hydra.launcher.n_jobs=0", "seed=1,2"], "hydra.launcher.n_jobs=0: joblib")):
        r = subprocess.run([*KVSIM, *args, f"hydra.sweep.dir={tmp_path / 'sw'}",
                            f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 2, (args, r.stderr[-1500:])
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"kvsim: error: {err}"), (args, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("arg, err", [
    ("seed=abc", "seed=abc: expected an integer"),
    ("tiers.host_gib=lots", "tiers.host_gib=lots: expected a number"),
    ("sim.fast_forward=maybe", "sim.fast_forward=maybe: expected true or false"),
    ("trace.max_requests=1.5", "trace.max_requests=1.5: expected an integer"),
    ("seed=null", "seed=null: expected a value (this key takes no null)"),
    ("trace.max_requests=1_000", None), ("trace.max_requests=null", None),
    ("tiers.host_gib=1e2", None), ("sim.fast_forward=off", None),
    ("seed=${oc.env:X}", None), ("trace.name=abc", None),
])
def test_mistyped_values_get_kvsim_errors(arg, err):
    """A value that cannot be the field's type is one line naming the override and what it
    expected (Hydra's error, :func:`sim.console.hydra_error`); interpolations, null where the
    field takes it and OmegaConf's other number and bool spellings compose."""
    assert composition_error(arg) == err


def test_override_key_given_twice_is_an_error(tmp_path):
    """A key given twice (``tiers=gpu_host tiers=gpu_only``; Hydra would keep the last), ``+``
    prefixes included, is exit 2 with a message naming both and the sweep spelling; distinct
    keys pass. Deleting a kvsim setting (``~seed``) is exit 2 with one line too."""
    from sim.cli.overrides import duplicate_override_key

    err = duplicate_override_key(["trace.max_requests=5", "seed=1", "+seed=2"])
    assert err.startswith("override key 'seed' given twice (seed=1, +seed=2)") and "-m seed=1,2" in err
    assert duplicate_override_key(["seed=1", "~hydra.job", "tiers=gpu_host", "tiers.host_gib=2", "-m"]) is None
    # a kvsim setting deleted with ~
    assert duplicate_override_key(["~seed"]).startswith("cannot delete config key 'seed' (~seed)")
    r = run_kvsim(tmp_path / "d", "~model")
    assert r.returncode == 2 and "cannot delete config key 'model'" in r.stderr and "Traceback" not in r.stderr
    r = run_kvsim(tmp_path / "r", "tiers=gpu_host", "tiers=gpu_only")
    assert r.returncode == 2 and "override key 'tiers' given twice" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()


def test_group_option_from_another_config_folder_is_left_to_hydra(tmp_path):
    """An option that only a --config-dir folder holds is not refused by kvsim's check (which
    reads the command's options as well as its overrides), nor is that folder's path, with '='
    in it, taken for an override."""
    import shutil

    d = tmp_path / "cfg=1" / "trace"
    d.mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "conf" / "trace" / "mooncake_conversation_10min.yaml",
                d / "mine.yaml")
    r = subprocess.run([*KVSIM, "--config-dir", str(tmp_path / "cfg=1"), "trace=mine", "--cfg",
                        "job"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-1500:]
    assert "mooncake_conversation_10min" in r.stdout


def test_unknown_group_option_is_one_line_with_a_hint():
    """An unknown config group option is one line (exit 2) with the closest option and the
    list."""
    assert composition_error("model=qwen3-8b") == (
        "model=qwen3-8b: no option 'qwen3-8b' in config group 'model'; did you mean "
        "model=qwen3_8b? (options: codellama_34b, deepseek_r1, deepseek_v3, gpt_oss_120b, "
        "llama2_7b, llama3_1_70b, llama3_1_8b, llama3_3_70b, qwen3_235b_a22b, qwen3_32b, "
        "qwen3_8b)")
    r = subprocess.run([*KVSIM, "trace=mooncake_conversaton"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("kvsim: error: trace=mooncake_conversaton: no "
                                                     "option"), r.stderr


def test_interpolation_sweep_dir_and_range_errors(tmp_path):
    """An unresolvable interpolation in an override (``cache.block_size=${nope}``) and a sweep
    folder that cannot be created are each one kvsim error line (exit 2), checked before Hydra
    makes a folder; in a sweep, a job whose swept value does not
    resolve is a failed job of the sweep."""
    from omegaconf import OmegaConf

    from sim.cli.overrides import unresolvable_interpolation

    cfg = OmegaConf.create({"a": {"b": "${nope}", "c": "${a.d}", "d": 3}})
    assert unresolvable_interpolation(cfg, ["++a.b=$\\{nope\\}"]).startswith(
        "++a.b=${nope}: cannot resolve the interpolation (Interpolation key 'nope' not found)")
    assert unresolvable_interpolation(OmegaConf.create({"a": {"c": "${a.d}", "d": 3}}), []) is None
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = tmp_path / "run"
    r = subprocess.run([*KVSIM, "cache.block_size=${nope}", f"hydra.run.dir={run}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr[-1500:]
    assert r.stderr.strip() == (
        "kvsim: error: cache.block_size=${nope}: cannot resolve the interpolation (Interpolation "
        "key 'nope' not found); expected a value, or an interpolation of an existing key (kvsim "
        "--cfg job lists them) or environment variable")
    assert not run.exists()  # (checked before Hydra makes the run folder)
    # a sweep's job whose swept value does not resolve is a failed job of the sweep
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "cache.block_size=16,${nope}",
                        f"hydra.sweep.dir={tmp_path / 'sv'}"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert "kvsim: sweep job 1 failed: cache.block_size=${nope}: cannot resolve" in r.stderr
    assert (tmp_path / "sv" / "1" / MARKER).read_text().startswith(
        "this run failed: cache.block_size=${nope}")
    assert (tmp_path / "sv" / "0" / "summary.json").exists()
    import shutil

    shutil.rmtree(tmp_path / "sv")
    (tmp_path / "afile").write_text("x")
    r = subprocess.run([*KVSIM, "-m", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'afile' / 'sw'}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr[-1500:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"kvsim: error: hydra.sweep.dir={tmp_path / 'afile' / 'sw'}: cannot "
                           f"create the sweep folder ({tmp_path / 'afile'} is a file, not a folder)")


def test_folders_hydra_makes_and_sweep_forms(tmp_path):
    """Hydra resolves and creates its run and sweep folders before kvsim's job runs, so kvsim
    checks them first: an unresolvable interpolation in ``output.dir`` / ``hydra.run.dir`` /
    ``hydra.sweep.dir``, a run folder that cannot be created, and a sweep job's ``output.dir``
    under a file are one line each (exit 2). ``range(1,3,0)``, ``range(1,3),5``, an empty
    range and a sweep value without ``-m`` are refused as well, and the duplicate-key message
    offers no invalid spelling."""
    from sim.cli.overrides import duplicate_override_key, unparsable_override

    assert "range() arg 3 must not be zero" in unparsable_override(["seed=range(1,3,0)"])
    for a in ("seed=range(5,1)", "seed=range(0,0)", "seed=range(1,2,-1)"):
        assert "the range has no values" in unparsable_override([a]), a
    assert "comma list cannot hold range()" in unparsable_override(["seed=range(1,3),5"])
    assert "runs with kvsim -m" in unparsable_override(["seed=1,2"], sweep=False)
    assert "runs with kvsim -m" in unparsable_override(["seed=range(1,3)"], sweep=False)
    assert unparsable_override(["seed=range(5,1,-1)", "seed=choice(1,2)", "gpu=glob(h*)",
                                "seed=1,2"], sweep=True) is None
    assert unparsable_override(["seed=3", "trace.path='a,b'"], sweep=False) is None
    err = duplicate_override_key(["seed=range(1,3)", "seed=5"])
    assert err == ("override key 'seed' given twice (seed=range(1,3), seed=5); expected one "
                   "value per key")
    (tmp_path / "afile").write_text("x")
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*args):
        r = subprocess.run([*KVSIM, *args], capture_output=True, text=True, cwd=tmp_path,
                           timeout=180, env=env)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        return r.stderr

    env.pop("KVSIM_NOT_SET", None)
    err = kvsim("output.dir=${oc.env:KVSIM_NOT_SET}")
    assert err.strip().splitlines() == [
        "kvsim: error: output.dir=${oc.env:KVSIM_NOT_SET}: cannot resolve the interpolation "
        "(KeyError raised while resolving interpolation: \"Environment variable 'KVSIM_NOT_SET' "
        "not found\"); expected a value, or an interpolation of an existing key (kvsim --cfg job "
        "lists them) or environment variable"]
    assert "kvsim: error: hydra.run.dir=${nope}: cannot resolve" in kvsim("hydra.run.dir=${nope}")
    sub = tmp_path / "afile" / "sub"
    assert kvsim(f"hydra.run.dir={sub}").strip() == (
        f"kvsim: error: hydra.run.dir={sub}: cannot create the run folder ({tmp_path / 'afile'} "
        f"is a file, not a folder); expected a folder kvsim can create and write")
    assert "hydra.sweep.dir=${nope}: cannot resolve" in kvsim("-m", "seed=1,2", "hydra.sweep.dir=${nope}")
    err = kvsim("-m", "trace.max_requests=20", f"output.dir={sub}", "seed=1,2",
                f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert f"kvsim: sweep job 1 failed: output.dir={sub}: {tmp_path / 'afile'} is a file" in err
    assert "2 sweep job(s) failed" in err
    assert kvsim("-m", "seed=range(5,1)", f"hydra.sweep.dir={tmp_path / 'sw2'}").count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "sw"]


@pytest.mark.slow
def test_hydra_mode_keys_and_sweep_functions_run_or_fail_in_one_line(tmp_path):
    """``hydra.mode=MULTIRUN`` runs a sweep as ``-m`` does; an unresolvable interpolation in any
    other Hydra key (``hydra.job.name``), a ``hydra.output_subdir`` that cannot be made,
    ``interval()`` under the basic sweeper, ``-m --cfg job`` and a ``glob()`` matching nothing
    are one line each (exit 2); ``hydra.job.chdir=true`` jobs are counted as the sweep's; an
    ``output.dir`` leading back to itself through ``hydra:job.override_dirname`` is named with
    the key that leaves it out."""
    from sim.cli.overrides import unparsable_override

    assert "interval() is sampled by a sampling sweeper" in unparsable_override(["seed=interval(1,2)"])
    assert unparsable_override(["seed=interval(1,2)", "hydra/sweeper=optuna"]) is None
    assert "step not 0" in unparsable_override(["seed=range(0.5,2.0,0.0)"])
    assert unparsable_override(["seed=1,2"], sweep=False, single=False) is None  # (--cfg job)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*args, rc=2):
        r = subprocess.run([*KVSIM, *args, "trace.max_requests=20"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=180, env=env)
        assert r.returncode == rc, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        return r.stderr

    err = kvsim("hydra.mode=MULTIRUN", "seed=1,2", "hydra.sweep.dir=mr", rc=0)
    assert "kvsim: sweep done: 2 job(s)" in err
    err = kvsim("-m", "seed=1,2", "hydra.job.chdir=true", "hydra.sweep.dir=cd", rc=0)
    assert "kvsim: sweep done: 2 job(s)" in err
    assert kvsim("hydra.job.name=${nope}").strip().startswith(
        "kvsim: error: hydra.job.name=${nope}: cannot resolve the interpolation")
    err = kvsim(f"output.dir={tmp_path / 'o'}/${{hydra:job.override_dirname}}")
    assert "exclude_keys=[output.dir] leaves it out" in err
    assert "cannot create the folder of Hydra's record" in kvsim("hydra.output_subdir=/proc/x")
    assert "-m runs a sweep and --cfg prints" in kvsim("-m", "--cfg", "job", "seed=1,2")
    err = kvsim("-m", "gpu=glob(zzz*)", "hydra.sweep.dir=g")
    assert "ran no job: a swept key has no values" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cd", "g", "mr"]


@pytest.mark.slow
def test_sweep_checks_make_no_folders_and_count_jobs_elsewhere(tmp_path):
    """The sweep-level checks create no folder (a per-job ``output.dir`` leaves only the jobs'
    folders), and a sweep whose ``hydra.sweep.subdir`` puts the jobs outside the sweep folder
    counts them."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "output.dir=results/${hydra:job.num}",
                        "seed=1,2", "hydra.sweep.dir=sw"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["0", "1"]
    out = tmp_path / "elsewhere"
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "seed=1,2", "hydra.sweep.dir=sw2",
                        f"hydra.sweep.subdir={out}/${{hydra.job.num}}"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kvsim: sweep done into" in r.stderr and "ran no job" not in r.stderr
    assert all((out / j / "summary.json").exists() for j in ("0", "1"))


def test_arguments_hydra_cannot_read_as_overrides_are_one_line(tmp_path):
    """An argument without '=' (``trace.max_requests 200``) and a config group given a number,
    a boolean or null (also as a sweep's value) are one kvsim error line naming the argument
    and what was expected, exit 2, before any folder is made."""
    for args, err in (
            (["trace.max_requests", "200"], "trace.max_requests: not an override Hydra can parse "
                                            "(it has no '='); expected KEY=VALUE"),
            (["policy=5"], "policy=5: a config group takes an option's name, not a number"),
            (["model=null"], "model=null: a config group takes an option's name, not null"),
            (["gpu=true"], "gpu=true: a config group takes an option's name, not true/false"),
            (["-m", "policy=full,5"], "policy=full,5: a config group takes an option's name")):
        r = subprocess.run([*KVSIM, *args, f"hydra.sweep.dir={tmp_path / 'sw'}",
                            f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 2, (args, r.stderr[-1500:])
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"kvsim: error: {err}"), (args, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
