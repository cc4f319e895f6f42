"""The in-pod agent: the progress sidecar (its HTTP front door, handlers and report), the
supervisor around the trainer's command, its doorbell and its warm interpreters. No torch:
the agent runs beside the trainer, never inside it (an import-linter contract keeps it so).
"""
