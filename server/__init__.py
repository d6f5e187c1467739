"""The ServerApp: run config, the run's loop and evaluator, results, reports and the threat-model row."""
