"""ddb_athena_build/pinned.py: what the image downloads lands only with the SHA-256 deploy/artifacts.lock pins."""

import hashlib
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddb_athena_build import pinned
from ddb_athena_build.jars import FetchError

SERVED = b"-----BEGIN CERTIFICATE-----\nnot really one\n-----END CERTIFICATE-----\n"


@pytest.fixture
def served_url():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(SERVED)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/bundle.pem"
    server.shutdown()


def test_an_artifact_with_its_pinned_digest_lands_and_one_with_another_is_refused_leaving_nothing(served_url, tmp_path):
    good = pinned.Pinned("bundle.pem", hashlib.sha256(SERVED).hexdigest(), served_url)
    assert pinned.fetch_pinned(good, tmp_path / "certs").read_bytes() == SERVED
    tampered = pinned.Pinned("other.pem", hashlib.sha256(b"what was reviewed").hexdigest(), served_url)
    with pytest.raises(FetchError, match="SHA-256 .* pins "):
        pinned.fetch_pinned(tampered, tmp_path / "certs")
    assert sorted(path.name for path in (tmp_path / "certs").iterdir()) == ["bundle.pem"]


def test_an_offline_build_may_go_without_an_artifact_but_never_with_a_wrong_one(served_url, tmp_path, monkeypatch, capsys):
    lock = tmp_path / "artifacts.lock"
    lock.write_text(f"# comment\nunreachable.pem {'0' * 64} http://127.0.0.1:9/nothing\nwrong.pem {'0' * 64} {served_url}\n")
    monkeypatch.setattr(pinned, "LOCK", lock)
    into = str(tmp_path / "certs")
    assert pinned.main(["unreachable.pem", "--into", into]) == 1
    assert pinned.main(["unreachable.pem", "--into", into, "--optional", "1"]) == 0
    assert "left out of this build" in capsys.readouterr().err
    assert pinned.main(["wrong.pem", "--into", into, "--optional", "1"]) == 1
    assert not (tmp_path / "certs" / "wrong.pem").exists()


def test_the_lock_pins_the_rds_certificate_authorities_from_awss_trust_store_over_https():
    (bundle,) = [artifact for artifact in pinned.pinned_artifacts().values() if artifact.name == "rds-ca-bundle.pem"]
    assert bundle.url.startswith("https://truststore.pki.rds.amazonaws.com/")
    assert len(bundle.sha256) == 64 and int(bundle.sha256, 16) >= 0


def signing_key(name: str) -> tuple[Path, Path]:
    """A throwaway GnuPG key in a keyring of its own, as a release manager's: (its home, its public half exported as a
    KEYS file, which is what the pin trusts). The home is short (/tmp/gpg-...): the agent's socket path must fit 108
    bytes, which a test's own directory under pytest-xdist does not."""
    home = Path(tempfile.mkdtemp(prefix="gpg-"))
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    try:
        subprocess.run([*gpg, "--quick-generate-key", f"{name} <{name}@example.com>", "ed25519", "sign", "never"], check=True, capture_output=True)
        keys = home / "KEYS"
        keys.write_bytes(subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True).stdout)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)  # the agent a key needs
    return home, keys


def sign(home: Path, path: Path) -> None:
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--yes"]
    try:
        subprocess.run([*gpg, "--armor", "--detach-sign", "--output", f"{path}.asc", str(path)], check=True, capture_output=True)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)


