from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder, KVPrefix, init_params
from longjax.models.kv_cache import CacheFullError, KVCache, cache_forward

__all__ = ["ModelConfig", "Decoder", "KVPrefix", "init_params", "KVCache", "CacheFullError",
           "cache_forward"]
