"""An S3 server on loopback (moto's, in this process) for the checkpoint storage tests."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

REGION = "us-east-1"


@pytest.fixture
def s3_bucket(s3_server: str):
    """A fresh bucket; yields an S3Storage on it with S3's smallest multipart sizes (5 MiB)."""
    import boto3
    from gpuflow.tasks.training.storage import S3Storage

    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name=REGION).create_bucket(Bucket=name)
    yield S3Storage(
        name,
        prefix="runs/",
        endpoint_url=s3_server,
        region_name=REGION,
        multipart_threshold_mb=5,
        multipart_chunk_mb=5,
    )


@pytest.fixture
def s3_auth_key(s3_server: str) -> Iterator[tuple[str, str]]:
    """An IAM user allowed s3:*, then moto told to check signatures and IAM policies (it
    accepts any credentials by default) through its /moto-api/reset-auth switch. Yields
    (access key id, secret); restores the default afterwards."""
    import boto3

    iam = boto3.client("iam", endpoint_url=s3_server, region_name=REGION)
    user = f"ckpt-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]

    def post(count: str) -> None:
        request = urllib.request.Request(
            f"{s3_server}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            # Not a form: the server reads the raw body as the number.
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            json.loads(answer.read())

    post("0")
    try:
        yield key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        post("inf")
