"""longjax: long-context LLM methods (Activation Beacon, FocusLLM) on frozen decoders in
JAX/Flax."""
import logging as _logging


class _NoTorchNotice(_logging.Filter):
  """Drops transformers' import-time "PyTorch was not found. Models won't be available" advice:
  longjax uses transformers for tokenizers and configs only, so on a machine without torch (the
  runtime requirements have none) that line is noise at the top of every entry point. Installed
  here, before any longjax module imports transformers, so no script needs its own switch; every
  other transformers message is left alone."""

  def filter(self, record):
    return "PyTorch was not found" not in record.getMessage()


_logging.getLogger("transformers").addFilter(_NoTorchNotice())

from longjax.errors import LongjaxError  # noqa: E402
from longjax.ckpts.checkpoint import load, load_any, save  # noqa: E402
from longjax.inference.generate import GenerateOutput, generate  # noqa: E402
from longjax.models.config import ModelConfig  # noqa: E402
from longjax.models.decoder import Decoder, KVPrefix, init_params  # noqa: E402
from longjax.beacon import BeaconConfig, BeaconLM, load_beacon, save_beacon  # noqa: E402
from longjax.focus import FocusConfig, FocusLLM, load_focus, save_focus  # noqa: E402
from longjax.plain import PlainLM  # noqa: E402

__all__ = ["LongjaxError", "ModelConfig", "Decoder", "KVPrefix", "init_params", "PlainLM",
           "generate", "GenerateOutput", "load", "save", "load_any", "BeaconConfig", "BeaconLM",
           "load_beacon", "save_beacon", "FocusConfig", "FocusLLM", "load_focus", "save_focus"]
