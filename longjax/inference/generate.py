"""One sampling loop for every method (plain LM, Activation Beacon, FocusLLM); the input checks
it shares with the methods are in ``longjax.models.inputs``.

A *method* is any object implementing the protocol of ``longjax.models.protocol`` (``cfg``,
``prefill``, ``step``, optionally ``device_plan``). ``generate`` handles prompts (ids or text),
batching, sampling, stop ids and streaming once for all of them.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers
import time
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from longjax.inference import decode_loop
from longjax.inference.sampling import SamplingConfig, select_next
# the checks every method shares live below the methods; generate re-exports them for its callers
from longjax.models.inputs import (GenerateError, TokenIdError, check_integer_ids,  # noqa: F401
                                   check_kv_fits, check_max_new_tokens, check_params,
                                   check_stop_ids, check_token_ids, host_memory_bytes,
                                   memory_limit_bytes)
from longjax.runtime.rounding import round_up


@dataclasses.dataclass
class GenerateOutput:
  tokens: list  # per prompt: generated ids (up to and including a stop id)
  logits: Optional[list] = None  # per prompt: [n_generated, V] float32 (return_logits=True)
  # per prompt: the decoded tokens (a final stop id left out), when a tokenizer was given
  text: Optional[list] = None
  # The method's state after the last fed token (the last generated token is not fed back):
  # lets a method continue from it (e.g. BeaconLM.resume for multi-turn).
  state: object = None
  # Wall-clock seconds of this call (see ``Timings``).
  timings: Optional["Timings"] = None


@dataclasses.dataclass(frozen=True)
class Timings:
  """Where a ``generate`` call spent its time. Prefill and decode include any compilation they
  triggered; ``compile_s`` is the part of both that JAX spent tracing, lowering and compiling
  (or loading from the persistent cache), as JAX's monitoring events report it."""
  prefill_s: float  # the prompt (to its first next-token logits)
  decode_s: float  # the generated tokens after the first
  decode_steps: int  # tokens fed back to the model (generated tokens - 1, per row)
  compile_s: float

  @property
  def decode_tokens_per_s(self) -> Optional[float]:
    """Decode steps per second of the whole batch (a step advances every row)."""
    return self.decode_steps / self.decode_s if self.decode_steps and self.decode_s > 0 else None

  def summary(self) -> str:
    rate = self.decode_tokens_per_s
    return (f"prefill {self.prefill_s:.2f}s, decode {self.decode_s:.2f}s"
            + (f" ({rate:.1f} steps/s)" if rate else "")
            + f", of which compiling {self.compile_s:.2f}s")


class _CompileClock:
  """Seconds JAX has spent compiling in this process: a listener on its monitoring events,
  registered on first use."""
  EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
            "/jax/core/compile/jaxpr_to_mlir_module_duration",
            "/jax/core/compile/backend_compile_duration")
  total = 0.0
  _registered = False

  @classmethod
  def now(cls) -> float:
    if not cls._registered:
      jax.monitoring.register_event_duration_secs_listener(cls._listen)
      cls._registered = True
    return cls.total

  @classmethod
  def _listen(cls, event, duration, **_):
    if event in cls.EVENTS:
      cls.total += float(duration)


def check_logits_fit(rows: int, max_new_tokens: int, vocab_size: int) -> None:
  """Host side, before the prefill: ``return_logits=True`` keeps a ``[rows, max_new_tokens, V]``
  float32 buffer (on device, then on the host), which must fit both."""
  steps = round_up(max_new_tokens, decode_loop.BUFFER_MULTIPLE)  # the device loop's buffer length
  need = rows * steps * vocab_size * np.dtype(np.float32).itemsize
  have = min(memory_limit_bytes(), host_memory_bytes())
  if need > have:
    raise GenerateError(f"return_logits=True with max_new_tokens={max_new_tokens} needs a "
                        f"[{rows}, {steps}, {vocab_size}] float32 logits buffer "
                        f"({need / 2**30:.1f} GiB), more than this machine holds "
                        f"({have / 2**30:.1f} GiB): lower max_new_tokens or the batch, or drop "
                        "return_logits")


