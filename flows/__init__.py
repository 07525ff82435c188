"""Prefect flows: one generation = one DAG of tasks; a flow = generations."""
