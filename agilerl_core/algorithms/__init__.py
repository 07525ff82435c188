"""RL algorithms on a small shared base: one module per algorithm, its hyperparameter model beside it
(``dqn.py`` and ``dqn_hp.py``), and the registry of their traits. Import the modules you need; this package
imports nothing, so reading the registry never loads torch."""
