"""Config files read by path, as train.py's ``--config=configs/x.py`` reads them: a file's
``get_config()`` without importing the ``configs`` folder as a package (the config files sit at
the top of the repository, above every module that reads them)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from longjax.run_config.build import ConfigError


def load_config_file(path) -> "object":
  """``get_config()`` of the config file at ``path`` (an ml_collections ConfigDict)."""
  path = Path(path)
  if not path.is_file():
    raise ConfigError(f"config file {path} does not exist; give a file such as "
                      "configs/tiny_beacon.py")
  spec = importlib.util.spec_from_file_location(f"longjax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
