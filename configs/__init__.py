"""Training / evaluation configs (ml_collections ``get_config()`` files, loaded by path by
train.py and eval.py). A regular package, so that ``from configs import common`` in a config finds
this directory (train.py and eval.py put the repository root first on ``sys.path``) and never
another installed ``configs``."""
