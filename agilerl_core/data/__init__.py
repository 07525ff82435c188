"""Offline datasets: flat HDF5 and Minari files, local or on S3 (cached by content), loaded into a
replay buffer in bulk; recording new ones from a policy."""
