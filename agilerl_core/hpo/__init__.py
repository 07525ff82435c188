"""Evolutionary hyperparameter optimisation for any kind of member: the Evolvable protocol, the Evolution
(population, selection, mutation, history, commit, resume), the hyperparameter space as data. Import the
modules you need (``hpo.space`` stays free of torch for the config)."""
