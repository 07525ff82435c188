"""Issue 2's learning target (DQN on CartPole-v1: 475 within 150,000 global env steps, seeds 0, 1, 2),
now one entry of learning_targets.py:

    python benchmarks/cartpole_dqn.py [--seeds 0 1 2]
"""

import sys

from learning_targets import main

if __name__ == "__main__":
    sys.argv[1:1] = ["--only", "dqn-cartpole"]
    main()
