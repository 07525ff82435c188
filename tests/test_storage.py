"""Storage URIs: local directories and S3 (against a real SeaweedFS with credentials enforced)."""

from __future__ import annotations

import pytest

from agilerl_core.errors import StorageError
from agilerl_core.io.storage import LocalStorage, S3Options, S3Storage, open_storage


def _exercise(st):
    st.put_bytes("run/a/x.bin", b"1")
    st.put_bytes("run/a/y.bin", b"22")
    st.put_bytes("run/b.json", b"{}")
    assert st.get_bytes("run/a/y.bin") == b"22"
    assert st.exists("run/a/x.bin") and not st.exists("run/a/z.bin")
    assert st.list("run/a/") == ["run/a/x.bin", "run/a/y.bin"]
    assert st.list("run/") == ["run/a/x.bin", "run/a/y.bin", "run/b.json"]
    st.put_bytes("run/a/x.bin", b"333")  # overwrite
    assert st.get_bytes("run/a/x.bin") == b"333"
    st.delete_prefix("run/a")
    assert st.list("run/") == ["run/b.json"]
    with pytest.raises(StorageError, match="not found"):
        st.get_bytes("run/a/x.bin")
    st.check()


def test_local_storage(tmp_path):
    st = open_storage(str(tmp_path / "store"))
    assert isinstance(st, LocalStorage)
    _exercise(st)
    assert not list((tmp_path / "store").rglob(".*"))  # no temp files left behind
    with pytest.raises(StorageError, match="escapes"):
        st.put_bytes("../outside", b"x")
    assert open_storage(f"file://{tmp_path}/store").root == st.root


def test_bad_uris_name_the_field(tmp_path):
    with pytest.raises(StorageError, match="unsupported scheme 'gs'"):
        open_storage("gs://bucket/x")
    with pytest.raises(StorageError, match="no bucket"):
        open_storage("s3://")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="storage.uri"):
        open_storage(str(tmp_path / "file" / "sub"))


@pytest.mark.integration
def test_s3_storage_round_trip(s3):
    c = s3.credentials()
    st = S3Storage("s3://agilerl/tests/rt", S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"]))
    _exercise(st)


@pytest.mark.integration
def test_s3_refuses_unauthenticated_and_wrong_credentials(s3):
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    anon = boto3.client("s3", endpoint_url=s3.s3_url, region_name="us-east-1", config=Config(signature_version=UNSIGNED))
    with pytest.raises(ClientError) as err:
        anon.put_object(Bucket="agilerl", Key="anon", Body=b"x")
    assert err.value.response["Error"]["Code"] in ("AccessDenied", "403")
    with pytest.raises(ClientError):
        anon.list_objects_v2(Bucket="agilerl")
    c = s3.credentials()
    wrong = S3Storage("s3://agilerl/x", S3Options(s3.s3_url, None, c["access_key_id"], "not-the-secret"))
    with pytest.raises(StorageError, match="secret key is wrong"):
        wrong.check()
    unknown = S3Storage("s3://agilerl/x", S3Options(s3.s3_url, None, "nobody", "nothing"))
    with pytest.raises(StorageError, match="access key id is unknown|access refused"):
        unknown.check()
    missing = S3Storage("s3://no-such-bucket/x", S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"]))
    with pytest.raises(StorageError, match="bucket .no-such-bucket. does not exist"):
        missing.check()


@pytest.mark.integration
def test_s3_credentials_from_the_environment_are_read_when_a_store_is_opened(s3, monkeypatch):
    """boto3 keeps the environment's credentials it first resolved for the whole process: a store opened after
    they changed (a second stack, rotated keys) must sign with the new ones."""
    c = s3.credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stale-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stale-secret")
    with pytest.raises(StorageError):
        S3Storage("s3://agilerl/env-creds", S3Options(s3.s3_url)).check()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", c["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", c["secret_access_key"])
    S3Storage("s3://agilerl/env-creds", S3Options(s3.s3_url)).check()


def test_unreachable_s3_endpoint_is_a_clear_error():
    from infra.stack import free_port

    # two attempts, not the default ten with backoff (about a minute): the message is what is checked here
    st = S3Storage("s3://b/x", S3Options(f"http://127.0.0.1:{free_port()}", None, "a", "b", max_attempts=2))
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint"):
        st.check()
