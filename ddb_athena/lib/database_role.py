"""The Dagster instance's own role in its RDS PostgreSQL database. It logs in with IAM database authentication (each
connection presents a 15-minute token signed with the task's role: no password to rotate, inject or leak) and owns
the instance's tables. The master user, whose password RDS keeps and rotates in Secrets Manager, only makes it: the
platform task's `database-setup` container runs `ddb-athena database-role` at every start (nothing to change after the
first)."""

import os

from ddb_athena.lake.identifiers import validate_identifier

# The role RDS grants to use IAM database authentication (it exists only on RDS).
RDS_IAM = "rds_iam"


def ensure_database_role(connection, role: str, iam_group: str = RDS_IAM) -> list[str]:
    """Make `role` the instance's login, as the connected (master) user: create it if missing, grant it `iam_group`
    (so it logs in with IAM tokens), let it create in the public schema, and hand it the tables, views and sequences
    there that the master user owns (an instance the master user created before). Safe to run again; returns what
    it changed."""
    from psycopg2 import sql

    role_name = sql.Identifier(validate_identifier(role, "role"))
    changed = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolname FROM pg_roles WHERE rolname IN (%s, %s)", (role, iam_group))
        existing = {name for (name,) in cursor.fetchall()}
        if iam_group not in existing:
            raise RuntimeError(f"the database has no role {iam_group}: IAM database authentication is RDS's (EnableIAMDatabaseAuthentication on the instance)")
        if role not in existing:
            cursor.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role_name))
            changed.append(f"created role {role}")
        cursor.execute("SELECT 1 FROM pg_auth_members WHERE roleid = %s::regrole AND member = %s::regrole", (iam_group, role))
        if not cursor.fetchone():
            cursor.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(iam_group), role_name))
            changed.append(f"granted {iam_group}")
        cursor.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(role_name))
        # Handing an object over takes being able to act as its new owner (PostgreSQL 16: SET on the role).
        cursor.execute(sql.SQL("GRANT {} TO CURRENT_USER WITH SET TRUE").format(role_name))
        handed = 0
        # Tables and views first: their columns' sequences follow them; what is left are sequences of their own.
        for kinds in (("r", "p", "v", "m"), ("S",)):
            cursor.execute(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = ANY(%s) AND c.relowner = CURRENT_USER::regrole",
                (list(kinds),),
            )
            for name, kind in cursor.fetchall():
                statement = {"v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}.get(kind, "TABLE")
                cursor.execute(sql.SQL(f"ALTER {statement} {{}} OWNER TO {{}}").format(sql.Identifier("public", name), role_name))
                handed += 1
        if handed:
            changed.append(f"handed over {handed} tables, views and sequences")
    connection.commit()
    return changed


def connect_as_master():
    """The instance's database as its master user, from the database-setup container's environment (ECS injects the
    password from the database's managed secret), verifying the server's certificate (PGSSLROOTCERT: the RDS CA bundle)."""
    import psycopg2

    return psycopg2.connect(
        host=os.environ["DAGSTER_POSTGRES_HOST"],
        port=int(os.environ.get("DAGSTER_POSTGRES_PORT", "5432")),
        dbname=os.environ["DAGSTER_POSTGRES_DB"],
        user=os.environ["DAGSTER_POSTGRES_MASTER_USER"],
        password=os.environ["DAGSTER_POSTGRES_MASTER_PASSWORD"],
        sslmode="verify-full",
        connect_timeout=10,
    )
