"""What an RDS endpoint puts before PostgreSQL, for the tests and benchmarks of a deployment's instance: TLS with a
certificate from a CA of its own (a client with `sslmode=verify-full` checks the name it dialled), and IAM database
authentication for the roles named IAM users. Such a role's password must be a token, a SigV4 presigned `connect`
for that user at this endpoint (botocore's `generate_db_auth_token`), signed by known credentials and at most 15
minutes old; the front checks it and opens the session on the server's own socket, which trusts that role. Any
other role (the master user) authenticates with the server itself, through the front. No plain-text connection is
accepted (RDS for PostgreSQL 15 and later force SSL by default)."""

import datetime
import hmac
import ipaddress
import select
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102
TOKEN_LIFETIME_SECONDS = 900
CLOCK_SKEW_SECONDS = 300


@dataclass(frozen=True)
class Authority:
    """A CA of the front's own and the server certificate it signed for the front's names."""

    ca_file: Path
    certificate_file: Path
    key_file: Path
    names: tuple[str, ...]


def make_authority(directory: Path, names: tuple[str, ...] = ("localhost", "127.0.0.1"), common_name: str = "ddb_athena test RDS CA") -> Authority:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, issuer_name, issuer_key, public_key, *, ca: bool, alternative_names=()):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if alternative_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(alternative_names)), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = certificate(common_name, ca_name, ca_key, ca_key.public_key(), ca=True)

    def alternative(name: str):
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    server = certificate(names[0], ca_name, ca_key, server_key.public_key(), ca=False, alternative_names=[alternative(name) for name in names])
    authority = Authority(directory / "ca.pem", directory / "server.pem", directory / "server.key", names)
    authority.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    authority.certificate_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key = server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    authority.key_file.write_bytes(key)
    authority.key_file.chmod(0o600)
    return authority


def token_problem(token: str, user: str, endpoint: str, credentials: dict[str, str], now: datetime.datetime) -> str | None:
    """Why RDS would refuse `token` as `user`'s password at `endpoint` (host:port), or None: it must be a `connect`
    for that user and endpoint, signed for the rds-db service by credentials in `credentials` (access key: secret
    key), dated within its lifetime."""
    unsigned, _, signature = token.rpartition("&X-Amz-Signature=")
    parts = urlsplit("https://" + unsigned)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if not signature or parts.netloc != endpoint or parts.path != "/":
        return "not a token for this endpoint"
    if query.get("Action") != "connect" or query.get("DBUser") != user:
        return "not a token for this user"
    access_key, _, region_and_service = query.get("X-Amz-Credential", "").partition("/")
    if region_and_service.split("/")[2:3] != ["rds-db"] or access_key not in credentials:
        return "not signed by a known identity for rds-db"
    signed_at = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    age = (now - signed_at).total_seconds()
    if not -CLOCK_SKEW_SECONDS <= age <= min(int(query.get("X-Amz-Expires", 0)), TOKEN_LIFETIME_SECONDS):
        return "expired"
    request = AWSRequest(method="GET", url="https://" + unsigned)
    request.context["timestamp"] = query["X-Amz-Date"]
    region = region_and_service.split("/")[1]
    signer = SigV4QueryAuth(Credentials(access_key, credentials[access_key], query.get("X-Amz-Security-Token")), "rds-db", region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    return None if hmac.compare_digest(expected, signature) else "signature does not match"


def _read_exactly(connection, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _error(message: str, code: str = "28000") -> bytes:
    fields = b"".join(kind + text.encode() + b"\0" for kind, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message))) + b"\0"
    return b"E" + struct.pack("!I", 4 + len(fields)) + fields


class RdsFront:
    """Listens on 127.0.0.1:<port>; each connection is checked as above, then piped to the server's Unix socket."""

    def __init__(self, socket_path: Path, authority: Authority, iam_users: set[str], credentials: dict[str, str], clock: Callable | None = None):
        self._socket_path = str(socket_path)
        self._names = authority.names
        self._iam_users = iam_users
        self._credentials = credentials
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(authority.certificate_file, authority.key_file)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.refused: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server = socket.socket(socket.AF_UNIX)
        try:
            length, code = struct.unpack("!II", _read_exactly(client, 8))
            if code == GSSENC_REQUEST:
                client.sendall(b"N")
                length, code = struct.unpack("!II", _read_exactly(client, 8))
            if code == CANCEL_REQUEST:
                server.connect(self._socket_path)
                server.sendall(struct.pack("!II", length, code) + _read_exactly(client, length - 8))
                return
            if code != SSL_REQUEST:
                client.sendall(_error("no pg_hba.conf entry: SSL off (rds.force_ssl)"))
                return
            client.sendall(b"S")
            client = self._tls.wrap_socket(client, server_side=True)
            (length,) = struct.unpack("!I", _read_exactly(client, 4))
            startup = _read_exactly(client, length - 4)
            fields = startup[4:].split(b"\0")
            parameters = dict(zip(fields[0::2], fields[1::2], strict=False))
            user = parameters.get(b"user", b"").decode()
            if user in self._iam_users and not self._iam_login(client, user):
                return
            server.connect(self._socket_path)
            server.sendall(struct.pack("!I", length) + startup)
            _pipe(client, server)
        except (OSError, ConnectionError, ssl.SSLError):
            pass
        finally:
            server.close()
            client.close()

    def _iam_login(self, client, user: str) -> bool:
        client.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword: the token, inside TLS
        kind, length = struct.unpack("!cI", _read_exactly(client, 5))
        token = _read_exactly(client, length - 4).rstrip(b"\0").decode()
        # The token names the host the client dialled: one of the certificate's names.
        dialled = urlsplit("https://" + token).hostname
        endpoint = f"{dialled if dialled in self._names else self._names[0]}:{self.port}"
        problem = "not a password message" if kind != b"p" else token_problem(token, user, endpoint, self._credentials, self._clock())
        if problem:
            self.refused.append(f"{user}: {problem}")
            client.sendall(_error(f'PAM authentication failed for user "{user}"', "28P01"))
            return False
        return True


def _pipe(client, server) -> None:
    while True:
        ready = [client] if getattr(client, "pending", lambda: 0)() else select.select([client, server], [], [], 5)[0]
        for source in ready:
            data = source.recv(65536)
            if not data:
                return
            (server if source is client else client).sendall(data)