@pytest.fixture
def maven_mirror(tmp_path):
    """A mirror of Maven Central over HTTP, laid out as Maven Central is: a JAR, the SHA-1 it publishes beside it, and
    its release manager's signature (`.asc`); the KEYS file of that release manager beside the lock."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    root = tmp_path / "mirror"
    jar = root / "org/apache/hadoop/hadoop-aws/3.3.4/hadoop-aws-3.3.4.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK\x03\x04 hadoop-aws")
    jar.with_name(jar.name + ".sha1").write_text(hashlib.sha1(jar.read_bytes(), usedforsecurity=False).hexdigest() + "  hadoop-aws-3.3.4.jar\n")
    home, keys = signing_key("release-manager")
    sign(home, jar)
    quiet = type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *args: None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lock = tmp_path / "artifacts.lock"
    lock.write_text(f"# the JAR\nhadoop-aws-3.3.4.jar  {pinned.UNPINNED}  {pinned.MAVEN_CENTRAL}org/apache/hadoop/hadoop-aws/3.3.4/hadoop-aws-3.3.4.jar\n")
    yield f"http://127.0.0.1:{server.server_port}/", jar, lock, keys
    server.shutdown()
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.subprocess  # GnuPG signs and checks the release
def test_an_unpinned_artifact_is_refused_until_pinned_then_fetched_from_a_mirror_by_its_pin(maven_mirror, tmp_path, monkeypatch, capsys):
    mirror, jar, lock, keys = maven_mirror
    monkeypatch.setattr(pinned, "LOCK", lock)
    into = tmp_path / "jars"
    assert pinned.main(["hadoop-aws-3.3.4.jar", "--into", str(into), "--maven-repository", mirror]) == 1
    assert "pins no SHA-256 for it yet" in capsys.readouterr().err and not (into / "hadoop-aws-3.3.4.jar").exists()
    # An offline build goes without it, and says so beside the JARs.
    assert pinned.main(["hadoop-aws-3.3.4.jar", "--into", str(into), "--optional", "1"]) == 0
    assert "hadoop-aws-3.3.4.jar" in (into / pinned.NOT_FETCHED_FILE).read_text()

    assert pinned.main(["--pin", "hadoop-aws-3.3.4.jar", "--maven-repository", mirror, "--keys", str(keys)]) == 0
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    assert f"hadoop-aws-3.3.4.jar {digest} (signed by " in capsys.readouterr().out
    assert lock.read_text() == f"# the JAR\nhadoop-aws-3.3.4.jar  {digest}  {pinned.MAVEN_CENTRAL}org/apache/hadoop/hadoop-aws/3.3.4/hadoop-aws-3.3.4.jar\n"
    assert pinned.main(["hadoop-aws-3.3.4.jar", "--into", str(into), "--maven-repository", mirror]) == 0
    assert (into / "hadoop-aws-3.3.4.jar").read_bytes() == jar.read_bytes() and not (into / pinned.NOT_FETCHED_FILE).exists()

    # The mirror serves another JAR under the same name later: the pin refuses it.
    jar.write_bytes(b"PK\x03\x04 tampered")
    assert pinned.main(["hadoop-aws-3.3.4.jar", "--into", str(tmp_path / "other"), "--maven-repository", mirror, "--optional", "1"]) == 1
    assert f"deploy/artifacts.lock pins {digest}" in capsys.readouterr().err


@pytest.mark.subprocess  # GnuPG signs and checks the release
def test_pinning_refuses_what_disagrees_with_the_sha1_its_repository_publishes(maven_mirror, monkeypatch, capsys):
    mirror, jar, lock, keys = maven_mirror
    monkeypatch.setattr(pinned, "LOCK", lock)
    jar.write_bytes(b"PK\x03\x04 corrupted on the way")
    before = lock.read_text()
    assert pinned.main(["--pin", "hadoop-aws-3.3.4.jar", "--maven-repository", mirror, "--keys", str(keys)]) == 1
    assert ".sha1 says" in capsys.readouterr().err
    assert lock.read_text() == before


def test_the_image_jars_are_the_official_maven_artifacts_of_the_lock():
    from ddb_athena.lake.local_jars import IMAGE_JAR_NAMES

    lock = pinned.pinned_artifacts()
    for name in IMAGE_JAR_NAMES:
        assert lock[name].url.startswith(pinned.MAVEN_CENTRAL) and lock[name].url.endswith("/" + name)
        assert lock[name].sha256 == pinned.UNPINNED or len(lock[name].sha256) == 64


@pytest.mark.subprocess  # GnuPG signs and checks the release
def test_pinning_refuses_a_jar_whose_signature_is_missing_bad_or_by_a_key_the_publisher_does_not_list(maven_mirror, tmp_path, monkeypatch, capsys):
    """Issue 69: the SHA-1 beside a JAR comes from the same server and catches corruption, not tampering; the release's
    signature by a key of the publisher's KEYS file is what makes a pin trustworthy."""
    mirror, jar, lock, keys = maven_mirror
    monkeypatch.setattr(pinned, "LOCK", lock)
    before, signature = lock.read_text(), jar.with_name(jar.name + ".asc")
    release_managers = signature.read_bytes()

    def pin() -> int:
        return pinned.main(["--pin", "hadoop-aws-3.3.4.jar", "--maven-repository", mirror, "--keys", str(keys)])

    # Replaced on the server, its SHA-1 beside it replaced to match.
    jar.write_bytes(b"PK\x03\x04 tampered")
    jar.with_name(jar.name + ".sha1").write_text(hashlib.sha1(jar.read_bytes(), usedforsecurity=False).hexdigest())
    # ... with the release manager's signature of the real JAR: not good for these bytes;
    assert pin() == 1 and "hadoop-aws-3.3.4.jar: the signature is not good" in capsys.readouterr().err
    # ... signed by someone the publisher's KEYS does not list;
    someone_else, _ = signing_key("someone-else")
    sign(someone_else, jar)
    shutil.rmtree(someone_else, ignore_errors=True)
    assert signature.read_bytes() != release_managers
    assert pin() == 1 and "signed by a key the KEYS file does not hold" in capsys.readouterr().err
    # ... or with no signature at all.
    signature.unlink()
    assert pin() == 1 and "no signature beside it" in capsys.readouterr().err
    assert lock.read_text() == before
    with pytest.raises(SystemExit):  # no KEYS file named: nothing to trust a signature by
        pinned.main(["--pin", "hadoop-aws-3.3.4.jar", "--maven-repository", mirror])
    assert "--pin needs --keys" in capsys.readouterr().err
