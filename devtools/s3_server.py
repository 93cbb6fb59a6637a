"""An S3-compatible server on loopback for tests: moto's standalone server, one bucket.

::

    with moto_s3("artifacts") as s3:
        monkeypatch.setenv(...) for each of s3.env    # or pass s3.env to a subprocess
        store = ArtifactStore(s3.url + "/tenants/acme")

Reusable by any test (the runtime's, the agents', the end-to-end ones): it
starts the server on a free port, creates the bucket, and hands back the
variables a process needs to reach it (``AWS_*``) and the bucket's URL.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
from moto.server import ThreadedMotoServer

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Server:
    """A running S3 server: its endpoint, one bucket's URL, and the environment to reach it."""

    endpoint: str
    url: str
    env: dict[str, str]


@contextlib.contextmanager
def moto_s3(bucket: str = "artifacts") -> Iterator[S3Server]:
    """Run moto's S3 server on 127.0.0.1 (a free port) with ``bucket`` created; stop it after."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        client.create_bucket(Bucket=bucket)
        env = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
        yield S3Server(endpoint=endpoint, url=f"s3://{bucket}", env=env)
    finally:
        server.stop()
