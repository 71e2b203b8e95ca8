"""Hydra configs (``experiments/conf``), named experiments and sweep tools."""
