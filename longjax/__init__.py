"""longjax: long-context LLM methods (Activation Beacon, FocusLLM) on frozen decoders in JAX/Flax."""
from longjax.errors import LongjaxError
from longjax.checkpoint import load, load_any, save
from longjax.generate import GenerateOutput, generate
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder, KVPrefix, init_params
from longjax.beacon import BeaconConfig, BeaconLM, load_beacon, save_beacon
from longjax.focus import FocusConfig, FocusLLM, load_focus, save_focus
from longjax.plain import PlainLM

__all__ = ["LongjaxError", "ModelConfig", "Decoder", "KVPrefix", "init_params", "PlainLM", "generate",
           "GenerateOutput", "load", "save", "load_any", "BeaconConfig", "BeaconLM",
           "load_beacon", "save_beacon", "FocusConfig", "FocusLLM", "load_focus", "save_focus"]
