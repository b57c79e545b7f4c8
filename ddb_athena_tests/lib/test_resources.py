"""lib/resources.py: the AWS clients a run builds."""

import threading

import boto3

from ddb_athena.lib.resources import AwsClientsResource

KEYS = {"region_name": "us-east-1", "endpoint_url": "http://127.0.0.1:9", "aws_access_key_id": "a", "aws_secret_access_key": "b"}


def sessions_built(monkeypatch) -> list:
    built = []
    original = boto3.session.Session.__init__

    def counted(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(kwargs.get("aws_access_key_id"))

    monkeypatch.setattr(boto3.session.Session, "__init__", counted)
    return built


def test_runs_with_the_same_credentials_build_their_clients_from_one_session_and_other_credentials_from_their_own(monkeypatch):
    built = sessions_built(monkeypatch)
    first_run, second_run = AwsClientsResource(**KEYS), AwsClientsResource(**KEYS)
    clients = [run.client(service) for run in (first_run, second_run) for service in ("s3", "dynamodb", "dynamodbstreams")]
    assert len({id(client) for client in clients}) == 6  # a client per service and run
    other = AwsClientsResource(**{**KEYS, "aws_access_key_id": "c"})
    assert other.client("s3").meta.region_name == "us-east-1"
    # At most one Session per set of credentials (none if an earlier test of this process built it).
    assert built.count("a") <= 1 and built.count("c") == 1
    assert first_run.client("s3") is first_run.client("s3")


def test_clients_asked_for_at_once_from_threads_are_each_whole_and_one_per_service_and_run():
    runs = [AwsClientsResource(**{**KEYS, "aws_access_key_id": "threads"}) for _ in range(2)]
    asks = [(run, service) for run in runs for service in ("s3", "dynamodb", "dynamodbstreams", "sqs")] * 3
    clients, errors = {}, []

    def ask(index: int, run: AwsClientsResource, service: str) -> None:
        try:
            clients[index] = run.client(service)
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=ask, args=(index, run, service)) for index, (run, service) in enumerate(asks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert [clients[index].meta.service_model.service_name for index in range(len(asks))] == [service for _, service in asks]
    for run in runs:
        for service in ("s3", "dynamodb", "dynamodbstreams", "sqs"):
            assert len({id(clients[index]) for index, (asker, asked) in enumerate(asks) if asker is run and asked == service}) == 1
