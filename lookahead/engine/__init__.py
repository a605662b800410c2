"""The engine: requests (sequence), who runs each step (scheduler), the batched loop (engine: schedule ->
plan -> forward -> accept -> commit), and the single-request decoder (generate)."""
