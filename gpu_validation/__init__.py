"""GPU validation for kvsim: a paged KV pool on a real GPU, Triton kernels for the
operations the simulator costs (compaction mover, NVFP4 / FP8 cold-page codecs fused with
the host copy), plain torch references, benchmarks that write a per-device calibration
file, and a replay that compares measured against predicted time.

Importing this package imports nothing heavy. ``gpu_validation.calibration_model`` needs
only numpy and the standard library; ``pool``, ``kernels``, ``reference``, ``calibrate`` and
``validate`` need torch and triton (and a GPU for ``calibrate`` / ``validate``).
"""

__all__ = ["calibration_model"]
