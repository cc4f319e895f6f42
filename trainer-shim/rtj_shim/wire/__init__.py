"""Messages that cross a process: the operator's signed restart order and its answer seal,
the drain order, the per-rank progress record, the supervisor's report, the trainers'
verdicts (a suspect state, a refused pinned step, the preflight's) and the environment
contract between the operator and the trainer's container. Each module holds one message,
its ``encode``/``parse`` (or write/read) side by side (``json_body``: the checks they share);
the operator imports these types instead of re-parsing them.
"""
