"""Capture of DynamoDB changes into change files in S3 (boto3 only, no Spark, no Dagster)."""
