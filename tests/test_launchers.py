"""Hydra launchers: ``hydra/launcher=local`` is joblib on every core, the cluster launchers'
configs compose with their plugins and name the pip extra without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KVSIM = [sys.executable, "-m", "sim.cli"]


def _kvsim(*args, timeout=300):
    r = subprocess.run([*KVSIM, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"kvsim {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def test_local_launcher_is_joblib_with_all_cores():
    out = _kvsim("hydra/launcher=local", "--cfg", "hydra").stdout
    assert "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher" in out
    assert "n_jobs: -1" in out


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher not installed (pip install -e '.[slurm]')")
    out = _kvsim("hydra/launcher=slurm", "--cfg", "hydra").stdout
    assert "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in out
    assert "cpus_per_task: 1" in out


def test_cluster_launcher_without_its_plugin_names_the_install():
    """hydra/launcher=slurm without hydra-submitit-launcher is exit 2 naming the pip extra
    (likewise ray_cluster), not Hydra's "Could not load"."""
    import importlib.util

    from sim.cli.overrides import LAUNCHER_PLUGINS, missing_launcher_plugin

    for name, (mod, extra) in LAUNCHER_PLUGINS.items():
        try:
            installed = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            installed = False
        err = missing_launcher_plugin(["-m", f"hydra/launcher={name}", "seed=0,1"])
        if installed:
            assert err is None
        else:
            assert f"pip install -e '.[{extra}]'" in err, err
    assert missing_launcher_plugin(["-m", "hydra/launcher=local"]) is None


def test_ray_launcher_config_extends_the_plugins_without_recursion():
    """ray_cluster.yaml extends the plugin's ``ray`` node (a file named ray.yaml with ``defaults:
    [ray]`` would find itself first: Hydra's RecursionError), here a stand-in registered the way
    hydra-ray-launcher registers its own, and sets the resources per run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    from sim.config import register_configs

    register_configs()
    ConfigStore.instance().store(group="hydra/launcher", name="ray", provider="test",
                                 node={"_target_": "stand_in.RayLauncher",
                                       "ray": {"init": {"address": None}, "remote": {}}})
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "experiments" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=ray_cluster"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == "stand_in.RayLauncher"
    assert cfg.hydra.launcher.ray.remote.num_cpus == 1
