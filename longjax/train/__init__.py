"""Training: tasks (beacon / FocusLLM / plain LM), mesh + sharding rules, optimizer, orbax
checkpoints with resume, metrics, the loop (``longjax.train.loop.Trainer``)."""
