"""rtj_shim: a checkpoint commit protocol that never lets a half-written step be resumed.

The package is in wings: ``checkpoint`` (the commit protocol and its stores), ``wire`` (the
messages that cross a process), ``fast`` (the fast tier), ``agent`` (the in-pod sidecar and
supervisor), ``torch`` (the trainer's side) and ``integrations`` (Lightning, Hugging Face);
``progress`` (a trainer's progress reports) and ``cli`` at the root. The checkpoint wing
depends only on pydantic. S3 needs the ``s3`` extra (boto3) and the
PyTorch state layer needs the ``torch`` extra.
"""

__version__ = "0.1.0"

from rtj_shim import _moved

_moved.install()
