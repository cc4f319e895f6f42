"""rtj_operator: the ResilientTrainingJob controller (kopf). Lands with the operator issue."""

__version__ = "0.1.0"
