"""Keep Amazon DynamoDB tables queryable in Amazon Athena through Apache Iceberg."""
