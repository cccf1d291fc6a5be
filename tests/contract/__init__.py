"""Contract tests: proto/ matches the models, stays v1-compatible, and its examples validate."""
