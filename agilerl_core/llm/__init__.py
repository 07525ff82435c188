"""Language-model machinery of the LLM arena: one frozen base model shared by the population
(:mod:`base_model`), each member's LoRA adapter as plain tensors (:mod:`adapter`), batched sampling with a
KV cache and completion log-probabilities (:mod:`sampling`), reward functions declared in config
(:mod:`rewards`)."""
