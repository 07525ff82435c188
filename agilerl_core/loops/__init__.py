"""The training loops, one per way of learning, each over a group of members (a member alone is a group of one):
:mod:`on_policy` (own fresh rollouts), :mod:`off_policy` (a shared replay buffer), :mod:`offline` (a fixed
dataset). The arenas build the envs and the data and call them."""
