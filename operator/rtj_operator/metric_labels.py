"""The labels every per-job series carries (one definition for metrics.py and its wings)."""

from __future__ import annotations

JOB_LABELS = ("namespace", "name")
"""A job's series are keyed by its namespace and name, as its alerts group them."""