def check_seed(seed) -> int:
  """``seed`` as an int: an integer that fits 64 bits (JAX's own errors for 1.5, 2**70 or "a" are
  a TypeError / OverflowError from inside the key derivation)."""
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or not (
      -2**63 <= int(seed) < 2**63):
    raise GenerateError(f"seed must be an integer in [-2**63, 2**63), got "
                        f"{type(seed).__name__} {seed!r}")
  return int(seed)


def _as_id_lists(prompts, tokenizer) -> list:
  if hasattr(prompts, "keys") and "input_ids" in prompts:
    # a tokenizer's output (transformers 5 apply_chat_template returns a BatchEncoding)
    prompts = prompts["input_ids"]
  if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                  and isinstance(prompts[0], str)):
    if tokenizer is None:
      raise GenerateError("text prompts need tokenizer=...; or pass token ids")
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    return [np.asarray(tokenizer.encode(t), np.int64) for t in texts]
  # Rows stay arrays of the caller's dtype, so that check_token_ids sees float ids as floats.
  if isinstance(prompts, (list, tuple)) and prompts and isinstance(
      prompts[0], (list, tuple, np.ndarray, jax.Array)):
    rows = [np.asarray(r) for r in prompts]
  else:
    arr = np.asarray(prompts)
    rows = list(arr) if arr.ndim == 2 else [arr]
  shapes = sorted({r.shape for r in rows if r.ndim != 1})
  if shapes:
    raise GenerateError(f"prompts must be a list of ids, a list of id lists or a [B, T] array; got "
                        f"rows of shape {shapes}")
  return rows


def generate(method, params, prompts, max_new_tokens: int = 32, *, tokenizer=None,
             temperature: float = 0.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             seed: int = 0, stop_ids: Sequence[int] = (), return_logits: bool = False,
             callback: Optional[Callable[[int, np.ndarray], None]] = None,
             loop: str = "auto", chunk: Optional[int] = None) -> GenerateOutput:
  """Generate continuations of one prompt or a batch of prompts of different lengths.

  Args:
    method: ``PlainLM``, a beacon model or a FocusLLM model (see module docstring).
    prompts: text (with ``tokenizer``), a list of ids, or a list of id lists / a 2-D array.
    temperature / top_k / top_p / seed: sampling; ``temperature=0`` is greedy. A temperature or
      top_p below ``longjax.inference.sampling.MIN_TEMPERATURE`` / ``MIN_TOP_P`` (1e-6; 0 excepted)
      is refused: it means greedy, but would overflow / round to 0 in float32. ``seed``: an integer
      that fits 64 bits.
    return_logits: also return every step's logits; their ``[B, max_new_tokens, V]`` float32
      buffer is size-checked before the prefill, as the KV cache is.
    stop_ids: a row stops after emitting any of these ids (the stop id is kept in the output).
    callback: called as ``callback(step, tokens [B])`` for each generated token (streaming; on
      the device loop, after each chunk of ``chunk`` tokens).
    loop: ``"device"``: the decode loop runs on device (one ``lax.while_loop``: sampling, stop
      ids, the method's step); ``"host"``: one jitted step per token from Python, sampled on the
      host (the reference); ``"auto"``: device when the method has ``device_plan``.
    chunk: device loop only: return to the host every ``chunk`` tokens (streaming granularity);
      default: only where the method switches programs, or every 8 tokens with a ``callback``.
  Both loops give the same tokens for the same seed (greedy or sampled; logits can differ in the
  last float bits where a method's device plan runs a larger memory bucket than its host step).
  """
  sampling = SamplingConfig(temperature, top_k, top_p)
  check_max_new_tokens(max_new_tokens)
  seed = check_seed(seed)
  use_device = _choose_loop(method, loop)
  chunk = _check_chunk(chunk, use_device, callback)
  ids = _as_id_lists(prompts, tokenizer)
  empty = [i for i, r in enumerate(ids) if not r.size]
  if not ids or empty:
    raise GenerateError(f"empty prompt (rows {empty or [0]}): give at least one token per prompt")
  # Checked before the int32 cast below, which would wrap ids >= 2**31 into range.
  check_token_ids(ids, method.cfg.vocab_size)
  check_params(params, method.cfg)
  check_stop_ids(stop_ids, method.cfg.vocab_size)  # before the (slow) prefill
  if return_logits:
    check_logits_fit(len(ids), max_new_tokens, method.cfg.vocab_size)
  lengths = np.array([len(r) for r in ids], np.int32)
  tokens = np.zeros((len(ids), int(lengths.max())), np.int32)
  for i, r in enumerate(ids):
    tokens[i, :len(r)] = r

  compile0, t0 = _CompileClock.now(), time.perf_counter()
  logits, state = method.prefill(params, tokens, lengths, max_new_tokens)
  logits = jax.block_until_ready(logits)
  t1 = time.perf_counter()
  key = jax.random.PRNGKey(seed)
  stops = check_stop_ids(stop_ids, method.cfg.vocab_size)
  if use_device:
    plan = method.device_plan(state, max_new_tokens - 1)
    samples, lg, state = decode_loop.run(plan, params, logits, max_new_tokens, sampling, key,
                                         stops.tolist(), return_logits=return_logits,
                                         callback=callback, chunk=chunk)
    out = list(samples.T)
    out_logits = None if lg is None else list(lg.transpose(1, 0, 2))
    return _output(out, out_logits, state, tokenizer, stops, t0, t1, compile0)
  out, out_logits = [], []
  done = np.zeros(len(ids), bool)
  select = _selector(sampling)
  for t in range(max_new_tokens):
    nxt = np.asarray(select(logits, jax.random.fold_in(key, t)))
    out.append(np.where(done, -1, nxt))
    if return_logits:
      out_logits.append(np.asarray(logits))
    if callback is not None:
      callback(t, nxt)
    done |= np.isin(nxt, stops)
    if done.all() or t == max_new_tokens - 1:
      break
    logits, state = method.step(params, state, nxt)
  return _output(out, out_logits if return_logits else None, state, tokenizer, stops, t0, t1,
                 compile0)


