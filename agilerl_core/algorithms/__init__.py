"""The RL algorithm families on a small shared base (:mod:`base`: a member; :mod:`group`: K members learning in
one call), a package per family (``dqn/``, ``actor_critic/``, ``ppo/``, ``maddpg/``) or a module (``cql``, ``bc``,
``ippo``, ``neural_bandit``), every family's hyperparameter model (``hyperparameters/``, which the config reads
without torch) and the registry of their traits. The LLM algorithms live in :mod:`agilerl_core.llm`, the language
games' in :mod:`agilerl_core.language`. Import the modules you need; this package imports nothing, so reading the
registry never loads torch."""
