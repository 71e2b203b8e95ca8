"""Hydra config tree of kvsim (a package so Hydra finds it installed or editable)."""
