"""The environment as a Hugging Face Space: a self-contained folder built from this checkout
(``build.py``), and OpenEnv's own validator run on it with its runtime checks executed, in a local
process where no Docker engine runs (``validation.py``)."""

from openenv_harness.space.build import SpaceBuildError, build_space, space_sources
from openenv_harness.space.dockerfile import Instruction, copied_sources, final_stage, image_env, parse_dockerfile

__all__ = ["Instruction", "SpaceBuildError", "build_space", "copied_sources", "final_stage", "image_env",
           "parse_dockerfile", "space_sources"]
