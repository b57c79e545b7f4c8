"""Messages to the alert topic (the data stack's AlertTopic): a subject within SNS's limit, lines, links to the UI.
A message names jobs, checks and runs, never item data."""

# SNS's limit on a subject.
SUBJECT_LIMIT = 100


def link(dagster_url: str | None, path: str) -> str:
    return f"{dagster_url.rstrip('/')}{path}" if dagster_url else path


def publish(sns, topic_arn: str, subject: str, lines: list[str]) -> None:
    sns.publish(TopicArn=topic_arn, Subject=subject[:SUBJECT_LIMIT], Message="\n".join(lines))
