"""train.py that kills itself: ``python tests/train_killed.py STEP <train.py arguments>`` runs
train.py and SIGKILLs the process once step STEP's metrics record is written and the checkpoints
saved so far are on disk (the kill -9 a resume must survive). The failure is injected here, in
the tests, not by a switch of the trainer.
"""
import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longjax.train import loop  # noqa: E402

KILL_AFTER = int(sys.argv.pop(1))
_checkpointer = []
_judge, _write = loop.Trainer._stop_on_nonfinite_update, loop._StepRecords.write


def _judge_and_keep_the_checkpointer(self, ck, *args, **kwargs):
  _checkpointer[:] = [ck]
  return _judge(self, ck, *args, **kwargs)


def _write_then_die(self, rec, dt):
  _write(self, rec, dt)
  if rec["step"] == KILL_AFTER:
    _checkpointer[0].wait()  # what an interrupted run leaves: the saved checkpoints complete
    os.kill(os.getpid(), signal.SIGKILL)


loop.Trainer._stop_on_nonfinite_update = _judge_and_keep_the_checkpointer
loop._StepRecords.write = _write_then_die
sys.argv[0] = str(ROOT / "train.py")
runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
