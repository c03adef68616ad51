"""The coordinator's workers' side: stage pools, worker processes, answers, exits, watchdogs."""
