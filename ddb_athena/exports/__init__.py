"""DynamoDB exports to S3 (boto3 only): one export per daily partition, its files, its record."""
