"""A real S3 API server for tests: moto's server mode over HTTPS (a trustme certificate), in a child process.

Run as `python -m tests.fakes.s3_server CERT KEY`; it binds a free port, writes the port as the one line of
its standard output, and serves until killed. `S3Server` starts it,
and hands out a fresh bucket per test (`bucket()`), the serve flags pointing at it (`flags()`), and a
boto3 client for the test's own inspection. One test-only endpoint besides the S3 API: `age()` moves an
object's LastModified into the past (S3 sets it on every write, so nothing in the API can make an old
object). moto reports every multipart upload as initiated in 2010 (`ListMultipartUploads`), so on this
server every unfinished upload is an old one. AWS credentials are dummies in the environment (botocore's
default chain picks them up, in the tests and in every proxy process they start).

The server's stderr goes to a temporary file, never to a pipe nobody reads: werkzeug logs every
request there, and once a pipe's 64 KiB buffer was full the logging thread blocked in `write`
holding the logging lock, so every later request hung before its response (the whole session's
S3 tests then failed with read timeouts). Requests are not logged at all any more (errors are).
"""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.process import REPO_ROOT

REGION = "us-east-1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_DEFAULT_REGION": REGION,
}
ENV_BUCKET = "TEST_S3_BUCKET"
ENV_ENDPOINT = "TEST_S3_ENDPOINT"
ENV_CA = "TEST_S3_CA_FILE"
AGE_PATH = "/_test/age"


class S3Server:
    """moto_server behind TLS on a free port of 127.0.0.1."""

    def __init__(self, cert: Path, key: Path, ca_file: Path) -> None:
        self.ca_file = ca_file
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open while the server runs, closed by stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.s3_server", str(cert), str(key)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, **CREDENTIALS},
        )
        assert self.process.stdout is not None
        with self.process.stdout:  # one line, then the server's standard output is /dev/null
            port = self.process.stdout.readline().strip()
        if not port.isdigit():
            self.process.wait(10)
            error = self.errors()[-2000:]
            self.log.close()
            raise RuntimeError(f"moto server did not start: {error}")
        self.port = int(port)
        self.url = f"https://127.0.0.1:{self.port}"
        self.client = self._client()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.list_buckets()
                return
            except Exception as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    self.process.wait(10)
                    error = self.errors()[-2000:]
                    self.stop()
                    raise RuntimeError(f"moto server did not start: {error}") from exc
                time.sleep(0.1)

    def _client(self) -> Any:
        return self.client_with(None)

    def client_with(self, config: Any) -> Any:
        """A boto3 client of the server with this botocore `Config` (None: the defaults)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            verify=str(self.ca_file),
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=config,
        )

    def bucket(self) -> str:
        """A fresh, empty bucket."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client.create_bucket(Bucket=name)
        return name

    def flags(self, bucket: str, prefix: str = "archives") -> list[str]:
        """`serve` flags for an archive store in `bucket` under `prefix`."""
        return [
            "--archive-store",
            f"s3://{bucket}/{prefix}",
            "--s3-endpoint-url",
            self.url,
            "--s3-region",
            REGION,
            "--s3-path-style",
            "--s3-ca-file",
            str(self.ca_file),
        ]

    def settings(self, bucket: str, prefix: str = "archives") -> dict[str, Any]:
        """`Settings` fields for an archive store in `bucket` under `prefix`."""
        return {
            "archive_store": f"s3://{bucket}/{prefix}",
            "s3_endpoint_url": self.url,
            "s3_region": REGION,
            "s3_path_style": True,
            "s3_ca_file": self.ca_file,
        }

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def age(self, bucket: str, key: str, seconds: float) -> None:
        """Make the object at `key` look `seconds` older (its LastModified) than it is."""
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({"bucket": bucket, "key": key, "seconds": seconds})
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(f"{self.url}{AGE_PATH}?{query}", data=b"", context=context, timeout=10) as answer:
            assert answer.status == 204, answer.status

    def errors(self) -> str:
        """What the server wrote to stderr (its errors; requests are not logged)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self.log.close()


def test_store(root: Path) -> Any:
    """An S3 archive store on the bucket named by the environment (for `tests.fakes.store_holder`), not opened."""
    from proxy.settings.config import parse_s3_location
    from proxy.storage.s3 import S3Options, S3Store

    return S3Store(
        root,
        parse_s3_location(f"s3://{os.environ[ENV_BUCKET]}/archives"),
        S3Options(
            endpoint_url=os.environ[ENV_ENDPOINT], region=REGION, path_style=True, ca_file=Path(os.environ[ENV_CA])
        ),
    )


test_store.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def sessions_sharing_one_loader() -> Callable[[], Any]:
    """A stand-in for aiobotocore's `get_session`: a new session each time, as the S3 store asks for, all
    reading botocore's data files (the S3 service model, endpoints) through one loader, which keeps what it
    read. A new session reads and parses them again: about 0.1 s of CPU per store opened. Credentials,
    configuration and clients stay the session's own."""
    from aiobotocore.session import get_session

    loader = get_session().get_component("data_loader")

    def session() -> Any:
        made = get_session()
        made.register_component("data_loader", loader)
        return made

    return session


def _with_age_endpoint(app: Any) -> Any:
    """The WSGI app, plus `POST AGE_PATH?bucket=&key=&seconds=` (moves the object's LastModified back)."""
    import datetime
    import urllib.parse

    from moto.s3.models import s3_backends

    def wsgi(environ: dict, start_response: Any) -> Any:
        if environ.get("PATH_INFO") != AGE_PATH:
            return app(environ, start_response)
        query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
        partition, account = s3_backends.bucket_accounts[query["bucket"]]
        stored = s3_backends[account][partition].get_bucket(query["bucket"]).keys[query["key"]]
        stored.last_modified -= datetime.timedelta(seconds=float(query["seconds"]))
        start_response("204 No Content", [])
        return [b""]

    return wsgi


def main(cert: str, key: str) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app = _with_age_endpoint(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        "127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler, ssl_context=(cert, key)
    )
    print(server.server_port, flush=True)
    with open(os.devnull, "wb") as devnull:  # nobody reads the pipe after that line
        os.dup2(devnull.fileno(), sys.stdout.fileno())
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
