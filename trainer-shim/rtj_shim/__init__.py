"""rtj_shim: a checkpoint commit protocol that never lets a half-written step be resumed.

The protocol core (layout, manifest, verification, selection, retention, protocol,
filesystem storage) depends only on pydantic. S3 needs the ``s3`` extra (boto3) and the
PyTorch state layer needs the ``torch`` extra.
"""

__version__ = "0.1.0"
