"""Language-model machinery of the LLM arena: one frozen base model shared by the population
(:mod:`base_model`), loaded and checked as data (:mod:`base_loading`), each member's LoRA adapter as plain
tensors (:mod:`adapter`), batched sampling with a KV cache and completion log-probabilities (:mod:`sampling`),
chat templates rendered in a bounded sandbox (:mod:`chat_template`, :mod:`template_bounds`), reward functions
declared in config (:mod:`rewards`), a process's share of a data-parallel step (:mod:`data_parallel`); and the
algorithms that fine-tune the adapters: a member (:mod:`algorithm`, its checkpoint :mod:`checkpoint`, the shared
maths :mod:`learning`), :mod:`grpo` with :mod:`gspo`, :mod:`cispo` and :mod:`reinforce` on its sampling,
:mod:`ppo`, :mod:`dpo`, :mod:`sft`, and :mod:`ilql` (with ``llm_bc``) on the recorded games of :mod:`games`."""