def _output(out, out_logits, state, tokenizer, stops, t0, t1, compile0) -> GenerateOutput:
  """``out``: per step the ``[B]`` samples (-1 or any value after a row's stop id); ``stops``:
  the checked stop ids."""
  timings = Timings(prefill_s=t1 - t0, decode_s=time.perf_counter() - t1,
                    decode_steps=len(out) - 1, compile_s=_CompileClock.now() - compile0)
  stops = set(int(x) for x in stops)
  rows = []
  for row in np.stack(out, axis=1):
    kept = []
    for x in row:  # up to and including the first stop id
      kept.append(int(x))
      if kept[-1] in stops:
        break
    rows.append(kept)
  result = GenerateOutput(tokens=rows, state=state, timings=timings)
  if out_logits is not None:
    lg = np.stack(out_logits, axis=1)
    result.logits = [lg[i, :len(r)] for i, r in enumerate(rows)]
  if tokenizer is not None:  # the stop id ends the answer; it is not part of its text
    result.text = [tokenizer.decode(r[:-1] if r and r[-1] in stops else r) for r in rows]
  return result


LOOPS = ("auto", "device", "host")


def _choose_loop(method, loop) -> bool:
  """True: run the device loop."""
  if loop not in LOOPS:
    raise GenerateError(f"loop must be one of {LOOPS}, got {loop!r}")
  has = callable(getattr(method, "device_plan", None))
  if loop == "device" and not has:
    raise GenerateError(f"loop='device' needs a method with device_plan(state, n_feeds); "
                        f"{type(method).__name__} has none: pass loop='host' (or 'auto')")
  return has if loop == "auto" else loop == "device"


def _check_chunk(chunk, use_device: bool, callback) -> Optional[int]:
  if chunk is None:
    return 8 if (use_device and callback is not None) else None
  if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
    raise GenerateError(f"chunk must be an integer >= 1 (tokens per device call), got {chunk!r}")
  if not use_device:
    raise GenerateError("chunk applies to the device loop only: drop it, or pass loop='device'")
  return int(chunk)


@functools.lru_cache(maxsize=16)
def _selector(sampling: SamplingConfig):
  return jax.jit(lambda logits, key: select_next(logits, key, sampling))
