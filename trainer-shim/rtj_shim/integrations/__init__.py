"""Framework integrations: checkpoints a framework writes, published through the commit
protocol, and resumed from the newest step that verifies.

- :mod:`rtj_shim.integrations.lightning`: a PyTorch Lightning ``CheckpointIO`` plugin;
- :mod:`rtj_shim.integrations.hf`: a Hugging Face ``Trainer`` callback and resume helper;
- :mod:`rtj_shim.integrations.accelerate`: ``accelerator.save_state``/``load_state`` for a
  Hugging Face Accelerate loop, published and resumed.

Each submodule imports its framework at its top; nothing else in ``rtj_shim`` imports them
(an import-linter contract), so the shim never needs Lightning, ``transformers`` or ``accelerate``.
"""
