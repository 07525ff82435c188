"""Evolutionary hyperparameter optimisation: space, selection, mutation, population."""

from agilerl_core.hpo.mutation import MUTATION_KINDS, Mutations
from agilerl_core.hpo.population import LineageEvent, Member, Population
from agilerl_core.hpo.space import HyperparameterSpace, HyperparameterSpec, merge_space
from agilerl_core.hpo.tournament import TournamentSelection, elite_index

__all__ = ["MUTATION_KINDS", "HyperparameterSpace", "HyperparameterSpec", "LineageEvent", "Member",
           "Mutations", "Population", "TournamentSelection", "elite_index", "merge_space"]
