"""The real local stack on loopback: Prefect server and worker, MLflow server, SeaweedFS S3."""
